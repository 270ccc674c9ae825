"""Concrete values onto the device without compiling anything.

In eager mode `jnp.asarray(numpy_array)` and `x.astype(dtype)` each compile a
small XLA program per shape and dtype (10-30 ms on a CPU), which adds up in the
constructors of operators and sparse matrices. Concrete values are converted in
NumPy and placed with `jax.device_put` instead (same dtype canonicalisation, weak
types kept for Python scalars); traced values and arrays committed to a device go
through JAX operations (their placement kept), and a JAX array already of the
right dtype is returned as it is.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jaxtyping import Array

from ._cache import COMPLEX_DTYPES, FLOAT_DTYPES, PLACED_CONSTANTS


def is_traced(x: Any) -> bool:
    return isinstance(x, Tracer)


def placed(x: Any) -> bool:
    """Whether `x` is traced or a JAX array committed to its devices (by
    `jax.device_put` or a sharding): JAX operations then keep where it lives, which
    a round trip through NumPy would not."""
    return is_traced(x) or (isinstance(x, jax.Array) and x.committed)


def _place(value: Any) -> Array:
    """A concrete value on the default device, concrete even inside a user's trace
    (a NumPy matrix given to an operator inside `jax.jit`): what is computed from
    it before compiling (zero patterns, norms, the Lindblad step's parts) then
    still sees its entries."""
    with jax.ensure_compile_time_eval():
        return jax.device_put(value)


def to_jax(x: Any, dtype: Any = None) -> Array:
    """`x` as a JAX array (of `dtype` if given), compiling nothing when concrete
    and not committed to a device."""
    if placed(x):
        return jnp.asarray(x, dtype)
    if isinstance(x, jax.Array):
        if dtype is None or x.dtype == jnp.dtype(dtype):
            return x
        return _place(np.asarray(x).astype(dtype))
    if dtype is None and isinstance(x, (bool, int, float, complex)):
        # By representation: -0.0 == 0.0, but their placed values differ.
        key = (type(x), repr(x), placement())
        hit = PLACED_CONSTANTS.get(key)
        if hit is None:  # weakly typed, as `jnp.asarray` makes it
            hit = PLACED_CONSTANTS.put(key, _place(x))
        return hit
    value = np.asarray(x, dtype)
    if value.nbytes > _KEPT_BYTES or value.dtype == object:
        return _place(value)
    # Small constants (the matrices of a few levels or qubits, a pulse's
    # parameters), which a user's code rebuilds on every call, are placed once per
    # value: a transfer costs 10-100 us, a look-up by content a few (32 KiB:
    # 114 us against 9; from a few hundred KiB on the two cost the same). The same
    # value placed again is the same array, so an operator rebuilt on every call
    # has the same leaves and finds the solvers' term kept for them (a 64-site
    # XXZ chain's stacked matrices, 128 KiB: 4.4 -> 2.3 ms a call).
    key = (value.dtype, value.shape, value.tobytes(), placement())
    hit = PLACED_CONSTANTS.get(key)
    if hit is None:
        hit = PLACED_CONSTANTS.put(key, _place(value))
    return hit


# The largest constant `to_jax` keeps by value (`PLACED_CONSTANTS`).
_KEPT_BYTES = 256 * 1024


def placement() -> tuple[bool, Any]:
    """What decides how a value is placed: x64 (the dtype a Python scalar gets) and
    the default device."""
    device = getattr(jax.config, "jax_default_device")  # noqa: B009
    return bool(jax.config.read("jax_enable_x64")), device


def complex_dtype(dtype: Any) -> Any:
    """`jnp.result_type(dtype, 1j)`: the complex dtype of a state of `dtype` (kept
    per dtype and x64, `COMPLEX_DTYPES`)."""
    key = (dtype, bool(jax.config.read("jax_enable_x64")))
    hit = COMPLEX_DTYPES.get(key)
    if hit is None:
        hit = COMPLEX_DTYPES.put(key, jnp.result_type(dtype, 1j))
    return hit


def float_dtype() -> Any:
    """`jnp.result_type(float)`: float64 under x64, else float32 (`FLOAT_DTYPES`)."""
    key = bool(jax.config.read("jax_enable_x64"))
    hit = FLOAT_DTYPES.get(key)
    if hit is None:
        hit = FLOAT_DTYPES.put(key, jnp.result_type(float))
    return hit


def as_array(x: Any) -> Any:
    """`jnp.asarray(x)`, without its cost (about 10 us) for what is already a JAX
    array or traced, and without an eager JAX operation for numbers (a NumPy array,
    a list): that compiles a small program on a process's first call."""
    if isinstance(x, (jax.Array, Tracer)):
        return x
    try:
        value = np.asarray(x)
    except (TypeError, ValueError):
        value = None
    if value is not None and value.dtype.kind in "biufc":
        return to_jax(value)
    return jnp.asarray(x)  # JAX's own error for what is not an array


def cast(x: Array, dtype: Any) -> Array:
    """`x.astype(dtype)`, without its cost (about 12 us) when it has that dtype, and
    converted in NumPy (no eager JAX operation) when concrete and not placed."""
    if x.dtype == dtype:
        return x
    return x.astype(dtype) if placed(x) else to_jax(x, dtype)
