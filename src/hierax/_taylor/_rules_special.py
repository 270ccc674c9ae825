"""Taylor rules of special functions: log-gamma, digamma and polygamma, the scaled
modified Bessel functions, and the regularised incomplete gamma and beta functions.

The gamma family satisfies no short differential equation, so its rules compute the
function's own Taylor coefficients at the primal value, $c_k = f^{(k)}(x_0)/k!$,
from Hurwitz zeta values, and substitute the input series into that power series
(`rec.substitute`, $O(K^3)$). The Bessel rules do the same with coefficients from a
backward recurrence. The incomplete gamma and beta functions have elementary
derivatives and use `rec.compose`.
"""

import math
from typing import Any

import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np

from . import _recurrences as rec
from ._core import Context, Series, is_series, register
from ._rules_nonlinear import _constant_power, _one, _operands, _value


@jax.custom_jvp
def _zeta(s: Any, q: Any) -> Any:
    """Hurwitz's $\\zeta(s, q)$, differentiable in $q$ (`lax.zeta` is not):
    $\\partial_q \\zeta(s, q) = -s\\,\\zeta(s + 1, q)$."""
    return lax.zeta(s, q)


@_zeta.defjvp
def _zeta_jvp(primals: Any, tangents: Any) -> Any:
    s, q = primals
    return _zeta(s, q), -s * _zeta(s + 1, q) * tangents[1]


def _orders(count: int, x: Any, start: int = 0) -> Any:
    """$k = $ `start`, ..., `start + count - 1` on a leading axis broadcasting
    against `x`."""
    k = jnp.arange(start, start + count, dtype=x.dtype)
    return k.reshape((count,) + (1,) * x.ndim)


def _digamma_coefficients(x: Any, count: int) -> Any:
    """$\\psi^{(j)}(x)/j!$ for $j <$ `count`: $(-1)^{j+1}\\zeta(j+1, x)$ above $j = 0$,
    from $\\psi(x) = \\psi(1 - x) - \\pi\\cot(\\pi x)$ where $x < 1/2$ (XLA's $\\zeta$
    is wrong at negative $x$)."""
    if count == 1:
        return lax.digamma(x)[None]
    shape = (count - 1,) + x.shape
    s = jnp.broadcast_to(_orders(count - 1, x, start=2), shape)  # j + 1
    q = lambda v: jnp.broadcast_to(v[None], shape)
    reflect = x < 0.5
    direct = jnp.where(s % 2 == 0, 1, -1) * _zeta(s, q(jnp.where(reflect, 1, x)))
    y = jnp.where(reflect, x, 0.25)
    r = y - jnp.round(y)  # cot has period 1: an exact reduction
    z = jnp.zeros((count,) + x.shape, x.dtype).at[0].set(math.pi * r).at[1].set(math.pi)
    # cos(pi r) as sin(pi (1/2 - |r|)): exact zeros at half-integers.
    sin, cos = rec.sin_cos(
        z, jnp.sin(math.pi * r), jnp.sin(math.pi * (0.5 - jnp.abs(r)))
    )
    reflected = -_zeta(s, q(1 - y)) - math.pi * rec.divide(cos, sin)[1:]
    higher = jnp.where(reflect[None], reflected, direct)
    return jnp.concatenate([lax.digamma(x)[None], higher], axis=0)


def _substituted(eqn: Any, invals: list[Any], u: Any, c: Any) -> Series:
    return Series(rec.substitute(c, u).at[0].set(_value(eqn, invals)))


@register("lgamma")
def _lgamma(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # lgamma' = digamma: c_k = psi^{(k-1)}(x0) / k!.
    u = invals[0].coeffs
    n = u.shape[0]
    psi = _digamma_coefficients(u[0], n)[: n - 1]
    c = jnp.concatenate([jnp.zeros_like(u[:1]), psi / _orders(n - 1, u[0], start=1)])
    return _substituted(eqn, invals, u, c)


@register("digamma")
def _digamma(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # c_k = psi^{(k)}(x0) / k!.
    u = invals[0].coeffs
    return _substituted(eqn, invals, u, _digamma_coefficients(u[0], u.shape[0]))


def _concrete(x: Any) -> Any:
    """`x` as a NumPy array, or None when it is only known at run time."""
    try:
        return np.asarray(x)
    except jax.errors.JAXTypeError:
        return None


@register("polygamma")
def _polygamma(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # polygamma(n)' = polygamma(n + 1): c_k = psi^{(n+k)}(x0) / k!.
    n = None if is_series(invals[0]) else _concrete(invals[0])
    if n is None or n.ndim or n != round(float(n)) or n < 0:
        raise ctx.unsupported(
            eqn,
            "its order n must be a non-negative integer known when tracing",
            hint="Pass n as a Python int (JAX's own derivative in n is undefined).",
        )
    n = int(n)
    u = _operands(ctx, eqn, invals)[1]
    factor = [math.perm(n + k, n) for k in range(u.shape[0])]  # (n+k)!/k!
    factor = np.array([float(f) if f < 2**1023 else math.inf for f in factor])
    psi = _digamma_coefficients(u[0], n + u.shape[0])[n:]
    c = psi * factor.astype(u.dtype).reshape((-1,) + (1,) * (u.ndim - 1))
    return _substituted(eqn, invals, u, c)


def _bessel_coefficients(x: Any, count: int) -> tuple[Any, Any]:
    """The Taylor coefficients of `i0e` and `i1e` at $x$, orders below `count`.

    At $a = |x| > 0$ those of $f = e^{-a}I_0$ solve, from $x f'' + (2x + 1) f' + f = 0$,
    $a(k+1)(k+2) c_{k+2} + (k+1)(k+1+2a) c_{k+1} + (2k+1) c_k = 0$, whose wanted
    solution is the minimal one: the ratios $c_{k+1}/c_k$ come from a backward
    recurrence started at order $2K + 100$ (Miller's algorithm; within 5e-14 of
    mpmath to order 60 for $a$ from 0.25 to 1e4), scaled so nothing overflows.
    `i1e` $= f' + f$, and $x < 0$ follows by symmetry. At $x = 0$, where JAX's
    derivative takes $\\operatorname{sign}(0) = 0$, they are those of $I_0$ and
    $I_1$.
    """
    a = jnp.abs(x)
    scale = 1 / jnp.maximum(1, 2 * a)
    a_scale = jnp.minimum(a, 0.5)  # a * scale

    def ratio(next_ratio: Any, k: Any) -> tuple[Any, Any]:
        den = (k + 1) * ((k + 1) * scale + 2 * a_scale)
        den = den + (k + 1) * (k + 2) * a_scale * next_ratio
        ratio = -(2 * k + 1) * scale / den
        return ratio, ratio

    k = jnp.arange(2 * count + 100, dtype=x.dtype)
    _, ratios = lax.scan(ratio, jnp.zeros_like(x), k, reverse=True)
    i0e = lax.bessel_i0e(a)[None] * jnp.cumprod(
        jnp.concatenate([jnp.ones_like(x)[None], ratios[:count]]), axis=0
    )
    i1e = _orders(count, x, start=1) * i0e[1:] + i0e[:-1]
    odd = _orders(count + 1, x) % 2 == 1
    sign = jnp.where(odd & (x < 0)[None], -1, 1).astype(x.dtype)
    # I_0 = sum_m (x/2)^{2m} / m!^2 and I_1 = I_0'.
    i0 = np.zeros(count + 1)
    i0[::2] = np.cumprod([1.0] + [1 / (4 * m * m) for m in range(1, count // 2 + 1)])
    i0 = i0.astype(x.dtype).reshape((-1,) + (1,) * x.ndim)
    i1 = np.arange(1, count + 1, dtype=x.dtype).reshape(i0[1:].shape) * i0[1:]
    zero = (x == 0)[None]
    return (
        jnp.where(zero, i0[:-1], sign[:-1] * i0e[:-1]),
        jnp.where(zero, i1, sign[1:] * i1e),
    )


@register("bessel_i0e", "bessel_i1e")
def _bessel(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # i0e' = i1e - sign(x) i0e, i1e' = i0e - (sign(x) + 1/x) i1e.
    u = invals[0].coeffs
    i0e, i1e = _bessel_coefficients(u[0], u.shape[0])
    c = i0e if eqn.primitive.name == "bessel_i0e" else i1e
    return _substituted(eqn, invals, u, c)


def _power_exp(u: Any, p: Any, w: Any) -> Any:
    """The series of $u^p e^w$ for a constant $p$: as $\\exp(p \\log u + w)$ (neither
    factor need be representable) where $u_0 \\ne 0$, by `_constant_power` (exact for
    an integer $p \\ge 0$, singular otherwise, as $u^p$ is) where $u_0 = 0$."""
    zero = (u[0] == 0)[None]
    general = jnp.where(zero, _one(u), u)
    e = p[None] * rec.log(general, jnp.log(general[0])) + w
    at_zero = jnp.where(zero, u, _one(u))
    value = at_zero[0] ** p * jnp.exp(w[0])  # kept where a non-integer p makes NaNs
    exact = _constant_power(at_zero, p, at_zero[0] ** p)
    exact = rec.cauchy(exact, rec.exp(w, jnp.exp(w[0]))).at[0].set(value)
    return jnp.where(zero, exact, rec.exp(e, jnp.exp(e[0])))


def _constant_parameters(ctx: Context, eqn: Any, invals: list[Any]) -> None:
    if any(is_series(x) for x in invals[:-1]):
        raise ctx.unsupported(
            eqn,
            "it depends on the expansion variable through a shape parameter",
            hint="JAX differentiates it in x only: hold the parameters fixed "
            "(`jax.lax.stop_gradient`) or compute them outside the expanded function.",
        )


@register("igamma", "igammac")
def _igamma(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # P(a, x)' = x^{a-1} e^{-x} / Gamma(a) = -Q(a, x)'.
    _constant_parameters(ctx, eqn, invals)
    a, u = _operands(ctx, eqn, invals)
    g = _power_exp(u, a[0] - 1, (-u).at[0].add(-lax.lgamma(a[0])))
    g = -g if eqn.primitive.name == "igammac" else g
    return Series(rec.compose(u, g).at[0].set(_value(eqn, invals)))


@register("regularized_incomplete_beta")
def _betainc(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # I_x(a, b)' = x^{a-1} (1 - x)^{b-1} / B(a, b), by the power of the nearer end.
    _constant_parameters(ctx, eqn, invals)
    a, b, u = _operands(ctx, eqn, invals)
    a, b = a[0], b[0]
    log_beta = lax.lgamma(a) + lax.lgamma(b) - lax.lgamma(a + b)
    upper = (u[0] > 0.5)[None]
    near = jnp.where(upper, _one(u) - u, u)  # the distance to the nearer end
    far = _one(u) - near
    far_log = rec.log(far, jnp.log1p(-near[0]))
    p, q = jnp.where(upper[0], b, a), jnp.where(upper[0], a, b)
    g = _power_exp(near, p - 1, ((q - 1)[None] * far_log).at[0].add(-log_beta))
    return Series(rec.compose(u, g).at[0].set(_value(eqn, invals)))
