"""Input checks shared by the public entry points.

Every check raises before any math runs, with a message that names the public call,
the argument and what was expected. Values that are only known inside `jit` (a traced
time) are checked with `eqx.error_if` instead, and so are the values of JAX arrays
given to a call whose compiled program checks them (`in_program=True`): reading a
device array here would be a round trip from the device on every call. NumPy and
Python values live on the host and are checked here.
"""

import math
import numbers
from collections.abc import Iterable
from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ._arrays import cast, is_traced, to_jax
from ._custom_types import Time


MAX_ORDER = 10_000


def is_int(x: Any) -> bool:
    """A Python or NumPy integer, and not a bool (which Python counts as one)."""
    return not isinstance(x, (bool, np.bool_)) and isinstance(
        x, (numbers.Integral, np.integer)
    )


def check_bool(x: Any, name: str, api: str) -> bool:
    """`x` as a bool, or a `TypeError` naming `name` of `api` if it is none."""
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"`{api}`: `{name}` must be a bool, got {x!r}.")
    return bool(x)


def as_sequence(x: Any, name: str, api: str, what: str) -> tuple:
    """`x`, a list or other iterable of `what` (not a string), as a tuple; a
    `TypeError` naming `name` of `api` otherwise."""
    if isinstance(x, (str, bytes)) or not isinstance(x, Iterable):
        raise TypeError(
            f"`{api}`: `{name}` must be a list or tuple of {what}, got "
            f"{type(x).__name__}."
        )
    return tuple(x)


def check_order(order: Any, api: str) -> int:
    """Return `order` as an int, or raise if it is not a non-negative int <= 10,000."""
    if not is_int(order):
        raise TypeError(
            f"`{api}(order=...)` must be a non-negative int, got {order!r} of type "
            f"{type(order).__name__}."
        )
    order = int(order)
    if order < 0:
        raise ValueError(f"`{api}(order=...)` must be a non-negative int, got {order}.")
    if order > MAX_ORDER:
        raise ValueError(
            f"`{api}(order=...)` must be at most {MAX_ORDER:,}, got {order:,}; "
            "orders that high overflow every floating-point type."
        )
    return order


def refuse_non_matrix(x: Any, name: str, api: str) -> None:
    """Objects that stand for operators but are no matrix (Pauli sums) say where
    they belong, in their `not_a_matrix` attribute."""
    hint = getattr(type(x), "not_a_matrix", None)
    if isinstance(hint, str):
        raise TypeError(f"`{api}`: `{name}` is a {type(x).__name__}; {hint}")


def as_period(period: Any, api: str) -> Array:
    """A drive's period as a positive real scalar: float32 stays float32 (the
    computation then runs in complex64), anything else becomes the default float
    dtype; a traced period is checked by the compiled call's results."""
    # Known values stay concrete inside a user's trace (`to_jax`), so that what is
    # decided from them before compiling (a symmetric drive) is still known there.
    period = to_jax(period)
    real = jnp.issubdtype(period.dtype, jnp.floating) or jnp.issubdtype(
        period.dtype, jnp.integer
    )
    if period.ndim != 0 or not real:
        raise ValueError(
            f"`{api}`: `period` must be a real scalar, got shape {period.shape} "
            f"and dtype {period.dtype}."
        )
    if period.dtype != jnp.float32:
        period = cast(period, jnp.result_type(float))
    if not is_traced(period) and not float(period) > 0:
        raise ValueError(f"`{api}`: `period` must be positive, got {float(period)}.")
    return period


def as_numeric_array(
    x: Any, name: str, api: str, finite: bool = False, in_program: bool = False
) -> Array:
    """Convert `x` to a JAX array of a supported numeric dtype.

    Integers are promoted to the default float dtype; booleans, strings, objects and
    half precision are refused. With `finite`, nan and inf are refused too where the
    values are known here (traced values are checked by the compiled calls, and so
    are JAX arrays with `in_program`: see `check_finite`).
    """
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"`{api}`: `{name}` must be numeric, got the boolean {x!r}.")
    refuse_non_matrix(x, name, api)
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"`{api}`: `{name}` must be a numeric array, got {x!r}.")
    if is_traced(x):
        array = x
    else:
        try:
            # (Python scalars stay as they are below, so JAX keeps them weakly typed
            # and they never widen float32 inputs.)
            dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"`{api}`: `{name}` must be a numeric array, got {type(x).__name__}."
            ) from e
        if isinstance(x, np.ndarray) and x.dtype.hasobject and _all_numbers(x):
            # Python numbers held as objects (`np.array(rows, dtype=object)`): the
            # same numbers in the dtype NumPy gives them.
            x = np.array(x.tolist())
            dtype = x.dtype
        if not (
            np.issubdtype(dtype, np.number) or np.issubdtype(dtype, np.bool_)
        ) and str(dtype) not in ("bfloat16",):
            raise TypeError(
                f"`{api}`: `{name}` must be a numeric array, got dtype {dtype}"
                f"{object_hint(x)}."
            )
        try:
            array = to_jax(x)  # compiles nothing for concrete values
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"`{api}`: `{name}` must be a numeric array, got {type(x).__name__}."
            ) from e
    dtype = array.dtype
    if dtype == jnp.bool_:
        raise TypeError(
            f"`{api}`: `{name}` must be numeric, got a boolean array; use 0/1 numbers "
            "if that is what you mean."
        )
    if dtype in (jnp.float16, jnp.bfloat16):
        raise TypeError(
            f"`{api}`: `{name}` has dtype {dtype}, which hierax does not support; use "
            "float32/complex64 or float64/complex128."
        )
    if jnp.issubdtype(dtype, jnp.integer):
        array = to_jax(array, jnp.result_type(float))
    elif not jnp.issubdtype(dtype, jnp.inexact):
        raise TypeError(f"`{api}`: `{name}` must be numeric, got dtype {dtype}.")
    if finite:
        check_finite(array, name, api, in_program)
    return array


def built_for(api: str, where: str, build: Any, *args: Any) -> Any:
    """`build(*args)`: a hierax object made inside the call `api` for a part of the
    user's argument (a coefficient, a pulse, a factor), its errors named by that
    call and `where` in the argument, not by the class built (which the user never
    wrote)."""
    try:
        return build(*args)
    except (TypeError, ValueError) as error:
        text = str(error)
        if text.startswith(f"`{api}`"):
            raise
        if text.startswith("`hierax."):
            text = text.partition("`: ")[2] or text
        raise type(error)(f"`{api}`: {where}: {text}") from None


def _all_numbers(x: np.ndarray) -> bool:
    return x.size > 0 and all(
        isinstance(item, numbers.Number) and not isinstance(item, (bool, np.bool_))
        for item in x.flat
    )


def int_as_float(x: int, api: str, what: str) -> float:
    """A Python int as the Python float it equals (weakly typed in JAX, as that
    float is); one past the float range is refused, `what` (e.g. "`frequency`",
    "the number") naming it."""
    try:
        return float(x)
    except OverflowError:
        raise ValueError(
            f"`{api}`: {what} must be finite, got an int of {x.bit_length()} bits, "
            "beyond the float range."
        ) from None


def object_hint(x: Any) -> str:
    """For an array of Python objects: what it holds, and the usual fix for the
    common mistake, `np.asarray(sparse_matrix)` (NumPy wraps the sparse matrix in a
    0-d object array instead of converting it)."""
    if not (isinstance(x, np.ndarray) and x.dtype.hasobject):
        return ""
    items = [item for item in x.flat[:1]]
    if not items or isinstance(items[0], numbers.Number):
        return ""
    item = items[0]
    kind = f"{type(item).__module__.split('.')[0]}.{type(item).__name__}"
    hint = f" (an array of {kind} objects"
    if x.ndim == 0 and hasattr(item, "shape") and hasattr(item, "tocoo"):
        hint += (
            "; `np.asarray` wraps a sparse matrix instead of converting it: pass "
            "the sparse matrix itself, which hierax keeps sparse, or its "
            "`.toarray()`"
        )
    return hint + ")"


def check_finite(array: Any, name: str, api: str, in_program: bool = False) -> None:
    """Refuse nan or inf in a concrete array, naming the argument and the first bad
    entry. Traced arrays pass (the compiled calls check them with `eqx.error_if`),
    and so do JAX arrays with `in_program`, for calls whose compiled program checks
    them: reading one here would wait for the device and copy it to the host."""
    if is_traced(array) or (in_program and isinstance(array, jax.Array)):
        return
    values = np.asarray(array)
    bad = ~np.isfinite(values)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0]) if values.ndim else ()
        entry = f" at index {where}" if where else ""
        raise ValueError(
            f"`{api}`: `{name}` must be finite, got {values[bad].flat[0]}{entry}."
        )


def as_square_matrix(x: Any, name: str, api: str) -> Array:
    """Convert `x` to a finite numeric (n, n) array, or raise naming `name`."""
    array = as_numeric_array(x, name, api, finite=True)
    if array.ndim != 2 or array.shape[0] != array.shape[1]:
        raise ValueError(
            f"`{api}`: `{name}` must be a square matrix of shape (n, n), got shape "
            f"{tuple(array.shape)}."
        )
    if array.shape[0] == 0:
        raise ValueError(f"`{api}`: `{name}` must not be empty, got shape (0, 0).")
    return array


# The dtypes a time may have.
_TIME_DTYPES = tuple(
    np.dtype(d) for d in (np.float32, np.float64, np.complex64, np.complex128)
)


def _canonical_time_dtype(dtype: np.dtype) -> np.dtype:
    """The default float (or complex) dtype, with x64 as it is now."""
    kind = np.complex128 if np.issubdtype(dtype, np.complexfloating) else np.float64
    return np.dtype(jax.dtypes.canonicalize_dtype(kind))


def as_time(t: Any, api: str, canonical: bool = True, in_program: bool = False) -> Time:
    """Check a time and return it in one canonical form: a 0-d array of the default
    float (or complex) dtype, so that a Python float, a NumPy scalar and a JAX array
    all share one compiled program. The time never sets the precision of a
    computation (the operators and states do).

    With `canonical=False` the dtype is kept (a time function evaluated at a float32
    time stays float32).

    Refused with an error naming `t`: non-scalars, non-numbers, and values that are
    not finite, including those that overflow the default dtype (1e39 without x64).
    Traced times are checked inside the computation by `check_time_finite`, and so
    are JAX arrays with `in_program` (for calls whose compiled program checks the
    time): a device scalar is then neither read here nor sent back.
    """
    if isinstance(t, (bool, np.bool_)):
        raise TypeError(f"`{api}`: `t` must be a real or complex number, got {t!r}.")
    if type(t) in (float, int):
        # The common case, kept cheap: a NumPy scalar of the default float dtype
        # (compared with the dtype's largest value first, so the conversion never
        # overflows and needs no floating-point error context).
        dtype = np.dtype(jax.dtypes.canonicalize_dtype(np.float64))
        if math.isfinite(t) and abs(t) <= float(np.finfo(dtype).max):
            value = dtype.type(t)
            # (A Python int as a float: an integer time would make the series of
            # `t ** 2` integer, [9, 0, 0] at t = 3 where it is [9, 6, 1].)
            return value if canonical else jnp.asarray(float(t))
        overflow = math.isfinite(t)
        raise ValueError(
            f"`{api}`: `t` must be finite in {dtype}, got {t!r}"
            + (
                " (it overflows: enable x64 or change the unit of time)."
                if overflow
                else "."
            )
        )
    if (
        in_program
        and isinstance(t, jax.Array)
        and t.ndim == 0
        and t.dtype in _TIME_DTYPES
    ):
        # Where it is (on the device, or traced): the compiled call checks it.
        if not canonical:
            return t
        dtype = _canonical_time_dtype(t.dtype)
        if t.dtype == dtype and not t.weak_type:
            return t
        # Converted on the device, weak type dropped (`jnp.asarray(0.1)` is weakly
        # typed, a NumPy or Python time is not), so that it shares their program.
        return lax.convert_element_type(t, dtype)
    if (
        canonical
        and not in_program
        and isinstance(t, jax.Array)
        and not is_traced(t)
        and t.ndim == 0
        and t.dtype in _TIME_DTYPES
    ):
        # A concrete JAX scalar: read on the host (a 0-d array is one word; the
        # finiteness check reads it anyway) and canonicalised there, so the call
        # runs no JAX operation of its own before the compiled one (an eager
        # `astype` costs more than a small hierarchy).
        dtype = _canonical_time_dtype(t.dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            value = np.asarray(t).astype(dtype)[()]
        if np.isfinite(value):
            return value
    array = as_numeric_array(t, "t", api)
    if array.ndim != 0:
        raise ValueError(
            f"`{api}`: `t` must be a scalar, got shape {tuple(array.shape)}; use "
            "`jax.vmap` to evaluate at many times."
        )
    kind = complex if jnp.iscomplexobj(array) else float
    converted = array.astype(jnp.result_type(kind))
    if in_program and isinstance(t, jax.Array):
        return converted if canonical else array
    if not is_traced(converted) and not bool(np.isfinite(np.asarray(converted))):
        overflow = bool(np.isfinite(np.asarray(array))) or type(t) in (float, int)
        raise ValueError(
            f"`{api}`: `t` must be finite in {converted.dtype}, got {t!r}"
            + (
                " (it overflows: enable x64 or change the unit of time)."
                if overflow
                else "."
            )
        )
    return converted if canonical else array


# The name of version 0.1 (the Taylor transform imports it).
as_time_array = as_time


def check_time_finite(t: Array, api: str) -> Array:
    """Inside jit: an error at run time if `t` is not finite."""
    return eqx.error_if(t, ~jnp.isfinite(t), f"`{api}`: `t` must be finite.")


def trace_callable(fn: Any, name: str, api: str) -> Any:
    """Trace `fn` once on an abstract scalar time and return the abstract output
    (`jax.ShapeDtypeStruct` for an array); refuse what is not callable or fails."""
    if not callable(fn):
        raise TypeError(f"`{api}`: `{name}` must be callable, got {type(fn).__name__}.")
    try:
        return jax.eval_shape(fn, jax.ShapeDtypeStruct((), jnp.result_type(float)))
    except Exception as e:
        raise TypeError(
            f"`{api}`: calling `{name}` on a scalar time failed with "
            f"{type(e).__name__}: {e}"
        ) from e
