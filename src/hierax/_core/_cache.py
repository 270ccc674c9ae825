"""Every process-global cache of hierax, in one place, each beside what it saves.

What hierax computes in Python before compiling (a module's flattened form, a
solver's term, the norms that choose the first step, constants placed on the
device) is kept here, found by the identity of the user's immutable objects
(modules, JAX arrays) or by value (numbers, dtypes, NumPy matrices by content).
Nothing else in the library keeps state between calls: a cache is declared here or
not at all (`tests/test_caches.py` reads the sources to hold it so), and `clear()`
empties every one of them.

A cache stays only where it saves at least about 5% of the eager call it serves.
Each comment gives the saving measured with `tests/measure_caches.py` (the
call from Python with the cache and with it disabled, every look-up a miss,
taking turns in one process; x64 on the 2-core CPU under load, medians of 300-900
calls): the small solves are those of `benchmarks/bench_overhead.py` (a driven
qubit's `sesolve`, a 4-level oscillator's `mesolve`, over 0.01), the hierarchy
is the seed's (`hierax.HeisenbergHierarchy(hierax.Cos() * sy, sx, 9)(1.0)`).
Measured and removed (below 5%): the span a `Solution.evaluate` checks a host time
against (2.6 us of 70, 3.8%), the tolerances `TaylorOptions` checked on the host
(0.4 us of 114: the compiled solve checks them again instead), `np.finfo(dtype).max`
of a time's dtype (1 us of 30-110), a diffrax adjoint's hashed static argument
(1.5 us of 200, 0.7%); in the operators layer, the stacks `TimeOperator +
TimeOperator` joins (0%), and whether a sparse matrix is uniform and its row-sum
bounds, by identity (a 14-site Ising chain rebuilt with a new drive amplitude on
every call: 2.9% and 3.5% of 38 ms; 16 sites, 2.7% of 190 ms).

Not here: each public call's compiled programs, kept with its function by
structure as `jax.jit` keeps its own (`_jit.module_jit`, `_jit.in_blocks`, and the
signatures `_custom_types.typechecked` has checked), and the registries filled
once at import: the Taylor transform's rules (`_taylor._core.RULES`), and what
later layers hand to earlier ones (`_time_functions._OPERATOR_PRODUCT`,
`_time_operators._FOREIGN`).
"""

import collections
import hashlib
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import numpy as np
from jax.core import Tracer

from . import _choices


def content_key(x: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    """A key for a C-contiguous NumPy array's content: its dtype, shape and a
    16-byte blake2b digest of its bytes (read in place, not copied)."""
    digest = hashlib.blake2b(x.reshape(-1).view(np.uint8).data, digest_size=16)
    return x.dtype.str, x.shape, digest.digest()


def _has_tracer(value: Any) -> bool:
    return any(isinstance(leaf, Tracer) for leaf in jax.tree.leaves(value))


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
        if _has_tracer(value):
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

    def clear(self) -> None:
        self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)


class KeyedCache:
    """The last `size` values kept by a hashable key (the oldest dropped first), or
    with `total_bytes` as many as fit in that many bytes of values (their
    `nbytes`). Values that hold traced arrays are not kept. (A look-up does not
    reorder the entries: on the calls' hot path that costs more than the rare
    eviction of a value still in use, which is only computed again.)"""

    def __init__(self, size: int | None = None, total_bytes: int | None = None):
        self.size, self.total_bytes, self.bytes = size, total_bytes, 0
        self.entries: collections.OrderedDict[Any, Any] = collections.OrderedDict()

    def get(self, key: Any) -> Any:
        """The value kept for `key`, or `None` (`TypeError` for an unhashable
        key)."""
        return self.entries.get(key)

    def put(self, key: Any, value: Any) -> Any:
        """Keep `value` for `key` (unless traced), and return it."""
        if _has_tracer(value):
            return value
        entries = self.entries
        if key in entries:
            self.bytes -= self._size_of(entries.pop(key))
        entries[key] = value
        self.bytes += self._size_of(value)
        while len(entries) > 1 and (
            (self.size is not None and len(entries) > self.size)
            or (self.total_bytes is not None and self.bytes > self.total_bytes)
        ):
            self.bytes -= self._size_of(entries.popitem(last=False)[1])
        return value

    def _size_of(self, value: Any) -> int:
        return 0 if self.total_bytes is None else getattr(value, "nbytes", 0)

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.entries)


class ArraysSeen:
    """Sets of arrays (with their tree structure) already found to pass a check, by
    identity: each entry holds weak references to its arrays (or the objects
    themselves where they cannot be referenced weakly) and is valid while they
    live."""

    def __init__(self, size: int):
        self.size = size
        self.entries: collections.OrderedDict[Any, list] = collections.OrderedDict()

    def key(self, *trees: Any) -> Any:
        """The key of `trees`, or `None` where a static part cannot be hashed."""
        leaves, treedef = jax.tree.flatten(trees)
        try:
            hash(treedef)
        except TypeError:
            return None
        return (treedef, tuple(id(x) for x in leaves)), leaves

    def get(self, key: Any) -> bool:
        held = self.entries.get(key[0])
        if held is None:
            return False
        for ref, leaf in zip(held, key[1]):
            if (ref() if isinstance(ref, weakref.ref) else ref) is not leaf:
                return False
        self.entries.move_to_end(key[0])
        return True

    def put(self, key: Any) -> None:
        def hold(x: Any) -> Any:
            try:
                return weakref.ref(x)
            except TypeError:
                return x

        self.entries[key[0]] = [hold(x) for x in key[1]]
        if len(self.entries) > self.size:
            self.entries.popitem(last=False)

    def clear(self) -> None:
        self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)


class Flattened(NamedTuple):
    leaves: list
    treedef: Any
    all_arrays: bool  # every leaf a concrete `jax.Array`
    signature: tuple  # (type, shape, dtype) of each leaf: what a type check reads


def flatten_module(module: Any) -> Flattened:
    """The flattened form of `module`, cached for concrete modules (`FLATTENED`)."""
    hit = FLATTENED.get(module)
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
        FLATTENED.put(module, flat)
    return flat


class TermCache:
    """What a solver builds from a user's operators (its term, and what that
    needs assembled), kept so that passing them again rebuilds nothing (their
    rewrites in NumPy, flattened form and norms, cached with the term, stay
    valid). Operator modules and JAX arrays are immutable: they are found by
    identity, and also by their leaves (the same tree structure over the same
    JAX arrays), so an operator rebuilt on every call from the same matrices and
    parameters (whose constants `to_jax` places once per value) finds its term
    too. NumPy matrices (mutable) are kept by value: each is replaced by a
    read-only copy, one per content (`NUMPY_BY_VALUE`), which then stands for it.
    Anything else (lists of numbers) or traced is rebuilt every call.
    `build(operators)` gets the operators as they are kept."""

    def __init__(self, size: int):
        self.size = size
        # By the first operator's identity (its entry dropped when it dies), holding
        # the others to compare them by identity.
        self.by_identity = IdentityCache(size)
        # By the operators' leaves, held so that their ids stay theirs.
        self.by_leaves: collections.OrderedDict[Any, tuple[Any, Any]] = (
            collections.OrderedDict()
        )
        self.held_bytes = 0

    def get(
        self, operators: tuple[Any, ...], build: Callable[[tuple[Any, ...]], Any]
    ) -> Any:
        operators = tuple(by_value(x) for x in operators)
        if not all(_immutable(x) for x in operators):
            return build(operators)
        # The key is the whole input: every operator (by identity or by leaves),
        # how many there are, x64 (which sets the dtypes a term is built in) and
        # the backend (whose choices set its structure, `_choices`).
        setting = (bool(jax.config.read("jax_enable_x64")), _choices.default_platform())
        hit = self.by_identity.get(operators[0])
        if hit is not None and hit[2] == setting and len(hit[0]) == len(operators):
            if all(a is b for a, b in zip(hit[0], operators, strict=True)):
                return hit[1]
        key, held = _leaves_key(operators)
        key = None if key is None else (setting, key)
        found = None if key is None else self.by_leaves.get(key)
        if found is not None:
            self.by_leaves.move_to_end(key)
            value = found[1]
        else:
            value = build(operators)
            if key is not None:
                self.by_leaves[key] = (held, value)
                self.held_bytes += _nbytes(held)
                while len(self.by_leaves) > self.size or (
                    self.held_bytes > _LEAVES_BYTES and len(self.by_leaves) > 1
                ):
                    self.held_bytes -= _nbytes(self.by_leaves.popitem(last=False)[1][0])
        self.by_identity.put(operators[0], (operators, value, setting))
        return value

    def clear(self) -> None:
        self.by_identity.clear()
        self.by_leaves.clear()
        self.held_bytes = 0

    def __len__(self) -> int:
        return len(self.by_identity) + len(self.by_leaves)


# The bytes of leaves `TermCache` holds to find operators by them, in all (the
# oldest dropped past it); larger operators only by identity, so that a dropped
# operator's big matrices are not held on for a rebuild that may never come.
_LEAVES_BYTES = 32 << 20


def _nbytes(leaves: list) -> int:
    return sum(getattr(leaf, "nbytes", 0) for leaf in leaves)


def _leaves_key(operators: tuple[Any, ...]) -> tuple[Any, list]:
    """The operators' tree structures and the identities of their leaves, and the
    leaves (to hold); `None` past `_LEAVES_BYTES`."""
    key, held = [], []
    for x in operators:
        if isinstance(x, eqx.Module):
            flat = flatten_module(x)
            key.append((flat.treedef, tuple(map(id, flat.leaves))))
            held.extend(flat.leaves)
        else:
            key.append(id(x))
            held.append(x)
    if _nbytes(held) > _LEAVES_BYTES:
        return None, held
    try:
        hash(found := tuple(key))
    except TypeError:  # an unhashable static field
        return None, held
    return found, held


def _immutable(x: Any) -> bool:
    """Whether `x` can be kept by identity: a module whose leaves are all concrete
    JAX arrays, numbers or read-only NumPy arrays (its flattened form, cached by
    identity, says whether every leaf is a concrete JAX array; a writable NumPy
    leaf could change in place and leave a stale term), a concrete JAX array, or a
    read-only copy from `by_value`."""
    if isinstance(x, eqx.Module):
        flat = flatten_module(x)
        return flat.all_arrays or all(map(_immutable_leaf, flat.leaves))
    return _immutable_leaf(x) and not isinstance(x, int | float | complex)


def _immutable_leaf(x: Any) -> bool:
    if isinstance(x, np.ndarray):
        return not x.flags.writeable
    if isinstance(x, jax.Array):
        return not isinstance(x, Tracer)
    return isinstance(x, int | float | complex | np.generic)


# Only NumPy matrices up to this size are kept by value: reading a larger one's
# content on every call would cost more than it saves.
_BY_VALUE_BYTES = 1 << 20


def by_value(x: Any) -> Any:
    """A NumPy matrix's read-only copy kept for its content (the same object for
    equal contents, `NUMPY_BY_VALUE`), so that rebuilding what is made from it is
    skipped; anything else as it is."""
    if (
        type(x) is not np.ndarray
        or x.dtype.kind not in "biufc"
        or x.nbytes > _BY_VALUE_BYTES
    ):
        return x
    data = np.array(x, order="C")  # a copy (0-d stays 0-d)
    key = content_key(data)
    hit = NUMPY_BY_VALUE.get(key)
    if hit is None:
        data.setflags(write=False)
        hit = NUMPY_BY_VALUE.put(key, data)
    return hit


# The caches. Savings: with -> without the cache (share of the call without).

# A module's flattened form, by identity: flattening walks its Python dataclass
# tree, which costs more than a small compiled call; every public call flattens
# its module (`module_jit`), and the same form brings back the same compiled
# function. sesolve 115 -> 140 us (18%), mesolve 110 -> 150 us (27%), the seed
# hierarchy 62 -> 80 us (22%), `hierax.Cos(1.0)(0.3)` 33 -> 40 us (17%).
FLATTENED = IdentityCache(32)

# What a run-time type check of a module reads (its structure, shapes, dtypes), by
# identity (`_custom_types.typechecked`). The seed hierarchy 60 -> 65 us (8%),
# `hierax.Cos(1.0)(0.3)` 32 -> 37 us (14%); sesolve 120 -> 123 us (3%), mesolve
# 109 -> 113 us (4%).
MODULE_SIGNATURES = IdentityCache(32)

# Small constants placed on the device by value (`_arrays.to_jax`), the oldest
# dropped past 16 MiB: a transfer costs 10-100 us, a look-up by content a few, and
# the same value placed again is the same array, so that an operator rebuilt on
# every call has the same leaves and finds its solver term (`TermCache`). sesolve
# of `0.5 * sz + hierax.Cos(1.0) * (0.2 * sx)` rebuilt from NumPy on every call
# 0.59 -> 1.74 ms (66%).
PLACED_CONSTANTS = KeyedCache(total_bytes=16 * 2**20)

# Dtype promotions of a public call, per dtype and x64 (`_arrays.complex_dtype`,
# `float_dtype`): `jnp.result_type` costs about 4 us a call, and a solve asks a
# few times. Complex: sesolve 104 -> 115 us (9%), mesolve 140 -> 154 us (9%);
# float: sesolve 113 -> 121 us (6%), mesolve 109 -> 117 us (6%).
COMPLEX_DTYPES = KeyedCache(64)
FLOAT_DTYPES = KeyedCache(8)

# Whether this process has a backend of a platform, asked once (`_backend`: the
# x64-on-a-TPU refusal, on every x64 call). sesolve 115 -> 123 us (7%), the seed
# hierarchy 61 -> 64 us (6%).
BACKENDS_PRESENT = KeyedCache(8)

# NumPy matrices given to the solvers, a read-only copy per content (`by_value`):
# an operator's copy then stands for it in `TermCache`. sesolve of a NumPy
# `0.5 * sz + 0.2 * sx` 120 -> 627 us (81%), mesolve with NumPy jump operators
# 0.22 -> 2.39 ms (91%).
NUMPY_BY_VALUE = KeyedCache(32)

# Each solver's term and the parts its step needs, by the operators given
# (`TermCache`): building them rewrites the operators in NumPy. sesolve
# 144 -> 628 us (77%), mesolve 0.16 -> 6.1 ms (97%).
SESOLVE_TERMS = TermCache(16)
MESOLVE_TERMS = TermCache(16)
# A stack of jump operators, `(J, n, n)`, kept as one array: its own cache, so that
# its key (the Hamiltonian and the stack) never meets that of a list of them.
# mesolve with the oscillator's two as one stack 0.16 -> 2.65 ms (94%).
MESOLVE_STACKED_TERMS = TermCache(16)

# `hierax.TaylorOptions` built from the solvers' flat keywords given as Python
# numbers, by their values and types (`_integrate.resolve_options`): one options
# object serves every call. sesolve 127 -> 192 us (34%), mesolve 116 -> 175 us
# (34%).
OPTIONS_BUILT = KeyedCache(32)

# The norms of a term's operators that choose a solve's first step, by the term's
# identity (`_integrate._generator_norms`; the row sums are no longer kept per
# matrix). sesolve 119 -> 185 us (36%), mesolve 122 -> 344 us (64%).
GENERATOR_NORMS = IdentityCache(16)

# The arrays of a Hamiltonian, period and start found Hermitian at a few times
# (`_floquet`, for an H not Hermitian by structure): a second call neither
# compiles the check's call nor reads its answer back from the device.
# `hierax.floquet` of `0.5 sz + Exp(2j) 0.3 sp + Exp(-2j) 0.3 sm` 1.65 -> 1.74 ms
# (4.9%, at the threshold: kept, since on an accelerator the read is a transfer).
VERIFIED_PERIODS = ArraysSeen(32)

# The one-period solve of an operator structure (`_floquet._period_solver`), built
# once per structure: built afresh, its blocked map compiles again on every call.
# `hierax.floquet` of a driven qubit 2.0 -> 956 ms.
PERIOD_SOLVERS = KeyedCache(32)


CACHES: dict[str, Any] = {
    name: value
    for name, value in globals().items()
    if isinstance(value, IdentityCache | KeyedCache | ArraysSeen | TermCache)
}


def clear() -> None:
    """Empty every cache (for tests: a call after `clear()` computes everything
    again and must give the same answer)."""
    for cache in CACHES.values():
        cache.clear()
