"""The automatic time scale: a unit of time in which the carried series neither
overflow nor underflow.

The hierarchies carry series in a rescaled time $\\sigma = \\tau / s$, where
coefficient $j$ of a quantity that oscillates at rate $\\rho$ has size about
$(\\rho s)^j / j!$. A unit with $\\rho s$ of order one to a few tens keeps every
coefficient to order K in range: energies of $10^{10}$ rad/s with times in seconds
get $s \\approx 10^{-10}$.

The propagator and density-matrix kernels carry all coefficients at the one scale
$s$, so an estimate $\\hat\\rho$ above the true rate $\\rho$ shrinks the top one,
$(\\rho s)^K / K!$, by $(\\hat\\rho / \\rho)^K$: at K = 40 a factor 3 is 19 orders
of magnitude, which float32's margin did not hold (levels flushed to zero). The
rate is therefore read from spectral norms (a step of the power method, not
Frobenius norms, which exceed them by up to $\\sqrt n$), and the target product
leaves room for a factor `_ALLOWANCE`.
"""

import math
from collections.abc import Sequence

import equinox as eqx
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._data import (
    AbstractSparseMatrix,
    TermSeries,
    exact_exp2,
    frobenius,
    real_dtype,
)


def _frequencies(coefficients: Array) -> Array:
    """Oscillation rates of scalar series from their first four coefficients,
    $\\nu^2 \\approx (j+2)(j+1)\\,|c_{j+2} / c_j|$ for j = 0, 1 (exact for
    $\\cos$, $\\sin$ and $e^{\\lambda t}$ whatever the amplitude; a pair whose
    denominator vanishes, as at a zero of $\\cos$, is skipped)."""
    c = jnp.abs(coefficients)
    rates = []
    for j in (0, 1):
        den = c[..., j]
        safe = jnp.where(den > 0, den, 1)
        ratio = (j + 2) * (j + 1) * c[..., j + 2] / safe
        rates.append(jnp.where(den > 0, jnp.sqrt(ratio), 0))
    return jnp.maximum(*rates)


def _traceless(matrices: Array) -> Array:
    """The traceless parts (what a commutator sees)."""
    n = matrices.shape[-1]
    trace = jnp.trace(matrices, axis1=-2, axis2=-1) / n
    eye = jnp.eye(n, dtype=matrices.dtype).reshape((1,) * (matrices.ndim - 2) + (n, n))
    return matrices - trace[..., None, None] * eye


def _start(n: int, dtype) -> Array:
    """A fixed start vector for the power method: entries of pseudo-random sign
    and size in [1/2, 1), from an integer hash of the index (the same on every
    backend, no constant of size n in the program), so that neither a symmetry of
    a physical operator nor a small entry hides a singular vector from it."""
    x = lax.iota(jnp.uint32, n) * np.uint32(0x9E3779B9) + np.uint32(0x7F4A7C15)
    for shift, factor in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        x = (x ^ (x >> shift)) * np.uint32(factor)
    x = x ^ (x >> 16)
    size = 0.5 + (x >> 9).astype(dtype) / 2**24
    return jnp.where((x & 1) == 1, -size, size)


def _spectral_norms(matrices: Array, traceless: bool = False) -> Array:
    """Estimates of the spectral norms of a stack `(..., n, n)` (of their traceless
    parts if asked), by one step of the power method on $A^\\dagger A$ from a
    fixed start $v$: $\\|A^\\dagger w\\|$, $w = A v / \\|A v\\|$; two passes over
    each matrix. It never exceeds $\\|A\\|_2$ (which the Frobenius norm may, by
    up to $\\sqrt n$), and measured 0.46 to 0.99 of it (random, banded, diagonal,
    spin-chain and rank-one-plus-noise matrices, n = 2 to 512). A rate read low
    only raises $\\rho s$: a factor c takes the largest coefficient from
    $e^{\\rho s}$ to $e^{c \\rho s}$, in range for c up to 6 (`target_products`)."""
    a = lax.stop_gradient(matrices)
    n = a.shape[-1]
    v = _start(n, real_dtype(a.dtype)).reshape((1,) * (a.ndim - 2) + (n,))
    shift = jnp.trace(a, axis1=-2, axis2=-1)[..., None] / n if traceless else 0
    w = jnp.sum(a * v[..., None, :], axis=-1) - shift * v
    w = w / jnp.where(_length(w) > 0, _length(w), 1)
    # $\\|(A - cI)^\\dagger w\\|$ read as the length of its conjugate, $w^* A - c w^*$:
    # no conjugate of the matrix is formed.
    u = jnp.conj(w)
    back = jnp.sum(u[..., :, None] * a, axis=-2) - shift * u
    return _length(back)[..., 0]


def _length(x: Array) -> Array:
    return jnp.sqrt(jnp.sum(jnp.abs(x) ** 2, axis=-1, keepdims=True))


def _sparse_norm(matrix: AbstractSparseMatrix, traceless: bool) -> Array:
    """A bound on the spectral norm of a sparse matrix from its entries alone (one
    pass each, no product): the smaller of its Frobenius norm and
    $\\sqrt{\\|A\\|_1 \\|A\\|_\\infty}$, tight for local operators (Pauli strings,
    chains) where the Frobenius norm exceeds it by up to $\\sqrt n$. Traceless:
    $\\|A - (\\mathrm{tr} A / n) I\\|$, where
    $\\|A - (\\mathrm{tr} A / n) I\\|_F^2 = \\|A\\|_F^2 - |\\mathrm{tr} A|^2 / n$ and
    the shift at most doubles the other bound."""
    n = matrix.shape[0]
    absolute = eqx.tree_at(lambda m: m.values, matrix, jnp.abs(matrix.values))
    ones = jnp.ones((n,), absolute.values.dtype)
    rows = jnp.max(absolute.matvec(ones))
    columns = jnp.max(absolute.rmatvec(ones))
    bound = jnp.sqrt(rows * columns)
    norm = matrix.frobenius_norm()
    if not traceless:
        return jnp.minimum(norm, bound)
    reduced = jnp.sqrt(jnp.maximum(norm**2 - jnp.abs(matrix.trace()) ** 2 / n, 0))
    return jnp.minimum(reduced, 2 * bound)


def _term_rates(coefficients: Array, norms: Array, factor: float | None) -> list[Array]:
    """The rates of terms $f_a M_a$: their functions' oscillation rates where the
    matrix acts, and, with a `factor` (2 for $\\mathrm{ad}_H$, 1 for $H$ acting
    on a state), the size of the generator per order."""
    nu = jnp.where(norms > 0, _frequencies(coefficients), 0)
    rates = [jnp.max(nu)]
    if factor is not None:
        sizes = jnp.sum(jnp.abs(coefficients) * norms[:, None], axis=0)
        m = jnp.arange(sizes.shape[0], dtype=sizes.dtype)
        rates.append(factor * jnp.max(sizes ** (1 / (m + 1))))
    return rates


def growth_rate(
    hamiltonian: TermSeries, observable: TermSeries | None, commutator: bool = True
) -> Array:
    """A cheap estimate of the rate at which the series of a hierarchy grow, from
    series of order 3 at scale 1: the size of the generator (its terms' spectral
    norms times their functions' coefficients, $\\|h_m\\|^{1/(m+1)}$) and the
    oscillation rates of the time functions whose matrices act at all. With
    `commutator` the generator is $\\mathrm{ad}_H$, of norm at most
    $2 \\|H - cI\\|$ (the trace part commutes); without, $H$ itself acting on a
    state (the propagator), of norm $\\|H\\|$, the trace included: an offset $cI$
    turns the state at rate $c$."""
    rates = []
    factor = 2.0 if commutator else 1.0
    for part, size in ((hamiltonian, factor), (observable, None)):
        if part is None:
            continue
        traceless = commutator and size is not None
        if part.coefficients.shape[0]:
            if size is None:  # The observable's norms only say which terms act.
                norms = frobenius(part.matrices, (-2, -1))
            else:
                norms = _spectral_norms(part.matrices, traceless)
            rates.extend(_term_rates(part.coefficients, norms, size))
        if part.sparse is not None:
            terms = part.sparse
            sparse_norms = jnp.stack(
                [_sparse_norm(m, traceless) for m in terms.matrices]
            ).astype(real_dtype(terms.coefficients.dtype))
            rates.extend(_term_rates(terms.coefficients, sparse_norms, size))
        if part.dense is not None:
            dense = _traceless(part.dense) if traceless else part.dense
            rates.append(_frequencies(frobenius(dense, (-2, -1))))
            if size is not None:
                norms = _spectral_norms(part.dense, traceless)
                m = jnp.arange(norms.shape[0], dtype=norms.dtype)
                rates.append(size * jnp.max(norms ** (1 / (m + 1))))
    if not rates:
        return jnp.zeros(())
    rate = combined_rate(rates)
    return lax.stop_gradient(jnp.where(jnp.isfinite(rate), rate, 0))


# How far above the true growth the estimate may lie and still leave the top
# coefficient in range: the 2 of $2\\|H - cI\\|$ against the spread of H's
# eigenvalues, and sums of terms' norms against the norm of their sum.
_ALLOWANCE = 4.0


def target_products(order: int, dtype) -> tuple[float, float]:
    """The range of $\\hat\\rho s$ to aim at for order K in `dtype`. Lower: the
    top coefficient $(\\rho s)^K / K!$ stays above $\\text{tiny} / \\epsilon^2$ (so
    that rounding, not underflow, limits it, with room for entries far below the
    norm) even where the estimate $\\hat\\rho$ is `_ALLOWANCE` times the true
    rate; at least 1. Upper: the largest coefficient, about $e^{\\rho s}$, and
    what the time functions' series reach in the same unit (a Gaussian's grow
    like $(s/w)^j / \\sqrt{j!}$), stay far below the largest float:
    $\\rho s \\le \\log(\\text{max}) / 6$. Where the two cross (float32 from
    K of about 40) the upper one wins: an overflow is never traded for an
    underflow."""
    info = np.finfo(real_dtype(dtype))
    log_tiny = math.log(float(info.tiny)) - 2 * math.log(float(info.eps))
    lower = _ALLOWANCE * math.exp((math.lgamma(order + 1) + log_tiny) / max(order, 1))
    return max(1.0, lower), math.log(float(info.max)) / 6


def default_time_scale(rate: Array, order: int, dtype) -> Array:
    """$s$, a power of two (multiplying by it is exact): the smallest with
    $\\hat\\rho s$ at least the lower target, unless that passes the upper one,
    then the largest below it (rounding to the nearest power instead could lose a
    factor $\\sqrt 2$, $2^{K/2}$ at the top order); 1 where the estimate is zero."""
    rdtype = real_dtype(dtype)
    rate = rate.astype(rdtype)
    lower, upper = target_products(order, dtype)
    positive = rate > 0
    safe = jnp.where(positive, rate, 1)
    exponent = jnp.minimum(
        jnp.ceil(jnp.log2(lower / safe)), jnp.floor(jnp.log2(upper / safe))
    )
    info = np.finfo(rdtype)
    exponent = jnp.clip(jnp.where(positive, exponent, 0), info.minexp, info.maxexp - 1)
    return lax.stop_gradient(exact_exp2(exponent, rdtype))


def jump_rate(jumps: Sequence[TermSeries]) -> list[Array]:
    """Growth-rate estimates the jump operators add: their own (as a Hamiltonian's:
    norms and the frequencies of their time functions) and the dissipator's
    $2 \\sum_j \\|L_j\\|^2$."""
    rates = []
    total = None
    for jump in jumps:
        rates.append(growth_rate(jump, None))
        norm = jnp.sum(
            jnp.abs(jump.coefficients[:, 0]) * _spectral_norms(jump.matrices)
        )
        if jump.dense is not None:
            norm = norm + _spectral_norms(jump.dense[0])
        total = norm**2 if total is None else total + norm**2
    if total is not None:
        rates.append(lax.stop_gradient(2 * total))
    return rates


def combined_rate(rates: list[Array]) -> Array:
    rdtype = jnp.result_type(*[real_dtype(r.dtype) for r in rates])
    return jnp.max(jnp.stack([r.astype(rdtype) for r in rates]))
