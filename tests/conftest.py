import gc
import os
import subprocess
import sys


# Tests compile many small programs and run each briefly: XLA's optimisation passes
# cost more than they save here (measured: about a quarter of the suite's CPU time).
# Set before JAX starts, so that the scripts the tests run in subprocesses inherit it.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

# One OpenBLAS thread a process (NumPy's and SciPy's references): the suite runs one
# test process a core (`pytest -n 2` on two cores), and OpenBLAS's threads, which
# spin while they wait, otherwise fight the other worker for its core (measured on
# test_density_layouts, test_fuzz_lockstep_large and test_pauli with `-n 2`: 100 ->
# 78 s of CPU time, 53 -> 43 s). The same algorithms; as with any other thread
# count, a large product may round differently in its last bits. Read when OpenBLAS
# loads: it reaches the pytest-xdist workers and the scripts the tests start (a
# process that has loaded NumPy before this file keeps its own count).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


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


# Python's cyclic garbage collector, tuned for tracing: JAX's traces allocate
# millions of short-lived containers, which at the default thresholds (700, 10, 10)
# outlive two young collections and are promoted into the oldest generation, whose
# full collections then scan the caches' several million objects again and again
# (measured on the whole suite: 33-53 full collections a worker, 35-42 s of its
# ~480). A young generation of 100000 lets them die young (test_lockstep.py: the
# collector's time 5.9 -> 0.7 s). Only when garbage is collected changes: nothing a
# test checks (tests that need a collection call `gc.collect()`). The scripts run in
# subprocesses set the same (`helpers._SCRIPT_RUNNER`).
GC_THRESHOLDS = (100_000, 50, 10)
gc.set_threshold(*GC_THRESHOLDS)


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


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """The session's garbage collected once after its last test and fixture, then
    the survivors frozen (`gc.freeze`): pytest's own collections at exit, which
    report what finalizers raised, then look only at what is new, instead of
    walking a worker's several million cached objects twice (2.8 s each). A
    pytest-xdist worker that is not done 5 s after it reports its end is sent
    SIGINT, which landed in JAX's garbage-collection callback and was reported as
    a warning (the controller waited ~10 s for its workers). What this collection's
    finalizers raise is reported as before."""
    gc.collect()
    gc.freeze()
