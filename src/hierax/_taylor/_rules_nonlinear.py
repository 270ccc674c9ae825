"""Taylor rules of the nonlinear primitives: products, quotients, powers and the
elementary functions.

Coefficient 0 of every result is the primitive applied to the primal values, so it
agrees exactly with the untransformed function; the higher coefficients come from the
fixed-shape recurrences of `_recurrences`.
"""

import math
from typing import Any

import jax.lax as lax
import jax.numpy as jnp
import numpy as np

from . import _recurrences as rec
from ._core import Context, Series, is_series, lift, primal, register
from ._rules_linear import batched


def _value(eqn: Any, invals: list[Any]) -> Any:
    """The primitive on the primal values: coefficient 0 of the result."""
    return eqn.primitive.bind(*[primal(x) for x in invals], **eqn.params)


def _full(ctx: Context, x: Any, v: Any, shape: tuple[int, ...]) -> Any:
    """Coefficients of an elementwise operand, broadcast to the result's shape (a
    jaxpr may combine a scalar with an array)."""
    c = lift(ctx.order, x, v.aval)
    c = c.reshape(c.shape[:1] + (1,) * (len(shape) - (c.ndim - 1)) + c.shape[1:])
    return jnp.broadcast_to(c, c.shape[:1] + tuple(shape))


def _operands(ctx: Context, eqn: Any, invals: list[Any]) -> list[Any]:
    shape = eqn.outvars[0].aval.shape
    return [_full(ctx, x, v, shape) for x, v in zip(invals, eqn.invars, strict=True)]


def _square(u: Any) -> Any:
    return rec.cauchy(u, u)


# --- products and quotients -------------------------------------------------------


def _contract_with_order(eqn: Any):
    """`combine` for `rec.cauchy` of a `dot_general`: one `dot_general` whose
    contraction also runs over the order axis, so a coefficient of the product is a
    single matrix product of inner dimension (K + 1) times the original one."""
    (lhs_c, rhs_c), (lhs_b, rhs_b) = eqn.params["dimension_numbers"]
    shift = lambda dims: tuple(d + 1 for d in dims)
    numbers = (
        ((0,) + shift(lhs_c), (0,) + shift(rhs_c)),
        (shift(lhs_b), shift(rhs_b)),
    )
    params = dict(eqn.params, dimension_numbers=numbers)
    return lambda a, w: eqn.primitive.bind(a, w, **params)


@register("mul", "dot_general", "conv_general_dilated")
def _bilinear(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    x, y = invals
    if not is_series(y):
        return Series(batched(eqn, [x.coeffs, y], [0, None]))
    if not is_series(x):
        return Series(batched(eqn, [x, y.coeffs], [None, 0]))
    name = eqn.primitive.name
    if name == "mul":
        return Series(rec.cauchy(*_operands(ctx, eqn, invals)))
    if name == "dot_general":
        combine = _contract_with_order(eqn)
    else:
        combine = lambda a, w: jnp.sum(batched(eqn, [a, w], [0, 0]), axis=0)
    return Series(rec.cauchy(x.coeffs, y.coeffs, combine))


@register("div")
def _div(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    x, y = invals
    if not is_series(y):
        return Series(batched(eqn, [x.coeffs, y], [0, None]))
    u, v = _operands(ctx, eqn, invals)
    return Series(rec.divide(u, v).at[0].set(_value(eqn, invals)))


@register("square")
def _square_rule(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    return Series(_square(invals[0].coeffs))


@register("integer_pow")
def _integer_pow(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    (x,) = invals
    n = eqn.params["y"]
    u = x.coeffs
    if n == 0:
        return Series(lift(ctx.order, jnp.ones(u.shape[1:], u.dtype)))
    out = rec.integer_power(u, abs(n))
    if n < 0:
        out = rec.divide(lift(ctx.order, jnp.ones(u.shape[1:], u.dtype)), out)
    return Series(out.at[0].set(_value(eqn, invals)))


def _integer_exponent(y: Any) -> int | None:
    """A concrete integer-valued exponent as a Python int, else None."""
    if isinstance(y, (int, float, np.ndarray, np.generic)):
        y = np.asarray(y)
        if y.ndim == 0 and np.isreal(y) and float(y.real) == round(float(y.real)):
            return int(round(float(y.real)))
    return None


def _constant_power(u: Any, p: Any, value: Any) -> Any:
    """$u^p$ for an exponent known only at run time (a closed-over or module array).

    Where $u_0 = 0$ and $p$ is a non-negative integer, $u = s^\\nu w$ with $w_0 \\neq 0$
    ($\\nu$ leading zero coefficients) and $u^p = s^{p\\nu} w^p$: the recurrence runs
    on $w$ and the result is shifted, exact as `integer_power` is for a static $p$.
    Elsewhere it is `rec.power` (singular at $u_0 = 0$, as $u^p$ is).
    """
    n = u.shape[0]
    nu = jnp.argmax(u != 0, axis=0)
    j = jnp.arange(n).reshape((n,) + (1,) * (u.ndim - 1))
    padded = jnp.concatenate([u, jnp.zeros_like(u)], axis=0)
    w = jnp.take_along_axis(padded, jnp.broadcast_to(j + nu[None], u.shape), axis=0)
    q = jnp.real(p)
    shifted = (u[0] == 0) & (w[0] != 0) & (p == jnp.round(q)) & (q >= 0)
    # One recurrence: on w where shifted, on u elsewhere (w's first coefficient
    # read only where it is nonzero).
    base = jnp.where(shifted[None], w, u)
    start = jnp.where(shifted, jnp.where(shifted, w[0], 1) ** p, value)
    powered = rec.power(base, p, start)
    shift = jnp.where(shifted, jnp.round(q) * nu, 0).astype(jnp.int32)
    shift = jnp.minimum(shift, n)
    padded = jnp.concatenate([jnp.zeros_like(powered), powered], axis=0)
    index = jnp.broadcast_to(j - shift[None] + n, u.shape)
    return jnp.take_along_axis(padded, index, axis=0).at[0].set(value)


@register("pow")
def _pow(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    x, y = invals
    value = _value(eqn, invals)
    if not is_series(y):
        n = _integer_exponent(y)
        u = _operands(ctx, eqn, invals)[0]
        if n is not None and n >= 0:
            if n == 0:
                return Series(lift(ctx.order, jnp.ones_like(u[0])))
            return Series(rec.integer_power(u, n).at[0].set(value))
        return Series(_constant_power(u, jnp.broadcast_to(y, u.shape[1:]), value))
    # x ** y = exp(y log x)
    u, w = _operands(ctx, eqn, invals)
    if is_series(x):
        log_u = rec.log(u, jnp.log(u[0]))
        exponent = rec.cauchy(w, log_u)
    else:
        # As JAX's derivative: a zero base has the constant value 0 for y > 0.
        base = jnp.where(u[0] == 0, jnp.ones_like(u[0]), u[0])
        exponent = w * jnp.log(base)[None]
    return Series(rec.exp(exponent, value))


@register("rem")
def _rem(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # x - y * trunc(x / y), the quotient piecewise constant.
    u, v = _operands(ctx, eqn, invals)
    quotient = jnp.trunc(u[0] / v[0])
    return Series((u - quotient[None] * v).at[0].set(_value(eqn, invals)))


# --- elementary functions ---------------------------------------------------------


@register("exp")
def _exp(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    return Series(rec.exp(invals[0].coeffs, _value(eqn, invals)))


@register("exp2")
def _exp2(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    u = invals[0].coeffs
    return Series(rec.exp(u * math.log(2.0), _value(eqn, invals)))


@register("expm1")
def _expm1(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    u = invals[0].coeffs
    value = _value(eqn, invals)
    return Series(rec.exp(u, value + 1).at[0].set(value))


@register("log")
def _log(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    return Series(rec.log(invals[0].coeffs, _value(eqn, invals)))


@register("log1p")
def _log1p(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    u = invals[0].coeffs
    return Series(rec.log(u.at[0].add(1), _value(eqn, invals)))


@register("sqrt")
def _sqrt(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    return Series(rec.sqrt(invals[0].coeffs, _value(eqn, invals)))


@register("rsqrt")
def _rsqrt(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    return Series(rec.power(invals[0].coeffs, -0.5, _value(eqn, invals)))


@register("cbrt")
def _cbrt(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    return Series(rec.power(invals[0].coeffs, 1.0 / 3.0, _value(eqn, invals)))


def _sin_cos(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    """sin, cos, sinh and cosh: the recurrence needs the partner function too."""
    name = eqn.primitive.name
    u, a = invals[0].coeffs, primal(invals[0])
    value = _value(eqn, invals)
    hyperbolic = name in ("sinh", "cosh")
    partner = {"sin": jnp.cos, "cos": jnp.sin, "sinh": jnp.cosh, "cosh": jnp.sinh}
    other = partner[name](a)
    if name in ("sin", "sinh"):
        s, _ = rec.sin_cos(u, value, other, hyperbolic)
        return Series(s)
    _, c = rec.sin_cos(u, other, value, hyperbolic)
    return Series(c)


register("sin", "cos", "sinh", "cosh")(_sin_cos)


@register("tan")
def _tan(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    return Series(rec.tan(invals[0].coeffs, _value(eqn, invals)))


@register("tanh")
def _tanh(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # 1 - tanh(u0)^2 cancels to 0 where tanh rounds to 1: the slope as sech^2.
    u = invals[0].coeffs
    slope = 1 / jnp.square(jnp.cosh(u[0]))
    return Series(rec.tan(u, _value(eqn, invals), hyperbolic=True, slope=slope))


@register("logistic")
def _logistic(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # y (1 - y) cancels to 0 where y rounds to 1: 1 - y is y at -u0.
    u, value = invals[0].coeffs, _value(eqn, invals)
    return Series(rec.logistic(u, value, slope=value * lax.logistic(-u[0])))


def _from_derivative_factor(eqn: Any, invals: list[Any], g: Any) -> Series:
    """The series $v$ with $v' = g\\,u'$ and $v_0$ the primitive's value."""
    u = invals[0].coeffs
    return Series(rec.compose(u, g).at[0].set(_value(eqn, invals)))


def _one(u: Any) -> Any:
    return jnp.zeros_like(u).at[0].set(1)


@register("erf", "erfc")
def _erf(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    u = invals[0].coeffs
    scale = 2 / math.sqrt(math.pi)
    if eqn.primitive.name == "erfc":
        scale = -scale
    g = scale * rec.exp(-_square(u), jnp.exp(-u[0] * u[0]))
    return _from_derivative_factor(eqn, invals, g)


@register("erf_inv")
def _erf_inv(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # y = erfinv(u): u = erf(y), so y' = (sqrt(pi) / 2) exp(y^2) u'.
    return Series(rec.erf_inv(invals[0].coeffs, _value(eqn, invals)))


@register("atan")
def _atan(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    u = invals[0].coeffs
    return _from_derivative_factor(
        eqn, invals, rec.divide(_one(u), _one(u) + _square(u))
    )


@register("atanh")
def _atanh(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    u = invals[0].coeffs
    return _from_derivative_factor(
        eqn, invals, rec.divide(_one(u), _one(u) - _square(u))
    )


def _inverse_sqrt(w: Any) -> Any:
    return rec.power(w, -0.5, 1 / jnp.sqrt(w[0]))


@register("asin")
def _asin(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    u = invals[0].coeffs
    return _from_derivative_factor(eqn, invals, _inverse_sqrt(_one(u) - _square(u)))


@register("acos")
def _acos(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    u = invals[0].coeffs
    return _from_derivative_factor(eqn, invals, -_inverse_sqrt(_one(u) - _square(u)))


@register("asinh")
def _asinh(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    u = invals[0].coeffs
    return _from_derivative_factor(eqn, invals, _inverse_sqrt(_one(u) + _square(u)))


@register("acosh")
def _acosh(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    u = invals[0].coeffs
    return _from_derivative_factor(eqn, invals, _inverse_sqrt(_square(u) - _one(u)))


@register("atan2")
def _atan2(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # atan2(y, x)' = (x y' - y x') / (x^2 + y^2)
    y, x = _operands(ctx, eqn, invals)
    numerator = rec.cauchy(x, rec.derivative(y)) - rec.cauchy(y, rec.derivative(x))
    d = rec.divide(numerator, _square(x) + _square(y))
    return Series(rec.antiderivative(d, _value(eqn, invals)))


# --- piecewise functions: analytic away from their kinks ----------------------------


@register("abs")
def _abs(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    u = invals[0].coeffs
    value = _value(eqn, invals)
    if jnp.issubdtype(u.dtype, jnp.complexfloating):
        return Series(rec.sqrt(jnp.real(rec.cauchy(u, jnp.conj(u))), value))
    return Series((jnp.sign(u[0])[None] * u).at[0].set(value))


@register("max", "min")
def _max_min(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # As JAX's derivative: the larger (smaller) operand, the mean of both at a tie.
    u, v = _operands(ctx, eqn, invals)
    if eqn.primitive.name == "max":
        pick_u, pick_v = u[0] > v[0], u[0] < v[0]
    else:
        pick_u, pick_v = u[0] < v[0], u[0] > v[0]
    out = jnp.where(pick_u[None], u, jnp.where(pick_v[None], v, (u + v) / 2))
    return Series(out.at[0].set(_value(eqn, invals)))


@register("clamp")
def _clamp(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # `clamp(lo, x, hi) = min(max(x, lo), hi)`, hence hi when lo > hi. The branch
    # selection is JAX's own derivative's, ties included (they get no derivative).
    lo, x, hi = _operands(ctx, eqn, invals)
    pick_lo = (lo[0] > x[0]) & (lo[0] < hi[0])
    pick_x = (x[0] > lo[0]) & (x[0] < hi[0])
    pick_hi = hi[0] < x[0]
    out = jnp.where(
        pick_lo[None],
        lo,
        jnp.where(pick_x[None], x, jnp.where(pick_hi[None], hi, jnp.zeros_like(x))),
    )
    return Series(out.at[0].set(_value(eqn, invals)))


@register("reduce_max", "reduce_min")
def _reduce_extremum(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # The series of the extremal entries (averaged over ties, where the extremum is
    # not differentiable anyway).
    u = invals[0].coeffs
    axes = tuple(a + 1 for a in eqn.params["axes"])
    value = _value(eqn, invals)
    hits = u[0] == jnp.expand_dims(value, [a - 1 for a in axes])
    count = jnp.sum(hits, axis=tuple(a - 1 for a in axes))
    total = jnp.sum(jnp.where(hits[None], u, jnp.zeros_like(u)), axis=axes)
    return Series((total / count.astype(total.dtype)[None]).at[0].set(value))


@register("reduce_prod")
def _reduce_prod(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    u = invals[0].coeffs
    axes = tuple(a + 1 for a in eqn.params["axes"])
    kept = tuple(a for a in range(u.ndim) if a not in axes)
    factors = jnp.transpose(u, kept + axes)
    factors = factors.reshape(factors.shape[: len(kept)] + (-1,))
    count = factors.shape[-1]
    if count == 0:
        return Series(lift(ctx.order, _value(eqn, invals)))

    def body(i, acc):
        return rec.cauchy(acc, lax.dynamic_index_in_dim(factors, i, -1, False))

    out = lax.fori_loop(1, count, body, factors[..., 0])
    return Series(out.at[0].set(_value(eqn, invals)))
