"""The compile policy of every public call: `eqx.filter_jit` semantics with a fast
path, on public JAX only.

A public call compiles one program per structure (the module's tree, the shapes and
dtypes of its arrays, the static keyword arguments) with XLA's default options:
the same program a user's own `jax.jit` around the call compiles, so a call runs as
fast inside a user's jit, `jax.grad` or `jax.vmap` as from Python. Times and
parameter values are traced, so changing them never retraces.
"""

import collections
import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.extend
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ._backend import products_context, refuse_unsupported_backend
from ._cache import flatten_module
from ._checks import at_top_level, collecting, failure
from ._choices import backend_choices


# How many tree structures each public call keeps compiled (each holds its program).
_STRUCTURES = 64


def _is_plain(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic)) or type(leaf) in (
        float,
        int,
        complex,
    )


def module_jit(
    fn: Callable, api: str | None = None, exact_products: bool = True
) -> Callable:
    """Compile `fn(module, *args, **static_kwargs)` once per structure.

    `api` names the public call in errors (by default the module's class, which
    is what the user called: `hierax.HeisenbergHierarchy`, `hierax.Cos`). The
    program is traced with its matrix products at hierax's chosen precision
    (`_backend`), unless `exact_products` is off (the Taylor transform, whose
    products are the user's own and keep the precision the user traced them
    with); 64-bit mode on a TPU is refused before anything compiles.

    Behaves like `eqx.filter_jit` (array leaves traced, everything else static), but
    when every leaf of the module is already an array (the usual case) and the other
    arguments are arrays or numbers, it dispatches through `jax.jit` on the module's
    cached leaves, which costs a few microseconds instead of the tens that
    flattening or filtering the pytree costs on every call. Keyword arguments are
    static (Python bools and the like). Python scalars passed positionally are
    traced by both paths, so changing a time or a parameter value never retraces.
    Both paths compile with XLA's defaults (no per-call compile options).

    The checks of a call's values (`_checks.raise_if`) raise from a host callback
    in the program, except in a call from Python where the backend chooses
    otherwise (`BackendChoices.host_checks`): its program returns its first failed
    check, and the call raises here. A program traced inside another keeps its
    callbacks.
    """

    def collected(*args, **static):
        # A program traced from Python: it returns its failure code beside its
        # result, and the call raises on the host (`_checks`).
        with collecting() as found:
            out = fn(*args, **static)
        return out, failure(found)

    filtered = eqx.filter_jit(fn)
    # One jitted function per tree structure and static keywords, found by the
    # identity of the structure: a module's flattened form is cached (`_cache`), so
    # the same module (or one rebuilt from the same cached parts) brings back the
    # same treedef object. Passing the treedef as a static argument instead made
    # JAX hash and compare it on every call: most of a small solve's eager call.
    direct: collections.OrderedDict[tuple[int, tuple[str, ...], bool], Any] = (
        collections.OrderedDict()
    )

    by_structure: dict[tuple[Any, tuple[str, ...], bool], Callable] = {}

    def compiled(treedef: Any, names: tuple[str, ...], host: bool) -> Callable:
        key = (id(treedef), names, host)
        hit = direct.get(key)
        if hit is not None and hit[0] is treedef:
            direct.move_to_end(key)
            return hit[1]
        # A new treedef object: an equal structure shares the jitted function (and
        # its compiled programs), found by hashing and comparing once.
        jitted = by_structure.get((treedef, names, host))
        if jitted is None:
            body = collected if host else fn

            def unflattened(leaves, *rest, **static):
                module = jax.tree_util.tree_unflatten(treedef, leaves)
                return body(module, *rest, **static)

            jitted = jax.jit(unflattened, static_argnames=names)
            by_structure[treedef, names, host] = jitted
        # The entry keeps its treedef alive, so its id cannot be reused meanwhile.
        direct[key] = (treedef, jitted)
        if len(direct) > _STRUCTURES:
            direct.popitem(last=False)
        return jitted

    @functools.wraps(fn)
    def call(*args, **static):
        try:
            return dispatch(*args, **static)
        except ValueError as error:
            # JAX's message names no argument; say which objects to move.
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
        refuse_unsupported_backend(
            lambda: api or f"hierax.{type(module).__name__}", (*rest, leaves)
        )
        if exact_products:
            with products_context():
                return run(args, rest, leaves, treedef, all_arrays, static)
        return run(args, rest, leaves, treedef, all_arrays, static)

    def run(args, rest, leaves, treedef, all_arrays, static):
        if all_arrays and all(_is_plain(leaf) for leaf in jax.tree.leaves(rest)):
            # From Python (nothing traced), where the backend chooses it: the
            # checks' failure read on the host (`_checks`).
            host = backend_choices().host_checks and at_top_level()
            jitted = compiled(treedef, tuple(sorted(static)), host)
            if not host:
                return jitted(leaves, *rest, **static)
            out, failed = jitted(leaves, *rest, **static)
            failed.throw()
            return out
        # Python scalars would be static under filtering: trace them as arrays.
        args = tuple(
            jnp.asarray(a) if isinstance(a, (float, complex, int)) else a for a in args
        )
        return filtered(*args, **static)

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


def by_batching(
    single: Callable, batched: Callable, differentiate_batched: bool = False
) -> Callable:
    """`single(*args)`, computed by `batched` instead when the call is mapped by
    `jax.vmap`: two layouts of one computation, the first for one problem (where
    what counts is how many operations and bytes it touches), the second for a
    batch (where what counts is arithmetic). The choice is made by JAX's public
    batching rule (`jax.custom_batching.custom_vmap`), not by inspecting tracers.
    `args` are arrays (pytrees of arrays). Derivatives are those of `single`, or
    with `differentiate_batched` those of `batched` (where its derivative is the
    smaller program: compile time grows with the operations a program has, and a
    derivative has several for each of the original's)."""

    def rule(axis_size: int, in_batched: Any, *args: Any) -> Any:
        axes = jax.tree.map(lambda b: 0 if b else None, tuple(in_batched))
        return jax.vmap(batched, in_axes=axes, axis_size=axis_size)(*args)

    # Behind a jit boundary, the constants `single` makes (NumPy arrays) stay in
    # its own program instead of becoming inputs of the batching rule, which JAX
    # requires to be unbatched (under a `lax.cond` on a batched predicate every
    # input is batched).
    return _with_batching_rule(
        batched if differentiate_batched else single, rule, jax.jit(single)
    )


def by_differentiation(plain: Callable, differentiable: Callable) -> Callable:
    """`plain(*args)`, computed by `differentiable` instead wherever it is
    differentiated (forward or reverse mode, also inside `jax.vmap`): two forms
    of one computation, the first faster to run, the second faster to
    differentiate. The choice is made by JAX's public rule for derivatives
    (`jax.custom_jvp`), whose derivative is the one of `differentiable`. `args`
    are arrays (pytrees of arrays)."""
    call = jax.custom_jvp(plain)

    @call.defjvp
    def derivative(primals, tangents):
        return jax.jvp(differentiable, primals, tangents)

    return call


def in_blocks(single: Callable, block: int) -> Callable:
    """`single(*args)`, mapped by `jax.vmap` in blocks of at most `block` lanes, one
    block after another (`lax.map` over vmapped blocks): the same computations,
    for a batch whose working set would outgrow the caches if all lanes ran in
    lockstep. `args` are arrays (pytrees of arrays, `None` allowed). `single` is
    not put behind a jit boundary of its own: a caller that builds it afresh on
    every call would compile it every call. The blocked map is jitted once per
    argument structure and batch, and kept with this wrapper: an eager `jax.vmap`
    over a wrapper the caller keeps (`floquet` keeps one per operator structure)
    then compiles it once, not on every call."""
    mappers: dict[Any, Callable] = {}

    def rule(axis_size: int, in_batched: Any, *args: Any) -> Any:
        flags = tuple(jax.tree.leaves(in_batched))
        leaves, tree = jax.tree.flatten(args)
        batch = min(block, axis_size)
        mapper = mappers.get((tree, flags, batch))
        if mapper is None:

            def blocked(leaves: list) -> Any:
                mapped = [x for x, b in zip(leaves, flags) if b]

                def one(xs: list) -> Any:
                    lanes = iter(xs)
                    filled = [next(lanes) if b else x for x, b in zip(leaves, flags)]
                    return single(*jax.tree.unflatten(tree, filled))

                return lax.map(one, mapped, batch_size=batch)

            mapper = mappers[tree, flags, batch] = jax.jit(blocked)
        return mapper(leaves)

    return _with_batching_rule(single, rule, single)


def _with_batching_rule(
    single: Callable, rule: Callable, unmapped: Callable
) -> Callable:
    """`single`, computed by `unmapped` (the same function, or it behind a jit
    boundary) when not mapped, and by `rule(axis_size, in_batched, *args)` when
    mapped by `jax.vmap` (every output batched).

    `custom_vmap` alone has no reverse-mode derivative, so the function is also a
    `jax.custom_jvp` whose rule differentiates `single` (under `jax.vmap` of a
    derivative, that rule is batched as any JAX function): forward and reverse mode
    both work, and give the derivative of `single` (`unmapped` computes the same
    function, perhaps in another layout)."""

    @jax.custom_batching.custom_vmap
    def mapped(*args):
        return unmapped(*args)

    @mapped.def_vmap
    def batching(axis_size, in_batched, *args):
        out = rule(axis_size, in_batched, *args)
        return out, jax.tree.map(lambda _: True, out)

    @jax.custom_jvp
    def call(*args):
        return mapped(*args)

    @call.defjvp
    def derivative(primals, tangents):
        return jax.jvp(single, primals, tangents)

    return call
