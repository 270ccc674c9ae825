"""Taylor rules of the primitives that hold inner jaxprs: calls and control flow
(custom derivatives are in `_rules_custom`).

Calls are inlined: the inner jaxpr is interpreted in place. Loops are lifted: the loop
runs as before, its carry now holding series, so a `fori_loop` of any trip count
costs one trace of its body. Trip counts and branch indices are integers, hence
constants, as long as they are computed from primal values.
"""

from collections.abc import Sequence
from typing import Any

import jax.lax as lax
import jax.numpy as jnp

from ._core import Context, Series, is_series, lift, register
from ._interpreter import eval_closed, eval_jaxpr, series_flags


def _flags(values: Sequence[Any]) -> list[bool]:
    return [is_series(x) for x in values]


def _raw(ctx: Context, values: Sequence[Any], flags: Sequence[bool], avals) -> list:
    """Loop-carried values as arrays: series as their coefficients (lifted where the
    flag asks for a series), constants as they are."""
    return [
        lift(ctx.order, x, aval) if flag else jnp.asarray(x, aval.dtype)
        for x, flag, aval in zip(values, flags, avals, strict=True)
    ]


def _wrap(values: Sequence[Any], flags: Sequence[bool]) -> list[Any]:
    return [Series(x) if f else x for x, f in zip(values, flags, strict=True)]


def _carry_fixed_point(
    jaxpr: Any, before: list[bool], carry: list[bool], after: list[bool]
) -> list[bool]:
    """The carries that may become series: iterate the dependency analysis of the
    loop body until it stops growing (at most one step per carry)."""
    carry = list(carry)
    while True:
        outs = series_flags(jaxpr, before + carry + after)[: len(carry)]
        new = [a or b for a, b in zip(carry, outs, strict=True)]
        if new == carry:
            return carry
        carry = new


# --- calls --------------------------------------------------------------------------


@register("jit")
def _jit(ctx: Context, eqn: Any, invals: list[Any]) -> list[Any]:
    return eval_closed(ctx.inside(eqn), eqn.params["jaxpr"], invals)


@register("closed_call")
def _call(ctx: Context, eqn: Any, invals: list[Any]) -> list[Any]:
    return eval_closed(ctx.inside(eqn), eqn.params["call_jaxpr"], invals)


@register("remat2")
def _open_call(ctx: Context, eqn: Any, invals: list[Any]) -> list[Any]:
    jaxpr = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    if hasattr(jaxpr, "consts"):
        return eval_closed(ctx.inside(eqn), jaxpr, invals)
    return eval_jaxpr(ctx.inside(eqn), jaxpr, (), invals)


# --- loops --------------------------------------------------------------------------


@register("scan")
def _scan(ctx: Context, eqn: Any, invals: list[Any]) -> list[Any]:
    params = eqn.params
    closed = params["jaxpr"]
    num_consts, num_carry = params["num_consts"], params["num_carry"]
    consts = invals[:num_consts]
    init = invals[num_consts : num_consts + num_carry]
    xs = invals[num_consts + num_carry :]
    carry_avals = [v.aval for v in eqn.invars[num_consts : num_consts + num_carry]]

    const_flags, xs_flags = _flags(consts), _flags(xs)
    carry_flags = _carry_fixed_point(closed.jaxpr, const_flags, _flags(init), xs_flags)
    out_flags = series_flags(closed.jaxpr, const_flags + carry_flags + xs_flags)
    ys_flags = out_flags[num_carry:]
    ys_avals = [v.aval for v in closed.jaxpr.outvars[num_carry:]]

    # Scanned series run over their axis 1: move it in front of the order axis.
    inner = ctx.inside(eqn)
    xs_raw = [jnp.moveaxis(x.coeffs, 1, 0) if is_series(x) else x for x in xs]

    def body(carry: list, x: list) -> tuple[list, list]:
        args = list(consts) + _wrap(carry, carry_flags) + _wrap(x, xs_flags)
        outs = eval_closed(inner, closed, args)
        new_carry = _raw(ctx, outs[:num_carry], carry_flags, carry_avals)
        ys = _raw(ctx, outs[num_carry:], ys_flags, ys_avals)
        return new_carry, ys

    carry, ys = lax.scan(
        body,
        _raw(ctx, init, carry_flags, carry_avals),
        xs_raw,
        length=params["length"],
        reverse=params["reverse"],
        unroll=params["unroll"],
    )
    ys = [jnp.moveaxis(y, 0, 1) if f else y for y, f in zip(ys, ys_flags, strict=True)]
    return _wrap(carry, carry_flags) + _wrap(ys, ys_flags)


@register("while")
def _while(ctx: Context, eqn: Any, invals: list[Any]) -> list[Any]:
    params = eqn.params
    cond, body_jaxpr = params["cond_jaxpr"], params["body_jaxpr"]
    cond_n, body_n = params["cond_nconsts"], params["body_nconsts"]
    cond_consts = invals[:cond_n]
    body_consts = invals[cond_n : cond_n + body_n]
    init = invals[cond_n + body_n :]
    avals = [v.aval for v in eqn.invars[cond_n + body_n :]]
    carry_flags = _carry_fixed_point(
        body_jaxpr.jaxpr, _flags(body_consts), _flags(init), []
    )
    inner = ctx.inside(eqn)

    def cond_fun(carry: list) -> Any:
        # A boolean result, hence computed from primal values: the trip count is
        # taken to be locally constant in the expansion variable.
        (keep_going,) = eval_closed(
            inner, cond, list(cond_consts) + _wrap(carry, carry_flags)
        )
        return keep_going

    def body_fun(carry: list) -> list:
        outs = eval_closed(
            inner, body_jaxpr, list(body_consts) + _wrap(carry, carry_flags)
        )
        return _raw(ctx, outs, carry_flags, avals)

    out = lax.while_loop(cond_fun, body_fun, _raw(ctx, init, carry_flags, avals))
    return _wrap(out, carry_flags)


@register("cond")
def _cond(ctx: Context, eqn: Any, invals: list[Any]) -> list[Any]:
    branches = eqn.params["branches"]
    index, operands = invals[0], invals[1:]
    if is_series(index):
        raise ctx.unsupported(eqn, "its branch index depends on the expansion variable")
    in_flags = _flags(operands)
    out_flags = [False] * len(eqn.outvars)
    for branch in branches:
        branch_flags = series_flags(branch.jaxpr, in_flags)
        out_flags = [a or b for a, b in zip(out_flags, branch_flags, strict=True)]
    out_avals = [v.aval for v in eqn.outvars]
    raw_operands = [x.coeffs if is_series(x) else x for x in operands]
    inner = ctx.inside(eqn)

    def make_branch(branch: Any):
        def run(*ops: Any) -> list:
            outs = eval_closed(inner, branch, _wrap(ops, in_flags))
            return _raw(ctx, outs, out_flags, out_avals)

        return run

    outs = lax.switch(index, [make_branch(b) for b in branches], *raw_operands)
    return _wrap(outs, out_flags)
