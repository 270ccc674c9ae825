"""Compilation of the public calls: `eqx.filter_jit` semantics with a fast path."""

import collections
import functools
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer


# Flattening a module walks its Python dataclass tree, which costs more than the
# compiled call of a small hierarchy. Modules are immutable, so the flattened form
# of one object never changes: the last few are kept, by identity. The cache holds a
# weak reference to each module and drops its entry when the module dies, so it never
# keeps a user's module or its arrays alive (and a dead module's id, reused by a new
# object, never finds the old entry).
class Flattened(NamedTuple):
    leaves: list
    treedef: Any
    all_arrays: bool  # every leaf a concrete `jax.Array`
    signature: tuple  # (type, shape, dtype) of each leaf: what a type check reads


_FLATTENED: collections.OrderedDict[int, tuple[weakref.ref, Flattened]] = (
    collections.OrderedDict()
)
_FLATTENED_SIZE = 32


def flatten_module(module: Any) -> Flattened:
    """The flattened form of `module`, cached for concrete modules."""
    key = id(module)
    hit = _FLATTENED.get(key)
    if hit is not None and hit[0]() is module:
        _FLATTENED.move_to_end(key)
        return hit[1]
    leaves, treedef = jax.tree_util.tree_flatten(module)
    traced = any(isinstance(leaf, Tracer) for leaf in leaves)
    flat = Flattened(
        leaves,
        treedef,
        not traced and all(isinstance(leaf, jax.Array) for leaf in leaves),
        tuple(
            (type(leaf), getattr(leaf, "shape", None), getattr(leaf, "dtype", None))
            for leaf in leaves
        ),
    )
    if not traced:

        def forget(ref: weakref.ref, key: int = key) -> None:
            entry = _FLATTENED.get(key)
            if entry is not None and entry[0] is ref:
                del _FLATTENED[key]

        _FLATTENED[key] = (weakref.ref(module, forget), flat)
        if len(_FLATTENED) > _FLATTENED_SIZE:
            _FLATTENED.popitem(last=False)
    return flat


def _is_plain(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic)) or type(leaf) in (
        float,
        int,
        complex,
    )


def module_jit(fn: Callable) -> Callable:
    """Compile `fn(module, *args, **static_kwargs)` once per structure.

    Behaves like `eqx.filter_jit` (array leaves traced, everything else static), but
    when every leaf of the module is already an array (the usual case) it dispatches
    through `jax.jit` on the module's cached leaves, which costs a few microseconds
    instead of the tens that flattening or filtering the pytree costs on every call.
    Keyword arguments are static (Python bools and the like). Python scalars passed
    positionally are traced by both paths, so changing a time or a parameter value
    never retraces.
    """
    filtered = eqx.filter_jit(fn)
    direct: dict[tuple[str, ...], Callable] = {}

    def unflattened(leaves, *rest, treedef, **static):
        return fn(jax.tree_util.tree_unflatten(treedef, leaves), *rest, **static)

    @functools.wraps(fn)
    def call(*args, **static):
        try:
            return dispatch(*args, **static)
        except ValueError as error:
            if "incompatible devices" not in str(error):
                raise
            devices = sorted(
                {
                    str(device)
                    for leaf in jax.tree_util.tree_leaves(args)
                    if isinstance(leaf, jax.Array)
                    for device in leaf.devices()
                }
            )
            raise ValueError(
                f"hierax: the arrays of one call live on different devices "
                f"({', '.join(devices)}); put the module and its arguments on one "
                "device (`jax.device_put(x, device)`) or give them one sharding. "
                f"JAX reported: {error}"
            ) from None

    def dispatch(*args, **static):
        module, rest = args[0], args[1:]
        # Only array leaves in the module (a Python int or bool field there is static
        # under filtering, and must stay so); the other arguments are times and
        # states, which may be Python numbers.
        leaves, treedef, all_arrays, _ = flatten_module(module)
        if all_arrays and all(
            _is_plain(leaf) for leaf in jax.tree_util.tree_leaves(rest)
        ):
            key = tuple(sorted(static))
            if key not in direct:
                direct[key] = jax.jit(unflattened, static_argnames=("treedef", *key))
            return direct[key](leaves, *rest, treedef=treedef, **static)
        # Python scalars would be static under filtering: trace them as arrays.
        args = tuple(
            jnp.asarray(a) if isinstance(a, (float, complex, int)) else a for a in args
        )
        return filtered(*args, **static)

    return call
