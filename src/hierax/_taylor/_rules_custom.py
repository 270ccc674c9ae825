"""Taylor rules of functions with custom derivatives.

A `jax.custom_jvp` function is expanded through its JVP rule, never through its
primal body: the body of `softplus`, `logaddexp`, `sinc` or `xlogy` takes a `max`,
`abs` or `where` branch at its guard point although the function is analytic there,
and only the rule knows. Along the input curve $x(t)$ the output $y = f(x)$ satisfies
$y' = \\mathrm{jvp}(f)(x, x')$, so with $x$ known to order $K$:

- $y_0$ is the function's value;
- the tangent $y'$ is needed only to order $K - 1$, so the rule's jaxpr is interpreted
  on the input series truncated to order $K-1$ and their derivatives $x'$ (whose
  coefficients to order $K-1$ are all known);
- $y_j = y'_{j-1} / j$.

Custom-JVP functions called inside the rule recurse at order $K-1$, which terminates
(at order 0 a call is its value): `sinc`'s rule calls a new function for every order,
so it nests $K$ levels deep. A rule that calls its own function on the same inputs
(`logaddexp` uses its own output) is a fixed point instead: the self-call returns the
current guess of $y$, and each sweep makes one more coefficient exact (coefficient $j$
of the tangent only reads coefficients up to $j$ of $y$), so $K$ sweeps in one
`fori_loop` give all of them with a program whose size does not depend on $K$.

This matches nested `jax.jvp`, which also differentiates the rule's jaxpr.
"""

from typing import Any

import jax
import jax.extend.core as jex
import jax.lax as lax
import jax.numpy as jnp
import numpy as np

from . import _recurrences as rec
from ._core import Context, Series, is_inexact, is_series, lift, primal, register
from ._interpreter import eval_closed, eval_jaxpr


def _jvp_jaxpr(eqn: Any, num_args: int) -> tuple[Any, Any, list[bool]]:
    """The rule's jaxpr `(*primals, *tangents) -> (*primal_outs, *tangent_outs)`
    with every tangent instantiated (as JAX does for `symbolic_zeros=False`), its
    constants, and which outputs have a symbolically zero tangent."""
    zeros = [False] * num_args
    params = eqn.params
    if "jvp_jaxpr_fun" in params:
        jaxpr, consts, out_zeros = params["jvp_jaxpr_fun"].call_wrapped(*zeros)
    else:  # JAX < 0.6
        jaxpr, consts, out_zeros = params["jvp_jaxpr_thunk"](*zeros)
    return jaxpr, consts, list(out_zeros)


def _same_function(a: Any, b: Any) -> bool:
    if a is b:
        return True
    info = lambda e: getattr(e.params.get("jvp_jaxpr_fun"), "debug_info", None)
    ja, jb = a.params["call_jaxpr"], b.params["call_jaxpr"]
    return info(a) == info(b) and (ja is jb or str(ja) == str(jb))


def _tangent(x: Any, v: Any, order: int) -> Any:
    """The series of $x'$ to order `order`, or a zero tangent for a constant."""
    if is_series(x):
        return Series(rec.derivative(x.coeffs)[: order + 1])
    aval = v.aval
    if not is_inexact(aval.dtype):
        return np.zeros(aval.shape, jax.dtypes.float0)
    return jnp.zeros(aval.shape, aval.dtype)


@register("custom_jvp_call")
def _custom_jvp(ctx: Context, eqn: Any, invals: list[Any]) -> list[Any]:
    # One rule, read top to bottom: the primal values, then the series through the
    # user's jvp rule or, past what it can give, through the primal body; split,
    # each piece would need the whole equation's state.
    params = eqn.params
    num_consts = params["num_consts"]
    order = ctx.order
    values = jex.jaxpr_as_fun(params["call_jaxpr"])(*[primal(x) for x in invals])
    out_avals = [v.aval for v in eqn.outvars]
    inexact = [is_inexact(a.dtype) for a in out_avals]

    args, arg_vars = invals[num_consts:], eqn.invars[num_consts:]
    for outer, inputs, guesses, used in ctx.pending:
        if len(inputs) == len(args) and all(
            a is b for a, b in zip(inputs, args, strict=True)
        ):
            if _same_function(outer, eqn):
                used.append(True)
                return [
                    Series(g[: order + 1]) if g is not None else value
                    for g, value in zip(guesses, values, strict=True)
                ]

    if any(is_series(x) for x in invals[:num_consts]):
        # The function closes over time-dependent values, which its rule does not
        # receive as inputs: expand the primal body (exact away from guard points).
        return eval_closed(ctx.inside(eqn), params["call_jaxpr"], invals)

    if order == 0:
        return [
            Series(lift(0, value)) if flag else value
            for value, flag in zip(values, inexact, strict=True)
        ]

    try:
        jaxpr, consts, out_zeros = _jvp_jaxpr(eqn, len(args))
    except Exception as e:  # the rule refuses to be traced (e.g. nondifferentiable)
        raise ctx.unsupported(
            eqn,
            f"its JVP rule raised {type(e).__name__}: {e}",
            hint="Expand a function whose custom JVP rule JAX's own `jax.jvp` "
            "accepts, or take this call out of the expanded function.",
        ) from e
    # The rule at order K - 1: inputs truncated, and their derivatives.
    truncated = [Series(x.coeffs[:order]) if is_series(x) else x for x in args]
    tangents = [_tangent(x, v, order - 1) for x, v in zip(args, arg_vars, strict=True)]
    n_out = len(out_zeros)
    nonzero = [i for i, z in enumerate(out_zeros) if not z]
    wanted = [False] * n_out + [inexact[i] for i in nonzero]
    inner_ctx = ctx.inside(eqn)

    def sweep(guesses: list[Any]) -> tuple[list[Any], bool]:
        used: list[bool] = []
        entry = (eqn, tuple(truncated), guesses, used)
        inner = inner_ctx.at_order(order - 1, ctx.pending + (entry,))
        outs = eval_jaxpr(inner, jaxpr, consts, truncated + tangents, wanted)
        tangent_outs = dict(zip(nonzero, outs[n_out:], strict=True))
        new = []
        for i, (value, aval) in enumerate(zip(values, out_avals, strict=True)):
            if not inexact[i]:
                new.append(None)
                continue
            d = tangent_outs.get(i)
            d = jnp.zeros((order,) + aval.shape, aval.dtype) if d is None else d
            d = lift(order - 1, d, aval).astype(aval.dtype)
            new.append(rec.antiderivative(jnp.concatenate([d, d[:1]]), value))
        return new, bool(used)

    start = [
        lift(order, value, aval) if flag else None
        for value, aval, flag in zip(values, out_avals, inexact, strict=True)
    ]
    ys, recursive = sweep(start)
    if recursive and order > 1:
        # Each sweep makes one more coefficient exact: K sweeps in all.
        carry = [y for y in ys if y is not None]

        def body(_: Any, carry: list[Any]) -> list[Any]:
            it = iter(carry)
            guesses = [next(it) if flag else None for flag in inexact]
            return [y for y in sweep(guesses)[0] if y is not None]

        carry = lax.fori_loop(1, order, body, carry)
        it = iter(carry)
        ys = [next(it) if flag else None for flag in inexact]
    return [
        Series(y) if y is not None else value
        for y, value in zip(ys, values, strict=True)
    ]


@register("custom_vjp_call")
def _custom_vjp(ctx: Context, eqn: Any, invals: list[Any]) -> list[Any]:
    # A custom VJP defines reverse mode only (JAX's `jax.jvp` refuses it): the
    # primal computation is expanded, as `jax.jvp` of the undecorated function would.
    return eval_closed(ctx.inside(eqn), eqn.params["call_jaxpr"], invals)
