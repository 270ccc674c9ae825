"""The `hierax` command: the seed demo (the project's main job) and the benchmarks.

`hierax seed` computes the hierarchy of the question that started the project with
[`hierax.HeisenbergHierarchy`][] and runs, beside it, the question's own recursion and
the answer it was offered, so that speed and exactness are shown in one run.
`hierax bench` measures compile time, run time and memory against the alternatives.
The command is an application: unlike the library, it sets JAX configuration (x64).
"""

import argparse
import json
import math
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import __version__, _seed
from ._bench import format_seconds, median_call_time, run_benchmarks, warm_up
from ._coefficients import Cos
from ._hierarchies import HeisenbergHierarchy


DEFAULT_ORDER = 9
# Level k of the naive recursion costs about 3x level k-1; through level 8 the whole
# demo takes ~20 s on a quiet 2-core machine, level 9 alone would add ~45 s.
DEFAULT_NAIVE_ORDER = 8


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a non-negative integer, got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"expected a non-negative integer, got {value}"
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `hierax` command, with its subcommands."""
    parser = argparse.ArgumentParser(
        prog="hierax",
        description=(
            "Exact operator hierarchies of time-dependent quantum systems, in JAX. "
            "Run `hierax seed` for the demo, `hierax bench` for the benchmarks."
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
        type=_non_negative_int,
        default=DEFAULT_ORDER,
        help=f"highest level K computed by hierax (default {DEFAULT_ORDER})",
    )
    seed.add_argument(
        "--t", type=_finite_float, default=1.0, help="the time t (default 1.0)"
    )
    seed.add_argument(
        "--naive-order",
        type=_non_negative_int,
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
        "--json", metavar="PATH", default=None, help="also write all numbers to PATH"
    )
    # Checks that need several arguments report through the subcommand's parser.
    seed.set_defaults(subparser=seed)

    bench = commands.add_parser(
        "bench",
        help="benchmarks side by side: compile time, run time, memory",
        description=(
            "Measure, in one run: compile time against the order for the naive "
            "recursion, jax.experimental.jet and hierax; steady-state run time "
            "against the matrix size (also in matmul-equivalents); peak memory at "
            "n = 256. Writes results.json, results.md and PNG plots to --out."
        ),
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help="fewer orders and sizes, smaller budgets (under a minute)",
    )
    bench.add_argument(
        "--out",
        default="benchmarks/out",
        metavar="DIR",
        help="output directory (default benchmarks/out)",
    )
    bench.set_defaults(subparser=bench)
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
    if args.command == "seed":
        naive_order = args.naive_order
        if naive_order is None:
            naive_order = min(DEFAULT_NAIVE_ORDER, args.order)
        elif naive_order > args.order:
            args.subparser.error(
                f"argument --naive-order: {naive_order} exceeds --order {args.order} "
                "(the naive levels are compared with hierax's)"
            )
        if args.json is not None and pathlib.Path(args.json).is_dir():
            args.subparser.error(f"argument --json: {args.json!r} is a directory")
        # Before anything creates an array: the dtype of every constant follows it.
        jax.config.update("jax_enable_x64", args.x64)
        return run_seed(args.order, args.t, naive_order, args.x64, args.json)
    if args.command == "bench":
        out = pathlib.Path(args.out)
        if out.exists() and not out.is_dir():
            args.subparser.error(f"argument --out: {args.out!r} is not a directory")
        jax.config.update("jax_enable_x64", True)
        return run_benchmarks(quick=args.quick, out=out)
    raise AssertionError(args.command)  # argparse guarantees a known subcommand


def _print(*parts: Any) -> None:
    # Flushed so that slow rows show up as they finish, even through a pipe.
    print(*parts, flush=True)


def _format_entry(z: complex, scale: float) -> str:
    # Rounding leaves imaginary parts ~1e-16 of the matrix scale on real results;
    # showing them would hide the numbers that matter.
    if abs(z.imag) <= 1e-12 * scale:
        return f"{z.real:.15g}"
    return f"{z.real:.15g}{z.imag:+.15g}j"


def format_matrix(matrix: Any) -> str:
    """A small matrix on one line, e.g. `[[0, 1], [1, 0]]`."""
    matrix = np.asarray(matrix)
    scale = float(np.max(np.abs(matrix))) if matrix.size else 0.0
    rows = (
        "[" + ", ".join(_format_entry(complex(z), scale) for z in row) + "]"
        for row in matrix
    )
    return "[" + ", ".join(rows) + "]"


def _format_levels(levels: list[int]) -> str:
    """`[2, 3, 4, 7]` -> `"2..4, 7"`; `"none"` when empty."""
    if not levels:
        return "none"
    runs: list[list[int]] = []
    for k in levels:
        if runs and k == runs[-1][1] + 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    return ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in runs)


def run_seed(
    order: int, t: float, naive_order: int, x64: bool, json_path: str | None
) -> int:
    """The seed demo; see `hierax seed --help`. Returns the exit status."""
    start = time.perf_counter()
    tolerance = _seed.default_tolerance(x64)
    precision = "x64 (complex128)" if x64 else "float32 (complex64)"
    _print(
        f"hierax seed: H(t) = cos(t) sigma_y, X_0 = sigma_x, t = {t:g}, "
        f"levels 0..{order}, {precision}, jax {jax.__version__} on "
        f"{jax.default_backend()}"
    )
    # Start the backend and the compiler before timing anything, so that neither
    # side pays the process's one-time costs.
    warm_up()

    hierarchy = HeisenbergHierarchy(Cos() * _seed.pauli_y(), _seed.pauli_x(), order)
    tick = time.perf_counter()
    levels = hierarchy(t).block_until_ready()
    hierax_first = time.perf_counter() - tick
    hierax_steady, steady_calls = median_call_time(lambda: hierarchy(t))
    levels = np.asarray(levels)
    _print(
        f"\nhierax.HeisenbergHierarchy ({hierarchy.algorithm}): all {order + 1} "
        "levels in one call"
    )
    _print(
        f"  first call (compile + run): {format_seconds(hierax_first)}; "
        f"steady state: {format_seconds(hierax_steady)} per call "
        f"(median of {steady_calls})"
    )

    _print("\nLevels X_k(t) (imaginary parts below 1e-12 of the matrix are not shown):")
    for k, level in enumerate(levels):
        _print(f"  X_{k} = {format_matrix(level)}")

    t_complex = jnp.asarray(t, _seed.complex_dtype())
    offered = np.asarray(_seed.make_offered_scan(order)(t_complex))
    offered_diff = [
        _seed.relative_difference(offered[k], levels[k]) for k in range(order + 1)
    ]
    offered_wrong = [d > tolerance for d in offered_diff]
    _print(
        "\nThe answer offered to the question (lax.scan; its derivative term "
        "differentiates a constant), top row:"
    )
    _print(
        f"  {'k':>3}  {'exact X_k[0,0]':>22}  {'exact X_k[0,1]':>22}  "
        f"{'offered [0,0]':>22}  {'offered [0,1]':>22}"
    )
    for k in range(order + 1):
        flag = "WRONG" if offered_wrong[k] else "ok"
        cells = [levels[k][0, 0], levels[k][0, 1], offered[k][0, 0], offered[k][0, 1]]
        scale = float(np.max(np.abs(levels[k])))
        text = "  ".join(f"{_format_entry(complex(c), scale):>22}" for c in cells)
        _print(f"  {k:>3}  {text}  {flag}")
    wrong_levels = [k for k, w in enumerate(offered_wrong) if w]
    _print(f"  wrong at levels: {_format_levels(wrong_levels)}")

    _print(
        f"\nThe question's recursion (jit with static k, nested jacfwd), levels "
        f"0..{naive_order} called in turn, each timed compile + run. Speed-up per "
        "level = naive time to get level k / hierax's first call (all levels "
        f"0..{order}); cumulative = naive time for levels 0..k together / the same."
    )
    _print(
        f"  {'k':>3}  {'naive k (s)':>12}  {'naive 0..k (s)':>14}  "
        f"{'speed-up':>9}  {'cumulative':>10}  {'rel. diff':>9}"
    )
    naive = _seed.make_naive_recursion()
    rows = []
    cumulative = 0.0
    for k in range(naive_order + 1):
        tick = time.perf_counter()
        value = naive(t_complex, k).block_until_ready()
        elapsed = time.perf_counter() - tick
        cumulative += elapsed
        diff = _seed.relative_difference(levels[k], value)
        row = {
            "k": k,
            "naive_seconds": elapsed,
            "naive_cumulative_seconds": cumulative,
            "speedup_per_level": elapsed / hierax_first,
            "speedup_cumulative": cumulative / hierax_first,
            "relative_difference": diff,
            "agrees": diff <= tolerance,
        }
        rows.append(row)
        _print(
            f"  {k:>3}  {elapsed:>12.3f}  {cumulative:>14.3f}  "
            f"{row['speedup_per_level']:>8.1f}x  {row['speedup_cumulative']:>9.1f}x  "
            f"{diff:>9.1e}{'' if row['agrees'] else '  DISAGREE'}"
        )

    agree = all(row["agrees"] for row in rows)
    worst = max(row["relative_difference"] for row in rows)
    top = rows[-1]
    _print(
        f"\nAgreement with the naive recursion at levels 0..{naive_order}: largest "
        f"relative difference {worst:.1e} (tolerance {tolerance:.0e}): "
        f"{'OK' if agree else 'FAILED'}"
    )
    _print(
        f"Speed-up at level {naive_order}: {top['speedup_per_level']:.1f}x (naive "
        f"level {naive_order} alone), {top['speedup_cumulative']:.1f}x (naive levels "
        f"0..{naive_order}), against hierax's first call for all levels 0..{order}."
    )
    total = time.perf_counter() - start
    _print(f"Total time: {total:.1f} s")

    if json_path is not None:
        record = {
            "command": "seed",
            "order": order,
            "t": t,
            "naive_order": naive_order,
            "x64": x64,
            "tolerance": tolerance,
            "jax_version": jax.__version__,
            "backend": jax.default_backend(),
            "algorithm": hierarchy.algorithm,
            "hierax_first_call_seconds": hierax_first,
            "hierax_steady_state_seconds": hierax_steady,
            "hierax_steady_state_calls": steady_calls,
            "levels": {"real": levels.real.tolist(), "imag": levels.imag.tolist()},
            "offered_scan": {
                "levels": {
                    "real": offered.real.tolist(),
                    "imag": offered.imag.tolist(),
                },
                "relative_difference": offered_diff,
                "wrong": offered_wrong,
            },
            "naive": rows,
            "agree": agree,
            "largest_relative_difference": worst,
            "total_seconds": total,
        }
        path = pathlib.Path(json_path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=2) + "\n")
        except OSError as error:
            print(f"hierax seed: error: cannot write {path}: {error}", file=sys.stderr)
            return 1
        _print(f"Wrote {path}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
