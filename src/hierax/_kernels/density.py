"""The series of a density matrix under the Lindblad equation,
$r_{j+1} = \\frac{1}{j+1} \\sum_{m \\le j} \\mathcal{L}_m[r_{j-m}]$, one coefficient per
order.

Two layouts of the same recursion: the general one (`density_series`, any term
series: callables and dense parts too), and the structured one for operators whose
terms are dense or diagonal matrices, whose step-independent parts (constant terms
merged, products of jump operators, the superoperators of small systems) are
assembled once (`density_parts`, written for NumPy and JAX alike) and whose
diagonal matrices act elementwise, real and imaginary ones in real arithmetic
(`structured_density_terms`); on vec(rho) instead, through the Schrödinger
kernel's `series_loop` (`vectorised_density_terms`), with the $n^2 \\times n^2$
superoperators held dense for n <= `VECTORISED_SIZE`, or at any n by their
nonzero diagonals when they are few (assembled from the diagonals of the
operators' own matrices, never the superoperators' $n^4$ entries). The general
layout is what a callable allows (a dense series per step, nothing to assemble
once); the structured one is what known terms allow.
"""

from collections.abc import Sequence
from types import ModuleType
from typing import Any, NamedTuple, cast

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._core import backend_choices
from .._data import TermSeries, frobenius, real_dtype, scalar_cauchy_product
from .heisenberg import scaled_generator
from .lindblad import cast_series, dagger, number_series, scaled_series, two_sided
from .propagator import (
    MAX_DIAGONALS,
    Diagonals,
    real_embedding,
    series_loop,
    side_by_side,
)


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
    `state_series`), with $\\mathcal{L}_m[r] = (G r - r R)_m +
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
    scaled = [scaled_series(jump, scale) for jump in jumps]
    merged_left = _merged(left, left.matrices, False)
    merged_right = _merged(left, right.matrices, False)
    jump_right = [_merged(jump, dagger(jump.matrices), True) for jump in jumps]
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
                adjoints = dagger(jump.matrices[varying]).astype(dtype)
                q_j = q_j + jnp.einsum("anm,amp->np", sums, adjoints)
            if window is not None and jump.dense is not None:
                q_j = q_j + jnp.einsum("inm,imp->np", window, dagger(jump.dense))
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
    jumps = [cast_series(jump, dtype) for jump in jumps]
    # -i s H: the Heisenberg generator's matrices negated.
    generator = scaled_generator(hamiltonian, scale, dtype)
    generator = TermSeries(
        generator.coefficients,
        -generator.matrices,
        None if generator.dense is None else -generator.dense,
        generator.constant,
    )
    if jumps:
        number = scaled_series(number_series(jumps, dtype), scale)
        left, right = two_sided(generator, number, -1.0)
    else:
        left = right = generator
    return left, right, jumps


def generator_sizes(
    left: TermSeries, right: TermSeries, jumps: Sequence[TermSeries], scale: Array
) -> Array:
    """A bound on the size of each coefficient $\\mathcal{L}_m$ of the Schrödinger
    generator's series, for `series_errors`: Frobenius norms of its parts."""
    rdtype = real_dtype(left.matrices.dtype)
    both = frobenius(left.matrices, (1, 2)) + frobenius(right.matrices, (1, 2))
    h = jnp.sum(jnp.abs(left.coefficients) * both[:, None], axis=0).astype(rdtype)
    if left.dense is not None and right.dense is not None:
        h = h + (frobenius(left.dense, (1, 2)) + frobenius(right.dense, (1, 2))).astype(
            rdtype
        )
    for jump in jumps:
        norms = jnp.sum(
            jnp.abs(jump.coefficients) * frobenius(jump.matrices, (1, 2))[:, None],
            axis=0,
        ).astype(rdtype)
        if jump.dense is not None:
            norms = norms + frobenius(jump.dense, (1, 2)).astype(rdtype)
        h = h + scale * scalar_cauchy_product(norms, norms)
    return h


# The largest n for which mesolve steps vec(rho) with n^2 x n^2 superoperators.
VECTORISED_SIZE = 8
# From which size real matrices pay in the structured kernel (measured, x64 CPU): a
# matrix-matrix product in real halves costs more to assemble than it saves below a
# few dozen rows.
REAL_DENSITY_SIZE = 32


class Term(NamedTuple):
    """One term $f(t) M$ of an operator: `matrix` an `(n, n)` matrix or, when
    `diagonal`, the `(n,)` diagonal; `value` the value of a constant f (shape
    `(1,)`), `None` for the rest; `constant` is static."""

    value: Any
    matrix: Any
    diagonal: bool
    constant: bool


def _left(matrix: Array, diagonal: bool, w: Array) -> Array:
    """`matrix @ w`; a real matrix acts on both halves of w in one product."""
    if diagonal:
        return matrix[:, None] * w
    if jnp.iscomplexobj(matrix) or w.shape[0] < REAL_DENSITY_SIZE:
        return matrix @ w
    n = w.shape[-1]
    both = matrix @ jnp.concatenate([w.real, w.imag], axis=1)
    return lax.complex(both[:, :n], both[:, n:])


def _right(w: Array, matrix: Array, diagonal: bool) -> Array:
    """`w @ matrix`, as `_left`."""
    if diagonal:
        return w * matrix[None, :]
    if jnp.iscomplexobj(matrix) or w.shape[0] < REAL_DENSITY_SIZE:
        return w @ matrix
    n = w.shape[0]
    both = jnp.concatenate([w.real, w.imag], axis=0) @ matrix
    return lax.complex(both[:n], both[n:])


def _dense(matrix: Any, diagonal: bool, xp: ModuleType) -> Any:
    return xp.diag(matrix) if diagonal else matrix


def _merge(
    terms: list[tuple[Any, Any, bool]], xp: ModuleType
) -> tuple[Any, bool] | None:
    """$\\sum_a c_a M_a$: a diagonal when every $M_a$ is one."""
    if not terms:
        return None
    diagonal = all(d for _, _, d in terms)
    parts = [c * (m if diagonal else _dense(m, d, xp)) for c, m, d in terms]
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total, diagonal


def _traceless(term: Term, n: int, xp: ModuleType) -> Any:
    """A constant Hamiltonian term's matrix without its trace part: the commutator
    does not see it, and an offset then costs no digits."""
    if term.diagonal:
        return term.matrix - xp.mean(term.matrix)
    return term.matrix - xp.trace(term.matrix) / n * xp.eye(n)


class StructuredParts(eqx.Module):
    """The step-independent parts of `structured_density_terms`, without the
    step's factor $h$: the constant part $G r - r R$ (`left` $G$, `right` $R$,
    diagonals when `fixed_diagonal`), `elementwise` $\\sum_j d_j d_j^\\dagger$ of
    the constant diagonal jump operators, the constant dense jump operators
    $(L, L^\\dagger)$ as `sandwiches`, the matrices of the two-sided
    time-dependent terms (`sided`, with their `sources`: `("h", i)` for the
    Hamiltonian's term i, `("pair", k, a, b)` for $A_a^\\dagger A_b$ of jump
    operator k) and of each time-dependent jump operator (`varying`, with the
    operators' indices `varying_index`)."""

    left: Any
    right: Any
    elementwise: Any
    sandwiches: tuple[tuple[Any, Any], ...]
    sided: tuple[Any, ...]
    varying: tuple[tuple[Any, ...], ...]
    fixed_diagonal: bool = eqx.field(static=True)
    sided_diagonal: tuple[bool, ...] = eqx.field(static=True)
    sources: tuple[tuple[Any, ...], ...] = eqx.field(static=True)
    varying_index: tuple[int, ...] = eqx.field(static=True)
    varying_diagonal: tuple[tuple[bool, ...], ...] = eqx.field(static=True)


class VectorisedParts(eqx.Module):
    """The step-independent parts of `vectorised_density_terms`: the real
    embeddings (`real_embedding`) of the constant superoperator $C$ (without $h$)
    and of each time-dependent one $S_p$, side by side in `stacked`, and of
    $i S_p$ in `rotated` (for complex series); `sources` say where each $S_p$'s
    series comes from: `("h", i)`, `("anti", k, a, b)` for
    $-\\frac12\\{A_a^\\dagger A_b, \\cdot\\}$ and `("sandwich", k, a, b)` for
    $A_a \\cdot A_b^\\dagger$ of jump operator k."""

    stacked: Any
    rotated: tuple[Any, ...]
    sources: tuple[tuple[Any, ...], ...] = eqx.field(static=True)


DensityParts = StructuredParts | VectorisedParts


def density_parts(
    hamiltonian: list[Term], jumps: list[list[Term]], n: int, xp: ModuleType
) -> DensityParts:
    """The step-independent parts of the Lindblad step for `operator_terms` of H
    and of each jump operator, in `xp` (NumPy or `jax.numpy`): with known (NumPy)
    operators, the superoperators held by their diagonals when that pays
    (`_diagonal_parts`, at any n); else the vectorised kernel's up to
    n = `VECTORISED_SIZE`, the structured one's above."""
    structured = (
        None if n <= VECTORISED_SIZE else _structured_parts(hamiltonian, jumps, n, xp)
    )
    if xp is np:
        parts = _diagonal_parts(hamiltonian, jumps, n, structured)
        if parts is not None:
            return parts
    if structured is not None:
        return structured
    return _vectorised_parts(*_superoperators(hamiltonian, jumps, n, xp), xp)


def cast_parts(parts: DensityParts, dtype: Any, place: Any) -> DensityParts:
    """Real arrays in the real dtype of `dtype`, complex ones in `dtype`."""
    rdtype = real_dtype(dtype)
    return jax.tree.map(
        lambda x: place(x, dtype if jnp.iscomplexobj(x) else rdtype), parts
    )


def _structured_parts(
    hamiltonian: list[Term], jumps: list[list[Term]], n: int, xp: ModuleType
) -> StructuredParts:
    left, right, sided, sided_diagonal, sources = [], [], [], [], []
    for i, term in enumerate(hamiltonian):
        if term.constant:
            c = -1j * term.value[0]
            matrix = _traceless(term, n, xp)
            left.append((c, matrix, term.diagonal))
            right.append((c, matrix, term.diagonal))
        else:
            sided.append(term.matrix)
            sided_diagonal.append(term.diagonal)
            sources.append(("h", i))
    # Constant jump operators, each merged into one matrix L first: diagonal ones
    # stacked, so that their anticommutator and sandwich parts are one sum each
    # whatever their number (a dephasing chain has one per site).
    diagonals, sandwiches, varying, varying_index = [], [], [], []
    for k, terms in enumerate(jumps):
        if not all(term.constant for term in terms):
            varying.append(tuple(term.matrix for term in terms))
            varying_index.append(k)
            continue
        merged = _merge([(t.value[0], t.matrix, t.diagonal) for t in terms], xp)
        assert merged is not None
        matrix, diagonal = merged
        if diagonal:
            diagonals.append(matrix)
        else:
            sandwiches.append((matrix, xp.conj(matrix.T)))
    elementwise = None
    if diagonals:
        d = xp.stack(diagonals)  # (J, n)
        # -1/2 {N, r} with N = sum_j |d_j|^2, and sum_j (d_j d_j^dagger) o r.
        number = xp.sum(xp.abs(d) ** 2, axis=0)
        left.append((-0.5, number, True))
        right.append((0.5, number, True))
        elementwise = xp.einsum("ja,jb->ab", d, xp.conj(d))
    for matrix, adjoint in sandwiches:
        number = adjoint @ matrix
        left.append((-0.5, number, False))
        right.append((0.5, number, False))
    for k in varying_index:
        terms = jumps[k]
        for a, ta in enumerate(terms):
            for b, tb in enumerate(terms):
                if ta.diagonal and tb.diagonal:
                    sided.append(xp.conj(ta.matrix) * tb.matrix)
                else:
                    da = _dense(ta.matrix, ta.diagonal, xp)
                    sided.append(xp.conj(da.T) @ _dense(tb.matrix, tb.diagonal, xp))
                sided_diagonal.append(ta.diagonal and tb.diagonal)
                sources.append(("pair", k, a, b))
    merged_left, merged_right = _merge(left, xp), _merge(right, xp)
    return StructuredParts(
        left=None if merged_left is None else merged_left[0],
        right=None if merged_right is None else merged_right[0],
        elementwise=elementwise,
        sandwiches=tuple(sandwiches),
        sided=tuple(sided),
        varying=tuple(varying),
        fixed_diagonal=merged_left is not None and merged_left[1],
        sided_diagonal=tuple(sided_diagonal),
        sources=tuple(sources),
        varying_index=tuple(varying_index),
        varying_diagonal=tuple(
            tuple(t.diagonal for t in jumps[k]) for k in varying_index
        ),
    )


def structured_density_terms(
    parts: StructuredParts,
    hamiltonian: list[Array],
    jumps: list[list[Array]],
    step: Array,
    rho: Array,
    order: int,
) -> Array:
    """The terms $v_j = \\rho^{(j)}(t)\\, h^j / j!$, $j = 0..K$, for
    $r_{j+1} = \\frac{1}{j+1} \\sum_{m \\le j} \\mathcal{L}_m[r_{j-m}]$ with
    $\\mathcal{L}[r] = -ih[H, r] - \\frac h2 \\{N, r\\} + h \\sum_j L_j r L_j^\\dagger$
    in the step's own time scale ($N = \\sum_j L_j^\\dagger L_j$), term by term
    (`hamiltonian`, `jumps`: the series of `operator_series`):

    - constant parts of $H$ and $N$ merged into $h (G r - r R)$, elementwise when
      diagonal;
    - a time-dependent term $f_a M_a$ as $M_a w_a \\pm w_a M_a$ with the window sum
      $w_a = \\sum_i c_{a,i} r_{j-i}$;
    - the constant diagonal jump operators as $h (\\sum_j d_j d_j^\\dagger) \\circ
      r_j$ in one elementwise product; a constant dense one as
      $h L (r_j L^\\dagger)$; a time-dependent one through the carried series
      $Q = r L^\\dagger$.

    **Returns:** shape `(order + 1, n, n)`, in `rho`'s dtype.
    """
    dtype = rho.dtype
    rdtype = real_dtype(dtype)
    n = rho.shape[-1]
    h = step.astype(rdtype)
    series = []
    for source in parts.sources:
        if source[0] == "h":
            series.append(-1j * h * hamiltonian[source[1]])
        else:
            k, a, b = source[1:]
            product = scalar_cauchy_product(jnp.conj(jumps[k][a]), jumps[k][b])
            series.append(-0.5 * h * product)
    lags = jnp.arange(order + 1)
    r = jnp.zeros((order + 1, n, n), dtype).at[0].set(rho)
    carried = [jnp.zeros((order + 1, n, n), dtype) for _ in parts.varying]
    sided_series = jnp.stack([s.astype(dtype) for s in series]) if series else None
    signs = [-1.0 if source[0] == "h" else 1.0 for source in parts.sources]
    diagonal = parts.fixed_diagonal

    def window_sums(series: Array, values: Array, j: Array) -> Array:
        """$\\sum_i c_{a, j-i} x_i$ for each row a of `series`: `(A, n, n)`."""
        valid = lags <= j
        weights = jnp.where(valid[None, :], series[:, jnp.where(valid, j - lags, 0)], 0)
        return jnp.tensordot(weights.astype(dtype), values, axes=(1, 0))

    def body(j, state):
        r, carried = state
        rj = lax.dynamic_index_in_dim(r, j, keepdims=False)
        fixed = []
        if parts.left is not None:
            fixed.append(
                _left(parts.left, diagonal, rj) - _right(rj, parts.right, diagonal)
            )
        if parts.elementwise is not None:
            fixed.append(parts.elementwise * rj)
        for matrix, adjoint in parts.sandwiches:
            fixed.append(_left(matrix, False, _right(rj, adjoint, False)))
        total = jnp.zeros((n, n), dtype)
        if fixed:
            total = h * sum(fixed[1:], fixed[0])
        if sided_series is not None:
            sums = window_sums(sided_series, r, j)
            for matrix, d, sign, w in zip(
                parts.sided, parts.sided_diagonal, signs, sums
            ):
                total = total + _left(matrix, d, w) + sign * _right(w, matrix, d)
        new_carried = []
        for k, matrices, diagonals, q in zip(
            parts.varying_index, parts.varying, parts.varying_diagonal, carried
        ):
            # Q_j = sum_i r_{j-i} l_i^dagger, then h sum_i l_i Q_{j-i}.
            series_k = cast(list[Array], jumps[k])  # all of its terms' series
            coefficients = jnp.stack([c.astype(dtype) for c in series_k])
            sums = window_sums(jnp.conj(coefficients), r, j)
            q_j = jnp.zeros((n, n), dtype)
            for matrix, d, w in zip(matrices, diagonals, sums):
                adjoint = jnp.conj(matrix) if d else jnp.conj(matrix.T)
                q_j = q_j + _right(w, adjoint, d)
            q = lax.dynamic_update_index_in_dim(q, q_j, j, 0)
            sums = window_sums(coefficients, q, j)
            for matrix, d, w in zip(matrices, diagonals, sums):
                total = total + h * _left(matrix, d, w)
            new_carried.append(q)
        step = (1 / (j + 1)).astype(rdtype).astype(dtype)
        # Index updates without a scatter's bounds checks (kernels of their own).
        r = lax.dynamic_update_index_in_dim(r, total * step, j + 1, 0)
        return r, new_carried

    r, _ = lax.fori_loop(0, order, body, (r, carried))
    return r


def _kron_right(matrix: Any, diagonal: bool, xp: ModuleType) -> Any:
    """The superoperator of $r \\mapsto r M$ on row-major vec(r): $I \\otimes M^T$."""
    n = matrix.shape[0]
    return xp.kron(xp.eye(n), _dense(matrix, diagonal, xp).T)


def _kron_left(matrix: Any, diagonal: bool, xp: ModuleType) -> Any:
    """The superoperator of $r \\mapsto M r$ on row-major vec(r): $M \\otimes I$."""
    n = matrix.shape[0]
    return xp.kron(_dense(matrix, diagonal, xp), xp.eye(n))


def _superoperators(
    hamiltonian: list[Term], jumps: list[list[Term]], n: int, xp: ModuleType
) -> tuple[Any, list[Any], list[tuple[Any, ...]]]:
    """The Liouvillian's superoperators on row-major vec(r): the constant one C
    (without the step's $h$), each time-dependent one $S_p$, and their `sources`
    (see `VectorisedParts`)."""
    constant = xp.zeros((n * n, n * n), complex)
    operators, sources = [], []
    for i, term in enumerate(hamiltonian):
        matrix = _traceless(term, n, xp) if term.constant else term.matrix
        commutator = -1j * (
            _kron_left(matrix, term.diagonal, xp)
            - _kron_right(matrix, term.diagonal, xp)
        )
        if term.constant:
            constant = constant + term.value[0] * commutator
        else:
            operators.append(commutator)
            sources.append(("h", i))
    for k, terms in enumerate(jumps):
        for a, ta in enumerate(terms):
            for b, tb in enumerate(terms):
                da = _dense(ta.matrix, ta.diagonal, xp)
                db = _dense(tb.matrix, tb.diagonal, xp)
                number = xp.conj(da.T) @ db
                # -1/2 {A_a^dagger A_b, r} with conj(f_a) f_b, and A_a r A_b^dagger
                # (A_a kron conj(A_b)) with f_a conj(f_b).
                anticommutator = _kron_left(number, False, xp) + _kron_right(
                    number, False, xp
                )
                sandwich = xp.kron(da, xp.conj(db))
                if ta.constant and tb.constant:
                    product = xp.conj(ta.value[0]) * tb.value[0]
                    constant = constant - 0.5 * product * anticommutator
                    constant = constant + xp.conj(product) * sandwich
                else:
                    operators += [anticommutator, sandwich]
                    sources += [("anti", k, a, b), ("sandwich", k, a, b)]
    return constant, operators, sources


# An n x n matrix by its nonzero diagonals: offset k -> `values[i]` = M[i, i + k]
# (zero where i + k is outside the matrix).
Bands = dict[int, np.ndarray]


def _bands(matrix: np.ndarray, diagonal: bool) -> Bands | None:
    """The nonzero diagonals of a NumPy matrix, or of the diagonal matrix whose
    entries are `matrix` when `diagonal`; `None` for more than `MAX_DIAGONALS`
    (any superoperator of which the matrix is a factor has as many)."""
    if diagonal:
        return {0: matrix} if np.any(matrix) else {}
    n = matrix.shape[0]
    rows, columns = np.nonzero(matrix)
    offsets = np.unique(columns - rows).tolist()
    if len(offsets) > MAX_DIAGONALS:
        return None
    out = {}
    for k in offsets:
        values = np.zeros(n, matrix.dtype)
        i = np.arange(max(0, -k), min(n, n - k))
        values[i] = matrix[i, i + k]
        out[k] = values
    return out


# A superoperator on row-major vec(r) as a sum of Kronecker products
# $c\, A \otimes B$ (`(c, bands of A, bands of B)`): $M r$ is $M \otimes I$,
# $r M$ is $I \otimes M^T$ and $A r B^\dagger$ is $A \otimes \bar B$. Diagonal
# offsets a of A and b of B give the offset $a n + b$ (entry $(i n + j, (i + a) n +
# j + b)$ is $A_{i, i+a} B_{j, j+b}$): the values are the outer product of the two
# diagonals, so the superoperator's diagonals cost O(count n^2), never n^4.
Kronecker = list[tuple[Any, Bands, Bands]]


def _kron_offsets(products: Kronecker, n: int) -> set[int]:
    return {a * n + b for _, left, right in products for a in left for b in right}


def _kron_sum(products: Kronecker, n: int) -> dict[int, np.ndarray]:
    """The diagonals of $\\sum c\\, A \\otimes B$ (length n^2 each, complex)."""
    out: dict[int, np.ndarray] = {}
    for c, left, right in products:
        for a, u in left.items():
            for b, w in right.items():
                values = c * np.outer(u, w).reshape(-1)
                k = a * n + b
                out[k] = values if k not in out else out[k] + values
    return out


def _embedded_diagonals(
    block: dict[int, np.ndarray], size: int, rotate: bool
) -> Diagonals:
    """The `Diagonals` of `real_embedding` of the superoperator S with diagonals
    `block` (of $iS$ with `rotate`): $S = P + iQ$ has P at offset k in both halves,
    $-Q$ at $k + n^2$ in the upper and Q at $k - n^2$ in the lower (two offsets
    that meet, k and $k' + n^2$, fill different columns of a row: the sum is
    exact); `size` is n^2."""
    out: dict[int, np.ndarray] = {}

    def add(k: int, half: int, values: np.ndarray) -> None:
        if not np.any(values):
            return
        if k not in out:
            out[k] = np.zeros(2 * size)
        out[k][half * size : (half + 1) * size] += values

    for k, v in block.items():
        re, im = np.real(v), np.imag(v)
        p, q = (-im, re) if rotate else (re, im)
        add(k, 0, p)
        add(k, 1, p)
        add(k + size, 0, -q)
        add(k - size, 1, q)
    offsets = sorted(k for k, v in out.items() if np.any(v))
    values = np.stack([out[k] for k in offsets]) if offsets else np.zeros((0, 2 * size))
    return Diagonals(values, tuple((0, k) for k in offsets), 1)


def _kron_superoperators(
    hamiltonian: list[Term], jumps: list[list[Term]], n: int
) -> tuple[Kronecker, list[Kronecker], list[tuple[Any, ...]]] | None:
    """`_superoperators` (C, each $S_p$, their sources) as sums of Kronecker
    products of known (NumPy) matrices' diagonals; `None` as soon as a factor has
    more than `MAX_DIAGONALS` of them (a product of A and B diagonals has at least
    half their product: an offset is shared by two pairs at most)."""
    eye = {0: np.ones(n)}
    constant: Kronecker = []
    operators, sources = [], []
    for i, term in enumerate(hamiltonian):
        matrix = _traceless(term, n, np) if term.constant else term.matrix
        left = _bands(matrix, term.diagonal)
        right = _bands(matrix if term.diagonal else matrix.T, term.diagonal)
        if left is None or right is None:
            return None
        commutator = [(-1j, left, eye), (1j, eye, right)]
        if term.constant:
            c = complex(term.value[0])
            constant += [(c * x, u, w) for x, u, w in commutator]
        else:
            operators.append(commutator)
            sources.append(("h", i))
    for k, terms in enumerate(jumps):
        for a, ta in enumerate(terms):
            for b, tb in enumerate(terms):
                if ta.diagonal and tb.diagonal:
                    number = number_t = _bands(np.conj(ta.matrix) * tb.matrix, True)
                else:
                    da = _dense(ta.matrix, ta.diagonal, np)
                    product = np.conj(da.T) @ _dense(tb.matrix, tb.diagonal, np)
                    number, number_t = _bands(product, False), _bands(product.T, False)
                left = _bands(ta.matrix, ta.diagonal)
                right = _bands(np.conj(tb.matrix), tb.diagonal)
                if number is None or number_t is None or left is None:
                    return None
                if right is None or len(left) * len(right) > 2 * MAX_DIAGONALS:
                    return None
                anticommutator = [(1.0, number, eye), (1.0, eye, number_t)]
                sandwich = [(1.0, left, right)]
                if ta.constant and tb.constant:
                    product = complex(np.conj(ta.value[0]) * tb.value[0])
                    constant += [
                        (-0.5 * product * x, u, w) for x, u, w in anticommutator
                    ]
                    constant += [(np.conj(product) * x, u, w) for x, u, w in sandwich]
                else:
                    operators += [anticommutator, sandwich]
                    sources += [("anti", k, a, b), ("sandwich", k, a, b)]
    return constant, operators, sources


def _diagonals_pay(count: int, products: int, n: int) -> bool:
    """Whether `count` diagonals beat the structured kernel's `products` (at
    least one: its elementwise work), by the backend's costs
    (`BackendChoices.diagonals_pay`)."""
    return backend_choices().diagonals_pay(
        count, max(products, 1), n, n < REAL_DENSITY_SIZE
    )


def _structured_products(parts: StructuredParts) -> int:
    """The n x n matrix products an order of `structured_density_terms` takes."""
    count = 2 * len(parts.sandwiches)
    if parts.left is not None and not parts.fixed_diagonal:
        count += 2
    count += 2 * sum(not d for d in parts.sided_diagonal)
    count += sum(not d for ds in parts.varying_diagonal for d in ds) * 2
    return count


def _diagonal_parts(
    hamiltonian: list[Term],
    jumps: list[list[Term]],
    n: int,
    structured: StructuredParts | None,
) -> VectorisedParts | None:
    """`VectorisedParts` with the real superoperators held by their nonzero
    diagonals (`Diagonals`), assembled in NumPy from the diagonals of the terms'
    own matrices (`_kron_superoperators`: O(count n^2) memory, never the
    $(1 + P)\\, 4 n^4$ entries of the dense superoperators; the Kerr oscillator at
    n = 64 peaks at 2.9 MiB, one such superoperator holds 512 MiB), when few: at
    most `MAX_DIAGONALS`; for n <= `VECTORISED_SIZE` at most (1 + P) n^2 / 4,
    where an entry of a diagonal (about 0.2 ns) beats the (1 + P) 2n^2 entries of a
    dense row (0.1 ns each) with room for the dense product's single operation;
    above, when they beat the `structured` kernel's products (`_diagonals_pay`).
    Measured on the open transmon pair (n = 9, 4 jump operators, 2 drives): 25
    diagonals, a step 384 -> 112-140 us (the structured kernel's, and 296 us with
    dense superoperators). `None` when they do not pay."""
    superoperators = _kron_superoperators(hamiltonian, jumps, n)
    if superoperators is None:
        return None
    constant, operators, sources = superoperators
    blocks = [constant, *operators]
    # The embedded count is at least the complex one (each complex diagonal
    # keeps an offset of its own): refused before any n^2 array is formed.
    if structured is None:

        def pays(count: int) -> bool:
            return 4 * count <= len(blocks) * n * n
    else:
        products = _structured_products(structured)

        def pays(count: int) -> bool:
            return _diagonals_pay(count, products, n)

    def refused(count: int) -> bool:
        return count > MAX_DIAGONALS or not pays(count)

    if refused(sum(len(_kron_offsets(block, n)) for block in blocks)):
        return None
    sums = [_kron_sum(block, n) for block in blocks]
    embedded = [_embedded_diagonals(block, n * n, False) for block in sums]
    if refused(sum(block.count for block in embedded)):
        return None
    return VectorisedParts(
        stacked=side_by_side(embedded),
        rotated=tuple(_embedded_diagonals(block, n * n, True) for block in sums[1:]),
        sources=tuple(sources),
    )


def _vectorised_parts(
    constant: Any, operators: list[Any], sources: list[tuple[Any, ...]], xp: ModuleType
) -> VectorisedParts:
    blocks = [real_embedding(x, xp) for x in [constant, *operators]]
    return VectorisedParts(
        stacked=xp.concatenate(blocks, axis=1),
        rotated=tuple(real_embedding(1j * x, xp) for x in operators),
        sources=tuple(sources),
    )


def vectorised_density_terms(
    parts: VectorisedParts,
    hamiltonian: list[Array],
    jumps: list[list[Array]],
    step: Array,
    rho: Array,
    order: int,
    adjoint: bool = False,
    constant: tuple[tuple[bool, ...], ...] | None = None,
) -> Array:
    """The terms of `structured_density_terms` for small n, on vec(rho) with the
    Liouvillian's own term structure: $\\mathcal{L} = h C + \\sum_p g_p(\\sigma)
    S_p$, each an $n^2 \\times n^2$ superoperator (the constant ones merged into
    C), so an order costs one matrix-vector product of size $n^2 \\times (1+P) n^2$
    instead of a dozen tiny matrix products, each of which costs more to dispatch
    than to compute. In real arithmetic on $(\\Re\\, \\mathrm{vec}(r),
    \\Im\\, \\mathrm{vec}(r))$: XLA's CPU products of small complex matrices cost
    several times real ones of twice the size; a complex series
    $g = g_r + i g_i$ adds the term $g_i\\, (iS)$.

    `adjoint`: see `series_loop`. `constant`: which terms of H and of each jump
    operator are constant in time (their series vanish above order 0), as
    `(hamiltonian, *jumps)`: their rows take no window of the Cauchy product in
    the loop (a rate swept by `jax.vmap` or differentiated is a traced constant,
    kept out of the merged constant superoperator but constant all the same).

    **Returns:** shape `(order + 1, n, n)`, in `rho`'s dtype.
    """
    dtype = rho.dtype
    rdtype = real_dtype(dtype)
    n = rho.shape[-1]
    h = step.astype(rdtype)
    width = order + 1
    products: dict[tuple[Any, ...], Array] = {}
    series, fixed = [], []
    for source in parts.sources:
        if source[0] == "h":
            series.append(h * hamiltonian[source[1]])
            fixed.append(constant is not None and constant[0][source[1]])
            continue
        k, a, b = source[1:]
        fixed.append(constant is not None and constant[1 + k][a] and constant[1 + k][b])
        if (k, a, b) not in products:
            products[k, a, b] = scalar_cauchy_product(
                jnp.conj(jumps[k][a]), jumps[k][b]
            )
        product = products[k, a, b]
        series.append(
            -0.5 * h * product if source[0] == "anti" else h * jnp.conj(product)
        )
    rows = [lax.pad(h[None], jnp.zeros((), rdtype), [(0, order, 0)])]
    rows += [jnp.real(g).astype(rdtype) for g in series]
    complex_rows = [p for p, g in enumerate(series) if jnp.iscomplexobj(g)]
    rows += [jnp.imag(series[p]).astype(rdtype) for p in complex_rows]
    stacked = parts.stacked
    if complex_rows:
        rotated = [parts.rotated[p] for p in complex_rows]
        stacked = side_by_side([stacked, *rotated])
    # The Schrödinger recursion of a real state (`series_loop`): the same
    # products, one per order.
    flat = rho.reshape(-1)
    # The constant superoperator's row is constant, and so are the rows of
    # constant terms; the others follow the series.
    flags = (True, *fixed, *(fixed[p] for p in complex_rows))
    v = series_loop(
        [(jnp.stack(rows), stacked, flags)],
        None,
        None,
        jnp.concatenate([flat.real, flat.imag]),
        order,
        adjoint,
    )
    return lax.complex(v[:, : n * n], v[:, n * n :]).reshape(width, n, n)
