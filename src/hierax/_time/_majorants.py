"""Bounds of time functions over discs of the complex plane, and from them bounds of
a truncated Taylor series' remainder over a whole step.

A step's series is taken at one point. Far in a `Gaussian`'s tail that series
says nothing of the peak: at 25 widths from the centre its terms are about
$e^{-312}$ times the peak's, and a step over the pulse looks exact (a pi pulse in
the middle of a free evolution was stepped over in one step, the state left
where it was). A bound that holds over the step's whole interval closes that gap.

Cauchy's estimate: where $|f(z)| \\le M(\\rho)$ on the disc $|z - t| \\le \\rho$,
$|f^{(n)}(t)| / n! \\le M(\\rho) / \\rho^n$, so the series of order K over a step
$h < \\rho$ leaves at most $M(\\rho) (h/\\rho)^{K+1} / (1 - h/\\rho)$ anywhere in
the step. The bound is taken at the best of a few radii. It is 10-40 times the
true remainder (against mpmath at orders 12 and 28, `tests/test_majorants.py`:
a Gaussian at its centre and in its tail, times a carrier, times a polynomial,
plus an exponential): where it is what limits a step, the step is at most
$40^{1/(K+1)}$, 14% at K = 28, shorter than it need be. On the held-back systems
of `benchmarks/` it limits none.

The majorants are in log form (an `M` overflows long before its bound matters)
and vectorised over the radii.
"""

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ._time_functions import (
    AbstractTimeFunction,
    Cos,
    Exp,
    Gaussian,
    Sin,
    TimeFunctionProduct,
    TimeFunctionSum,
)


# The radii tried, as multiples of the step: the best radius of a Gaussian at its
# centre is about w sqrt(K + 1), five to eight times the steps taken there.
_RATIOS = np.array([1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0])


@functools.singledispatch
def log_majorant(function: AbstractTimeFunction, t: Array, radius: Array) -> Any:
    """$\\log \\max_{|z - t| \\le \\rho} |f(z)|$ for each radius $\\rho$ of `radius`
    (an upper bound of it), or `None` where no bound is known (a callable).
    By default from a series that ends (a polynomial, a spline's segment: the
    steps stop at its knots): $\\sum_k |c_k| \\rho^k$."""
    degree = function.series_degree
    if degree is None:
        return None
    c = jnp.abs(function.series(t, degree, None))
    log_radius = jnp.log(radius)
    return _log_sum([jnp.log(c[k]) + k * log_radius for k in range(degree + 1)])


def _log_sum(logs: list[Array]) -> Array:
    """$\\log \\sum_i e^{\\ell_i}$ of a few arrays, term by term: elementwise
    operations that XLA fuses with their neighbours (a reduction is a kernel of its
    own, and each kernel a step of its CPU runtime in every solver step)."""
    top = functools.reduce(jnp.maximum, logs)
    finite = jnp.where(jnp.isfinite(top), top, 0)
    return finite + jnp.log(sum(jnp.exp(x - finite) for x in logs))


def _log_abs(x: Array) -> Array:
    return jnp.log(jnp.abs(x))


def _log_cosh(x: Array) -> Array:
    """$\\log\\cosh x$ for $x \\ge 0$, without overflow."""
    return x + jnp.log1p(jnp.exp(-2 * x)) - math.log(2.0)


def _sinusoid(function: Cos | Sin, radius: Array) -> Array:
    # |cos(w z + p)| and |sin(w z + p)| <= cosh(|Im(w z + p)|) <= cosh(|w| rho) for
    # real w, p and t.
    rate = jnp.abs(function.frequency)
    return _log_abs(function.amplitude) + _log_cosh(rate * radius)


@log_majorant.register
def _(function: Cos, t, radius):
    return _sinusoid(function, radius)


@log_majorant.register
def _(function: Sin, t, radius):
    return _sinusoid(function, radius)


@log_majorant.register
def _(function: Exp, t, radius):
    # |e^{a z}| = e^{Re(a z)} <= e^{Re(a) t + |a| rho} for real t.
    rate = function.rate
    return _log_abs(function.amplitude) + jnp.real(rate) * t + jnp.abs(rate) * radius


@log_majorant.register
def _(function: Gaussian, t, radius):
    # With x = (t - mu)/w and r = rho/|w|, the largest real part of -(x + r e^{i
    # theta})^2 / 2 over theta: r^2/2 - x^2/4 where |x| <= 2r, else -(|x| - r)^2/2.
    x = jnp.abs((t - function.mean) / function.width)
    r = radius / jnp.abs(function.width)
    exponent = jnp.where(x <= 2 * r, r * r / 2 - x * x / 4, -((x - r) ** 2) / 2)
    return _log_abs(function.amplitude) + exponent


@log_majorant.register
def _(function: TimeFunctionSum, t, radius):
    parts = [log_majorant(f, t, radius) for f in function.factors]
    if any(p is None for p in parts):
        return None
    return _log_sum(parts)


@log_majorant.register
def _(function: TimeFunctionProduct, t, radius):
    parts = [log_majorant(f, t, radius) for f in function.factors]
    if any(p is None for p in parts):
        return None
    return sum(parts[1:], parts[0])


def hides_its_peak(function: AbstractTimeFunction) -> bool:
    """Whether a series of `function` taken far from a feature may not show it: a
    `Gaussian`, alone or as a factor or term. (A sinusoid, an exponential or a
    polynomial is as large over a step as its series at the step's start says.)"""
    if isinstance(function, Gaussian):
        return True
    if isinstance(function, TimeFunctionSum | TimeFunctionProduct):
        return any(hides_its_peak(f) for f in function.factors)
    return False


def remainder_bound(
    function: AbstractTimeFunction, t: Array, step: Array, order: int
) -> Array | None:
    """An upper bound on $|f(s) - \\sum_{k \\le K} f^{(k)}(t) (s - t)^k / k!|$ for
    every s in the step from `t` of length `step` (either sign), K = `order`;
    `None` where no majorant is known. Finite (at most the dtype's largest
    value), with no derivative: it steers the step size."""
    t, step = jax.lax.stop_gradient((t, step))
    h = jnp.abs(step)
    rdtype = h.dtype
    tiny = np.finfo(rdtype).tiny
    ratios = _RATIOS.astype(rdtype)
    log_m = log_majorant(function, t, jnp.maximum(h, tiny) * ratios)
    if log_m is None:
        return None
    log_bound = log_m - (order + 1) * np.log(ratios) - np.log(1 - 1 / ratios)
    # (All of the function's majorants -inf: a zero amplitude, a zero bound.) The
    # least over the radii term by term, as `_log_sum`.
    log_bound = jnp.real(log_bound).astype(rdtype)
    best = functools.reduce(jnp.minimum, [log_bound[i] for i in range(len(ratios))])
    bound = jnp.exp(jnp.minimum(best, np.log(np.finfo(rdtype).max)))
    return jnp.where(h > 0, bound, 0).astype(rdtype)
