"""The Lindblad step's series with the structure of its operators kept: diagonal
matrices (dephasing, lab-frame energies, number operators) act elementwise, real
and imaginary ones in real arithmetic, and constant parts are merged, so that a
dephasing chain costs a few matrix products per order instead of two per jump
operator.

What does not change from step to step (the constant terms merged, the products of
jump operators, the superoperators of small systems) is assembled once per solve,
by one function written for NumPy and JAX alike (`density_parts`): in NumPy before
compiling when the operators are known (`known_density_parts`; each kernel of
assembly left out of the compiled step is 4-8 ms less compile on a CPU), and in the
step itself, in JAX, when they are traced (a gradient with respect to a matrix, a
user's own diffrax solve). The step then computes only the series of the
time-dependent terms and the recursion."""

from types import ModuleType
from typing import Any, NamedTuple, cast

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._arrays import placed, to_jax
from .._operators import AbstractTimeOperator, OperatorSum, TimeOperator
from .._series import real_dtype, scalar_cauchy_product
from .._sparse import SparseMatrix
from ._term import REAL_DENSITY_SIZE, LindbladTerm, known_value


# The largest n for which mesolve steps vec(rho) with n^2 x n^2 superoperators.
VECTORISED_SIZE = 8


class _Term(NamedTuple):
    """One term $f(t) M$ of an operator: `matrix` an `(n, n)` matrix or, when
    `diagonal`, the `(n,)` diagonal; `value` the value of a constant f (shape
    `(1,)`), `None` for the rest; `constant` is static."""

    value: Any
    matrix: Any
    diagonal: bool
    constant: bool


def step_signs(step: Array, order: int) -> Array:
    """1 at even orders and the sign of $h$ at odd ones: a series at scale $|h|$
    times these is the series at scale $h$."""
    return jnp.where(jnp.arange(order + 1) % 2 == 0, 1, jnp.sign(step))


def _time_operators(operator: AbstractTimeOperator) -> tuple[TimeOperator, ...] | None:
    """The `TimeOperator`s of an operator whose terms all have dense or diagonal
    matrices; `None` for any other (a callable, a general sparse matrix), which the
    generic kernel handles."""
    ops = operator.operators if isinstance(operator, OperatorSum) else (operator,)
    out = []
    for op in ops:
        if not isinstance(op, TimeOperator):
            return None
        if isinstance(op.matrices, tuple) and not all(
            isinstance(m, SparseMatrix) and m.diagonal for m in op.matrices
        ):
            return None
        out.append(op)
    return tuple(out)


def operator_series(
    operator: AbstractTimeOperator,
    t: Array,
    order: int,
    scale: Array,
    signs: Array,
    constants: bool,
) -> list[Array | None] | None:
    """The series at scale $h$ of each term's time function (in the order of
    `operator_terms`; `scale` $= |h|$, `signs` from `step_signs`), `None` for
    constant terms unless `constants`; `None` for an operator the structured
    kernels do not take."""
    ops = _time_operators(operator)
    if ops is None:
        return None
    out: list[Array | None] = []
    for op in ops:
        for function in op.functions:
            if function.is_constant and not constants:
                out.append(None)
                continue
            c = function.series(t, order, scale)
            out.append(c * signs.astype(c.dtype))
    return out


def operator_terms(
    operator: AbstractTimeOperator, series: list[Array | None] | None = None
) -> list[_Term] | None:
    """The terms of an operator of `TimeOperator`s with dense or diagonal matrices.
    Without `series`: in NumPy, for known (not traced, not placed on a device)
    matrices and constant terms that are known `Constant`s, else `None`. With the
    step's `series` (`operator_series` with `constants`): in JAX, the values of
    constant terms from their series."""
    ops = _time_operators(operator)
    if ops is None:
        return None
    terms = []
    index = 0
    for op in ops:
        sparse = isinstance(op.matrices, tuple)
        if series is None:
            leaves = [m.values for m in op.matrices] if sparse else [op.matrices]
            if any(placed(leaf) for leaf in leaves):
                return None
            matrices = (
                [np.sum(np.asarray(m.values), axis=1) for m in op.matrices]
                if sparse
                else list(np.asarray(op.matrices))
            )
        else:
            matrices = (
                [jnp.sum(m.values, axis=1) for m in op.matrices]
                if sparse
                else list(op.matrices)
            )
        for function, matrix in zip(op.functions, matrices):
            value = None
            if function.is_constant:
                if series is None:
                    value = known_value(function)
                    if value is None:
                        return None
                    value = np.reshape(value, (1,))
                else:
                    value = cast(Array, series[index])[:1]
            terms.append(_Term(value, matrix, sparse, function.is_constant))
            index += 1
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


def _traceless(term: _Term, n: int, xp: ModuleType) -> Any:
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
    hamiltonian: list[_Term], jumps: list[list[_Term]], n: int, xp: ModuleType
) -> DensityParts:
    """The step-independent parts of the Lindblad step for `operator_terms` of H
    and of each jump operator, in `xp` (NumPy or `jax.numpy`): the vectorised
    kernel's up to n = `VECTORISED_SIZE`, the structured one's above."""
    if n <= VECTORISED_SIZE:
        return _vectorised_parts(hamiltonian, jumps, n, xp)
    return _structured_parts(hamiltonian, jumps, n, xp)


def known_density_parts(term: LindbladTerm, dtype: Any) -> DensityParts | None:
    """`density_parts` in NumPy (float64) before compiling, placed as JAX arrays
    of the state's precision; `None` when the operators are traced or not of the
    structured kernels' kind."""
    hamiltonian = operator_terms(term.hamiltonian)
    jumps = [operator_terms(op) for op in term.jump_operators]
    if hamiltonian is None or any(j is None for j in jumps):
        return None
    widened = [
        [
            t._replace(matrix=np.asarray(t.matrix, np.result_type(t.matrix, float)))
            for t in ts
        ]
        for ts in [hamiltonian, *[j for j in jumps if j is not None]]
    ]
    parts = density_parts(widened[0], widened[1:], term.size, np)
    return _cast_parts(parts, dtype, lambda x, d: to_jax(np.asarray(x, d)))


def _cast_parts(parts: DensityParts, dtype: Any, place: Any) -> DensityParts:
    """Real arrays in the real dtype of `dtype`, complex ones in `dtype`."""
    rdtype = real_dtype(dtype)
    return jax.tree.map(
        lambda x: place(x, dtype if jnp.iscomplexobj(x) else rdtype), parts
    )


def traced_density_parts(
    term: LindbladTerm,
    hamiltonian: list[Array | None],
    jumps: list[list[Array | None]],
    dtype: Any,
) -> DensityParts:
    """`density_parts` inside the step, in JAX, from the step's series of every
    term (`operator_series` with `constants`)."""
    terms = [
        operator_terms(op, series)
        for op, series in zip(
            (term.hamiltonian, *term.jump_operators), (hamiltonian, *jumps)
        )
    ]
    assert all(t is not None for t in terms)  # the step's series came from them
    known = cast(list[list[_Term]], terms)
    parts = density_parts(known[0], known[1:], term.size, jnp)
    return _cast_parts(parts, dtype, lambda x, d: x.astype(d))


def _structured_parts(
    hamiltonian: list[_Term], jumps: list[list[_Term]], n: int, xp: ModuleType
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
    hamiltonian: list[Array | None],
    jumps: list[list[Array | None]],
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


def _vectorised_parts(
    hamiltonian: list[_Term], jumps: list[list[_Term]], n: int, xp: ModuleType
) -> VectorisedParts:
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
    blocks = [real_embedding(x, xp) for x in [constant, *operators]]
    return VectorisedParts(
        stacked=xp.concatenate(blocks, axis=1),
        rotated=tuple(real_embedding(1j * x, xp) for x in operators),
        sources=tuple(sources),
    )


def vectorised_density_terms(
    parts: VectorisedParts,
    hamiltonian: list[Array | None],
    jumps: list[list[Array | None]],
    step: Array,
    rho: Array,
    order: int,
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

    **Returns:** shape `(order + 1, n, n)`, in `rho`'s dtype.
    """
    dtype = rho.dtype
    rdtype = real_dtype(dtype)
    n = rho.shape[-1]
    h = step.astype(rdtype)
    width = order + 1
    products: dict[tuple[Any, ...], Array] = {}
    series = []
    for source in parts.sources:
        if source[0] == "h":
            series.append(h * hamiltonian[source[1]])
            continue
        k, a, b = source[1:]
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
        stacked = jnp.concatenate([stacked, *rotated], axis=1)
    coefficients = jnp.stack(rows)
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


def real_embedding(matrix: Any, xp: ModuleType = jnp) -> Any:
    """The real matrix $\\begin{pmatrix} P & -Q \\\\ Q & P \\end{pmatrix}$ of
    $M = P + iQ$ acting on $(\\Re x, \\Im x)$; for a stack of matrices, one per
    matrix."""
    p, q = xp.real(matrix), xp.imag(matrix)
    top = xp.concatenate([p, -q], axis=-1)
    bottom = xp.concatenate([q, p], axis=-1)
    return xp.concatenate([top, bottom], axis=-2)


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
