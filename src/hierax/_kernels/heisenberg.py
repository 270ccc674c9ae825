"""The level recursion of the Heisenberg hierarchy, on normalised series:
$X_k = \\mathcal{G}_t[X_{k-1}] + dX_{k-1}/dt$, each level carried as its truncated
Taylor series in scaled time with a power-of-two exponent per coefficient
(`taylor_levels`, the one level recursion), and its commutator step
$\\mathcal{G} * Y = [G, Y]$ for a generator with term structure
(`commutator_step`; `heisenberg_levels` puts the two together).

Every loop over orders is a `lax.fori_loop` or `lax.scan` over fixed-shape arrays,
so the traced program has the same size for every order K, and memory stays
O(K n^2). The direct recursion of the commutator is stable: each level's rounding
error is bounded relative to the level's own size and to the parts of H that act on
it. (Propagator conjugation, $V^{-1} X V$, is cheaper but cancels digits whenever
$\\|H\\|$ exceeds the frequencies the observable sees: offsets, spectators,
lab-frame energies.) The Lindblad levels (`lindblad.py`) run on the same recursion
with another step.
"""

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._core import by_batching
from .._data import TermSeries, exact_exp2, frobenius, real_dtype, times_exp


class Levels(NamedTuple):
    """Levels carried with a power-of-two exponent each: level k is
    `values[k] * 2**exponents[k]`, so that no intermediate overflows or underflows
    before the true value does; `errors[k]` estimates its relative rounding error
    (when asked for)."""

    values: Array
    exponents: Array
    errors: Array | None = None


# XLA's CPU runtime runs a sequence of operations in one thread when every array
# it touches is at most this many bytes, concurrently otherwise (see `run_if`).
_SEQUENTIAL_BYTES = 512

# Diagonals at or below this size are searched entry by entry (fused; no reduction
# or gather, each a kernel launch of its own for a handful of numbers).
_SMALL_SIZE = 4


def _diagonal_shift(matrices: Array) -> Array:
    """For each matrix, the diagonal entry nearest the middle of its diagonal's
    range: subtracting it removes a constant offset, and each difference
    $h_{ii} - h_{kk}$ is exact whenever the two are within a factor 2 of each other
    (Sterbenz), so the shift itself adds no rounding beyond what the commutator's
    own differences would have. (Subtracting the mean would: for diag(0, 1, 1000)
    the mean 333.67 is not representable, and 0 - 333.67 and 1 - 333.67 would each
    be rounded.)"""
    diagonal = jnp.diagonal(matrices, axis1=-2, axis2=-1)
    n = diagonal.shape[-1]
    if n <= _SMALL_SIZE:
        # The same choice entry by entry (first of equals), fused: no reductions.
        d = [diagonal[..., i] for i in range(n)]
        low = high = d[0].real
        for x in d[1:]:
            low, high = jnp.minimum(low, x.real), jnp.maximum(high, x.real)
        middle = low + (high - low) / 2
        best, distance = d[0], jnp.abs(d[0].real - middle)
        for x in d[1:]:
            closer = jnp.abs(x.real - middle) < distance
            best = jnp.where(closer, x, best)
            distance = jnp.where(closer, jnp.abs(x.real - middle), distance)
        return best
    low = jnp.min(diagonal.real, axis=-1, keepdims=True)
    high = jnp.max(diagonal.real, axis=-1, keepdims=True)
    middle = low + (high - low) / 2
    nearest = jnp.argmin(jnp.abs(diagonal.real - middle), axis=-1)
    return jnp.take_along_axis(diagonal, nearest[..., None], axis=-1)[..., 0]


def without_trace(terms: TermSeries) -> TermSeries:
    """The same series minus a multiple of the identity in each part: commutators
    do not change, and a constant offset $cI$ (or the common part of large level
    energies) no longer enters any product, so it cannot cost digits."""
    n = terms.matrices.shape[-1]
    eye = jnp.eye(n, dtype=terms.matrices.dtype)[None]
    shift = _diagonal_shift(terms.matrices)
    matrices = terms.matrices - shift[:, None, None] * eye
    dense = terms.dense
    if dense is not None:
        dense = dense - _diagonal_shift(dense)[:, None, None] * eye
    return TermSeries(terms.coefficients, matrices, dense, terms.constant)


# The exponent of a coefficient that is exactly zero: below every real one, so it
# never sets the scale of a sum, yet finite, so differences of exponents stay numbers.
_ZERO_EXPONENT = -1e9


def scale_exponents(level: Array, exponents: Array) -> Array:
    """`exponents`, with `_ZERO_EXPONENT` where a coefficient is exactly zero: what
    may set the scale of a sum."""
    size = jnp.max(jnp.abs(level), axis=tuple(range(1, level.ndim)))
    return jnp.where(size > 0, exponents, _ZERO_EXPONENT)


def times_powers_of_two(x: Array, e: Array) -> Array:
    """`x[j] * 2**e[j]` along the leading axis (exact, bar underflow)."""
    factor = exact_exp2(e, real_dtype(x.dtype)).astype(x.dtype)
    return x * factor.reshape((-1,) + (1,) * (x.ndim - 1))


# The work of a full-width run, about K^2 n^2 (n + K) (each level's matrix products
# and its Cauchy sums with the time functions' series), per phase added: each phase
# saves work but is one more copy of the loop body to compile (about 0.5 s on a CPU),
# so small problems take one phase and larger ones one more per doubling.
_WORK_PER_PHASE = 2**25


def _phases(order: int, size: int) -> list[tuple[int, int, int]]:
    """Split levels 1..K into phases `(first, last, width)`. Level k needs the
    coefficients j <= K - k only, so a phase carries what its first level needs
    (plus one, see `heisenberg_levels`): with 8 phases about 0.56 K^2 coefficient
    updates in all instead of K^2. The number of phases, and so the program size,
    is at most 8 whatever K; it grows with the log of the work (`size` n), so the
    seed compiles one phase up to K = 200 and n = 128 at K = 40 eight."""
    work = order**2 * size**2 * (size + order)
    count = 1 + max(0, int(math.log2(max(work, 1) / _WORK_PER_PHASE)))
    count = min(order, 8, count)
    bounds = [1 + (order * i) // count for i in range(count)] + [order + 1]
    return [
        (first, stop - 1, order - first + 2)
        for first, stop in zip(bounds[:-1], bounds[1:], strict=True)
        if stop > first
    ]


def toeplitz(coefficients: Array, width: int) -> Array:
    """`T[a, j, m] = c[a, j - m]` for m <= j < width, else 0: the Cauchy product
    with each scalar series as one small matrix product."""
    j = np.arange(width)
    diff = j[:, None] - j[None, :]
    taken = coefficients[:, np.clip(diff, 0, None).astype(np.int32)]
    return jnp.where(jnp.asarray(diff >= 0), taken, jnp.zeros_like(taken))


def weighted_sums(t: Array, level: Array) -> Array:
    """`z[a, j] = sum_m t[a, j, m] level[m]`; real weights act on the real and
    imaginary parts separately (half the arithmetic of a complex product)."""
    if jnp.iscomplexobj(t) or not jnp.iscomplexobj(level):
        return jnp.einsum("ajm,mnp->ajnp", t.astype(level.dtype), level)
    real = jnp.einsum("ajm,mnp->ajnp", t, level.real)
    imag = jnp.einsum("ajm,mnp->ajnp", t, level.imag)
    return lax.complex(real, imag)


def lower_shifts(exponents: Array, out_exponents: Array, dtype: Any) -> Array:
    """`shift[j, m]` $= 2^{\\min(E_m - F_j, 0)}$ for $m \\le j$, else 0 (`dtype`,
    exact powers of two): what brings coefficient m of a level, carried at the
    power of two $E_m$, to output coefficient j, carried at $F_j$, in a Cauchy
    product."""
    width = exponents.shape[0]
    shift = exact_exp2(
        jnp.minimum(exponents[None, :] - out_exponents[:, None], 0), dtype
    )
    return jnp.where(np.tri(width, dtype=bool), shift, 0)


def operator_norm_bound(matrices: Array) -> Array:
    """A cheap bound on the spectral norm of each matrix, the smaller of its
    Frobenius norm and $\\sqrt{\\|G\\|_1 \\|G\\|_\\infty}$ (tight for diagonal and
    permutation-like matrices): it bounds $\\|G z\\|_F / \\|z\\|_F$."""
    a = jnp.abs(matrices)
    one = jnp.max(jnp.sum(a, axis=-2), axis=-1)
    infinity = jnp.max(jnp.sum(a, axis=-1), axis=-1)
    return jnp.minimum(frobenius(matrices, (-2, -1)), jnp.sqrt(one * infinity))


def _parts(x: Array) -> tuple[Array, Array]:
    return jnp.real(x), jnp.imag(x)


def _fused_product(a, b, left: bool) -> tuple[Array, Array]:
    """`sum_a Z_a G_a` (or, `left`, `sum_a G_a Z_a`) for a stack of levels Z (B, W,
    n, n) and matrices G (B, n, n), complex, given as (real, imaginary) parts, as
    elementwise sums over the contracted index, which the compiler fuses with what
    follows (no matrix product, each a kernel of its own)."""

    def einsum(x, y):
        if left:  # x: G (B, n, n), y: Z
            terms = [
                x[:, None, :, m, None] * y[:, :, m, None, :] for m in range(x.shape[-1])
            ]
        else:  # x: Z, y: G
            terms = [
                x[:, :, :, p, None] * y[:, None, None, p, :] for p in range(y.shape[-1])
            ]
        return sum(terms[1:], terms[0]).sum(0)

    (a_re, a_im), (b_re, b_im) = a, b
    re = einsum(a_re, b_re) - einsum(a_im, b_im)
    im = einsum(a_re, b_im) + einsum(a_im, b_re)
    return re, im


def _cauchy_sum(
    coefficients: Array, exponents: Array, out: Array, x: Array, small: bool
) -> Array:
    """`z[a, j] = sum_{m <= j} c[a, j - m] 2^(min(E_m - F_j, 0)) x[m]`: the Cauchy
    product of each real scalar series c (B, W) with a real series of matrices x
    (W, n, n), whose coefficient m carries the power of two E_m (`exponents`),
    output coefficient j the power F_j (`out`).

    `small`: as one fused elementwise expression in which no W x W array is
    stored (see `run_if` for why bytes count); otherwise as one matrix product."""
    width = x.shape[0]
    if not small:
        shift = lower_shifts(exponents, out, exponents.dtype)
        weights = toeplitz(coefficients, width) * shift[None]
        return jnp.einsum("ajm,mnp->ajnp", weights, x)
    # Summed over the lag d = j - m, reading the level's coefficients through a
    # window instead of forming a Toeplitz matrix of the series, which the
    # compiler would store, loop invariant, outside the loop. The exponents are
    # integers within int32 (`_ZERO_EXPONENT` included): gathered as such, their
    # window takes half the bytes (see `run_if`).
    j, d = np.arange(width)[:, None], np.arange(width)[None, :]
    source = np.clip(j - d, 0, None).astype(np.int32)  # m = j - d
    window = exponents.astype(jnp.int32)[source].astype(exponents.dtype)
    shift = jnp.where(d <= j, exact_exp2(jnp.minimum(window - out[:, None], 0)), 0)
    window = (shift[:, :, None, None] * x[source])[None]  # (1, W, W, n, n): [j, d]
    terms = coefficients[:, None, :, None, None] * window
    return jnp.sum(terms, axis=2)


def _complex_cauchy_sums(
    coefficients: Array,
    exponents: Array,
    out: Array,
    re: Array,
    im: Array,
    small: bool,
) -> tuple[Array, Array]:
    """`_cauchy_sum` of a complex level given as parts, with real or complex
    series; the sums as parts."""
    sums = functools.partial(_cauchy_sum, exponents=exponents, out=out, small=small)
    if not jnp.iscomplexobj(coefficients):
        return sums(coefficients, x=re), sums(coefficients, x=im)
    c_re, c_im = coefficients.real, coefficients.imag
    return (
        sums(c_re, x=re) - sums(c_im, x=im),
        sums(c_re, x=im) + sums(c_im, x=re),
    )


def _pack(re: Array, im: Array) -> Array:
    """A Hermitian matrix as one real matrix: its real part on and above the
    diagonal, its imaginary part below (the rest follows from symmetry)."""
    n = re.shape[-1]
    return jnp.where(np.triu(np.ones((1, n, n), bool)), re, im)


def _unpack(packed: Array) -> tuple[Array, Array]:
    """The real and imaginary parts of the Hermitian matrices `_pack` packed."""
    n = packed.shape[-1]
    lead = (1,) * (packed.ndim - 2)
    upper = np.triu(np.ones((n, n), bool)).reshape(lead + (n, n))
    swapped = jnp.swapaxes(packed, -1, -2)
    re = jnp.where(upper, packed, swapped)
    im = jnp.where(upper, -swapped, packed)
    return re, jnp.where(np.eye(n, dtype=bool).reshape(lead + (n, n)), 0, im)


# A level's coefficients j < W as real and imaginary parts `(re, im)`, shape
# `(W, n, n)` each, with their power-of-two exponents E (`exponents`) and those of
# the output F (`out`): `PhaseStep(re, im, exponents, out, magnitude)` gives the
# coefficients of $\mathcal{G}(\sigma) * Y(\sigma)$ (the Cauchy product of a linear
# generator's series with the level's) times $2^{-F_j}$, as parts, and with
# `magnitude` the size of what its products add up per coefficient (else None).
# A `LevelStep` is called once per phase with the phase's width, outside the loop,
# so that what the step reads (merged matrices, their parts, the series cut to the
# width) is formed once and closed over.
PhaseStep = Callable[
    [Array, Array, Array, Array, bool], tuple[Array, Array, Array | None]
]
LevelStep = Callable[[int], PhaseStep]


def _sizes(re: Array, im: Array) -> Array:
    """The largest entry (in modulus) of each coefficient."""
    return jnp.max(jnp.abs(lax.complex(re, im)), axis=(1, 2))


def _normalise(re: Array, im: Array, size: Array) -> tuple[Array, Array, Array]:
    """Each coefficient divided by the power of two nearest its largest entry
    (`size`), and those exponents. A coefficient that is exactly zero (or not
    finite) gets the smallest exponent of the others, so its weight in later sums
    is at most 1 and its derivative flows exactly (no mask). The exponents have no
    gradient of their own: any power of two gives the same product."""
    rdtype = re.dtype
    usable = jnp.isfinite(size) & (size > 0)
    e = jnp.round(jnp.log2(jnp.where(usable, size, 1)))
    smallest = jnp.min(jnp.where(usable, e, jnp.inf))
    smallest = jnp.where(jnp.isfinite(smallest), smallest, 0)
    e = lax.stop_gradient(jnp.where(usable, e, smallest).astype(rdtype))
    factor = exact_exp2(-e)[:, None, None]
    return re * factor, im * factor, e


def _frobenius(re: Array, im: Array, axes: tuple[int, int]) -> Array:
    return jnp.sqrt(jnp.sum(re * re + im * im, axis=axes))


def taylor_levels(
    step: LevelStep,
    observable: Array,
    order: int,
    estimate: bool = False,
) -> Levels:
    """$X_k / k!$ for $k = 0..K$ by the direct Taylor recursion
    $X_k = \\mathcal{G}_t[X_{k-1}] + dX_{k-1}/dt$ of a linear generator whose series
    `step` applies, in scaled time: the one level recursion of the Heisenberg and
    Lindblad hierarchies.

    For the Heisenberg hierarchy `step` is the commutator with the series of
    $G(\\sigma) = i s H(t + s\\sigma)$ (`commutator_step`); `observable` is the
    series of $X_0(t + s\\sigma)$, shape `(K+1, n, n)`, or `(1, n, n)` when both are
    constant (then every level is one coefficient: nested commutators). Level k is
    carried as the series
    $u^{(k)}_j = s^{k+j} x^{(k)}_j / k!$, which obeys
    $u^{(k)} = \\big(\\mathcal{G} * u^{(k-1)} + d u^{(k-1)}/d\\sigma\\big) / k$
    ($\\mathcal{G} * u = [G, u]$ for the Heisenberg hierarchy), and
    $u^{(k)}_0 = s^k X_k / k!$. Each coefficient j of the carried level is
    `hat[j] * 2**E[j]`, its largest entry near 1: a level's coefficients span many
    decades at high orders (the series of $X_0$ alone falls like $1/j!$), more than
    one exponent per level holds.

    Level k needs its coefficients $j \\le K - k$, and coefficient j needs
    coefficients $j$ and $j + 1$ of the level before. Within a phase the carried
    width is fixed; the top coefficients, which would need one more than is carried,
    are computed from a zero in its place and are wrong, but every level reads them
    only for coefficients it does not need, so the needed triangle is exact.

    Cost: about $0.56 K^2$ coefficient updates for large matrices ($K^2$ for small
    ones, see `_phases`), each what one `step` costs per coefficient (for the
    commutator one matrix product per term, `hermitian_levels`, or two).

    Complex numbers are carried as their real and imaginary parts, two real arrays
    (a complex product is four real ones, the same arithmetic): XLA's CPU runtime
    runs a sequence of operations in one thread only when each touches at most 512
    bytes, and the seed's level, ten complex 2 x 2 matrices, is 640 bytes, its
    parts 320 each (see `run_if`). Each level's exponents, scales and floor are
    carried instead of recomputed, and the scan collects the outputs: a small
    hierarchy's call costs what this loop costs.

    One function on purpose (longer than the house's 80 lines): the scan body of
    each phase closes over that phase's constants (widths, factors, the step);
    split up, the same arrays would pass through every piece, and the body is what
    XLA fuses.

    With `estimate`, `Levels.errors` holds a running estimate of each level's
    relative rounding error: level k adds $u\\,(M_k / \\|u^{(k)}\\| + 2)$, $u$ the unit
    roundoff, where $M_k$ is the size of what its products and derivative add up
    (so a level that cancels, small against its parts, is charged for it), to the
    estimate of level k-1.
    """
    rdtype = real_dtype(observable.dtype)
    n = observable.shape[-1]
    # Unit roundoff u = eps / 2: a product of matrices errs by about u times the
    # size of what it adds up, and the level's own additions and division by k
    # add about 2u relative.
    unit = float(np.finfo(rdtype).eps) / 2
    re, im = jnp.real(observable).astype(rdtype), jnp.imag(observable).astype(rdtype)
    size = _sizes(re, im)
    re, im, exponents = _normalise(re, im, size)
    scales = jnp.where(size > 0, exponents, _ZERO_EXPONENT)
    values = [(re[:1], im[:1])]
    out_exponents = [exponents[:1]]
    errors = [jnp.full((1,), unit, rdtype)]
    error = jnp.asarray(unit, rdtype)
    constant_series = observable.shape[0] == 1
    phases = [(1, order, 1)] if constant_series else _phases(order, n)
    for first, last, width in phases:
        re, im = re[:width], im[:width]
        exponents, scales = exponents[:width], scales[:width]
        floor = jnp.min(exponents)
        factor = np.arange(1, width + 1)
        log_factor = jnp.asarray(np.round(np.log2(factor)), rdtype)
        factor = jnp.asarray(factor, rdtype)
        phase_step = step(width)

        def body(carry, k, factor=factor, log_factor=log_factor, step=phase_step):
            re, im, exponents, scales, floor, error = carry
            # The derivative's coefficient j is (j+1) y_{j+1}: its exponent, with
            # nothing above the top coefficient. Output exponents: the largest input
            # exponent any coefficient reads, never below the smallest carried one
            # (so every weight is <= 1).
            above = jnp.concatenate([exponents[1:], floor[None]])
            above_scale = jnp.concatenate(
                [scales[1:], jnp.full((1,), _ZERO_EXPONENT, rdtype)]
            )
            out = jnp.maximum(lax.cummax(scales), above_scale + log_factor)
            out = jnp.maximum(out, floor)
            weight = factor * exact_exp2(jnp.minimum(above - out, 0))

            def derivative(x):
                shifted = jnp.concatenate([x[1:], jnp.zeros_like(x[:1])])
                return shifted * weight[:, None, None]

            # The generator's part first, then the derivative: G z and z G may be
            # large and cancel (lab-frame energies), the derivative must not round
            # first.
            grown_re, grown_im, magnitude = step(re, im, exponents, out, estimate)
            d_re, d_im = derivative(re), derivative(im)
            inverse = 1 / k.astype(rdtype)
            grown_re = (grown_re + d_re) * inverse
            grown_im = (grown_im + d_im) * inverse
            size = _sizes(grown_re, grown_im)
            if estimate:
                assert magnitude is not None
                magnitude = magnitude + _frobenius(d_re, d_im, (1, 2))
                # Whole-level sizes, each coefficient at its own power of two.
                weights = exact_exp2(out - jnp.max(out))
                own = jnp.sum(_frobenius(grown_re, grown_im, (1, 2)) * weights)
                total = jnp.sum(magnitude * weights) * inverse
                error = error + jnp.where(total > 0, unit * (total / own + 2), 0)
            re, im, e = _normalise(grown_re, grown_im, size)
            exponents = out + e
            scales = jnp.where(size > 0, exponents, _ZERO_EXPONENT)
            floor = jnp.min(exponents)
            carry = (re, im, exponents, scales, floor, error)
            return carry, (re[0], im[0], exponents[0], error)

        steps = np.arange(first, last + 1)  # a constant, not an iota
        carry, (new_re, new_im, new_exponents, new_errors) = lax.scan(
            body, (re, im, exponents, scales, floor, error), steps
        )
        re, im, exponents, scales, _, error = carry
        values.append((new_re, new_im))
        out_exponents.append(new_exponents)
        errors.append(new_errors)
    value = lax.complex(
        jnp.concatenate([r for r, _ in values]), jnp.concatenate([i for _, i in values])
    )
    return Levels(
        value,
        jnp.concatenate(out_exponents),
        jnp.concatenate(errors) if estimate else None,
    )


def commutator_step(
    generator: TermSeries,
    dtype: Any,
    hermitian_levels: bool,
    small: bool = False,
    right: TermSeries | None = None,
) -> LevelStep:
    """The step $Y \\mapsto [G(\\sigma), Y(\\sigma)]$ of `taylor_levels` for a series G
    with term structure, in the levels' complex `dtype`.

    With $g_m = \\sum_a c_{a,m} G_a + D_m$:
    $\\sum_m [g_m, y_{j-m}] = \\sum_a [G_a, z_{a,j}] + \\sum_m [D_m, y_{j-m}]$ with
    $z_{a,j} = \\sum_m c_{a,j-m} y_m$ (scalar-weighted sums of matrices, the weights
    $c_{a,j-m} 2^{E_m - F_j}$ carrying the powers of two; for the terms that are
    constant by structure, merged into one matrix first, simply $y_j$). A term then
    costs two matrix products per coefficient, and one when `hermitian_levels` ($G_a$
    anti-Hermitian, as $iH$ is, real series, and every $z$ Hermitian:
    $[G_a, z] = -(z G_a + (z G_a)^\\dagger)$, and z summed packed as one real
    matrix, `_pack`).

    With `right` (the same coefficients and constant flags, other matrices $R_a$ and
    dense part $R_m$), the product $G Y - Y R$ instead: the Lindblad generator
    $i[H, X] - \\{N, X\\}/2$ is $G = iH - N/2$, $R = iH + N/2$. The `hermitian_levels`
    shortcut then needs $\\sum_a G_a z_a = -(\\sum_a z_a R_a)^\\dagger$, which holds
    for $R = -G^\\dagger$ and Hermitian levels.

    The magnitude (`PhaseStep`) is $\\sum_a p \\|G_a\\|_2 \\|z_{a,j}\\|_F 2^{-F_j}$
    ($p$ the number of products per term, 1 or 2), which bounds their rounding.

    `small`: the Cauchy sums and products as fused elementwise sums, so no K x K
    weight matrix is ever stored (a problem whose every array fits XLA:CPU's
    one-thread limit, see `heisenberg_levels`); otherwise as matrix products, with
    the Cauchy weights formed once per level."""
    rdtype = real_dtype(dtype)
    right_matrices = generator.matrices if right is None else right.matrices
    flags = generator.constant_flags()
    fixed = [a for a, c in enumerate(flags) if c]
    varying = [a for a, c in enumerate(flags) if not c]
    terms = []
    if fixed:
        idx = np.asarray(fixed)
        c = generator.coefficients[idx, 0].astype(dtype)
        left = jnp.einsum("a,anm->nm", c, generator.matrices[idx].astype(dtype))[None]
        merged_right = (
            left
            if right is None
            else jnp.einsum("a,anm->nm", c, right_matrices[idx].astype(dtype))[None]
        )
        terms.append(_Term(left, merged_right, None))
    if varying:
        idx = np.asarray(varying)
        left = generator.matrices[idx].astype(dtype)
        terms.append(
            _Term(left, right_matrices[idx].astype(dtype), generator.coefficients[idx])
        )
    dense = None if generator.dense is None else generator.dense.astype(dtype)
    dense_right = dense
    if right is not None and dense is not None:
        assert right.dense is not None, "`right` needs a dense part where G has one"
        dense_right = right.dense.astype(dtype)

    def bound(term: _Term) -> Array:
        # The size of what a term's products add up, per unit of ||z||_F.
        if hermitian_levels:
            return operator_norm_bound(term.right)
        if right is None:
            return 2 * operator_norm_bound(term.left)
        return operator_norm_bound(term.left) + operator_norm_bound(term.right)

    def phase(width: int) -> PhaseStep:
        phase_terms = [
            term._replace(coefficients=term.coefficients[:, :width])
            if term.coefficients is not None
            else term
            for term in terms
        ]

        def apply(re, im, exponents, out, magnitude):
            grown_re, grown_im = jnp.zeros_like(re), jnp.zeros_like(im)
            size = jnp.zeros((width,), rdtype) if magnitude else None
            for term in phase_terms:
                c = term.coefficients
                if c is None:
                    shift = exponents - out
                    z = [times_powers_of_two(x, shift)[None] for x in (re, im)]
                elif hermitian_levels and not jnp.iscomplexobj(c):
                    # Real series and a Hermitian level: the sums are Hermitian,
                    # and summing the level packed as one real matrix halves the
                    # work.
                    z = _unpack(_cauchy_sum(c, exponents, out, _pack(re, im), small))
                else:
                    z = _complex_cauchy_sums(c, exponents, out, re, im, small)
                c_re, c_im = _term_commutator(term, z, hermitian_levels, small)
                grown_re, grown_im = grown_re + c_re, grown_im + c_im
                if size is not None:
                    grown = _frobenius(z[0], z[1], (2, 3))
                    size = size + jnp.sum(bound(term)[:, None] * grown, 0)
            if dense is not None and dense_right is not None:
                level = lax.complex(re, im)
                extra, size = _dense_commutator(
                    dense, dense_right, right is None, level, exponents, out, size
                )
                grown_re, grown_im = grown_re + extra.real, grown_im + extra.imag
            return grown_re, grown_im, size

        return apply

    return phase


class _Term(NamedTuple):
    """Matrices `(B, n, n)` of a generator's terms on the left and the right, and
    their coefficient series `(B, K + 1)` (`None` for the constant ones, merged)."""

    left: Array
    right: Array
    coefficients: Array | None


def _term_commutator(
    term: _Term, z: Any, hermitian_levels: bool, small: bool
) -> tuple[Array, Array]:
    """$\\sum_a (G_a z_a - z_a R_a)$ for the sums z (parts, `(B, W, n, n)` each)."""
    if small:
        p_re, p_im = _fused_product(z, _parts(term.right), False)
        if hermitian_levels:
            # [G, z] = -(z G + (z G)^dagger) for anti-Hermitian G and Hermitian z:
            # one product.
            return -(p_re + jnp.swapaxes(p_re, -1, -2)), -(
                p_im - jnp.swapaxes(p_im, -1, -2)
            )
        l_re, l_im = _fused_product(_parts(term.left), z, True)
        return l_re - p_re, l_im - p_im
    # One complex product per side: as fast as four real ones of the same size or
    # faster (n = 4..32, measured).
    zc = lax.complex(*z)
    p = jnp.einsum("ajmp,apq->jmq", zc, term.right)
    if hermitian_levels:
        grown = -(p + jnp.conj(jnp.swapaxes(p, -1, -2)))
    else:
        grown = jnp.einsum("anm,ajmp->jnp", term.left, zc) - p
    return jnp.real(grown), jnp.imag(grown)


def _dense_commutator(
    dense: Array,
    dense_right: Array,
    same: bool,
    level: Array,
    exponents: Array,
    out_exponents: Array,
    size: Array | None,
) -> tuple[Array, Array | None]:
    """$\\sum_{m \\le j} (D_m y_{j-m} - y_{j-m} R_m) 2^{E_{j-m} - F_j}$ for a dense
    series $D_m$ (`dense`, and `dense_right` $R_m$; `same` when they are one), one
    order m at a time, and the size of what it adds up into `size`."""
    width = level.shape[0]
    rdtype = real_dtype(level.dtype)

    def add(m, carry):
        out, size = carry
        shifted = jnp.roll(level, m, axis=0)
        e = jnp.roll(exponents, m) - out_exponents
        keep = jnp.arange(width) >= m
        weight = jnp.where(keep, exact_exp2(jnp.minimum(e, 0), rdtype), 0)
        shifted = shifted * weight.astype(level.dtype)[:, None, None]
        d, r = dense[m], dense_right[m]
        left = jnp.einsum("nm,jmp->jnp", d, shifted)
        out = out + left - jnp.einsum("jnm,mp->jnp", shifted, r)
        if size is not None:
            if same:
                bound = 2 * operator_norm_bound(d[None])[0]
            else:
                bound = operator_norm_bound(jnp.stack([d, r])).sum()
            size = size + bound * frobenius(shifted, (1, 2))
        return out, size

    steps = min(width, dense.shape[0])
    return lax.fori_loop(0, steps, add, (jnp.zeros_like(level), size))


def heisenberg_levels(
    generator: TermSeries,
    observable: Array,
    order: int,
    hermitian_levels: bool,
    estimate: bool = False,
) -> Levels:
    """$X_k / k!$ for $k = 0..K$: `taylor_levels` with the commutator step
    (`commutator_step`; `hermitian_levels` as there).

    A problem small enough for every array to stay within XLA:CPU's one-thread
    limit (see `run_if`) forms its Cauchy sums and products as fused elementwise
    sums, each recomputing what it needs (few operations, few bytes); under
    `jax.vmap` it takes the matrix products instead (`by_batching`), and its
    derivatives are theirs (a 2 x 2 hierarchy's gradient, order 4..9: 1.3-1.5 s
    to compile against 1.7-2.1 s through the fused sums, and faster). Otherwise
    (larger matrices, more terms, higher orders, dense parts, the error estimate)
    matrix products, with the Cauchy weights formed once per level: the elementwise
    sums cost O(K^2 n^2) each and were 2-7x slower there (the seed under vmap: 20
    against 30 us per time; one call 108 against 200 us)."""
    dtype = jnp.result_type(observable, generator.matrices, 1j)
    n = observable.shape[-1]
    count = max(1, sum(1 for c in generator.constant_flags() if not c))
    widest = observable.shape[0]  # the first phase's width
    small = (
        not estimate
        and generator.dense is None
        and n <= _SMALL_SIZE
        and widest * widest * 4 <= _SEQUENTIAL_BYTES  # the int32 exponent window
        and count * widest * n * n * np.dtype(real_dtype(dtype)).itemsize
        <= _SEQUENTIAL_BYTES
    )
    if not small:
        step = commutator_step(generator, dtype, hermitian_levels)
        return taylor_levels(step, observable, order, estimate)
    constant = generator.constant

    def layout(fused: bool):
        def levels(coefficients, matrices, observable):
            series = TermSeries(coefficients, matrices, None, constant)
            step = commutator_step(series, dtype, hermitian_levels, fused)
            values, exponents, _ = taylor_levels(step, observable, order)
            return values, exponents

        return levels

    run = by_batching(layout(True), layout(False), differentiate_batched=True)
    return Levels(*run(generator.coefficients, generator.matrices, observable))


def log_factorials(order: int, dtype) -> Array:
    """$\\log k!$ for k = 0..K, computed once in float64 from exact integers."""
    j = np.arange(1, order + 1, dtype=np.float64)
    return jnp.asarray(np.concatenate([[0.0], np.cumsum(np.log(j))]), dtype)


def level_factors(levels: Levels, normalised: bool) -> Array:
    """The natural log of the factor each carried level is multiplied by on the
    way out (`finish_levels`)."""
    order = levels.values.shape[0] - 1
    rdtype = real_dtype(levels.values.dtype)
    exponent = levels.exponents * math.log(2.0)
    if not normalised:
        exponent = exponent + log_factorials(order, rdtype)
    return exponent


def finish_errors(levels: Levels, normalised: bool) -> Array:
    """The relative error estimate per returned level: the carried estimate plus the
    rounding of the log-space factor, $\\epsilon\\,(1 + |\\log\\text{factor}|)$."""
    rdtype = real_dtype(levels.values.dtype)
    eps = float(np.finfo(rdtype).eps)
    factors = jnp.abs(level_factors(levels, normalised))
    assert levels.errors is not None
    return levels.errors + eps * (1 + factors)


def finish_levels(levels: Levels, normalised: bool) -> Array:
    """The levels as returned: $X_k / k!$ (`normalised`) or $X_k$, from the carried
    `values * 2**exponents` $= X_k / k!$, with every factor applied in log space
    (see `times_exp`): a level is inf or 0 only where its true value is."""
    return times_exp(levels.values, level_factors(levels, normalised))


def scaled_generator(h: TermSeries, scale: Array, dtype: Any) -> TermSeries:
    """The series of $G(\\sigma) = i s H(t + s\\sigma)$, shifted by a multiple of
    the identity (see `without_trace`): $s$ goes into the scalar coefficients (kept
    real where they are), $i$ into the matrices."""
    rdtype = jnp.finfo(dtype).dtype
    complex_coefficients = jnp.iscomplexobj(h.coefficients)
    coefficients = h.coefficients.astype(dtype if complex_coefficients else rdtype)
    h = without_trace(
        TermSeries(
            coefficients,
            h.matrices.astype(dtype),
            None if h.dense is None else h.dense.astype(dtype),
            h.constant,
        )
    )
    dense = None if h.dense is None else 1j * scale * h.dense
    return TermSeries(h.coefficients * scale, 1j * h.matrices, dense, h.constant)
