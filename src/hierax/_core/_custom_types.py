"""jaxtyping aliases shared by the modules of hierax."""

import functools
from typing import Any

import equinox as eqx
import jax
import numpy as np
from beartype import beartype
from jax.core import Tracer
from jaxtyping import Array, ArrayLike, Inexact, ScalarLike, Shaped, jaxtyped

from ._cache import MODULE_SIGNATURES, flatten_module


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


class _Hashed:
    """A hashable value whose hash is computed once: a module's tree structure and
    leaf signature, hashed on every call, cost a small call more than its
    dictionary look-up."""

    __slots__ = ("value", "hash")

    def __init__(self, value: Any):
        self.value = value
        self.hash = hash(value)  # TypeError for an unhashable static part

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, _Hashed)
            and self.hash == other.hash
            and self.value == other.value
        )


_PLAIN_TYPES = frozenset({bool, int, float, complex, str, type(None)})


def _signature(x: Any) -> Any:
    """What a jaxtyping check of `x` depends on: its type and, for arrays and
    modules, the tree structure and the shapes and dtypes of the array leaves (never
    the values)."""
    # (Exact types: `isinstance` against a builtin type reads a module's
    # `__class__` through equinox's attribute hook, a microsecond a type.)
    if type(x) in _PLAIN_TYPES:
        return type(x)
    # A module seen before first (a look-up by identity: the `isinstance` checks
    # of JAX's and equinox's abstract classes cost microseconds each).
    hit = MODULE_SIGNATURES.get(x)
    if hit is not None:
        return hit
    if isinstance(x, jax.Array | np.ndarray):  # a leaf: no tree to walk
        return type(x), x.shape, x.dtype
    if isinstance(x, eqx.Module):
        flat = flatten_module(x)
        hit = _Hashed((flat.treedef, flat.signature))
        if not any(isinstance(leaf, Tracer) for leaf in flat.leaves):
            MODULE_SIGNATURES.put(x, hit)
        return hit
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
            known = key in seen
        except TypeError:  # an unhashable static part: check every time
            return checked(*args, **kwargs)
        if known:
            return fn(*args, **kwargs)
        out = checked(*args, **kwargs)
        seen.add(key)
        return out

    return call
