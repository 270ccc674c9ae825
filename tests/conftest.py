import os
import subprocess
import sys


# Tests compile many small programs and run each briefly: XLA's optimisation passes
# cost more than they save here (measured: about a quarter of the suite's CPU time).
# Set before JAX starts, so that the scripts the tests run in subprocesses inherit it.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")


def _fast_compile_flag() -> None:
    """Compile with XLA:CPU's elemental emitters, which compile the suite's many
    small programs in about two thirds of the time of its default fusion emitters
    (the whole suite 412 -> 286 s on 2 cores; the same arithmetic), and each
    program as one LLVM module: XLA splits it into up to 32 for parallel code
    generation, which on two busy cores costs more than it gains (the suite's CPU
    time 657 -> 561 s). Test-only: the library sets no XLA flag, and the
    benchmarks run with XLA's defaults. A jaxlib that does not know a flag aborts
    at start-up, so they are tried in a subprocess first (once per test process;
    the flags then reach the scripts the tests run too)."""
    flag = (
        "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
    )
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_use_fusion_emitters" in flags:
        return
    wanted = f"{flags} {flag}".strip()
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()",
        ],
        env={**os.environ, "XLA_FLAGS": wanted},
        capture_output=True,
        timeout=120,
    )
    if probe.returncode == 0:
        os.environ["XLA_FLAGS"] = wanted


_fast_compile_flag()

import jax  # noqa: E402


# Tests run in double precision and refuse silent rank promotion; float32 is
# exercised explicitly where it matters (inside `jax.experimental.enable_x64(False)`
# blocks are not used: the float32 tests build float32/complex64 inputs directly).
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")


def _memoised_frame_filter() -> None:
    """Equinox's `error_if` formats the stack when it is traced, asking JAX's
    `include_frame` of every frame, which compares the frame's file with each
    of 41 excluded paths by `os.path` calls and a stat: 0.4 ms a frame, and under
    pytest and xdist a stack is about a hundred frames deep (16433 frames asked in
    `test_solvers.py` and `test_mesolve.py`: about 6.6 s of their 190). Test-only:
    the answers memoised by file name and the number of exclusions (a module
    imported later adds its own), the same answers. A JAX without this private
    function is left alone."""
    from jax._src import traceback_util

    original = getattr(traceback_util, "include_filename", None)
    excluded = getattr(traceback_util, "_exclude_paths", None)
    if original is None or not isinstance(excluded, list):
        return
    answers: dict[tuple[str, int], bool] = {}

    def include_filename(filename: str) -> bool:
        key = (filename, len(excluded))
        if key not in answers:
            answers[key] = original(filename)
        return answers[key]

    traceback_util.include_filename = include_filename


_memoised_frame_filter()


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_precision_left_behind():
    """hierax traces its programs inside `jax.default_matmul_precision(...)`
    blocks: none may outlive the call that entered it (a leaked one would change
    the precision of a user's own products). Checked around every test (against
    the value before it: importing dynamiqs sets "highest" for the process)."""
    before = jax.config.jax_default_matmul_precision  # pyright: ignore[reportAttributeAccessIssue]
    yield
    after = jax.config.jax_default_matmul_precision  # pyright: ignore[reportAttributeAccessIssue]
    assert after == before, f"JAX's default_matmul_precision {before!r} -> {after!r}"
