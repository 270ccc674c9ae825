"""Caches by identity: what hierax computes in Python from a user's immutable
objects (modules, JAX arrays) is kept for as long as the object lives."""

import collections
import hashlib
import weakref
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.core import Tracer


def content_key(x: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    """A key for a C-contiguous NumPy array's content: its dtype, shape and a
    16-byte blake2b digest of its bytes (read in place, not copied)."""
    digest = hashlib.blake2b(x.reshape(-1).view(np.uint8).data, digest_size=16)
    return x.dtype.str, x.shape, digest.digest()


class IdentityCache:
    """The last `size` results of a function of immutable objects (modules, JAX
    arrays), by identity. Each entry holds a weak reference to its object and is
    dropped when the object dies, so the cache never keeps a user's module or
    arrays alive (and a dead object's id, reused by a new one, never finds the old
    entry)."""

    def __init__(self, size: int):
        self.size = size
        self.entries: collections.OrderedDict[int, tuple[weakref.ref, Any]] = (
            collections.OrderedDict()
        )

    def get(self, obj: Any) -> Any:
        """The cached result for `obj`, or `None`."""
        key = id(obj)
        hit = self.entries.get(key)
        if hit is not None and hit[0]() is obj:
            self.entries.move_to_end(key)
            return hit[1]
        return None

    def put(self, obj: Any, value: Any) -> None:
        """Keep `value` for `obj`, unless it holds traced values (computed inside a
        trace, they belong to that trace only)."""
        if any(isinstance(leaf, Tracer) for leaf in jax.tree.leaves(value)):
            return
        key = id(obj)
        entries = self.entries

        def forget(ref: weakref.ref, key: int = key) -> None:
            entry = entries.get(key)
            if entry is not None and entry[0] is ref:
                del entries[key]

        entries[key] = (weakref.ref(obj, forget), value)
        if len(entries) > self.size:
            entries.popitem(last=False)


class Flattened(NamedTuple):
    leaves: list
    treedef: Any
    all_arrays: bool  # every leaf a concrete `jax.Array`
    signature: tuple  # (type, shape, dtype) of each leaf: what a type check reads


# Flattening a module walks its Python dataclass tree, which costs more than the
# compiled call of a small hierarchy. Modules are immutable, so the flattened form
# of one object never changes: the last few are kept, by identity.
_FLATTENED = IdentityCache(32)


def flatten_module(module: Any) -> Flattened:
    """The flattened form of `module`, cached for concrete modules."""
    hit = _FLATTENED.get(module)
    if hit is not None:
        return hit
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
        _FLATTENED.put(module, flat)
    return flat
