"""Taylor rules of sorting and cumulative reductions.

Away from ties, sorting and running extrema are permutations and selections fixed by
the values at order 0, so every coefficient follows the same index; running
products are Cauchy products carried along the axis.
"""

from typing import Any

import jax.lax as lax
import jax.numpy as jnp

from . import _recurrences as rec
from ._core import Context, Series, is_series, lift, primal, register


def _value(eqn: Any, invals: list[Any]) -> Any:
    return eqn.primitive.bind(*[primal(x) for x in invals], **eqn.params)


def _take(coeffs: Any, index: Any, axis: int) -> Any:
    """`coeffs[:, ..., index, ...]` along `axis` of the series' values."""
    return jnp.take_along_axis(coeffs, index[None], axis=axis + 1)


@register("sort")
def _sort(ctx: Context, eqn: Any, invals: list[Any]) -> list[Any]:
    # The permutation of the primal keys (ties broken as the primitive breaks them),
    # applied to every coefficient of every operand.
    params = eqn.params
    axis = params["dimension"]
    primals = [primal(x) for x in invals]
    shape = eqn.invars[0].aval.shape
    iota = lax.broadcasted_iota(jnp.int32, shape, axis)
    *values, permutation = lax.sort_p.bind(*primals, iota, **params)
    return [
        Series(_take(x.coeffs, permutation, axis).at[0].set(value))
        if is_series(x)
        else value
        for x, value in zip(invals, values, strict=True)
    ]


@register("cumprod")
def _cumprod(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    axis, reverse = eqn.params["axis"], eqn.params["reverse"]
    u = jnp.moveaxis(invals[0].coeffs, axis + 1, 0)

    def step(carry: Any, x: Any) -> tuple[Any, Any]:
        product = rec.cauchy(carry, x)
        return product, product

    one = lift(ctx.order, jnp.ones(u.shape[2:], u.dtype))
    _, out = lax.scan(step, one, u, reverse=reverse)
    out = jnp.moveaxis(out, 0, axis + 1)
    return Series(out.at[0].set(_value(eqn, invals)))


@register("cummax", "cummin")
def _cumulative_extremum(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # Entry i follows the last entry, up to i, where the running extremum was
    # attained (first entry, scanning in reverse).
    axis, reverse = eqn.params["axis"], eqn.params["reverse"]
    x = invals[0]
    value = _value(eqn, invals)
    iota = lax.broadcasted_iota(jnp.int32, value.shape, axis)
    n = value.shape[axis]
    if reverse:
        attained = jnp.where(primal(x) == value, iota, n)
        index = lax.cummin(attained, axis=axis, reverse=True)
    else:
        attained = jnp.where(primal(x) == value, iota, -1)
        index = lax.cummax(attained, axis=axis)
    return Series(_take(x.coeffs, index, axis).at[0].set(value))


@register("cumlogsumexp")
def _cumlogsumexp(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # log(cumsum(exp(x - c))) + c with c the largest entry at order 0, a constant.
    axis, reverse = eqn.params["axis"], eqn.params["reverse"]
    u = invals[0].coeffs
    c = jnp.max(u[0], axis=axis, keepdims=True)
    e = rec.exp(u - c[None], jnp.exp(u[0] - c))
    s = lax.cumsum(e, axis=axis + 1, reverse=reverse)
    out = rec.log(s, jnp.log(s[0])) + c[None]
    return Series(out.at[0].set(_value(eqn, invals)))
