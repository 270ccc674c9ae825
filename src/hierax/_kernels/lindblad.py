"""The Heisenberg-picture Lindblad generator as a step of the level recursion
(`heisenberg.taylor_levels`).

The generator's Hamiltonian part and the anticommutator with
$N = \\sum_j L_j^\\dagger L_j$ together are one product $G Y - Y R$ with a term
structure (`commutator_step` with other right-hand matrices); the sandwiches
$L^\\dagger Y L$ are two products in a row, each a Cauchy product of the jump
operator's series with a series of matrices, so a jump operator
$\\sum_b f_b(t) A_b$ costs $2B$ matrix products per coefficient, not $2B^2$.
"""

from collections.abc import Sequence
from typing import Any

import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._data import TermSeries, frobenius, real_dtype, scalar_cauchy_product
from .heisenberg import (
    Levels,
    PhaseStep,
    commutator_step,
    heisenberg_levels,
    lower_shifts,
    operator_norm_bound,
    scale_exponents,
    taylor_levels,
    times_powers_of_two,
    toeplitz,
    weighted_sums,
)


def dagger(m: Array) -> Array:
    return jnp.conj(jnp.swapaxes(m, -1, -2))


def _dense_cauchy_adjoint(series: Array) -> Array:
    """$N_m = \\sum_{p \\le m} l_p^\\dagger l_{m-p}$ for a dense series l (a callable
    jump operator): one batch of products per p, computed once per call."""
    width = series.shape[0]
    index = jnp.arange(width)

    def add(p, total):
        shifted = jnp.roll(series, p, axis=0)
        shifted = jnp.where((index >= p)[:, None, None], shifted, 0)
        return total + jnp.einsum("mn,jmq->jnq", jnp.conj(series[p]), shifted)

    return lax.fori_loop(0, width, add, jnp.zeros_like(series))


def number_series(jumps: Sequence[TermSeries], dtype: Any) -> TermSeries:
    """The series of $N = \\sum_j L_j^\\dagger L_j$ with term structure: the pairs
    $A_a^\\dagger A_b$ of each jump operator's terms, with the Cauchy products
    $\\overline{f_a} f_b$ as coefficients (constant where both are; the conjugate of
    a series at real t is the series of the conjugate); a jump operator with a dense
    part enters wholly as a dense series."""
    n = jumps[0].matrices.shape[-1]
    coefficients, matrices, constant, dense = [], [], [], None
    for jump in jumps:
        if jump.dense is not None:
            part = _dense_cauchy_adjoint(jump.full().astype(dtype))
            dense = part if dense is None else dense + part
            continue
        flags = jump.constant_flags()
        c = jump.coefficients
        a = jump.matrices.astype(dtype)
        for i in range(c.shape[0]):
            for j in range(c.shape[0]):
                coefficients.append(scalar_cauchy_product(jnp.conj(c[i]), c[j]))
                matrices.append(dagger(a[i]) @ a[j])
                constant.append(flags[i] and flags[j])
    width = jumps[0].coefficients.shape[-1] if dense is None else dense.shape[0]
    if coefficients:
        coefficient_dtype = jnp.result_type(*coefficients)
        stacked = jnp.stack([c.astype(coefficient_dtype) for c in coefficients])
        stacked_matrices = jnp.stack(matrices)
    else:
        stacked = jnp.zeros((0, width), real_dtype(dtype))
        stacked_matrices = jnp.zeros((0, n, n), dtype)
    return TermSeries(stacked, stacked_matrices, dense, tuple(constant))


def scaled_series(terms: TermSeries, scale: Array) -> TermSeries:
    """The series of $s\\,L(t + s\\sigma)$ (s a power of two: exact)."""
    dense = None if terms.dense is None else terms.dense * scale
    return TermSeries(terms.coefficients * scale, terms.matrices, dense, terms.constant)


def two_sided(
    hamiltonian: TermSeries, number: TermSeries, sign: float
) -> tuple[TermSeries, TermSeries]:
    """Left and right parts $(G, R)$ of $Y \\mapsto G Y - Y R$ for the Hamiltonian
    part (the commutator with `hamiltonian`, already $\\pm i s H$ with its trace part
    removed) plus `sign` times the anticommutator with $s N / 2$ (`number`, already
    times s): the terms of both side by side, constant ones merged by the kernel.
    Only the Hamiltonian is shifted by a multiple of the identity: the commutator
    does not see it, the anticommutator would."""
    dtype = hamiltonian.matrices.dtype
    half = number.matrices.astype(dtype) * (sign / 2)
    coefficients = jnp.concatenate(
        [
            hamiltonian.coefficients,
            number.coefficients.astype(
                jnp.result_type(hamiltonian.coefficients, number.coefficients)
            ),
        ]
    )
    constant = hamiltonian.constant_flags() + number.constant_flags()
    dense_left = dense_right = hamiltonian.dense
    if number.dense is not None:
        d = number.dense.astype(dtype) * (sign / 2)
        base = jnp.zeros_like(d) if hamiltonian.dense is None else hamiltonian.dense
        dense_left, dense_right = base + d, base - d
    left = TermSeries(
        coefficients,
        jnp.concatenate([hamiltonian.matrices, half]),
        dense_left,
        constant,
    )
    right = TermSeries(
        coefficients,
        jnp.concatenate([hamiltonian.matrices, -half]),
        dense_right,
        constant,
    )
    return left, right


def _right_product(
    jump: TermSeries,
    level: Array,
    exponents: Array,
    out_exponents: Array,
    magnitude: bool,
    carried: Array | None = None,
) -> tuple[Array, Array | None]:
    """Coefficients $j < W$ of $(Y L)(\\sigma) \\cdot 2^{-F_j}$ for a level
    $y_m = \\hat y_m 2^{E_m}$: $\\sum_b z_{b,j} A_b$ with the scalar-weighted sums
    $z_{b,j} = \\sum_m c_{b,j-m} 2^{E_m - F_j} \\hat y_m$ (one product per term and
    coefficient; constant terms merged first), plus the dense part term by term.

    With `magnitude`, also the size of what the products add up per coefficient,
    $\\sum_b \\|A_b\\|_2 (\\|z_{b,j}\\|_F + \\sum_m |w_{b,j,m}|\\,\\text{carried}_m)$:
    `carried` is the size already committed to each input coefficient (the first
    product's, for the second), which the product carries along."""
    width = level.shape[0]
    rdtype = real_dtype(level.dtype)
    shift = lower_shifts(exponents, out_exponents, rdtype)
    flags = jump.constant_flags()
    fixed = [a for a, c in enumerate(flags) if c]
    varying = [a for a, c in enumerate(flags) if not c]
    out = jnp.zeros_like(level)
    size = jnp.zeros((width,), rdtype) if magnitude else None
    if fixed:
        idx = np.asarray(fixed)
        merged = jnp.einsum(
            "a,anm->nm", jump.coefficients[idx, 0], jump.matrices[idx]
        ).astype(level.dtype)
        diagonal = exponents - out_exponents
        z = times_powers_of_two(level, diagonal)
        out = out + jnp.einsum("jnm,mp->jnp", z, merged)
        if size is not None:
            grown = frobenius(z, (1, 2))
            if carried is not None:
                grown = grown + jnp.exp2(diagonal) * carried
            size = size + operator_norm_bound(merged[None])[0] * grown
    if varying:
        idx = np.asarray(varying)
        t = toeplitz(jump.coefficients[idx, :width], width) * shift[None]
        z = weighted_sums(t, level)
        out = out + jnp.einsum("ajnm,amp->jnp", z, jump.matrices[idx].astype(z.dtype))
        if size is not None:
            grown = frobenius(z, (2, 3))
            if carried is not None:
                grown = grown + jnp.abs(t) @ carried
            bound = operator_norm_bound(jump.matrices[idx])
            size = size + jnp.sum(bound[:, None] * grown, axis=0)
    if jump.dense is not None:
        dense = jump.dense.astype(level.dtype)

        def add(m, state):
            # out[j] += y_{j-m} D_m 2^(E_{j-m} - F_j) for j >= m.
            out, size = state
            e = jnp.roll(exponents, m) - out_exponents
            keep = jnp.arange(width) >= m
            weight = jnp.where(keep, jnp.exp2(jnp.minimum(e, 0)), 0).astype(rdtype)
            shifted = (
                jnp.roll(level, m, axis=0) * weight.astype(level.dtype)[:, None, None]
            )
            out = out + jnp.einsum("jnm,mp->jnp", shifted, dense[m])
            if size is not None:
                grown = frobenius(shifted, (1, 2))
                if carried is not None:
                    grown = grown + weight * jnp.roll(carried, m)
                size = size + operator_norm_bound(dense[m][None])[0] * grown
            return out, size

        out, size = lax.fori_loop(0, min(width, dense.shape[0]), add, (out, size))
    return out, size


def _sandwich(
    jump: TermSeries,
    scaled: TermSeries,
    level: Array,
    exponents: Array,
    out_exponents: Array,
    magnitude: bool,
) -> tuple[Array, Array | None]:
    """Coefficients of $s L^\\dagger Y L \\cdot 2^{-F_j}$: first $Q = Y L$, at the
    running largest input exponent $C_j$ (so both steps weigh by powers $\\le 1$),
    then $s L^\\dagger Q = (Q^\\dagger\\, sL)^\\dagger$: the conjugated coefficients of
    $L^\\dagger$ come out of the outer dagger, for the price of none."""
    floor = jnp.min(exponents)
    middle = jnp.maximum(lax.cummax(scale_exponents(level, exponents)), floor)
    q, q_size = _right_product(jump, level, exponents, middle, magnitude)
    r, size = _right_product(
        scaled, dagger(q), middle, out_exponents, magnitude, q_size
    )
    return dagger(r), size


def lindblad_levels(
    left: TermSeries,
    right: TermSeries | None,
    jumps: Sequence[TermSeries],
    scale: Array,
    observable: Array,
    order: int,
    hermitian_levels: bool,
    estimate: bool,
) -> Levels:
    """$X_k / k!$ for the Heisenberg-picture Lindbladian by the direct Taylor
    recursion (`taylor_levels`), the step
    $\\mathcal{G} * Y = (G Y - Y R) + \\sum_j s L_j^\\dagger Y L_j$ with
    $G = isH - sN/2$, $R = isH + sN/2$ in parts (`_two_sided`)."""
    jumps = list(jumps)
    if not jumps and right is None:
        # The closed system: the same computation as the Heisenberg hierarchy's.
        return heisenberg_levels(left, observable, order, hermitian_levels, estimate)
    scaled = [scaled_series(jump, scale) for jump in jumps]
    dtype = jnp.result_type(observable, left.matrices, 1j)
    commutator = commutator_step(left, dtype, hermitian_levels, right=right)

    def step(width: int) -> PhaseStep:
        products = commutator(width)

        def apply(re, im, exponents, out_exponents, magnitude):
            grown_re, grown_im, size = products(
                re, im, exponents, out_exponents, magnitude
            )
            level = lax.complex(re, im)
            for jump, jump_scaled in zip(jumps, scaled, strict=True):
                part, part_size = _sandwich(
                    jump, jump_scaled, level, exponents, out_exponents, magnitude
                )
                grown_re, grown_im = grown_re + part.real, grown_im + part.imag
                if size is not None and part_size is not None:
                    size = size + part_size
            return grown_re, grown_im, size

        return apply

    return taylor_levels(step, observable, order, estimate)


def cast_series(terms: TermSeries, dtype: Any) -> TermSeries:
    """Matrices (and a dense part) in the working dtype; coefficients stay real
    where they are."""
    rdtype = jnp.finfo(dtype).dtype
    complex_coefficients = jnp.iscomplexobj(terms.coefficients)
    return TermSeries(
        terms.coefficients.astype(dtype if complex_coefficients else rdtype),
        terms.matrices.astype(dtype),
        None if terms.dense is None else terms.dense.astype(dtype),
        terms.constant,
    )
