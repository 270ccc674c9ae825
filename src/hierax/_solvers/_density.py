"""The Lindblad step's series with the structure of its operators kept: diagonal
matrices (dephasing, lab-frame energies, number operators) act elementwise, real
and imaginary ones in real arithmetic, and constant parts are merged, so that a
dephasing chain costs a few matrix products per order instead of two per jump
operator."""

from typing import Any, NamedTuple

import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._operators import AbstractTimeOperator, OperatorSum, TimeOperator
from .._series import real_dtype, scalar_cauchy_product
from .._sparse import SparseMatrix
from ._term import REAL_DENSITY_SIZE


class _Term(NamedTuple):
    """One term $f(t + h\\sigma) M$ of an operator: `series` the signed series of
    f at scale |h| (`(K+1,)`), `matrix` an `(n, n)` matrix or, when `diagonal`, the
    `(n,)` diagonal; `constant` is static."""

    series: Array
    matrix: Array
    diagonal: bool
    constant: bool


def step_signs(step: Array, order: int) -> Array:
    """1 at even orders and the sign of $h$ at odd ones: a series at scale $|h|$
    times these is the series at scale $h$."""
    return jnp.where(jnp.arange(order + 1) % 2 == 0, 1, jnp.sign(step))


def operator_terms(
    operator: AbstractTimeOperator, t: Array, order: int, scale: Array, signs: Array
) -> list[_Term] | None:
    """The terms of an operator made of `TimeOperator`s with dense or diagonal
    matrices, at $t$, with the series at scale $h$ (`scale` $= |h|$, `signs` from
    `step_signs`); `None` for any other operator (a callable, a general sparse
    matrix), which the generic kernel handles."""
    ops = operator.operators if isinstance(operator, OperatorSum) else (operator,)
    terms = []
    for op in ops:
        if not isinstance(op, TimeOperator):
            return None
        series = op.sparse_series(t, order, scale)
        if series.sparse is not None:
            sparse = series.sparse
            for c, m, k in zip(sparse.coefficients, sparse.matrices, sparse.constant):
                if not (isinstance(m, SparseMatrix) and m.diagonal):
                    return None
                diagonal = jnp.sum(m.values, axis=1)
                terms.append(_Term(c * signs.astype(c.dtype), diagonal, True, k))
        flags = series.constant_flags()
        for c, m, k in zip(series.coefficients, series.matrices, flags):
            terms.append(_Term(c * signs.astype(c.dtype), m, False, k))
    return terms


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


def _adjoint(matrix: Array, diagonal: bool) -> Array:
    return jnp.conj(matrix) if diagonal else jnp.conj(matrix.T)


def _merge(terms: list[tuple[Any, Array, bool]]) -> tuple[Array, bool] | None:
    """$\\sum_a c_a M_a$ for constant terms: a diagonal when every $M_a$ is one."""
    if not terms:
        return None
    diagonal = all(d for _, _, d in terms)
    parts = [c * (m if diagonal or not d else jnp.diag(m)) for c, m, d in terms]
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total, diagonal


class _Sided(NamedTuple):
    """A term of $w \\mapsto M w + \\text{sign}\\, w M$ with window weights."""

    series: Array
    matrix: Array
    diagonal: bool
    sign: float


def structured_density_terms(
    hamiltonian: list[_Term],
    jumps: list[list[_Term]],
    step: Array,
    rho: Array,
    order: int,
) -> Array:
    """The terms $v_j = \\rho^{(j)}(t)\\, h^j / j!$, $j = 0..K$, for
    $r_{j+1} = \\frac{1}{j+1} \\sum_{m \\le j} \\mathcal{L}_m[r_{j-m}]$ with
    $\\mathcal{L}[r] = -ih[H, r] - \\frac h2 \\{N, r\\} + h \\sum_j L_j r L_j^\\dagger$
    in the step's own time scale ($N = \\sum_j L_j^\\dagger L_j$), term by term:

    - constant parts of $H$ and $N$ merged into $G r - r R$ (the Hamiltonian's
      trace part removed first: the commutator does not see it, and an offset then
      costs no digits), elementwise when diagonal;
    - a time-dependent term $f_a M_a$ as $M_a w_a \\pm w_a M_a$ with the window sum
      $w_a = \\sum_i c_{a,i} r_{j-i}$;
    - a constant diagonal jump operator $d$ as $(d d^\\dagger) \\circ r_j$, all of
      them in one elementwise product; a constant dense one as $L (r_j L^\\dagger)$;
      a time-dependent one through the carried series $Q = r L^\\dagger$.

    **Returns:** shape `(order + 1, n, n)`, in `rho`'s dtype.
    """
    dtype = rho.dtype
    rdtype = real_dtype(dtype)
    n = rho.shape[-1]
    h = step.astype(rdtype)

    def cast(matrix: Array) -> Array:
        return matrix.astype(rdtype if not jnp.iscomplexobj(matrix) else dtype)

    # Two-sided terms: -ih (H w - w H) and -h/2 (N w + w N).
    fixed_left, fixed_right, sided = [], [], []
    for term in hamiltonian:
        matrix = cast(term.matrix)
        if term.constant:
            # The trace part of constant terms removed (exact for the commutator).
            if term.diagonal:
                matrix = matrix - jnp.mean(matrix)
            else:
                matrix = matrix - jnp.trace(matrix) / n * jnp.eye(n, dtype=matrix.dtype)
            c = (-1j * h * term.series[0]).astype(dtype)
            fixed_left.append((c, matrix, term.diagonal))
            fixed_right.append((c, matrix, term.diagonal))
        else:
            sided.append(_Sided(-1j * h * term.series, matrix, term.diagonal, -1.0))
    # Constant jump operators, each merged into one matrix L first: diagonal ones
    # stacked, so that their anticommutator and sandwich parts are one sum each
    # whatever their number (a dephasing chain has one per site).
    elementwise = None
    diagonals, dense_constant, varying = [], [], []
    for terms in jumps:
        if not all(term.constant for term in terms):
            varying.append(terms)
            continue
        merged = _merge(
            [(cast(t.series[0]), cast(t.matrix), t.diagonal) for t in terms]
        )
        assert merged is not None
        matrix, diagonal = merged
        (diagonals if diagonal else dense_constant).append(matrix)
    if diagonals:
        d = jnp.stack([x.astype(dtype) for x in diagonals])  # (J, n)
        # -h/2 {N, r} with N = sum_j |d_j|^2, and h sum_j (d_j d_j^dagger) o r.
        number = jnp.sum(jnp.abs(d) ** 2, axis=0).astype(rdtype)
        fixed_left.append((-0.5 * h, number, True))
        fixed_right.append((0.5 * h, number, True))
        elementwise = h * jnp.einsum("ja,jb->ab", d, jnp.conj(d))
    for matrix in dense_constant:
        number = jnp.conj(matrix.T) @ matrix
        fixed_left.append((-0.5 * h, number, False))
        fixed_right.append((0.5 * h, number, False))
    for terms in varying:
        for a in terms:
            for b in terms:
                diagonal = a.diagonal and b.diagonal
                ma, mb = cast(a.matrix), cast(b.matrix)
                if diagonal:
                    matrix = jnp.conj(ma) * mb
                else:
                    da = jnp.diag(ma) if a.diagonal else ma
                    db = jnp.diag(mb) if b.diagonal else mb
                    matrix = jnp.conj(da.T) @ db
                series = scalar_cauchy_product(jnp.conj(a.series), b.series)
                sided.append(_Sided(-0.5 * h * series, matrix, diagonal, 1.0))
    left = _merge(fixed_left)
    right = _merge(fixed_right)

    dense_constant = [(m, _adjoint(m, False)) for m in dense_constant]
    varying = [[t._replace(matrix=cast(t.matrix)) for t in terms] for terms in varying]
    lags = jnp.arange(order + 1)
    r = jnp.zeros((order + 1, n, n), dtype).at[0].set(rho)
    carried = [jnp.zeros((order + 1, n, n), dtype) for _ in varying]
    sided_series = jnp.stack([s.series.astype(dtype) for s in sided]) if sided else None

    def window_sums(series: Array, values: Array, j: Array) -> Array:
        """$\\sum_i c_{a, j-i} x_i$ for each row a of `series`: `(A, n, n)`."""
        valid = lags <= j
        weights = jnp.where(valid[None, :], series[:, jnp.where(valid, j - lags, 0)], 0)
        return jnp.tensordot(weights.astype(dtype), values, axes=(1, 0))

    def body(j, state):
        r, carried = state
        rj = lax.dynamic_index_in_dim(r, j, keepdims=False)
        total = jnp.zeros((n, n), dtype)
        if left is not None and right is not None:
            total = total + _left(left[0], left[1], rj) - _right(rj, right[0], right[1])
        if elementwise is not None:
            total = total + elementwise * rj
        for matrix, adjoint in dense_constant:
            total = total + h * _left(matrix, False, _right(rj, adjoint, False))
        if sided_series is not None:
            sums = window_sums(sided_series, r, j)
            for term, w in zip(sided, sums):
                total = total + _left(term.matrix, term.diagonal, w)
                total = total + term.sign * _right(w, term.matrix, term.diagonal)
        new_carried = []
        for terms, q in zip(varying, carried):
            # Q_j = sum_i r_{j-i} l_i^dagger, then h sum_i l_i Q_{j-i}.
            series = jnp.stack([jnp.conj(t.series).astype(dtype) for t in terms])
            sums = window_sums(series, r, j)
            q_j = jnp.zeros((n, n), dtype)
            for term, w in zip(terms, sums):
                q_j = q_j + _right(
                    w, _adjoint(term.matrix, term.diagonal), term.diagonal
                )
            q = lax.dynamic_update_index_in_dim(q, q_j, j, 0)
            series = jnp.stack([t.series.astype(dtype) for t in terms])
            sums = window_sums(series, q, j)
            for term, w in zip(terms, sums):
                total = total + h * _left(term.matrix, term.diagonal, w)
            new_carried.append(q)
        step = (1 / (j + 1)).astype(rdtype).astype(dtype)
        # Index updates without a scatter's bounds checks (kernels of their own).
        r = lax.dynamic_update_index_in_dim(r, total * step, j + 1, 0)
        return r, new_carried

    r, _ = lax.fori_loop(0, order, body, (r, carried))
    return r


def _kron_right(matrix: Array, diagonal: bool) -> Array:
    """The superoperator of $r \\mapsto r M$ on row-major vec(r): $I \\otimes M^T$."""
    n = matrix.shape[0]
    dense = jnp.diag(matrix) if diagonal else matrix
    return jnp.kron(jnp.eye(n, dtype=dense.dtype), dense.T)


def _kron_left(matrix: Array, diagonal: bool) -> Array:
    """The superoperator of $r \\mapsto M r$ on row-major vec(r): $M \\otimes I$."""
    n = matrix.shape[0]
    dense = jnp.diag(matrix) if diagonal else matrix
    return jnp.kron(dense, jnp.eye(n, dtype=dense.dtype))


def vectorised_density_terms(
    hamiltonian: list[_Term],
    jumps: list[list[_Term]],
    step: Array,
    rho: Array,
    order: int,
) -> Array:
    """The terms of `structured_density_terms` for small n, on vec(rho) with the
    Liouvillian's own term structure: $\\mathcal{L} = \\sum_a g_a(\\sigma) S_a$,
    each $S_a$ an $n^2 \\times n^2$ superoperator (the constant ones merged), so an
    order costs one matrix-vector product of size $n^2 \\times A n^2$ instead of a
    dozen tiny matrix products, each of which costs more to dispatch than to
    compute. The Hamiltonian's trace part is removed as there.

    **Returns:** shape `(order + 1, n, n)`, in `rho`'s dtype.
    """
    dtype = rho.dtype
    rdtype = real_dtype(dtype)
    n = rho.shape[-1]
    h = step.astype(rdtype)
    width = order + 1
    constant = jnp.zeros((n * n, n * n), dtype)
    series, operators = [], []

    def add(coefficients: Array, superoperator: Array, fixed: bool) -> None:
        """A term $g(\\sigma) S$; the constant ones are merged into one."""
        nonlocal constant
        if fixed:
            constant = constant + (coefficients[0] * superoperator).astype(dtype)
        else:
            series.append(coefficients)
            operators.append(superoperator.astype(dtype))

    for term in hamiltonian:
        matrix = term.matrix.astype(dtype)
        if term.constant:
            if term.diagonal:
                matrix = matrix - jnp.mean(matrix)
            else:
                matrix = matrix - jnp.trace(matrix) / n * jnp.eye(n, dtype=dtype)
        commutator = _kron_left(matrix, term.diagonal) - _kron_right(
            matrix, term.diagonal
        )
        add(h * term.series, -1j * commutator, term.constant)
    for terms in jumps:
        for a in terms:
            for b in terms:
                ma, mb = a.matrix.astype(dtype), b.matrix.astype(dtype)
                da = jnp.diag(ma) if a.diagonal else ma
                db = jnp.diag(mb) if b.diagonal else mb
                fixed = a.constant and b.constant
                # The series of conj(f_a) f_b and of its conjugate (a constant
                # pair's is its first coefficient: no Cauchy product to compile).
                if fixed:
                    product = (jnp.conj(a.series[:1]) * b.series[:1]).astype(dtype)
                else:
                    product = scalar_cauchy_product(jnp.conj(a.series), b.series)
                # -h/2 {A_a^dagger A_b, r} with conj(f_a) f_b.
                number = jnp.conj(da.T) @ db
                anticommutator = _kron_left(number, False) + _kron_right(number, False)
                add(-0.5 * h * product, anticommutator, fixed)
                # h A_a r A_b^dagger with f_a conj(f_b): A_a kron conj(A_b).
                add(h * jnp.conj(product), jnp.kron(da, jnp.conj(db)), fixed)
    # In real arithmetic on (Re vec(r), Im vec(r)): XLA's CPU products of small
    # complex matrices cost several times real ones of twice the size. A complex
    # superoperator S = P + iQ is the real [[P, -Q], [Q, P]]; a complex series
    # g = g_r + i g_i adds the term g_i (iS).
    unit = jnp.zeros((width,), rdtype).at[0].set(1)
    real_series, blocks = [unit], [real_embedding(constant)]
    for g, superoperator in zip(series, operators):
        real_series.append(jnp.real(g).astype(rdtype))
        blocks.append(real_embedding(superoperator))
        if jnp.iscomplexobj(g):
            real_series.append(jnp.imag(g).astype(rdtype))
            i_times = lax.complex(-superoperator.imag, superoperator.real)
            blocks.append(real_embedding(i_times))
    coefficients = jnp.stack(real_series)
    stacked = jnp.concatenate(blocks, axis=1)
    count = coefficients.shape[0]
    weights = lagged_weights(coefficients)
    flat = rho.reshape(-1)
    v = (
        jnp.zeros((width, 2 * n * n), rdtype)
        .at[0]
        .set(jnp.concatenate([flat.real, flat.imag]))
    )

    def body(j, v):
        window = lax.dynamic_index_in_dim(weights, j, axis=1, keepdims=False)
        inner = jnp.tensordot(window, v, axes=(1, 0)).reshape(count * 2 * n * n)
        return lax.dynamic_update_index_in_dim(v, stacked @ inner, j + 1, 0)

    v = lax.fori_loop(0, order, body, v)
    return lax.complex(v[:, : n * n], v[:, n * n :]).reshape(width, n, n)


def real_embedding(matrix: Array) -> Array:
    """The real matrix $\\begin{pmatrix} P & -Q \\\\ Q & P \\end{pmatrix}$ of
    $M = P + iQ$ acting on $(\\Re x, \\Im x)$; for a stack of matrices, one per
    matrix."""
    p, q = jnp.real(matrix), jnp.imag(matrix)
    top = jnp.concatenate([p, -q], axis=-1)
    bottom = jnp.concatenate([q, p], axis=-1)
    return jnp.concatenate([top, bottom], axis=-2)


def lagged_weights(coefficients: Array) -> Array:
    """`weights[a, j, i]` $= c_{a, j-i} / (j+1)$ for $i \\le j$, else 0: the Cauchy
    products of a recursion $v_{j+1} = \\frac{1}{j+1} \\sum_a M_a \\sum_{i \\le j}
    c_{a,j-i} v_i$ as one slice per order (`weights[:, j]`; A (K+1)^2 numbers,
    formed once per step, in the layout the gather gives: no transpose), so that the
    loop body is a contraction and a product."""
    width = coefficients.shape[-1]
    lags = np.arange(width)
    valid = lags[None, :] <= lags[:, None]
    index = np.where(valid, lags[:, None] - lags[None, :], 0)
    rdtype = real_dtype(coefficients.dtype)
    scale = (1 / jnp.arange(1, width + 1, dtype=rdtype)).astype(coefficients.dtype)
    taken = coefficients[:, index] * scale[None, :, None]
    return jnp.where(jnp.asarray(valid)[None], taken, 0)
