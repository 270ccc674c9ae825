import os


# Tests compile many small programs and run each briefly: XLA's optimisation passes
# cost more than they save here (measured: about a quarter of the suite's CPU time).
# Set before JAX starts, so that the scripts the tests run in subprocesses inherit it.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import jax  # noqa: E402


# Tests run in double precision and refuse silent rank promotion; float32 is
# exercised explicitly where it matters (inside `jax.experimental.enable_x64(False)`
# blocks are not used: the float32 tests build float32/complex64 inputs directly).
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
