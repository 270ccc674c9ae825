"""The automatic time scale: a unit of time in which the carried series neither
overflow nor underflow.

The hierarchies carry series in a rescaled time $\\sigma = \\tau / s$, where
coefficient $j$ of a quantity that oscillates at rate $\\rho$ has size about
$(\\rho s)^j / j!$. A unit with $\\rho s$ of order one to a few tens keeps every
coefficient to order K in range: energies of $10^{10}$ rad/s with times in seconds
get $s \\approx 10^{-10}$.
"""

import math
from collections.abc import Sequence

import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._data import AbstractSparseMatrix, TermSeries, frobenius, real_dtype


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


def _norms(matrices: Array) -> Array:
    """Frobenius norms of the traceless parts (what a commutator sees)."""
    n = matrices.shape[-1]
    trace = jnp.trace(matrices, axis1=-2, axis2=-1) / n
    eye = jnp.eye(n, dtype=matrices.dtype).reshape((1,) * (matrices.ndim - 2) + (n, n))
    traceless = matrices - trace[..., None, None] * eye
    return jnp.sqrt(jnp.sum(jnp.abs(traceless) ** 2, axis=(-2, -1)))


def _term_rates(coefficients: Array, norms: Array, commutes: bool) -> list[Array]:
    """The rates of terms $f_a M_a$: their functions' oscillation rates where the
    matrix acts, and for H the size of $\\mathrm{ad}_H$ per order."""
    nu = jnp.where(norms > 0, _frequencies(coefficients), 0)
    rates = [jnp.max(nu)]
    if commutes:
        sizes = jnp.sum(jnp.abs(coefficients) * norms[:, None], axis=0)
        m = jnp.arange(sizes.shape[0], dtype=sizes.dtype)
        rates.append(2 * jnp.max(sizes ** (1 / (m + 1))))
    return rates


def _sparse_norm(matrix: AbstractSparseMatrix, traceless: bool) -> Array:
    """The Frobenius norm of a sparse matrix, of its traceless part if asked:
    $\\|A - (\\mathrm{tr} A / n) I\\|^2 = \\|A\\|^2 - |\\mathrm{tr} A|^2 / n$."""
    norm = matrix.frobenius_norm()
    if not traceless:
        return norm
    n = matrix.shape[0]
    return jnp.sqrt(jnp.maximum(norm**2 - jnp.abs(matrix.trace()) ** 2 / n, 0))


def growth_rate(hamiltonian: TermSeries, observable: TermSeries | None) -> Array:
    """A cheap estimate of the rate at which the series of a hierarchy grow, from
    series of order 3 at scale 1: the size of $\\mathrm{ad}_H$ (its terms' traceless
    norms times their functions' coefficients, $\\|h_m\\|^{1/(m+1)}$) and the
    oscillation rates of the time functions whose matrices act at all."""
    rates = []
    for part, commutes in ((hamiltonian, True), (observable, False)):
        if part is None:
            continue
        norms = (
            _norms(part.matrices)
            if commutes
            else jnp.sqrt(jnp.sum(jnp.abs(part.matrices) ** 2, axis=(-2, -1)))
        )
        if part.coefficients.shape[0]:
            rates.extend(_term_rates(part.coefficients, norms, commutes))
        if part.sparse is not None:
            terms = part.sparse
            sparse_norms = jnp.stack(
                [_sparse_norm(m, commutes) for m in terms.matrices]
            ).astype(real_dtype(terms.coefficients.dtype))
            rates.extend(_term_rates(terms.coefficients, sparse_norms, commutes))
        if part.dense is not None:
            dense_norms = (
                _norms(part.dense)
                if commutes
                else jnp.sqrt(jnp.sum(jnp.abs(part.dense) ** 2, axis=(-2, -1)))
            )
            rates.append(_frequencies(dense_norms))
            if commutes:
                m = jnp.arange(dense_norms.shape[0], dtype=dense_norms.dtype)
                rates.append(2 * jnp.max(dense_norms ** (1 / (m + 1))))
    if not rates:
        return jnp.zeros(())
    rdtype = jnp.result_type(*[real_dtype(r.dtype) for r in rates])
    rate = jnp.max(jnp.stack([r.astype(rdtype) for r in rates]))
    return lax.stop_gradient(jnp.where(jnp.isfinite(rate), rate, 0))


def target_product(order: int, dtype) -> float:
    """The value of $\\rho s$ to aim at for order K in `dtype`: large enough that
    $(\\rho s)^K / K!$ stays above the smallest float, small enough that
    $e^{2 \\rho s}$, the largest coefficient in a level, stays below the largest."""
    info = np.finfo(real_dtype(dtype))
    log_max = math.log(float(info.max))
    log_tiny = math.log(float(info.tiny))
    lower = max(
        1.0, math.exp((math.lgamma(order + 1) + 0.5 * log_tiny) / max(order, 1))
    )
    return min(lower, log_max / 8)


def default_time_scale(rate: Array, order: int, dtype) -> Array:
    """$s = (\\rho s)_{target} / \\rho$, or 1 where the estimate is zero."""
    rdtype = real_dtype(dtype)
    rate = rate.astype(rdtype)
    target = target_product(order, dtype)
    scale = jnp.where(rate > 0, target / jnp.where(rate > 0, rate, 1), 1)
    # Snap to a power of two: multiplying by s is then exact.
    return lax.stop_gradient(jnp.exp2(jnp.round(jnp.log2(scale))).astype(rdtype))


def jump_rate(jumps: Sequence[TermSeries]) -> list[Array]:
    """Growth-rate estimates the jump operators add: their own (as a Hamiltonian's:
    norms and the frequencies of their time functions) and the dissipator's
    $2 \\sum_j \\|L_j\\|^2$."""
    rates = []
    total = None
    for jump in jumps:
        rates.append(growth_rate(jump, None))
        norm = jnp.sum(
            jnp.abs(jump.coefficients[:, 0]) * frobenius(jump.matrices, (1, 2))
        )
        if jump.dense is not None:
            norm = norm + frobenius(jump.dense[0], (0, 1))
        total = norm**2 if total is None else total + norm**2
    if total is not None:
        rates.append(jax.lax.stop_gradient(2 * total))
    return rates


def combined_rate(rates: list[Array]) -> Array:
    rdtype = jnp.result_type(*[real_dtype(r.dtype) for r in rates])
    return jnp.max(jnp.stack([r.astype(rdtype) for r in rates]))
