import jax


# Tests run in double precision and refuse silent rank promotion; float32 is
# exercised explicitly where it matters (inside `jax.experimental.enable_x64(False)`
# blocks are not used: the float32 tests build float32/complex64 inputs directly).
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
