"""The jaxpr interpreter behind [`hierax.taylor`][]: trace a function once, then
evaluate its jaxpr with every time-dependent variable replaced by its truncated
Taylor series.
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp

from ._core import RULES, Context, Series, is_inexact, is_series, lift, primal


def bind(eqn: Any, invals: Sequence[Any]) -> Any:
    """Run `eqn`'s primitive on plain values, as `jax.core.eval_jaxpr` does."""
    params = eqn.primitive.get_bind_params(eqn.params)
    if isinstance(params, tuple):  # JAX < 0.7 returned (subfuns, params)
        subfuns, params = params
        return eqn.primitive.bind(*subfuns, *invals, **params)
    return eqn.primitive.bind(*invals, **params)


def _read_literal(v: Any) -> Any:
    return v.val


def apply_equation(ctx: Context, eqn: Any, invals: list[Any]) -> list[Any]:
    """The outputs of one equation, as `Series` or plain values."""
    prim = eqn.primitive
    if not any(is_series(x) for x in invals):
        outs = bind(eqn, invals)
    elif not any(is_inexact(v.aval.dtype) for v in eqn.outvars):
        # Integer and boolean results (comparisons, indices, trip counts) are
        # piecewise constant: their Taylor coefficients above order 0 vanish.
        outs = bind(eqn, [primal(x) for x in invals])
    else:
        rule = RULES.get(prim.name)
        if rule is None:
            raise ctx.unsupported(eqn)
        outs = rule(ctx, eqn, invals)
    return list(outs) if prim.multiple_results else [outs]


def eval_jaxpr(
    ctx: Context,
    jaxpr: Any,
    consts: Sequence[Any],
    args: Sequence[Any],
    wanted: Sequence[bool] | None = None,
) -> list[Any]:
    """Evaluate an open `jaxpr` whose arguments may be `Series`.

    With `wanted`, only the equations that the wanted outputs depend on run (the
    others' outputs are returned as None).
    """
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return _read_literal(v) if isinstance(v, jex.Literal) else env[v]

    def write(v: Any, value: Any) -> None:
        if not isinstance(v, jex.DropVar):
            env[v] = value

    for v, value in zip(jaxpr.constvars, consts, strict=True):
        write(v, value)
    for v, value in zip(jaxpr.invars, args, strict=True):
        write(v, value)
    eqns = jaxpr.eqns if wanted is None else live_equations(jaxpr, wanted)
    for eqn in eqns:
        outs = apply_equation(ctx, eqn, [read(v) for v in eqn.invars])
        for v, value in zip(eqn.outvars, outs, strict=True):
            write(v, value)
    if wanted is None:
        return [read(v) for v in jaxpr.outvars]
    return [read(v) if w else None for v, w in zip(jaxpr.outvars, wanted, strict=True)]


def live_equations(jaxpr: Any, wanted: Sequence[bool]) -> list[Any]:
    """The equations of `jaxpr` that the `wanted` outputs depend on, in order
    (equations with side effects are always kept)."""
    live = {
        v
        for v, w in zip(jaxpr.outvars, wanted, strict=True)
        if w and not isinstance(v, jex.Literal)
    }
    kept = []
    for eqn in reversed(jaxpr.eqns):
        if eqn.effects or any(v in live for v in eqn.outvars):
            kept.append(eqn)
            live.update(v for v in eqn.invars if not isinstance(v, jex.Literal))
    return kept[::-1]


def eval_closed(ctx: Context, closed: Any, args: Sequence[Any]) -> list[Any]:
    return eval_jaxpr(ctx, closed.jaxpr, closed.consts, args)


def series_flags(jaxpr: Any, in_flags: Sequence[bool]) -> list[bool]:
    """Which outputs of `jaxpr` may be `Series` when the inputs flagged are.

    A conservative dependency analysis: an inexact result counts as a series as soon
    as one operand does. The interpreter never returns a series where this says
    none, so loop carries and branch outputs can be given a fixed type up front.
    """
    flags: dict[Any, bool] = dict(zip(jaxpr.invars, in_flags, strict=True))

    def flag(v: Any) -> bool:
        return not isinstance(v, jex.Literal) and flags.get(v, False)

    for eqn in jaxpr.eqns:
        depends = any(flag(v) for v in eqn.invars)
        for v in eqn.outvars:
            flags[v] = depends and is_inexact(v.aval.dtype)
    return [flag(v) for v in jaxpr.outvars]


def function_name(fn: Any) -> str:
    name = getattr(fn, "__name__", None) or getattr(fn, "__qualname__", None)
    return name if name is not None else type(fn).__name__


def expand(
    fn: Callable,
    *series: Any,
    api: str = "hierax.taylor",
    fn_name: str | None = None,
) -> Any:
    """Push truncated Taylor series through `fn`.

    Each positional argument of `fn` is given as a pytree of coefficient arrays of
    shape `(K + 1, *shape)`, coefficient $j$ being $x^{(j)}/j!$ of the matching
    argument along some curve. Returns the coefficients of `fn` along that curve, a
    pytree with `fn`'s output structure whose leaves have shape `(K + 1, *shape)`.
    Integer leaves are treated as constants (coefficients above order 0 vanish).
    """
    leaves, treedef = jax.tree_util.tree_flatten(series)
    orders = {jnp.shape(leaf)[0] for leaf in leaves if jnp.ndim(leaf) > 0}
    if len(orders) > 1 or any(jnp.ndim(leaf) == 0 for leaf in leaves):
        raise ValueError(
            f"`{api}`: every input series needs the same leading order axis, got "
            f"shapes {[jnp.shape(leaf) for leaf in leaves]}."
        )
    if not leaves:
        raise ValueError(f"`{api}`: no input series to expand.")
    order = orders.pop() - 1
    leaves = [jnp.asarray(leaf) for leaf in leaves]
    ctx = Context(order, api, fn_name if fn_name is not None else function_name(fn))

    out_tree: list[Any] = []

    def flat_fn(*primals: Any) -> list[Any]:
        out = fn(*jax.tree_util.tree_unflatten(treedef, primals))
        out_leaves, out_def = jax.tree_util.tree_flatten(out)
        out_tree.append(out_def)
        return out_leaves

    closed = jax.make_jaxpr(flat_fn)(*[leaf[0] for leaf in leaves])
    args = [Series(leaf) if is_inexact(leaf.dtype) else leaf[0] for leaf in leaves]
    outs = eval_closed(ctx, closed, args)
    outs = [
        lift(order, value, v.aval)
        for value, v in zip(outs, closed.jaxpr.outvars, strict=True)
    ]
    return jax.tree_util.tree_unflatten(out_tree[0], outs)
