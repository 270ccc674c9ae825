"""jaxtyping aliases shared by the modules of hierax."""

import functools
from typing import Any

import equinox as eqx
import jax
import numpy as np
from beartype import beartype
from jaxtyping import Array, ArrayLike, Inexact, ScalarLike, Shaped, jaxtyped

from ._cache import flatten_module


# A scalar time, a real or complex number or 0-d array. (Annotated as broadly as any
# array so that the precise checks in `_validation.as_time` give the error message;
# a checked time is a JAX array or a NumPy scalar, see `as_time`.)
TimeLike = ArrayLike | np.generic
# A checked time (what `as_time` returns): a JAX array or a NumPy scalar.
Time = Array | np.ndarray | np.number
# A Taylor order: a non-negative Python or NumPy int (checked by `check_order`).
OrderLike = int | np.integer
# Normalised Taylor coefficients of a scalar time function, orders 0..K.
ScalarSeries = Inexact[Array, " order_plus_1"]
# Normalised Taylor coefficients of an (n, n) operator, orders 0..K.
OperatorSeries = Inexact[Array, "order_plus_1 n n"]

__all__ = [
    "Array",
    "ArrayLike",
    "OperatorSeries",
    "OrderLike",
    "ScalarLike",
    "ScalarSeries",
    "Shaped",
    "Time",
    "TimeLike",
    "typechecked",
]


def _signature(x: Any) -> Any:
    """What a jaxtyping check of `x` depends on: its type and, for arrays and
    modules, the tree structure and the shapes and dtypes of the array leaves (never
    the values)."""
    if isinstance(x, (bool, int, float, complex, str, type(None))):
        return type(x)
    if isinstance(x, eqx.Module):
        flat = flatten_module(x)
        return flat.treedef, flat.signature
    leaves, tree = jax.tree_util.tree_flatten(x)
    return tree, tuple(
        (type(leaf), getattr(leaf, "shape", None), getattr(leaf, "dtype", None))
        for leaf in leaves
    )


def typechecked(fn):
    """Check a public function's jaxtyping annotations at run time with beartype.

    A check depends only on the types, shapes and dtypes of the arguments, so it
    runs once per such signature: later calls with the same signature skip it
    (a dictionary look-up instead of the full check, which cost about 20% of a
    small call). Under `jit` it runs once per trace.
    """
    checked = jaxtyped(typechecker=beartype)(fn)
    seen: set[Any] = set()

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            key = (
                tuple(_signature(a) for a in args),
                tuple((k, _signature(v)) for k, v in sorted(kwargs.items())),
            )
            hash(key)
        except TypeError:  # an unhashable static part: check every time
            return checked(*args, **kwargs)
        if key in seen:
            return fn(*args, **kwargs)
        out = checked(*args, **kwargs)
        seen.add(key)
        return out

    return call
