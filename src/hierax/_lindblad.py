"""Open systems: the Heisenberg hierarchy under a Lindblad generator, and all time
derivatives of a density matrix.

Both run on the kernels of the closed hierarchies. The generator's Hamiltonian part
and the anticommutator with $N = \\sum_j L_j^\\dagger L_j$ together are one product
$G Y - Y R$ with a term structure (`commutator_series` with other right-hand
matrices); the sandwiches $L^\\dagger Y L$ are two products in a row, each a Cauchy
product of the jump operator's series with a series of matrices, so a jump operator
$\\sum_b f_b(t) A_b$ costs $2B$ matrix products per coefficient, not $2B^2$.
"""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Complex, Float

from ._algorithms import (
    Levels,
    _lower_shifts,
    _norm,
    _operator_norm_bound,
    _scale_exponents,
    _times_powers_of_two,
    _toeplitz,
    _weighted_sums,
    commutator_series,
    finish_errors,
    finish_levels,
    heisenberg_levels,
    series_errors,
    taylor_levels,
)
from ._custom_types import OrderLike, TimeLike, typechecked
from ._hierarchies import (
    _TIME_SCALE_DOC,
    AbstractHierarchy,
    _check_time_scale,
    _checked_time,
    _complex_dtype,
    _hermitian_matrices,
    _is_hermitian,
    _scaled_generator,
    _time_scale,
)
from ._interop import as_state
from ._jit import module_jit
from ._operators import AbstractTimeOperator, to_operator
from ._series import TermSeries, real_dtype, scalar_cauchy_product
from ._time_scale import growth_rate
from ._validation import as_numeric_array, as_time, check_order


# ----------------------------------------------------------------------------------
# Series of the generator's parts
# ----------------------------------------------------------------------------------


def _adjoint(m: Array) -> Array:
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


def _number_series(jumps: Sequence[TermSeries], dtype: Any) -> TermSeries:
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
                matrices.append(_adjoint(a[i]) @ a[j])
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


def _scaled(terms: TermSeries, scale: Array) -> TermSeries:
    """The series of $s\\,L(t + s\\sigma)$ (s a power of two: exact)."""
    dense = None if terms.dense is None else terms.dense * scale
    return TermSeries(terms.coefficients * scale, terms.matrices, dense, terms.constant)


def _two_sided(
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


# ----------------------------------------------------------------------------------
# The Heisenberg-picture kernel: the sandwich L^dagger Y L on carried levels
# ----------------------------------------------------------------------------------


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
    shift = _lower_shifts(exponents, out_exponents, rdtype)
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
        z = _times_powers_of_two(level, diagonal)
        out = out + jnp.einsum("jnm,mp->jnp", z, merged)
        if size is not None:
            grown = _norm(z, (1, 2))
            if carried is not None:
                grown = grown + jnp.exp2(diagonal) * carried
            size = size + _operator_norm_bound(merged[None])[0] * grown
    if varying:
        idx = np.asarray(varying)
        t = _toeplitz(jump.coefficients[idx, :width], width) * shift[None]
        z = _weighted_sums(t, level)
        out = out + jnp.einsum("ajnm,amp->jnp", z, jump.matrices[idx].astype(z.dtype))
        if size is not None:
            grown = _norm(z, (2, 3))
            if carried is not None:
                grown = grown + jnp.abs(t) @ carried
            bound = _operator_norm_bound(jump.matrices[idx])
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
                grown = _norm(shifted, (1, 2))
                if carried is not None:
                    grown = grown + weight * jnp.roll(carried, m)
                size = size + _operator_norm_bound(dense[m][None])[0] * grown
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
    $L^\\dagger$ come out of the outer adjoint, for the price of none."""
    floor = jnp.min(exponents)
    middle = jnp.maximum(lax.cummax(_scale_exponents(level, exponents)), floor)
    q, q_size = _right_product(jump, level, exponents, middle, magnitude)
    r, size = _right_product(
        scaled, _adjoint(q), middle, out_exponents, magnitude, q_size
    )
    return _adjoint(r), size


def lindblad_levels(
    left: TermSeries,
    right: TermSeries | None,
    jumps: Sequence[TermSeries],
    scale: Array,
    observable: Array,
    order: int,
    hermitian: bool,
    estimate: bool,
) -> Levels:
    """$X_k / k!$ for the Heisenberg-picture Lindbladian by the direct Taylor
    recursion (`taylor_levels`), the step
    $\\mathcal{G} * Y = (G Y - Y R) + \\sum_j s L_j^\\dagger Y L_j$ with
    $G = isH - sN/2$, $R = isH + sN/2$ in parts (`_two_sided`)."""
    jumps = list(jumps)
    if not jumps and right is None:
        # The closed system: the same computation as the Heisenberg hierarchy's.
        return heisenberg_levels(left, observable, order, hermitian, estimate)
    scaled = [_scaled(jump, scale) for jump in jumps]

    def step(
        level: Array, exponents: Array, out_exponents: Array, magnitude: bool
    ) -> Array | tuple[Array, Array]:
        result = commutator_series(
            left, level, exponents, out_exponents, hermitian, magnitude, right=right
        )
        grown, size = result if isinstance(result, tuple) else (result, None)
        for jump, jump_scaled in zip(jumps, scaled, strict=True):
            part, part_size = _sandwich(
                jump, jump_scaled, level, exponents, out_exponents, magnitude
            )
            grown = grown + part
            if size is not None and part_size is not None:
                size = size + part_size
        return (grown, size) if size is not None else grown

    return taylor_levels(step, observable, order, estimate)


# ----------------------------------------------------------------------------------
# The Schrodinger-picture kernel: rho's series one coefficient per step
# ----------------------------------------------------------------------------------


def _window_sums(
    terms: TermSeries, series: Array, j: Array, conjugate: bool
) -> tuple[Array, np.ndarray] | tuple[None, None]:
    """For the time-dependent terms, $\\sum_{i \\le j} c_{a,j-i}\\, x_i$ of the
    carried `series` x (conjugated coefficients with `conjugate`), read in place
    (no window of x is gathered); the constant ones, merged, need only $x_j$."""
    flags = terms.constant_flags()
    varying = np.asarray([a for a, c in enumerate(flags) if not c], dtype=int)
    if varying.size == 0:
        return None, None
    c = terms.coefficients[varying]
    c = jnp.conj(c) if conjugate else c
    lags = jnp.arange(series.shape[0])
    valid = lags <= j
    weights = jnp.where(valid[None, :], c[:, jnp.where(valid, j - lags, 0)], 0)
    return jnp.tensordot(weights.astype(series.dtype), series, axes=(1, 0)), varying


def _merged(terms: TermSeries, matrices: Array, conjugate: bool) -> Array | None:
    flags = terms.constant_flags()
    fixed = np.asarray([a for a, c in enumerate(flags) if c], dtype=int)
    if fixed.size == 0:
        return None
    c = terms.coefficients[fixed, 0]
    c = jnp.conj(c) if conjugate else c
    return jnp.einsum("a,anm->nm", c.astype(matrices.dtype), matrices[fixed])


def _window(series: Array, j: Array) -> Array:
    """Entry i is `series[j - i]` for i <= j, else zero."""
    width = series.shape[0]
    i = jnp.arange(width)
    taken = jnp.take(series, jnp.clip(j - i, 0, width - 1), axis=0)
    return jnp.where((i <= j)[:, None, None], taken, 0)


def density_series(
    left: TermSeries,
    right: TermSeries,
    jumps: Sequence[TermSeries],
    scale: Array,
    rho: Array,
    order: int,
) -> Array:
    """Normalised series of $\\rho(t + s\\sigma)$ for $\\rho' = \\mathcal{L}_t[\\rho]$,
    $\\rho(t)$ = `rho`: $r_{j+1} = \\frac{1}{j+1} \\sum_{m \\le j}
    \\mathcal{L}_m[r_{j-m}]$, one coefficient per step (the pattern of
    `propagator_series`), with $\\mathcal{L}_m[r] = (G r - r R)_m +
    \\sum_j (L_j r L_j^\\dagger)_m$ and $G = -isH - sN/2$, $R = -isH + sN/2$.

    The sandwich runs through $Q_j = (r L^\\dagger)_j$, carried as a series and
    extended by one coefficient per step, then $(L Q)_j$: $2B$ products per jump
    operator of B terms and order. Each coefficient is a sum whose largest term has
    the size of the result, with the Hamiltonian's trace part removed, so the
    recursion loses no digits to offsets.

    **Returns:** shape `(order + 1, n, n)`.
    """
    dtype = rho.dtype
    n = rho.shape[-1]
    r = jnp.zeros((order + 1, n, n), dtype).at[0].set(rho)
    jumps = list(jumps)
    scaled = [_scaled(jump, scale) for jump in jumps]
    merged_left = _merged(left, left.matrices, False)
    merged_right = _merged(left, right.matrices, False)
    jump_right = [_merged(jump, _adjoint(jump.matrices), True) for jump in jumps]
    jump_left = [_merged(jump, jump.matrices, False) for jump in scaled]
    carried = [jnp.zeros((order + 1, n, n), dtype) for _ in jumps]
    dense_parts = left.dense is not None or any(j.dense is not None for j in jumps)

    def body(j, state):
        r, carried = state
        # Dense parts (callables) sum over the window of r; terms read r in place.
        window = _window(r, j) if dense_parts else None
        total = jnp.zeros((n, n), dtype)
        if merged_left is not None and merged_right is not None:
            total = total + merged_left @ r[j] - r[j] @ merged_right
        sums, varying = _window_sums(left, r, j, False)
        if sums is not None:
            total = total + jnp.einsum("anm,amp->np", left.matrices[varying], sums)
            total = total - jnp.einsum("anm,amp->np", sums, right.matrices[varying])
        if window is not None and left.dense is not None and right.dense is not None:
            d_left, d_right = left.dense, right.dense
            total = total + jnp.tensordot(d_left, window, axes=((0, 2), (0, 1)))
            total = total - jnp.einsum("inm,imp->np", window, d_right)
        new_carried = []
        for jump, jump_scaled, r_merged, l_merged, q in zip(
            jumps, scaled, jump_right, jump_left, carried, strict=True
        ):
            # Q_j = sum_i r_{j-i} l_i^dagger, then sum_i s l_i Q_{j-i}.
            q_j = jnp.zeros((n, n), dtype)
            if r_merged is not None:
                q_j = q_j + r[j] @ r_merged
            sums, varying = _window_sums(jump, r, j, True)
            if sums is not None:
                adjoints = _adjoint(jump.matrices[varying]).astype(dtype)
                q_j = q_j + jnp.einsum("anm,amp->np", sums, adjoints)
            if window is not None and jump.dense is not None:
                q_j = q_j + jnp.einsum("inm,imp->np", window, _adjoint(jump.dense))
            q = q.at[j].set(q_j)
            if l_merged is not None:
                total = total + l_merged @ q_j
            sums, varying = _window_sums(jump_scaled, q, j, False)
            if sums is not None:
                matrices = jump_scaled.matrices[varying].astype(dtype)
                total = total + jnp.einsum("anm,amp->np", matrices, sums)
            if jump_scaled.dense is not None:
                total = total + jnp.tensordot(
                    jump_scaled.dense, _window(q, j), axes=((0, 2), (0, 1))
                )
            new_carried.append(q)
        step = (1 / (j + 1)).astype(real_dtype(dtype)).astype(dtype)
        return r.at[j + 1].set(total * step), new_carried

    r, _ = lax.fori_loop(0, order, body, (r, carried))
    return r


def density_generator(
    hamiltonian: TermSeries, jumps: Sequence[TermSeries], scale: Array, dtype: Any
) -> tuple[TermSeries, TermSeries, list[TermSeries]]:
    """The parts `(left, right, jumps)` that `density_series` takes, from the series
    of $H(t + s\\sigma)$ and of each $L_j(t + s\\sigma)$ at the scale `scale`
    ($s$ of either sign: every part is linear in it), in the working `dtype`."""
    jumps = [_cast(jump, dtype) for jump in jumps]
    # -i s H: the Heisenberg generator's matrices negated.
    generator = _scaled_generator(hamiltonian, scale, dtype)
    generator = TermSeries(
        generator.coefficients,
        -generator.matrices,
        None if generator.dense is None else -generator.dense,
        generator.constant,
    )
    if jumps:
        number = _scaled(_number_series(jumps, dtype), scale)
        left, right = _two_sided(generator, number, -1.0)
    else:
        left = right = generator
    return left, right, jumps


def _generator_sizes(
    left: TermSeries, right: TermSeries, jumps: Sequence[TermSeries], scale: Array
) -> Array:
    """A bound on the size of each coefficient $\\mathcal{L}_m$ of the Schrödinger
    generator's series, for `series_errors`: Frobenius norms of its parts."""
    rdtype = real_dtype(left.matrices.dtype)
    both = _norm(left.matrices, (1, 2)) + _norm(right.matrices, (1, 2))
    h = jnp.sum(jnp.abs(left.coefficients) * both[:, None], axis=0).astype(rdtype)
    if left.dense is not None and right.dense is not None:
        h = h + (_norm(left.dense, (1, 2)) + _norm(right.dense, (1, 2))).astype(rdtype)
    for jump in jumps:
        norms = jnp.sum(
            jnp.abs(jump.coefficients) * _norm(jump.matrices, (1, 2))[:, None], axis=0
        ).astype(rdtype)
        if jump.dense is not None:
            norms = norms + _norm(jump.dense, (1, 2)).astype(rdtype)
        h = h + scale * scalar_cauchy_product(norms, norms)
    return h


# ----------------------------------------------------------------------------------
# The public modules
# ----------------------------------------------------------------------------------


def _check_jump_operators(jumps: Any, size: int, api: str) -> tuple:
    if not isinstance(jumps, (list, tuple)):
        raise TypeError(
            f"`{api}`: `jump_operators` must be a list or tuple of operators (e.g. "
            f"`[jnp.sqrt(gamma) * sigma_minus]`, or `[]` for none), got "
            f"{type(jumps).__name__}."
        )
    operators = tuple(
        to_operator(jump, f"jump_operators[{i}]", api) for i, jump in enumerate(jumps)
    )
    for i, op in enumerate(operators):
        if op.size != size:
            raise ValueError(
                f"`{api}`: `jump_operators[{i}]` is {op.size}x{op.size} but "
                f"`hamiltonian` is {size}x{size}; they must act on the same space."
            )
    return operators


def _jump_rate(jumps: Sequence[TermSeries]) -> list[Array]:
    """Growth-rate estimates the jump operators add: their own (as a Hamiltonian's:
    norms and the frequencies of their time functions) and the dissipator's
    $2 \\sum_j \\|L_j\\|^2$."""
    rates = []
    total = None
    for jump in jumps:
        rates.append(growth_rate(jump, None))
        norm = jnp.sum(jnp.abs(jump.coefficients[:, 0]) * _norm(jump.matrices, (1, 2)))
        if jump.dense is not None:
            norm = norm + _norm(jump.dense[0], (0, 1))
        total = norm**2 if total is None else total + norm**2
    if total is not None:
        rates.append(jax.lax.stop_gradient(2 * total))
    return rates


def _combined_rate(rates: list[Array]) -> Array:
    rdtype = jnp.result_type(*[real_dtype(r.dtype) for r in rates])
    return jnp.max(jnp.stack([r.astype(rdtype) for r in rates]))


class LindbladHierarchy(AbstractHierarchy):
    """The Heisenberg hierarchy of an observable under a Lindblad master equation
    ($\\hbar = 1$):

    $$X_0(t) = X(t), \\qquad X_k(t) = \\mathcal{L}_t^+[X_{k-1}(t)] +
      \\frac{d}{dt} X_{k-1}(t),$$
    $$\\mathcal{L}_t^+[X] = i[H, X] + \\sum_j \\Big(L_j^\\dagger X L_j -
      \\tfrac12 \\{L_j^\\dagger L_j, X\\}\\Big),$$

    the adjoint (Heisenberg-picture) Lindbladian, with $H$ and every $L_j$ possibly
    time-dependent. For a density matrix evolving under the dual equation
    ([`hierax.DensityMatrixDerivatives`][]),
    $\\frac{d^k}{dt^k} \\mathrm{tr}\\big(X_0 \\rho(t)\\big) = \\mathrm{tr}\\big(X_k(t)
    \\rho(t)\\big)$ whenever $X_0$ is constant, and in general $X_k$ is what the
    $k$-th derivative of the observable looks like in the Heisenberg picture of
    the open system. With no jump operators it is [`hierax.HeisenbergHierarchy`][].

    Algorithm: the direct Taylor recursion of
    [`hierax.HeisenbergHierarchy`][], level by level on truncated series, with
    the commutator replaced by the generator's series: the Hamiltonian and
    $N = \\sum_j L_j^\\dagger L_j$ enter as $GY - YR$ with $G = iH - N/2$,
    $R = iH + N/2$ term by term (the Hamiltonian's trace part removed, so an offset
    $H + cI$ costs no digits), and each $L_j^\\dagger Y L_j$ as two products in a
    row, $Q = YL$ then $L^\\dagger Q$. Cost per coefficient update: one matrix
    product per term of $H$ and $N$ together (constant terms merged into one
    matrix; Hermitian $H$ and $X$ with real time functions) or two, plus two per
    term of each jump operator; between $K^2$ updates in all (small $n K$: one
    phase carries every coefficient) and about $0.56 K^2$ (large $n K$: the levels
    are carried in up to eight phases of shrinking width), $K$ when everything is
    constant. Each update also forms the scalar-weighted sums of its time-dependent
    terms and renormalises by powers of two, $O(K n^2)$ work beside the products
    (measured at $n = 32$, $K = 20$, three jump operators: 0.6-1.2 times the
    product count in two runs, the products being faster in a batch than one at a
    time). Memory: a
    few $(K+1) \\times n \\times n$ arrays.

    !!! example

        ```python
        import jax.numpy as jnp
        import hierax

        sz = jnp.array([[1.0, 0], [0, -1]])
        sm = jnp.array([[0.0, 0], [1, 0]])  # lowers |0> = (1, 0) to |1>
        hierarchy = hierax.LindbladHierarchy(
            0.5 * sz, [jnp.sqrt(0.1) * sm], sz, order=6
        )
        levels = hierarchy(0.0)  # shape (7, 2, 2)
        ```
    """

    hamiltonian: AbstractTimeOperator
    jump_operators: tuple[AbstractTimeOperator, ...]
    observable: AbstractTimeOperator
    order: int = eqx.field(static=True)
    time_scale: Array | None
    hermitian: bool = eqx.field(static=True)

    def __init__(
        self,
        hamiltonian: Any,
        jump_operators: Any,
        observable: Any,
        order: OrderLike,
        *,
        time_scale: ArrayLike | None = None,
    ):
        """**Arguments:**

        - `hamiltonian`: $H(t)$, in any form [`hierax.HeisenbergHierarchy`][]
            accepts.
        - `jump_operators`: a list (or tuple) of the $L_j(t)$, each in the same
            forms (e.g. `jnp.sqrt(gamma) * sigma_minus`,
            `hierax.Exp(-0.3) * sigma_minus`, a callable); rates go into the
            operators. `[]` for a closed system.
        - `observable`: $X_0(t)$, in the same forms, of the same size.
        - `order`: the highest level $K$, a non-negative Python int.
        - TIME_SCALE
        """
        api = "hierax.LindbladHierarchy"
        self.order = check_order(order, api)
        self.time_scale = _check_time_scale(time_scale, api)
        self.hamiltonian = to_operator(hamiltonian, "hamiltonian", api)
        n = self.hamiltonian.size
        self.jump_operators = _check_jump_operators(jump_operators, n, api)
        self.observable = to_operator(observable, "observable", api)
        if self.observable.size != n:
            raise ValueError(
                f"`{api}`: `hamiltonian` is {n}x{n} but `observable` is "
                f"{self.observable.size}x{self.observable.size}; they must act on "
                "the same space."
            )
        self.hermitian = _is_hermitian(self.hamiltonian) and _is_hermitian(
            self.observable
        )

    @typechecked
    def __call__(self, t: TimeLike) -> Complex[Array, "order_plus_1 n n"]:
        """All levels at time `t`.

        **Arguments:**

        - `t`: the time, a real scalar.

        **Returns:**

        An array of shape `(order + 1, n, n)`: $X_0(t), X_1(t), \\ldots, X_K(t)$.
        """
        t = as_time(t, "hierax.LindbladHierarchy(...)(t)")
        return _lindblad(self, t, normalised=False)

    @typechecked
    def normalised(self, t: TimeLike) -> Complex[Array, "order_plus_1 n n"]:
        """All levels divided by $k!$, for high orders where $X_k$ itself overflows.

        **Arguments:**

        - `t`: the time, a real scalar.

        **Returns:**

        An array of shape `(order + 1, n, n)`: $X_k(t) / k!$ for $k = 0..K$.
        """
        t = as_time(t, "hierax.LindbladHierarchy(...).normalised(t)")
        return _lindblad(self, t, normalised=True)

    @typechecked
    def error_estimate(self, t: TimeLike) -> Float[Array, " order_plus_1"]:
        """An estimate of each level's relative rounding error at `t`, as
        [`hierax.HeisenbergHierarchy.error_estimate`][] computes it, with the size
        of what the dissipator's products add up (both products of each sandwich,
        the first's rounding carried through the second) in each level's share.

        **Arguments:**

        - `t`: the time, a real scalar.

        **Returns:**

        An array of shape `(order + 1,)`, real, in the hierarchy's precision.
        """
        t = as_time(t, "hierax.LindbladHierarchy(...).error_estimate(t)")
        return _lindblad_errors(self, t)


LindbladHierarchy.__init__.__doc__ = (LindbladHierarchy.__init__.__doc__ or "").replace(
    "TIME_SCALE", _TIME_SCALE_DOC
)


def _lindblad_levels(
    hierarchy: LindbladHierarchy, t: Array, estimate: bool = False
) -> Levels:
    api = "hierax.LindbladHierarchy(...)(t)"
    t = _checked_time(hierarchy, t, api)
    order = hierarchy.order
    hamiltonian, observable = hierarchy.hamiltonian, hierarchy.observable
    operators = hierarchy.jump_operators
    constant = (
        hamiltonian.is_constant
        and observable.is_constant
        and all(op.is_constant for op in operators)
    )
    width = 0 if constant else order

    def probe():
        rates = [
            growth_rate(
                hamiltonian.term_series(t, 3, None), observable.term_series(t, 3, None)
            )
        ]
        return _combined_rate(
            rates + _jump_rate([op.term_series(t, 3, None) for op in operators])
        )

    probe_dtype = _complex_dtype(hierarchy)
    scale = (
        jnp.ones((), jnp.finfo(probe_dtype).dtype)
        if constant
        else _time_scale(hierarchy, probe, probe_dtype, api)
    )
    time_scale = None if constant else scale
    h = hamiltonian.term_series(t, width, time_scale)
    x = observable.term_series(t, width, time_scale)
    jumps = [op.term_series(t, width, time_scale) for op in operators]
    dtype = _complex_dtype(hierarchy, h, x, *jumps)
    rdtype = jnp.finfo(dtype).dtype
    scale = scale.astype(rdtype)
    jumps = [_cast(jump, dtype) for jump in jumps]
    hermitian = (
        hierarchy.hermitian
        and h.dense is None
        and x.dense is None
        and not jnp.iscomplexobj(h.coefficients)
        and not jnp.iscomplexobj(x.coefficients)
    )
    generator = _scaled_generator(h, scale, dtype)
    number = _scaled(_number_series(jumps, dtype), scale) if jumps else None
    right: TermSeries | None = None
    if number is None:
        left = generator
    else:
        left, right = _two_sided(generator, number, -1.0)
    series = x.full().astype(dtype)
    if hermitian:
        ok = _hermitian_matrices(h) & _hermitian_matrices(x)
        series = eqx.error_if(
            series,
            ~ok,
            f"`{api}`: the hierarchy was built for Hermitian matrices and they have "
            "been replaced by non-Hermitian ones; build a new LindbladHierarchy.",
        )
    levels = lindblad_levels(
        left, right, jumps, scale, series, order, hermitian, estimate
    )
    if constant:
        return levels
    k = jnp.arange(order + 1, dtype=levels.exponents.dtype)
    exponents = levels.exponents - k * jnp.log2(scale.astype(k.dtype))
    return Levels(levels.values, exponents, levels.errors)


def _cast(terms: TermSeries, dtype: Any) -> TermSeries:
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


def _lindblad_impl(hierarchy: LindbladHierarchy, t: Array, normalised: bool):
    return finish_levels(_lindblad_levels(hierarchy, t), normalised)


def _lindblad_errors_impl(hierarchy: LindbladHierarchy, t: Array):
    return finish_errors(_lindblad_levels(hierarchy, t, estimate=True), False)


_lindblad = module_jit(_lindblad_impl)
_lindblad_errors = module_jit(_lindblad_errors_impl)


class DensityMatrixDerivatives(AbstractHierarchy):
    """All time derivatives $\\rho^{(k)}(t)$, $k = 0..K$, of a density matrix
    under the Lindblad master equation ($\\hbar = 1$), given $\\rho(t)$:

    $$\\rho' = \\mathcal{L}_t[\\rho] = -i[H, \\rho] + \\sum_j \\Big(L_j \\rho
      L_j^\\dagger - \\tfrac12 \\{L_j^\\dagger L_j, \\rho\\}\\Big),$$

    with $H$ and every $L_j$ possibly time-dependent; the derivatives are total
    derivatives along the flow (for a time-dependent generator,
    $\\rho'' = \\mathcal{L}_t[\\rho'] + \\dot{\\mathcal{L}}_t[\\rho]$, and so on).

    The normalised coefficients follow
    $r_{j+1} = \\frac{1}{j+1} \\sum_{m \\le j} \\mathcal{L}_m[r_{j-m}]$ with
    $r_0 = \\rho(t)$ and $\\mathcal{L}_m$ the Taylor coefficients of the generator,
    one coefficient per step, as [`hierax.PropagatorDerivatives`][] does for
    $U' = -iHU$. Cost per order: two matrix products per term of $H$ and
    $N = \\sum_j L_j^\\dagger L_j$ together (two in all when they are constant),
    and two per term of each jump operator; $K$ orders. A time-dependent term
    also forms a scalar-weighted sum over earlier coefficients, $O(K n^2)$ per
    order, which at $n = 32$, $K = 20$ weighs about as much as the products
    (measured: 1.7-2.1x the product count; [`hierax.mesolve`][] steps with a kernel
    that also keeps diagonal and real matrices apart). Memory: a few
    $(K+1) \\times n \\times n$ arrays. The Hamiltonian's trace part is removed
    (the commutator does not see it), so an offset $H + cI$ costs no digits.

    !!! example

        ```python
        import jax.numpy as jnp
        import hierax

        sz = jnp.array([[1.0, 0], [0, -1]])
        sm = jnp.array([[0.0, 0], [1, 0]])
        derivatives = hierax.DensityMatrixDerivatives(
            0.5 * sz, [jnp.sqrt(0.1) * sm], order=6
        )
        rho = jnp.array([[0.5, 0.5], [0.5, 0.5]])
        out = derivatives(0.0, rho)  # shape (7, 2, 2): rho, rho', ..., rho^(6)
        ```
    """

    hamiltonian: AbstractTimeOperator
    jump_operators: tuple[AbstractTimeOperator, ...]
    order: int = eqx.field(static=True)
    time_scale: Array | None

    def __init__(
        self,
        hamiltonian: Any,
        jump_operators: Any,
        order: OrderLike,
        *,
        time_scale: ArrayLike | None = None,
    ):
        """**Arguments:**

        - `hamiltonian`: $H(t)$, in any form [`hierax.HeisenbergHierarchy`][]
            accepts.
        - `jump_operators`: a list (or tuple) of the $L_j(t)$, in the same forms,
            rates included in the operators; `[]` for a closed system.
        - `order`: the highest derivative $K$, a non-negative Python int.
        - TIME_SCALE
        """
        api = "hierax.DensityMatrixDerivatives"
        self.order = check_order(order, api)
        self.time_scale = _check_time_scale(time_scale, api)
        self.hamiltonian = to_operator(hamiltonian, "hamiltonian", api)
        self.jump_operators = _check_jump_operators(
            jump_operators, self.hamiltonian.size, api
        )

    @typechecked
    def __call__(self, t: TimeLike, rho: Any) -> Complex[Array, "order_plus_1 n n"]:
        """All derivatives at `t`.

        **Arguments:**

        - `t`: the time, a real scalar.
        - `rho`: $\\rho(t)$, an `(n, n)` matrix (any operator works: the equation
            is linear), or a QuTiP or dynamiqs density matrix or ket (a ket
            $|\\psi\\rangle$ is read as $|\\psi\\rangle\\langle\\psi|$).

        **Returns:**

        An array of shape `(order + 1, n, n)`: $\\rho(t), \\rho'(t), \\ldots,
        \\rho^{(K)}(t)$.
        """
        api = "hierax.DensityMatrixDerivatives(...)(t, rho)"
        t = as_time(t, api)
        return _density(self, t, self._check_rho(rho, api), normalised=False)

    @typechecked
    def normalised(self, t: TimeLike, rho: Any) -> Complex[Array, "order_plus_1 n n"]:
        """The derivatives divided by $k!$ (the Taylor coefficients of $\\rho$
        around `t`), for high orders.

        **Arguments:**

        - `t`: the time, a real scalar.
        - `rho`: $\\rho(t)$, shape `(n, n)`.

        **Returns:**

        An array of shape `(order + 1, n, n)`: $\\rho^{(k)}(t) / k!$.
        """
        api = "hierax.DensityMatrixDerivatives(...).normalised(t, rho)"
        t = as_time(t, api)
        return _density(self, t, self._check_rho(rho, api), normalised=True)

    @typechecked
    def error_estimate(self, t: TimeLike, rho: Any) -> Float[Array, " order_plus_1"]:
        """An estimate of the relative rounding error of each derivative (and of
        its normalised value), as [`hierax.PropagatorDerivatives.error_estimate`][]
        computes it, with the size of each coefficient of the generator's series
        (Hamiltonian, anticommutator and sandwiches) in place of $\\|h_m\\|$.

        **Arguments:**

        - `t`: the time, a real scalar.
        - `rho`: $\\rho(t)$, shape `(n, n)`.

        **Returns:**

        An array of shape `(order + 1,)`, real.
        """
        api = "hierax.DensityMatrixDerivatives(...).error_estimate(t, rho)"
        t = as_time(t, api)
        return _density_errors(self, t, self._check_rho(rho, api))

    def _check_rho(self, rho: Any, api: str) -> Array:
        rho = as_state(rho, "rho", api, density=True)
        rho = as_numeric_array(rho, "rho", api, finite=True)
        n = self.hamiltonian.size
        if rho.ndim != 2 or rho.shape != (n, n):
            raise ValueError(
                f"`{api}`: `rho` must be a square matrix of shape ({n}, {n}) to match "
                f"the {n}x{n} `hamiltonian`, got shape {tuple(rho.shape)}."
            )
        return rho


DensityMatrixDerivatives.__init__.__doc__ = (
    DensityMatrixDerivatives.__init__.__doc__ or ""
).replace("TIME_SCALE", _TIME_SCALE_DOC)


def _density_levels(
    derivatives: DensityMatrixDerivatives, t: Array, rho: Array, estimate: bool
) -> Levels:
    api = "hierax.DensityMatrixDerivatives(...)(t, rho)"
    t = _checked_time(derivatives, t, api)
    rho = eqx.error_if(
        rho, ~jnp.all(jnp.isfinite(rho)), f"`{api}`: `rho` must be finite."
    )
    order = derivatives.order
    hamiltonian = derivatives.hamiltonian
    operators = derivatives.jump_operators

    def probe():
        rates = [growth_rate(hamiltonian.term_series(t, 3, None), None)]
        return _combined_rate(
            rates + _jump_rate([op.term_series(t, 3, None) for op in operators])
        )

    probe_dtype = _complex_dtype(derivatives, rho)
    scale = _time_scale(derivatives, probe, probe_dtype, api)
    h = hamiltonian.term_series(t, order, scale)
    jumps = [op.term_series(t, order, scale) for op in operators]
    dtype = _complex_dtype(derivatives, h, rho, *jumps)
    rdtype = jnp.finfo(dtype).dtype
    scale = scale.astype(rdtype)
    left, right, jumps = density_generator(h, jumps, scale, dtype)
    series = density_series(left, right, jumps, scale, rho.astype(dtype), order)
    errors = None
    if estimate:
        sizes = _generator_sizes(left, right, jumps, scale)
        errors = series_errors(sizes, series)
    exponents = -jnp.arange(order + 1, dtype=rdtype) * jnp.log2(scale)
    return Levels(series, exponents, errors)


def _density_impl(
    derivatives: DensityMatrixDerivatives, t: Array, rho: Array, normalised: bool
) -> Array:
    return finish_levels(_density_levels(derivatives, t, rho, False), normalised)


def _density_errors_impl(
    derivatives: DensityMatrixDerivatives, t: Array, rho: Array
) -> Array:
    return finish_errors(_density_levels(derivatives, t, rho, True), False)


_density = module_jit(_density_impl)
_density_errors = module_jit(_density_errors_impl)
