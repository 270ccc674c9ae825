"""jaxtyping aliases shared by the modules of hierax."""

import functools
import re
from typing import Any

import equinox as eqx
import jax
import numpy as np
from beartype import beartype
from jax.core import Tracer
from jaxtyping import (
    Array,
    ArrayLike,
    Inexact,
    ScalarLike,
    Shaped,
    TypeCheckError,
    jaxtyped,
)

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
    typed = jaxtyped(typechecker=beartype)(fn)
    seen: set[Any] = set()
    where = f"{fn.__module__}.{fn.__qualname__}"
    api = f"hierax.{fn.__qualname__}"

    def checked(*args, **kwargs):
        try:
            return typed(*args, **kwargs)
        except TypeCheckError as error:
            name = api
            if "." in fn.__qualname__ and args:  # a method: its object's class
                name = f"hierax.{type(args[0]).__name__}.{fn.__name__}"
            message = _argument_message(str(error), where, name)
            if message is None:
                raise
            raise TypeError(message) from None

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


def _argument_message(text: str, where: str, api: str) -> str | None:
    """jaxtyping's report of a wrong argument of `where` (the function's full
    name), as one line naming the public call and the argument; `None` for any
    other report (a check inside the call, a return value). (Its own report lists
    every parameter and annotation: 1400 characters for a wrong `throw=1`.)"""
    if f"checking the parameters of {where}." not in text:
        return None
    name = re.search(r"typechecking parameter '(\w+)'", text)
    expected = re.search(r"Expected type: (.*?)\.?\n", text)
    value = re.search(r"Actual value: (.*)\n", text)
    if name is None or expected is None:
        return None
    kind = re.sub(r"<class '([\w.]+)'>", r"\1", expected.group(1).strip())
    if "Shaped[" in kind and "''" in kind:  # `ScalarLike`
        kind = "a scalar (a number or a 0-d array)"
    elif "numpy.ndarray" in kind and "Array" in kind:  # `ArrayLike`
        kind = "an array or a number" + (" (or None)" if "NoneType" in kind else "")
    got = "" if value is None else f", got {value.group(1).strip()[:80]}"
    return f"`{api}`: `{name.group(1)}` must be {kind}{got}."
