"""Time-reversal symmetry of an operator about a time $c$:
$H(c + s) = \\overline{H(c - s)}$ for every real $s$ (the complex conjugate, not the
adjoint).

For such an H the propagator over $[c - d, c + d]$ follows from its first half.
With $R(s) = U(c + s, c)$ and $L(s) = U(c - s, c)$,
$\\dot R = -i H(c + s) R = -i \\overline{H(c - s)} R$ and
$\\dot{\\overline L} = -i \\overline{H(c - s)}\\, \\overline L$: the same equation
from the identity, so $R = \\overline L$ and, with $U_h = U(c, c - d)$,
$$U(c + d, c - d) = \\overline{U_h^{-1}}\\, U_h = U_h^{T} U_h$$
($U_h$ unitary). A cosine drive on real matrices about a maximum of the cosine,
a sine drive on imaginary ones about a zero of the sine, Gaussian pulses centred
at $c$: [`hierax.floquet`][] solves half a period for them.

The symmetry is read from the operator's structure and its known parameter
values, never from samples of H: where either is unknown (a traced frequency, a
callable), the answer is no, and the full span is solved.

A periodic H symmetric about one time c is symmetric about $c + T/2$ too
($H(c + T/2 + s) = H(c - T/2 + s) = \\overline{H(c + T/2 - s)}$), so a centre lies
within every half period: `mirror_center` finds one from the drives' phases
(where $\\omega c + \\varphi$ is a multiple of $\\pi/2$), whatever the start.
"""

import functools
import math
from typing import Any

import numpy as np

from .._core import is_traced
from .._operators import AbstractTimeOperator
from .._time import (
    AbstractTimeFunction,
    Constant,
    Cos,
    Exp,
    Gaussian,
    Polynomial,
    Sin,
    TimeFunctionProduct,
    TimeFunctionSum,
)


def _known(x: Any) -> complex | None:
    """The value of a concrete scalar parameter, `None` if traced."""
    return None if is_traced(x) else complex(np.asarray(x))


def _conjugate_sign(x: Any) -> int:
    """+1 for a real number ($\\bar x = x$: a real dtype, traced or not), -1 for a
    known imaginary one ($\\bar x = -x$), 0 otherwise."""
    if not np.issubdtype(x.dtype, np.complexfloating):
        return 1
    value = _known(x)
    if value is None:
        return 0
    if value.imag == 0:
        return 1
    return -1 if value.real == 0 else 0


@functools.singledispatch
def mirror_sign(function: AbstractTimeFunction, center: float, tolerance: float) -> int:
    """The sign $\\sigma$ with $f(c + s) = \\sigma\\, \\overline{f(c - s)}$ for every
    real s: +1, -1, or 0 where there is none or it is not known. `tolerance`: the
    relative rounding allowed in the known values that decide it."""
    del function, center, tolerance
    return 0


@mirror_sign.register
def _(function: Constant, center: float, tolerance: float) -> int:
    del center, tolerance
    return _conjugate_sign(function.value)


@mirror_sign.register
def _(function: Polynomial, center: float, tolerance: float) -> int:
    del center, tolerance
    if function.coefficients.shape[0] != 1:
        return 0
    return _conjugate_sign(function.coefficients[0])


def _quarter_turn_sign(angle: float, tolerance: float) -> int:
    """+1 for an even multiple of $\\pi / 2$, -1 for an odd one (to the relative
    `tolerance`), 0 otherwise."""
    quarters = angle / (math.pi / 2)
    nearest = round(quarters)
    if abs(quarters - nearest) > tolerance * max(1.0, abs(quarters)):
        return 0
    return 1 if nearest % 2 == 0 else -1


def _sinusoid_sign(function: Cos | Sin, center: float, tolerance: float, lag: float):
    """$A \\cos(\\omega t + \\varphi - \\text{lag})$ about c: with
    $\\theta = \\omega c + \\varphi - \\text{lag}$ a multiple of $\\pi / 2$,
    $\\cos(\\theta + \\omega s)$ is $\\pm\\cos(\\omega s)$ (even in s) for an even
    multiple and $\\mp\\sin(\\omega s)$ (odd) for an odd one."""
    frequency, phase = _known(function.frequency), _known(function.phase)
    if frequency is None or phase is None:
        return 0
    angle = frequency.real * center + phase.real - lag
    return _quarter_turn_sign(angle, tolerance) * _conjugate_sign(function.amplitude)


@mirror_sign.register
def _(function: Cos, center: float, tolerance: float) -> int:
    return _sinusoid_sign(function, center, tolerance, 0.0)


@mirror_sign.register
def _(function: Sin, center: float, tolerance: float) -> int:
    # sin(x) = cos(x - pi/2)
    return _sinusoid_sign(function, center, tolerance, math.pi / 2)


@mirror_sign.register
def _(function: Exp, center: float, tolerance: float) -> int:
    # A e^{i w t}: f(c + s) / conj(f(c - s)) = (A / conj(A)) e^{2 i w c}, a sign
    # when w c is a multiple of pi / 2 (a real rate grows: no sign).
    rate = _known(function.rate)
    if rate is None or rate.real != 0:
        return 0
    sign = _quarter_turn_sign(rate.imag * center, tolerance)
    return sign * _conjugate_sign(function.amplitude)


@mirror_sign.register
def _(function: Gaussian, center: float, tolerance: float) -> int:
    mean, width = _known(function.mean), _known(function.width)
    if mean is None or width is None:
        return 0
    scale = max(1.0, abs(center), abs(width.real))
    if abs(mean.real - center) > tolerance * scale:
        return 0
    return _conjugate_sign(function.amplitude)


@mirror_sign.register
def _(function: TimeFunctionSum, center: float, tolerance: float) -> int:
    signs = {mirror_sign(term, center, tolerance) for term in function.terms}
    return signs.pop() if len(signs) == 1 else 0


@mirror_sign.register
def _(function: TimeFunctionProduct, center: float, tolerance: float) -> int:
    left = mirror_sign(function.left, center, tolerance)
    return left * mirror_sign(function.right, center, tolerance)


@functools.singledispatch
def center_grid(function: AbstractTimeFunction) -> tuple[float, float] | None:
    """Where f's mirror centres can lie: `(offset, spacing)`, every centre being
    `offset + k spacing` (spacing `inf`: the offset alone); `None` where f leaves
    the centre free (a constant) or its parameters are not known. A candidate is
    only a candidate: `mirror_sign` decides."""
    del function
    return None


def _sinusoid_grid(frequency: Any, phase: Any) -> tuple[float, float] | None:
    # omega c + phi a multiple of pi / 2: c = (k pi / 2 - phi) / omega.
    w, phi = _known(frequency), _known(phase)
    if w is None or phi is None or w.real == 0:
        return None
    return -phi.real / w.real, math.pi / (2 * abs(w.real))


@center_grid.register
def _(function: Cos | Sin) -> tuple[float, float] | None:
    return _sinusoid_grid(function.frequency, function.phase)


@center_grid.register
def _(function: Exp) -> tuple[float, float] | None:
    rate = _known(function.rate)
    if rate is None or rate.real != 0:
        return None
    return _sinusoid_grid(rate.imag, 0.0)


@center_grid.register
def _(function: Gaussian) -> tuple[float, float] | None:
    mean = _known(function.mean)
    return None if mean is None else (mean.real, math.inf)


def _first_grid(functions: Any) -> tuple[float, float] | None:
    grids = (center_grid(f) for f in functions)
    return next((g for g in grids if g is not None), None)


@center_grid.register
def _(function: TimeFunctionSum) -> tuple[float, float] | None:
    return _first_grid(function.terms)


@center_grid.register
def _(function: TimeFunctionProduct) -> tuple[float, float] | None:
    return _first_grid((function.left, function.right))


# The most candidate centres tried within a half period (a drive at a high
# harmonic of the period has many).
_MAX_CANDIDATES = 16


def mirror_center(
    operator: AbstractTimeOperator, start: float, period: float, tolerance: float
) -> float | None:
    """How far after `start` ($t_0$) a centre of the T-periodic `operator` lies
    (`is_mirrored`): $c - t_0 \\in (0, T/2]$, exactly $T/2$ where the middle of
    the period is one (tried first); `None` where no centre is known. (The
    distance, not c: at a late start c - t0 would lose the digits that tell the
    middle from a centre next to it.)"""
    half = period / 2
    if is_mirrored(operator, start + half, tolerance):
        return half
    grid = _first_grid(_functions(operator))
    if grid is None:
        return None
    offset, spacing = grid
    # The grid's points in (t0, t0 + T/2); a grid wider than half a period is
    # folded by half periods (centres repeat every T/2). Points within rounding
    # of either end (in the solve's precision, which `tolerance` is a few units
    # of) stand for the middle, which has failed.
    step = min(spacing, half)
    first = (offset - start) % step
    margin = 4 * tolerance * max(period, abs(start))
    for k in range(min(_MAX_CANDIDATES, math.ceil(half / step) + 1)):
        distance = first + k * step
        if margin < distance < half - margin and is_mirrored(
            operator, start + distance, tolerance
        ):
            return distance
    return None


def _functions(operator: AbstractTimeOperator) -> tuple[AbstractTimeFunction, ...]:
    """The time functions of an operator, in order."""
    return operator.fold_functions(
        lambda f: (f,), lambda parts: tuple(f for p in parts for f in p), _pair, ()
    )


def _pair(
    function: tuple[AbstractTimeFunction, ...],
    inner: tuple[AbstractTimeFunction, ...],
) -> tuple[AbstractTimeFunction, ...]:
    return function + inner


def is_mirrored(
    operator: AbstractTimeOperator, center: float, tolerance: float
) -> bool:
    """Whether $H(c + s) = \\overline{H(c - s)}$ for every real s, as far as the
    operator's structure and known values tell (no where they do not)."""
    return operator.is_mirrored(lambda f: mirror_sign(f, center, tolerance))


# Periodicity. A closed-form function is a finite sum of exponentials
# $e^{i \nu t}$ (complex $\nu$ for a growing or decaying one): $\cos \omega t$ has
# $\nu = \pm\omega$, $e^{\lambda t}$ has $\nu = -i\lambda$, a product has the sums
# of its factors' frequencies. Such a sum is T-periodic when every $\nu T / 2\pi$ is
# an integer (barring amplitudes that cancel). A Gaussian or a polynomial of degree
# one or more is periodic with no period. Sampled pulses and callables say nothing:
# `hierax.floquet` takes what they give on $[t_0, t_0 + T]$ as one period.


class _NotPeriodic:
    """The answer for functions periodic with no period (a Gaussian)."""

    def __repr__(self) -> str:
        return "NOT_PERIODIC"


NOT_PERIODIC = _NotPeriodic()

# The most frequencies followed through products (a product of sums multiplies
# their counts); past it the answer is "not known".
_MAX_FREQUENCIES = 256

Frequencies = tuple[Any, ...] | _NotPeriodic | None


@functools.singledispatch
def frequencies(function: AbstractTimeFunction) -> Frequencies:
    """The frequencies $\\nu$ of f as a sum of $e^{i \\nu t}$, each a parameter or
    an expression of parameters (arrays, traced or not, or Python numbers);
    `NOT_PERIODIC` for a function periodic with no period; `None` where not known
    (sampled pulses, callables)."""
    del function
    return None


@frequencies.register
def _(function: Constant) -> Frequencies:
    del function
    return (0.0,)


@frequencies.register
def _(function: Polynomial) -> Frequencies:
    return (0.0,) if function.coefficients.shape[0] == 1 else NOT_PERIODIC


@frequencies.register
def _(function: Cos | Sin) -> Frequencies:
    return (function.frequency, -function.frequency)


@frequencies.register
def _(function: Exp) -> Frequencies:
    return (-1j * function.rate,)


@frequencies.register
def _(function: Gaussian) -> Frequencies:
    del function
    return NOT_PERIODIC


@frequencies.register
def _(function: TimeFunctionSum) -> Frequencies:
    return _sum_frequencies([frequencies(term) for term in function.terms])


@frequencies.register
def _(function: TimeFunctionProduct) -> Frequencies:
    return _product_frequencies(frequencies(function.left), frequencies(function.right))


def _sum_frequencies(parts: list[Frequencies]) -> Frequencies:
    """A sum: every part's frequencies. One part periodic with no period among
    periodic ones leaves the sum so; two may cancel (not known)."""
    if any(p is None for p in parts):
        return None
    aperiodic = sum(p is NOT_PERIODIC for p in parts)
    if aperiodic:
        return NOT_PERIODIC if aperiodic == 1 else None
    joined = tuple(nu for p in parts for nu in p)  # type: ignore[union-attr]
    return joined if len(joined) <= _MAX_FREQUENCIES else None


def _product_frequencies(left: Frequencies, right: Frequencies) -> Frequencies:
    """A product: the sums of the factors' frequencies; a factor periodic with no
    period (a Gaussian envelope) leaves the product so (with periodic factors)."""
    if left is None or right is None:
        return None
    if left is NOT_PERIODIC or right is NOT_PERIODIC:
        return NOT_PERIODIC
    assert isinstance(left, tuple) and isinstance(right, tuple)
    if len(left) * len(right) > _MAX_FREQUENCIES:
        return None
    return tuple(a + b for a in left for b in right)


def operator_frequencies(operator: AbstractTimeOperator) -> Frequencies:
    """`frequencies` of every entry of the operator: its terms' functions together
    (a term periodic with no period makes H so: its matrix is not cancelled by the
    others'); `None` for a callable operator."""
    return operator.fold_functions(frequencies, _of_terms, _product_frequencies, None)


def _of_terms(parts: list[Frequencies]) -> Frequencies:
    """The frequencies of a sum of terms with these: unknown if one is, not
    periodic if one is not (its matrix is not cancelled by the others')."""
    if any(p is None for p in parts):
        return None
    if any(p is NOT_PERIODIC for p in parts):
        return NOT_PERIODIC
    return _sum_frequencies(parts)


def harmonic_gap(nus: tuple[Any, ...], period: Any, xp: Any) -> Any:
    """How far the frequencies are from harmonics of $2\\pi / T$: the largest
    distance of $\\nu T / 2\\pi$ from an integer, relative to its size (at least 1),
    with `xp` NumPy (known values) or `jax.numpy` (traced ones)."""
    gaps = []
    for nu in nus:
        cycles = xp.asarray(nu) * period / (2 * math.pi)
        real, imag = xp.real(cycles), xp.imag(cycles)
        gap = xp.abs(real - xp.round(real)) + xp.abs(imag)
        gaps.append(gap / xp.maximum(1.0, xp.abs(cycles)))
    return xp.max(xp.stack(gaps)) if gaps else xp.zeros(())
