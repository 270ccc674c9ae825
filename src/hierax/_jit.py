"""Compilation of the public calls: `eqx.filter_jit` semantics with a fast path."""

import collections
import contextlib
import functools
import math
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.extend
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jaxtyping import Array


class Flattened(NamedTuple):
    leaves: list
    treedef: Any
    all_arrays: bool  # every leaf a concrete `jax.Array`
    signature: tuple  # (type, shape, dtype) of each leaf: what a type check reads


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
        key = id(obj)
        entries = self.entries

        def forget(ref: weakref.ref, key: int = key) -> None:
            entry = entries.get(key)
            if entry is not None and entry[0] is ref:
                del entries[key]

        entries[key] = (weakref.ref(obj, forget), value)
        if len(entries) > self.size:
            entries.popitem(last=False)


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


# XLA's CPU compiler spends most of a small program's compile time generating code
# for each of its many small kernels. For programs on small matrices its older
# kernel emitters compile the seed hierarchy about a quarter to a third faster than
# its MLIR fusion emitters, and the programs run as fast (and give the same bits).
# (Turning LLVM's optimisation off as well would halve the compile time again, but
# the eager call then runs 2-3x slower.) Calls that opt in (`fast_compile`) get
# this when every array leaf of the module and the arguments is small (or when
# their own rule says so) and nothing is tracing; a user's own `jax.jit` keeps
# XLA's defaults. The solvers' programs on states of n < 256 compile 25-35% faster
# and run 7-11% longer (sesolve's transmon and 5-qubit chain; mesolve's transmon
# and 6-qubit dephasing chain within a few percent; a 1024-level state ran 1.8x
# slower, so larger states keep the defaults).
# Per-call compile options, never global configuration; a version of XLA that does
# not know them gets the defaults.
_FAST_COMPILE = {"xla_cpu_use_fusion_emitters": False}
# Small: every array leaf of at most this many elements (a 4x4 matrix).
_SMALL_LEAF = 16
# XLA's CPU runtime runs a program's operations in the order its scheduler gives
# them; with the default (concurrency-optimised) schedule it hands independent
# small operations to its thread pool, and each hand-off costs microseconds. The
# memory-optimised schedule (1) keeps them in one sequence: the seed hierarchy's
# call went from 110-145 to 60 us, n = 4 from 89 to 64 us, n = 128 (order 40) 2%
# faster, sesolve unchanged; same bits. Every top-level call on a CPU gets it.
_CPU = {"xla_cpu_scheduler_type": 1}
_fast_compile_known = [True]


try:  # JAX has no public test for a batched value either; without it, none.
    from jax._src.interpreters.batching import BatchTracer as _BatchTracer
except ImportError:  # pragma: no cover
    _BatchTracer = ()
_BATCHED = [False]


def tracing_batched() -> bool:
    """Whether the public call being traced runs under `jax.vmap` (as its dispatch
    saw it). Kernels read it to choose their layout: one call of a small problem
    costs what its operations and bytes cost (see `run_if`), a batch of them what
    their arithmetic costs."""
    return _BATCHED[0]


@contextlib.contextmanager
def _batched_hint(batched: bool):
    before = _BATCHED[0]
    _BATCHED[0] = batched
    try:
        yield
    finally:
        _BATCHED[0] = before


def _top_level() -> bool:
    """Whether no transformation is tracing (compile options are for top-level
    programs only; JAX has no public test for it, so without this one, none)."""
    try:
        from jax._src.core import trace_state_clean
    except ImportError:  # pragma: no cover
        return False
    return bool(trace_state_clean())


def _cpu_top_level() -> bool:
    """Whether compile options for XLA's CPU compiler apply to this call."""
    return _fast_compile_known[0] and jax.default_backend() == "cpu" and _top_level()


def _small(flat: Flattened) -> bool:
    return all(math.prod(shape or ()) <= _SMALL_LEAF for _, shape, _ in flat.signature)


def _is_plain(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic)) or type(leaf) in (
        float,
        int,
        complex,
    )


def module_jit(
    fn: Callable, fast_compile: bool | Callable[..., bool] = False
) -> Callable:
    """Compile `fn(module, *args, **static_kwargs)` once per structure.

    Behaves like `eqx.filter_jit` (array leaves traced, everything else static), but
    when every leaf of the module is already an array (the usual case) it dispatches
    through `jax.jit` on the module's cached leaves, which costs a few microseconds
    instead of the tens that flattening or filtering the pytree costs on every call.
    Keyword arguments are static (Python bools and the like). Python scalars passed
    positionally are traced by both paths, so changing a time or a parameter value
    never retraces. With `fast_compile`, the direct path compiles programs on small
    matrices with fewer optimisations (see `_FAST_COMPILE`); a callable decides from
    the call's arguments after the module instead.
    """

    def hinted(*args, batched, **static):
        with _batched_hint(batched):
            return fn(*args, **static)

    filtered = eqx.filter_jit(hinted)
    direct: dict[tuple[tuple[str, ...], bool, bool, bool], Callable] = {}

    def unflattened(leaves, *rest, treedef, batched, **static):
        module = jax.tree_util.tree_unflatten(treedef, leaves)
        with _batched_hint(batched):
            return fn(module, *rest, **static)

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
        flat = flatten_module(module)
        leaves, treedef, all_arrays, _ = flat
        rest_leaves = jax.tree_util.tree_leaves(rest)
        batched = any(isinstance(leaf, _BatchTracer) for leaf in rest_leaves)
        if all_arrays and all(_is_plain(leaf) for leaf in rest_leaves):
            cpu = not any(isinstance(leaf, Tracer) for leaf in rest_leaves) and (
                _cpu_top_level()
            )
            if callable(fast_compile):
                small = cpu and fast_compile(*rest)
            else:
                small = (
                    cpu
                    and fast_compile
                    and all(np.size(leaf) <= _SMALL_LEAF for leaf in rest)
                    and _small(flat)
                )
            key = (tuple(sorted(static)), cpu, small, batched)
            if key not in direct:
                options = {**(_CPU if cpu else {}), **(_FAST_COMPILE if small else {})}
                direct[key] = jax.jit(
                    unflattened,
                    static_argnames=("treedef", "batched", *key[0]),
                    compiler_options=options or None,
                )
            try:
                return direct[key](
                    leaves, *rest, treedef=treedef, batched=batched, **static
                )
            except jax.errors.JaxRuntimeError as error:
                if not (cpu and "compile option" in str(error)):
                    raise
                _fast_compile_known[0] = False
                direct.clear()
                return dispatch(*args, **static)
        # Python scalars would be static under filtering: trace them as arrays.
        args = tuple(
            jnp.asarray(a) if isinstance(a, (float, complex, int)) else a for a in args
        )
        batched = batched or any(isinstance(leaf, _BatchTracer) for leaf in leaves)
        return filtered(*args, batched=batched, **static)

    return call


def run_if(ok: Array, compute: Callable[[], Any]) -> Any:
    """`compute()` where `ok`, zeros of the same shapes elsewhere, as one
    conditional in the compiled program.

    XLA's CPU runtime runs a sequence of operations concurrently, handing ready ones
    to its thread pool at microseconds each, unless the sequence is short (at most 8
    operations) or every operation touches at most 512 bytes; a conditional's
    branch is a sequence of its own. Inside a user's `jax.jit` the seed
    hierarchy's ~300 small operations took 65-125 us run concurrently and 37 us in
    one thread. `ok` is a validity check of the call (a finite time): where it
    fails the call raises, and no work is wasted on what it would return."""
    closed, shapes = jax.make_jaxpr(compute, return_shape=True)()
    run = jax.extend.core.jaxpr_as_fun(closed)
    out = lax.cond(
        ok,
        run,
        lambda: [
            jnp.zeros(s.shape, s.dtype) for s in jax.tree_util.tree_leaves(shapes)
        ],
    )
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), out)
