"""The argument parser of the `hierax` command, its argument checks, and dispatch.

Every mistake in the arguments is reported before any computation, as argparse
reports its own: a usage message, exit status 2, no traceback. That includes what
only the file system or the chosen precision can tell (an output path that cannot
be written, a time that float32 cannot hold). The subcommands' modules are imported
only when they run.
"""

import argparse
import math
import pathlib
import tempfile
from collections.abc import Sequence

import numpy as np

from .. import __version__
from .._core import MAX_ORDER


DEFAULT_ORDER = 9
# Level k of the naive recursion costs about 3x level k-1; through level 8 the whole
# demo takes ~20 s on a quiet 2-core machine, level 9 alone would add ~45 s.
DEFAULT_NAIVE_ORDER = 8


def _order(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a non-negative integer, got {text!r}"
        ) from None
    if not 0 <= value <= MAX_ORDER:
        raise argparse.ArgumentTypeError(
            f"expected a non-negative integer at most {MAX_ORDER:,}, got {value}"
        )
    return value


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _path(text: str) -> pathlib.Path:
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got ''")
    return pathlib.Path(text)


def _directory_problem(path: pathlib.Path) -> str | None:
    """Create `path` (and its parents) if needed and check that files can be
    written in it; a description of what is wrong, or None."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return "is not a directory"
    except OSError as error:
        return f"cannot be created ({error.strerror or error})"
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        return f"is not writable ({error.strerror or error})"
    return None


def _file_problem(path: pathlib.Path) -> str | None:
    """Check that `path` can be written as a file (creating its parent folders);
    a description of what is wrong, or None. Leaves no file behind."""
    if path.is_dir():
        return "is a directory"
    problem = _directory_problem(path.parent)
    if problem is not None:
        return f"is in a folder that {problem}"
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as error:
        return f"is not writable ({error.strerror or error})"
    if not existed:
        path.unlink()
    return None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `hierax` command, with its subcommands."""
    parser = argparse.ArgumentParser(
        prog="hierax",
        description=(
            "Exact operator hierarchies of time-dependent quantum systems, in JAX. "
            "Run `hierax seed` for the demo (the benchmarks live in the repository's "
            "benchmarks/ folder)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"hierax {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    seed = commands.add_parser(
        "seed",
        help="the seed hierarchy, exact, beside the naive recursion (the main demo)",
        description=(
            "Compute X_0..X_K of H(t) = cos(t) sigma_y, X_0 = sigma_x with "
            "hierax.HeisenbergHierarchy, time it against the question's recursive "
            "jit/jacfwd code level by level, check they agree, and show where the "
            "lax.scan answer offered to the question is wrong. Exits with status 1 "
            "if hierax and the naive recursion disagree."
        ),
    )
    seed.add_argument(
        "--order",
        type=_order,
        default=DEFAULT_ORDER,
        help=(
            f"highest level K computed by hierax, at most {MAX_ORDER:,} "
            f"(default {DEFAULT_ORDER})"
        ),
    )
    seed.add_argument(
        "--t", type=_finite_float, default=1.0, help="the time t (default 1.0)"
    )
    seed.add_argument(
        "--naive-order",
        type=_order,
        default=None,
        metavar="N",
        help=(
            "run the naive recursion for levels 0..N (default "
            f"min({DEFAULT_NAIVE_ORDER}, order); each level costs ~3x the one "
            "before: level 9 alone takes ~45 s)"
        ),
    )
    seed.add_argument(
        "--x64",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="double precision (default on); --no-x64 runs in float32/complex64",
    )
    seed.add_argument(
        "--json",
        type=_path,
        metavar="PATH",
        default=None,
        help=(
            "also write all numbers to PATH, as strict JSON: numbers that overflow "
            'the precision are written as the strings "inf", "-inf" or "nan"'
        ),
    )
    # Checks that need several arguments report through the subcommand's parser.
    seed.set_defaults(subparser=seed)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hierax` console script and of `python -m hierax`.

    **Arguments:**

    - `argv`: the arguments without the program name; `sys.argv[1:]` by default.

    **Returns:**

    The exit status: 0 on success, 1 if a check failed. Argument errors exit with
    status 2 and a usage message (argparse's convention).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    error = args.subparser.error
    if args.command == "seed":
        naive_order = args.naive_order
        if naive_order is None:
            naive_order = min(DEFAULT_NAIVE_ORDER, args.order)
        elif naive_order > args.order:
            error(
                f"argument --naive-order: {naive_order} exceeds --order {args.order} "
                "(the naive levels are compared with hierax's)"
            )
        largest = float(np.finfo(np.float64 if args.x64 else np.float32).max)
        if abs(args.t) > largest:
            error(
                f"argument --t: {args.t:g} does not fit in "
                f"{'float64' if args.x64 else 'float32'} (largest {largest:.4g})"
            )
        if args.json is not None:
            problem = _file_problem(args.json)
            if problem is not None:
                error(f"argument --json: {str(args.json)!r} {problem}")
        from ._seed import run_seed

        return run_seed(args.order, args.t, naive_order, args.x64, args.json)
    raise AssertionError(args.command)  # argparse guarantees a known subcommand
