"""The series of a state or propagator under the Schrodinger equation,
$v_{j+1} = \\frac{1}{j+1} \\sum_{m \\le j} h_m v_{j-m}$, $v_0 = y_0$, with the step's
factor (a time scale, $-i$ and the sign of a step) in the scalar series: one
implementation for [`hierax.PropagatorDerivatives`][] and the Taylor solver's steps.

Each coefficient is a sum whose largest term has the size of the result (no
cancellation between large parts), so the recursion is stable as it stands.
"""

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._core import backend_choices, by_differentiation, exact_products
from .._data import (
    AbstractSparseMatrix,
    SparseTerms,
    TermSeries,
    frobenius,
    real_dtype,
    sparse_products,
)


def _order_loop(order: int, body: Any, init: Any) -> Any:
    """`lax.fori_loop(0, order, body, init)`, a loop over the orders, unrolled by the
    backend's factor (`BackendChoices.order_unroll`): a fixed factor, so the program
    does not grow with the order."""
    return lax.fori_loop(0, order, body, init, unroll=backend_choices().order_unroll)


def step_signs(step: Array, order: int) -> Array:
    """1 at even orders and the sign of $h$ at odd ones: a series at scale $|h|$
    times these is the series at scale $h$."""
    return jnp.where(np.arange(order + 1) % 2 == 0, 1, jnp.sign(step))


def real_embedding(matrix: Any, xp: ModuleType = jnp) -> Any:
    """The real matrix $\\begin{pmatrix} P & -Q \\\\ Q & P \\end{pmatrix}$ of
    $M = P + iQ$ acting on $(\\Re x, \\Im x)$; for a stack of matrices, one per
    matrix."""
    return _embedding(xp.real(matrix), xp.imag(matrix), xp)


def _embedding(p: Any, q: Any, xp: ModuleType) -> Any:
    """`real_embedding` of $P + iQ$ from its parts."""
    top = xp.concatenate([p, -q], axis=-1)
    bottom = xp.concatenate([q, p], axis=-1)
    return xp.concatenate([top, bottom], axis=-2)


def _along_orders(factor: Array, coefficients: Array) -> Array:
    """`factor` (one number per order, `(K+1,)`) shaped to scale `coefficients`
    along their orders: `(A, K+1)`, or `(A, K+1, m)` with one series per column of
    the state (a batch stepped together: `hierax.sesolve` under `jax.vmap`)."""
    return factor.reshape((1, -1) + (1,) * (coefficients.ndim - 2))


def lagged_weights(coefficients: Array) -> Array:
    """`weights[a, j, i]` $= c_{a, j-i} / (j+1)$ for $i \\le j$, else 0: the Cauchy
    products of a recursion $v_{j+1} = \\frac{1}{j+1} \\sum_a M_a \\sum_{i \\le j}
    c_{a,j-i} v_i$, every order's window in one table (A (K+1)^2 numbers), as the
    adjoint recursion reads them (`_by_adjoint`; the forward loop slices
    `reversed_padded` instead)."""
    width = coefficients.shape[-1]
    lags = np.arange(width)
    valid = lags[None, :] <= lags[:, None]
    index = np.where(valid, lags[:, None] - lags[None, :], 0)
    rdtype = real_dtype(coefficients.dtype)
    scale = (1 / np.arange(1, width + 1, dtype=rdtype)).astype(coefficients.dtype)
    taken = coefficients[:, index] * scale[None, :, None]
    return jnp.where(jnp.asarray(valid)[None], taken, 0)


def reversed_padded(series: Array, axis: int = -1) -> Array:
    """A series along `axis` (coefficients `(A, K+1)` by default) latest first and
    then K zeros, 2K+1 long: entry $K - m$ is $c_m$, so that its slice of K+1 from
    $K - j$ is the window of order j of the Cauchy product, $c_{j-i}$ at
    $i \\le j$ and zero beyond (`lagged_slice`)."""
    axis = axis % series.ndim
    order = series.shape[axis] - 1
    shape = series.shape[:axis] + (order,) + series.shape[axis + 1 :]
    zeros = jnp.zeros(shape, series.dtype)
    return jnp.concatenate([jnp.flip(series, axis), zeros], axis=axis)


def lagged_slice(padded: Array, j: Array, axis: int = -1) -> Array:
    """Entry i along `axis` is $c_{j-i}$ for $i \\le j$ and zero for $i > j$, from
    `reversed_padded(c, axis)`: one dynamic slice, whatever j is."""
    order = (padded.shape[axis] - 1) // 2
    return lax.dynamic_slice_in_dim(padded, order - j, order + 1, axis=axis)


def _lagged_of_padded(padded: Array) -> Array:
    """`lagged_weights` of the coefficients whose `reversed_padded` is `padded`
    (for the adjoint, which reads every window): `weights[a, j, i]` is
    `padded[a, K - j + i]` (zero past $i > j$ by the padding) over $j + 1$."""
    order = (padded.shape[-1] - 1) // 2
    lags = np.arange(order + 1)
    rdtype = real_dtype(padded.dtype)
    scale = (1 / np.arange(1, order + 2, dtype=rdtype)).astype(padded.dtype)
    return padded[:, order - lags[:, None] + lags[None, :]] * scale[None, :, None]


# From which size real matrices pay (measured, x64 CPU): a matrix-vector product in
# real halves costs more operations than it saves below a few hundred rows (n = 32:
# 2x slower; n = 1024: 2x faster); a matrix-matrix product pays from a few dozen.
# Below REAL_STATE_SIZE a state is stepped as (Re y, Im y) with each -iH_a as one
# real matrix of twice the size instead (`_embedded_series`).
REAL_STATE_SIZE = 256


def state_series(
    real: TermSeries | None,
    series: TermSeries | None,
    factor: Array,
    y0: Array,
    order: int,
    embedded: "EmbeddedParts | DenseEmbedding | None" = None,
    adjoint: bool = False,
    degree: int | None = None,
) -> Array:
    """The terms $v_j$, $j = 0..K$, of $v_{j+1} = \\frac{-i\\,\\phi_{j+1}}{j+1}
    \\sum_m h_m v_{j-m}$, $v_0 = y_0$: the series of $\\dot y = -iH y$ in a time
    unit $s$, with $\\phi$ = `factor` (shape `(K+1,)`, real: $s$, with odd orders
    negated for a step backwards) and $h_m$ the series of $H(t + |s|\\sigma)$ in
    two parts, `real` (terms whose matrices are real, applied to the real and
    imaginary parts of the state side by side: half the work of complex
    products) and `series` (the rest: dense terms, a dense part, sparse terms).
    A small state (below `REAL_STATE_SIZE`) with dense terms only is stepped in
    real arithmetic (`_embedded_series`; `embedded`: the terms' real embeddings
    held by their diagonals, when assembled before compiling). A loop over orders
    of fixed shape, so the traced program does not grow with K; the state's dtype
    sets the precision. `adjoint`: see `series_loop`. `degree`: the highest order
    at which the series $h_m$ can be nonzero, known from the terms' structure
    (`series_degree`), or `None`. **Returns:** shape `(order + 1, *y0.shape)`."""
    dtype = jnp.result_type(y0, 1j)
    rdtype = real_dtype(dtype)
    if (
        y0.shape[0] < REAL_STATE_SIZE
        and real is None
        and series is not None
        and series.dense is None
        and series.sparse is None
    ):
        return _embedded_series(
            series, factor.astype(rdtype), y0, order, embedded, adjoint, degree
        )
    # -i phi / (j + 1) goes into the weights, so each order costs the products only.
    complex_factor = factor.astype(dtype) * (-1j)
    n = y0.shape[0]
    # Real matrices, real coefficients and nothing else: the coefficients are -i
    # times real ones, and the loop runs in real arithmetic (`series_loop`'s
    # `turned`).
    turned = (
        real is not None
        and series is None
        and not jnp.iscomplexobj(real.coefficients)
        and (real.column_scales is None or not jnp.iscomplexobj(real.column_scales))
    )
    parts = []
    for part, matrix_dtype in ((real, rdtype), (series, dtype)):
        if part is None or part.coefficients.shape[0] == 0:
            continue
        # (A, n, n) -> (n, A n): the products of all terms as one matrix product.
        count = part.coefficients.shape[0]
        stacked = jnp.transpose(part.matrices.astype(matrix_dtype), (1, 0, 2))
        coefficients = part.coefficients.astype(dtype) * _along_orders(
            complex_factor, part.coefficients
        )
        parts.append(
            (
                coefficients,
                stacked.reshape(n, count * n),
                part.constant_flags(),
                part.column_scales,
            )
        )
    dense = sparse = None
    if series is not None and series.dense is not None:
        shape = (-1,) + (1,) * (series.dense.ndim - 1)
        dense = series.dense.astype(dtype) * complex_factor.reshape(shape)
    if series is not None and series.sparse is not None:
        # The matrices keep their kind: `sparse_products` casts them.
        sparse = series.sparse._replace(
            coefficients=series.sparse.coefficients.astype(dtype)
            * complex_factor[None, :]
        )
    return series_loop(
        parts, dense, sparse, y0.astype(dtype), order, adjoint, turned, degree
    )


# From this many entries of a state on, `series_loop` reads only the D + 1 latest
# terms in each order's window where the series end at order D (`degree`). Measured
# (`sesolve` of a transmon under two 32-knot cubic splines, x64, 2 cores, a ket in
# the real embedding of 2 x levels rows): 48 levels 37.4-38.2 -> 30.3-31.1 ms (its
# gradient 246-248 -> 212-230 ms), 32 levels 13.3-13.7 -> 11.9-12.0 ms (82-89 ->
# 73-74 ms); from 6 to 12 levels within the machine's noise, and 5 levels
# 0.56-0.61 -> 0.89-0.92 ms (two dynamic slices an order cost more than the window
# they shorten).
_DEGREE_WINDOW_SIZE = 64


# From this many entries of a state on, `series_loop` carries each order beside the
# series (see there). Measured (`sesolve`, Ising chains with sparse terms, 2 cores):
# unequal fields (products that read every entry) n = 65536 282 -> 212 ms, n = 16384
# 55 -> 50 ms; a uniform sum_i X_i (`UniformSparseMatrix`) 160 -> 156 ms and
# 40 -> 44 ms; below, handing the products to threads costs more than it saves
# (n = 8192 20-21 -> 22 ms, n = 4096 18 -> 24 ms).
_PARALLEL_STATE_SIZE = 16384


class Diagonals(eqx.Module):
    """A real matrix of n rows and `blocks` n columns (square blocks side by side,
    as `series_loop` takes the matrices of several terms) held by its nonzero
    diagonals: `values[k, r]` is the entry of row r in block `offsets[k][0]`,
    column `r + offsets[k][1]` (zero where that column is outside the block).

    The superoperators of the Lindblad equation for the usual sparse operators
    (ladder, number and Pauli operators, couplings between a few modes) have a few
    dozen nonzero diagonals, whatever n. A product is then one shifted slice, one
    multiply and one add per diagonal, which XLA fuses into one loop over the rows
    with no gather (measured on a CPU: about 0.2 ns an entry, against 0.1 for a
    dense product and 1-2.5 for a gathered sparse one). The structure is static:
    the program has one slice per diagonal."""

    values: Any  # NumPy until placed (`cast_parts`)
    offsets: tuple[tuple[int, int], ...] = eqx.field(static=True)
    blocks: int = eqx.field(static=True)

    @classmethod
    def from_matrix(cls, matrix: np.ndarray) -> "Diagonals":
        """The nonzero diagonals of a square NumPy matrix (one block)."""
        n = matrix.shape[0]
        rows, columns = np.nonzero(matrix)
        offsets = np.unique(columns - rows)
        values = np.zeros((len(offsets), n), matrix.dtype)
        where = np.searchsorted(offsets, columns - rows)
        values[where, rows] = matrix[rows, columns]
        return cls(values, tuple((0, int(d)) for d in offsets), 1)

    @property
    def count(self) -> int:
        return len(self.offsets)

    def __matmul__(self, x: Array) -> Array:
        n = self.values.shape[-1]
        blocks = x.reshape((self.blocks, n) + x.shape[1:])
        pad = max((abs(d) for _, d in self.offsets), default=0)
        widths = [(0, 0), (pad, pad)] + [(0, 0)] * (x.ndim - 1)
        padded = jnp.pad(blocks, widths)
        values = self.values.astype(x.dtype).reshape(
            self.values.shape + (1,) * (x.ndim - 1)
        )
        out = jnp.zeros((n,) + x.shape[1:], x.dtype)
        for k, (block, offset) in enumerate(self.offsets):
            start = pad + offset
            out = out + values[k] * padded[block, start : start + n]
        return out


def side_by_side(matrices: list[Any]) -> Any:
    """Matrices of n rows side by side: dense ones concatenated, `Diagonals` with
    their blocks renumbered."""
    if not isinstance(matrices[0], Diagonals):
        return jnp.concatenate(matrices, axis=1)
    offsets, first = [], 0
    for m in matrices:
        offsets += [(first + block, offset) for block, offset in m.offsets]
        first += m.blocks
    known = all(isinstance(m.values, np.ndarray) for m in matrices)
    values = (np if known else jnp).concatenate([m.values for m in matrices])
    return Diagonals(values, tuple(offsets), first)


def series_loop(
    parts: list[tuple[Any, ...]],
    dense: Array | None,
    sparse: Any,
    y0: Array,
    order: int,
    adjoint: bool = False,
    turned: bool = False,
    degree: int | None = None,
) -> Array:
    """The recursion $v_{j+1} = \\frac{1}{j+1} \\sum_m h_m v_{j-m}$, $v_0 = y_0$,
    with the step's factor already in the series: `parts` are (coefficients
    `(A, K+1)`, matrices side by side `(n, A n)`, dense or `Diagonals`, which
    rows are constant: static flags, empty for none, and optionally real
    per-column scales of the rows `(A, m)` or `None`: see
    `TermSeries.column_scales`), `dense` a series
    `(K+1, n, n)`, `sparse` sparse terms. A loop over orders of fixed shape, so the
    traced program does not grow with K. Real matrices with a complex state are
    applied to its real and imaginary parts side by side.

    `adjoint`: differentiate in reverse mode by the adjoint recursion
    (`_by_adjoint`) rather than by JAX's transpose of the loop, where the loop has
    no `dense` part; forward mode (`jax.jvp`) through the result is then
    refused.

    `turned`: every part's coefficients (and values and scales) are $-i$ times real
    ones, exactly (as `state_series` forms them: a real number times $-i$ is exact),
    its matrices real, and there is no `dense` or `sparse` part. The loop then
    runs on the real and imaginary halves of the state side by side, `(n, 2m)`,
    with the real coefficients, and turns each order by $-i$: $-i(a + ib) = b - ia$,
    a swap of the halves. Every product is real, and an order takes one product
    for the window and one for the matrices (a complex state took two more passes
    an order to split its halves for the real matrices and join them after, and
    its window's complex products were a quarter zeros).

    `degree`: the highest order at which the parts' coefficients can be nonzero
    (`series_degree`), or `None`: each order's window then reads the D + 1 latest
    terms only (the adjoint's tables read them all, zeros beyond D)."""
    dtype = y0.dtype
    n = y0.shape[0]
    columns = math.prod(y0.shape[1:])
    rdtype = real_dtype(dtype)
    # The time-dependent rows' coefficients latest first and zero-padded, formed
    # once: each order's window of the Cauchy product is one slice of them. (A
    # table of every order's window, (K+1)^2 numbers a row gathered every step,
    # cost a batch of steps under `jax.vmap` most of its time: 256 detunings of a
    # qubit under a Gaussian pulse, K = 28, 641-673 -> 235-239 us a step, K = 12
    # 130 -> 68 us, its gradient 43-46 -> 34-35 ms; alone, one such solve ties
    # (7.5-8.7 against 6.8-9.0 us a step) and the lab-frame transmon's sesolve
    # gains, 3.4-3.5 -> 2.8 ms.) A dense series' window is a slice the same way. A
    # constant row needs only its value times v_j (in a window, a row of zeros but
    # one: a step's constant Hamiltonian and a drive spent half the window's work on
    # it).
    inverse = (1 / np.arange(1, order + 2, dtype=rdtype)).astype(rdtype)
    # The orders a window reads: c_{j-i} vanishes for j - i > D (from
    # `_DEGREE_WINDOW_SIZE` entries of the state on).
    width = order + 1
    if degree is not None and n * columns >= _DEGREE_WINDOW_SIZE:
        width = min(order, degree) + 1
    dense_padded = None if dense is None else reversed_padded(dense, axis=0)
    arrays, rows_of, scales_of = [], [], []
    for coefficients, stacked, constant, *scales in parts:
        flags = constant if len(constant) == coefficients.shape[0] else ()
        rows = range(coefficients.shape[0])
        fixed = np.asarray([a for a in rows if flags and flags[a]], dtype=int)
        varying = np.asarray([a for a in rows if not (flags and flags[a])], dtype=int)
        # Per-column series (a batch in lockstep): coefficients `(A, K+1, m)` that
        # differ between columns in their constant rows only, and real per-column
        # scales of the rows (`TermSeries.column_scales`): a time-dependent row's
        # window is any column's, its product with v scaled per column.
        shared = coefficients if coefficients.ndim == 2 else coefficients[..., 0]
        window = reversed_padded(shared[varying]) if varying.size else None
        values = coefficients[fixed, 0] if fixed.size else None
        scale = scales[0] if scales and scales[0] is not None else None
        if scale is not None:
            # (Complex scales only for a complex step: `_embedded_series` takes
            # real ones.)
            scale = scale.astype(dtype if jnp.iscomplexobj(scale) else rdtype)
            if values is not None:
                given = values if values.ndim == 2 else values[:, None]
                values = given * scale[fixed]
            scale = scale[varying] if varying.size else None
        arrays.append((window, values, stacked))
        rows_of.append((fixed, varying))
        scales_of.append(scale)

    def inner_of(window, values, rows, scale, v, j, current, columns=columns):
        """The vectors that meet the stacked matrices, row by row: `(A, n, ...)`."""
        summed = scaled = None
        if window is not None:
            weights = lagged_slice(window, j) * jnp.asarray(inverse)[j]
            past = v
            if width <= order:
                # Orders j - D ... j (from 0 while j < D, where the weights of
                # orders past j are zero).
                start = jnp.clip(j - (width - 1), 0, order + 1 - width)
                weights = lax.dynamic_slice_in_dim(weights, start, width, axis=1)
                past = lax.dynamic_slice_in_dim(v, start, width, axis=0)
            summed = jnp.tensordot(weights, past, axes=(1, 0))
            if scale is not None:
                # One scale per row and column, against the columns of the sum.
                rows_ = summed.reshape((summed.shape[0], n, columns))
                summed = (rows_ * scale[:, None, :]).reshape(summed.shape)
        if values is not None:
            vj = (
                lax.dynamic_index_in_dim(v, j, keepdims=False)
                if current is None
                else current
            )
            scale = (1 / (j + 1)).astype(rdtype)
            if values.ndim == 1:
                shape = (-1,) + (1,) * vj.ndim
                scaled = (values * scale).reshape(shape) * vj[None]
            else:
                # One value per column, against the columns of v_j.
                rows_ = vj.reshape((vj.shape[0], columns))
                scaled = ((values * scale)[:, None, :] * rows_[None]).reshape(
                    (values.shape[0],) + vj.shape
                )
        return _in_term_order(rows, summed, scaled)

    def products(arrays, scales, v, j, current, width, out_dtype):
        """The parts' products of order j: `(n, width)`."""
        out = jnp.zeros((n, width), out_dtype)
        for (window, values, stacked), rows, scale in zip(arrays, rows_of, scales):
            inner = inner_of(window, values, rows, scale, v, j, current, width)
            out = out + _times(stacked, inner.reshape(-1, width))
        return out

    def body(arrays, sparse, j, v, current):
        out = products(arrays, scales_of, v, j, current, columns, dtype)
        out = out.reshape(y0.shape)
        if dense_padded is not None or sparse is not None:
            rest = jnp.zeros(y0.shape, dtype)
            if dense_padded is not None:
                window = lagged_slice(dense_padded, j, axis=0)
                rest = rest + jnp.tensordot(window, v, axes=((0, 2), (0, 1)))
            if sparse is not None:
                rest = rest + sparse_products(sparse, v, j, current)
            # 1 / (j + 1) as a real factor: a complex division costs far more.
            out = out + rest * (1 / (j + 1)).astype(real_dtype(dtype))
        return out

    def turned_loop(arrays, y0):
        """The loop of `turned` parts, on $(\\Re v, \\Im v)$ side by side."""

        # -i times a real number, exactly: the real number is minus its imaginary
        # part. Per-column values and scales (2-D) serve both halves of their
        # column.
        def real_of(x):
            if x is None:
                return None
            x = -jnp.imag(x) if jnp.iscomplexobj(x) else x.astype(rdtype)
            return x if x.ndim == 1 else jnp.concatenate([x, x], axis=-1)

        real = [
            (None if window is None else -jnp.imag(window), real_of(values), stacked)
            for window, values, stacked in arrays
        ]
        scales = [real_of(s) for s in scales_of]
        start = y0.reshape(n, columns)
        start = jnp.concatenate([start.real, start.imag], axis=1)
        width = 2 * columns

        def body(j, v):
            out = products(real, scales, v, j, None, width, rdtype)
            turned = jnp.concatenate([out[:, columns:], -out[:, :columns]], axis=1)
            return lax.dynamic_update_index_in_dim(v, turned, j + 1, 0)

        v = jnp.zeros((order + 1, n, width), rdtype).at[0].set(start)
        v = _order_loop(order, body, v)
        both = lax.complex(v[..., :columns], v[..., columns:])
        return both.reshape((order + 1,) + y0.shape)

    def loop(arrays, sparse, y0):
        if turned:
            return turned_loop(arrays, y0)
        v = jnp.zeros((order + 1,) + y0.shape, dtype).at[0].set(y0)
        if sparse is None or n * columns < _PARALLEL_STATE_SIZE:
            return _order_loop(
                order,
                lambda j, v: lax.dynamic_update_index_in_dim(
                    v, body(arrays, sparse, j, v, None), j + 1, 0
                ),
                v,
            )

        # XLA:CPU fuses the computation of an order into the in-place update of
        # `v`, which it runs on one thread. For a large state the order is also
        # carried beside `v` (read by the next order's constant terms, and written
        # once more after the loop, so that the carry stays live whatever the
        # terms): the products then form a loop fusion of their own, which XLA
        # splits across threads.
        def carried(j, state):
            v, current = state
            out = body(arrays, sparse, j, v, current)
            return lax.dynamic_update_index_in_dim(v, out, j + 1, 0), out

        v, last = _order_loop(order, carried, (v, v[0]))
        return lax.dynamic_update_index_in_dim(v, last, order, 0)

    # (Per-column coefficients are stepped forward only: `hierax.sesolve`
    # differentiates a batch element by element.)
    per_column = any(s is not None for s in scales_of)
    per_column = per_column or any(part[0].ndim == 3 for part in parts)
    if adjoint and dense is None and not per_column:
        return _by_adjoint(loop, arrays, rows_of, sparse, y0, order)
    return loop(arrays, sparse, y0)


def _in_term_order(
    rows: tuple[np.ndarray, np.ndarray], varying: Array | None, fixed: Array | None
) -> Array:
    """Rows `(A, ...)` in the order of a part's terms, from those of its
    time-dependent rows (`varying`, in the order of `rows[1]`) and of its
    constant ones (`fixed`, in the order of `rows[0]`)."""
    pieces = {}
    for part, indices in ((varying, rows[1]), (fixed, rows[0])):
        if part is not None:
            pieces.update({int(a): part[k : k + 1] for k, a in enumerate(indices)})
    ordered = [pieces[a] for a in range(len(pieces))]
    return ordered[0] if len(ordered) == 1 else jnp.concatenate(ordered)


def _times(stacked: Any, x: Array) -> Array:
    """`stacked @ x` for `x` of shape `(A n, columns)`."""
    if isinstance(stacked, Diagonals):
        return stacked @ x
    return _dense_product(stacked, x, 1)


def _dense_product(matrix: Array, x: Array, axis: int) -> Array:
    """The product of a dense matrix, contracted on `axis` (1: `matrix @ x`, 0:
    `matrix.T @ x`, with no transpose formed), with `x` of shape
    `(rows, columns)`; a real matrix with a complex `x` in one pass over the
    matrix for both halves of `x`."""
    if jnp.iscomplexobj(matrix) or not jnp.iscomplexobj(x):
        return jnp.tensordot(matrix, x.astype(jnp.result_type(matrix, x)), (axis, 0))
    columns = x.shape[1]
    both = jnp.tensordot(matrix, jnp.concatenate([x.real, x.imag], axis=1), (axis, 0))
    return lax.complex(both[:, :columns], both[:, columns:])


def _by_adjoint(
    loop: Any,
    arrays: list[tuple[Array | None, Array | None, Any]],
    rows_of: list[tuple[np.ndarray, np.ndarray]],
    sparse: Any,
    y0: Array,
    order: int,
) -> Array:
    """`loop(arrays, sparse, y0)` (the recursion of `series_loop`, linear in $v_0$
    and in each part's window $W$, constant values and matrices $S$) differentiated
    in reverse mode by its adjoint recursion instead of JAX's transpose of the loop,
    which saves every order's operands and spends about four times the forward
    loop's operations on the way back (the lab-frame transmon pair's step: 160 us
    against 24 us forward).

    With $v_{j+1} = S\\, u_j$, $u_j$ the rows' vectors (`inner_of`: $\\sum_i W_{a,j,i}
    v_i$, or $c_a v_j / (j+1)$ for a constant row), and $g_i$ the cotangent of
    $v_i$ with every later order's share, from $j = K-1$ down:
    $g_{j+1} = \\bar v_{j+1} + \\sum_{a,\\, j' > j} W_{a,j',j+1}\\, z_{a,j'}$ (a
    constant row's $z_{a,j+1}$ with weight $c_a / (j+2)$), then
    $z_j = S^T g_{j+1}$: each order's cotangent gathered once from the later
    $z$, as the forward loop gathers its window from the earlier $v$. (Adding
    each $z_j$ to every earlier $g_i$ instead rewrote all $K+1$ of them every
    order, two passes over $(K+1)\\, n$ numbers: the 16-level open oscillator's
    gradient took 2.7-3.9 ms against 2.1 ms.) After the loop
    $\\bar y_0 = g_0$, $\\bar W_{a,j,i} = z_{a,j} \\cdot v_i$,
    $\\bar c_a = \\sum_j z_{a,j} \\cdot v_j / (j+1)$ and
    $\\bar S = \\sum_j g_{j+1} u_j^T$: one loop of the forward loop's size and a
    few contractions. Cotangents are JAX's (transposes, no conjugation). Sparse
    terms (`sparse`, `SparseTerms`) enter the same way, each a part of one row
    whose transposed product is a scatter of its entries."""
    n = y0.shape[0]
    columns = math.prod(y0.shape[1:])
    # NumPy leaves (known diagonals) enter as arrays: the rule may not close over
    # values of the trace, and takes none from outside it.
    inputs = jax.tree.map(jnp.asarray, arrays)
    flags: tuple[bool, ...] = () if sparse is None else sparse.constant
    given = None if sparse is None else (sparse.coefficients, sparse.matrices)

    def terms_of(given: Any) -> Any:
        if given is None:
            return None
        coefficients, matrices = given
        return SparseTerms(coefficients, matrices, flags)

    @jax.custom_vjp
    def run(inputs, given, y0):
        return loop(inputs, terms_of(given), y0)

    # Every input's cotangent is formed: XLA drops those nothing reads. (JAX's
    # symbolic zeros cannot choose them: a program traced once is differentiated
    # again with other inputs perturbed, and the backward rule then meets another
    # forward trace's flags.)
    def forward(inputs, given, y0):
        v = loop(inputs, terms_of(given), y0)
        return v, (inputs, given, v)

    def backward(residuals, v_bar):
        parts, given, v = residuals
        # The adjoint reads every window: the table of them, once per backward pass.
        padded = [window for window, _, _ in parts]
        parts = [
            (None if w is None else _lagged_of_padded(w), values, stacked)
            for w, values, stacked in parts
        ]
        rows_all = list(rows_of)
        if given is not None:
            more, more_rows = _sparse_parts(terms_of(given), v.dtype)
            parts, rows_all = parts + more, rows_all + more_rows
        flat = v.reshape(order + 1, n * columns)
        rdtype = real_dtype(v.dtype)

        # The weights of the later z in each order's cotangent, for every row,
        # formed once before the loop (as are Diagonals' transposes):
        # `reads[i, j', a]` = $W_{a,j',i}$ for a time-dependent row, and
        # $c_a / (i+1)$ at $j' = i$ for a constant one; one slice an order.
        inverse = (1 / jnp.arange(1, order + 2)).astype(rdtype)  # 1 / (i + 1)
        reads = []
        for (window, values, _), rows in zip(parts, rows_all):
            varying = constant = None
            if window is not None:
                varying = jnp.swapaxes(window, 1, 2)[:, :, :order]
            if values is not None:
                at = np.eye(order + 1, order, dtype=bool)
                by_order = values[:, None] * inverse[None, :]
                constant = jnp.where(at[None], by_order[:, :, None], 0)
            weights = _in_term_order(rows, varying, constant).astype(v.dtype)
            reads.append(jnp.transpose(weights, (1, 2, 0)))
        transposes = [
            _transposed_blocks(s) if isinstance(s, Diagonals) else s
            for _, _, s in parts
        ]
        v_bar = v_bar.astype(v.dtype).reshape(order + 1, n * columns)

        # A part of constant rows only reads $v_i$ at order i alone: its share
        # of $g_i$ is $\\sum_a c_a z_{a,i} / (i+1)$, one row of its z, not a
        # product over every order's. (Where every part is such a part, with
        # dense matrices and no sparse terms, `_constant_rows_adjoint` runs
        # instead; this serves the rest: diagonals, or beside other parts.)
        own_order = [window is None for window, _, _ in parts]

        def gathered(zs, i):
            """$g_i$ from $\\bar v_i$ and the $z_{a,j'}$ (`(K, A, n m)`, zero
            where not yet formed) of the orders $u_{j'}$ that read $v_i$."""
            g_i = lax.dynamic_index_in_dim(v_bar, i, keepdims=False)
            for read, z, own in zip(reads, zs, own_order):
                if own:
                    # (A,) against (A, n m); nothing reads v_K (i = K: weight 0).
                    at = jnp.minimum(i, order - 1)
                    weights = lax.dynamic_index_in_dim(
                        lax.dynamic_index_in_dim(read, i, keepdims=False),
                        at,
                        keepdims=False,
                    )
                    z_i = lax.dynamic_index_in_dim(z, at, keepdims=False)
                    g_i = g_i + jnp.tensordot(weights, z_i, axes=(0, 0))
                    continue
                weights = lax.dynamic_index_in_dim(read, i, keepdims=False)
                # (K, A) against (K, A, n m): one product over both axes.
                g_i = g_i + jnp.tensordot(weights, z, axes=((0, 1), (0, 1)))
            return g_i

        def back(r, carry):
            g, zs = carry
            j = order - 1 - r
            later = gathered(zs, j + 1)
            g = lax.dynamic_update_index_in_dim(g, later, j + 1, 0)
            later = later.reshape(n, columns)
            zs = [
                lax.dynamic_update_index_in_dim(
                    z_all,
                    _times_transposed(transposed, later).reshape(-1, n * columns),
                    j,
                    0,
                )
                for transposed, z_all in zip(transposes, zs)
            ]
            return g, zs

        if given is None and all(
            w is None and not isinstance(s, Diagonals) for w, _, s in parts
        ):
            g, zs = _constant_rows_adjoint(parts, v_bar, order, n, columns, inverse)
        else:
            zs = [
                jnp.zeros((order, rows[0].size + rows[1].size, n * columns), v.dtype)
                for rows in rows_all
            ]
            g, zs = _order_loop(order, back, (jnp.zeros_like(v_bar), zs))
            g = lax.dynamic_update_index_in_dim(g, gathered(zs, 0), 0, 0)
        past = flat[:order]
        scale = inverse[:order]
        bars = []
        for (window, values, stacked), rows, z in zip(parts, rows_all, zs):
            fixed, varying = rows
            window_bar = values_bar = u_varying = u_fixed = None
            if window is not None:
                w_bar = jnp.einsum("jkx,ix->kji", z[:, varying], flat)
                w_bar = jnp.concatenate([w_bar, jnp.zeros_like(w_bar[:, :1])], axis=1)
                window_bar = _like(w_bar, window)
                u_varying = jnp.einsum(
                    "kji,ix->kjx", window[:, :order].astype(v.dtype), flat
                )
            if values is not None:
                by_order = jnp.einsum("jkx,jx->kj", z[:, fixed], past) * scale[None]
                values_bar = _like(jnp.sum(by_order, axis=1), values)
                u_fixed = (
                    values.astype(v.dtype)[:, None, None]
                    * (past * scale[:, None])[None]
                )
            # u[a, j] = u_{a,j}: the columns of S are the terms' blocks.
            u = _in_term_order(rows, u_varying, u_fixed).reshape(-1, order, n, columns)
            later = g[1:].reshape(order, n, columns)
            stacked_bar = _matrix_cotangent(stacked, later, u)
            bars.append((window_bar, values_bar, stacked_bar))
        sparse_bar = None
        if given is not None:
            sparse_bar = _sparse_cotangents(given, flags, bars[len(rows_of) :])
        y0_bar = g[0].reshape(y0.shape).astype(y0.dtype)
        own = [
            (bar if w is None else jax.vjp(_lagged_of_padded, w)[1](bar)[0], c, s)
            for (bar, c, s), w in zip(bars[: len(rows_of)], padded)
        ]
        return own, sparse_bar, y0_bar

    run.defvjp(forward, exact_products(backward))
    return run(inputs, given, y0)


def _constant_rows_adjoint(
    parts: list[tuple[Any, Any, Any]],
    v_bar: Array,
    order: int,
    n: int,
    columns: int,
    inverse: Array,
) -> tuple[Array, list[Array]]:
    """The loop of `_by_adjoint` for parts of constant rows only and dense
    matrices (a constant Hamiltonian, piecewise-constant pulses): there
    $v_{j+1} = G v_j / (j+1)$ with $G = \\sum_a c_a S_a$, so
    $g_j = \\bar v_j + G^T g_{j+1} / (j+1)$, one product an order, and every
    $z_{a,j} = S_a^T g_{j+1}$ after the loop in one product. Returns `g`
    `(K+1, n m)` and each part's `z` `(K, A, n m)`, as the general loop does."""
    dtype = v_bar.dtype
    merged = None
    for _, values, stacked in parts:
        blocks = stacked.reshape(n, -1, n)
        g_part = jnp.einsum("a,ian->in", values.astype(dtype), blocks.astype(dtype))
        merged = g_part if merged is None else merged + g_part
    assert merged is not None

    def back(r, g):
        j = order - 1 - r
        later = lax.dynamic_index_in_dim(g, j + 1, keepdims=False)
        own = lax.dynamic_index_in_dim(v_bar, j, keepdims=False)
        earlier = _dense_product(merged, later.reshape(n, columns), 0)
        earlier = own + earlier.reshape(-1) * inverse[j].astype(dtype)
        return lax.dynamic_update_index_in_dim(g, earlier, j, 0)

    g = lax.dynamic_update_index_in_dim(jnp.zeros_like(v_bar), v_bar[order], order, 0)
    g = _order_loop(order, back, g)
    # (n, K m): every later cotangent side by side, against each part's S^T.
    later = jnp.moveaxis(g[1:].reshape(order, n, columns), 0, 1).reshape(n, -1)
    zs = []
    for _, values, stacked in parts:
        z = _dense_product(stacked, later, 0).reshape(-1, n, order, columns)
        zs.append(jnp.moveaxis(z, 2, 0).reshape(order, values.shape[0], n * columns))
    return g, zs


def _sparse_parts(
    terms: Any, dtype: Any
) -> tuple[list[tuple[Any, Any, Any]], list[tuple[np.ndarray, np.ndarray]]]:
    """Each sparse term as a part of `_by_adjoint`: its window (or constant value)
    with the 1 / (j+1) of `series_loop`, and its matrix, real matrices kept real
    as `sparse_products` keeps them."""
    parts, rows = [], []
    one, none = np.asarray([0]), np.asarray([], dtype=int)
    for s, matrix in enumerate(terms.matrices):
        kind = dtype if jnp.iscomplexobj(matrix.values) else real_dtype(dtype)
        c = terms.coefficients[s : s + 1].astype(dtype)
        if terms.constant[s]:
            parts.append((None, c[:, 0], matrix.astype(kind)))
            rows.append((one, none))
        else:
            parts.append((lagged_weights(c), None, matrix.astype(kind)))
            rows.append((none, one))
    return parts, rows


def _sparse_cotangents(given: Any, flags: tuple[bool, ...], bars: list) -> Any:
    """The cotangents of the sparse terms' (coefficients, matrices) from those of
    their parts (`_sparse_parts`): a window's through `lagged_weights`."""
    coefficients, matrices = given
    rows = []
    for s, (window_bar, values_bar, _) in enumerate(bars):
        c = coefficients[s : s + 1].astype(jnp.result_type(coefficients, 1j))
        if flags[s]:
            row = jnp.zeros_like(c).at[:, 0].set(values_bar.astype(c.dtype))
        else:
            _, back = jax.vjp(lagged_weights, c)
            (row,) = back(window_bar.astype(c.dtype))
        rows.append(_like(row, coefficients))
    matrix_bars = tuple(
        eqx.tree_at(
            lambda m: (m.values, m.columns),
            m,
            (_like(bar.values, m.values), None),
            is_leaf=lambda x: x is None,
        )
        for m, (_, _, bar) in zip(matrices, bars)
    )
    return jnp.concatenate(rows), matrix_bars


def _matrix_cotangent(stacked: Any, later: Array, u: Array) -> Any:
    """$\\bar S = \\sum_j g_{j+1} u_j^T$ from `later[j]` $= g_{j+1}$ `(K, n, c)` and
    `u[a, j]` $= u_{a,j}$ `(A, K, n, c)`, in the form of `stacked`: for
    `Diagonals`, the entries on its diagonals (the values' cotangent)."""
    n = later.shape[1]
    if isinstance(stacked, AbstractSparseMatrix):
        values_bar = stacked.values_cotangent(u[0], later)
        return eqx.tree_at(
            lambda m: m.values, stacked, _like(values_bar, stacked.values)
        )
    if not isinstance(stacked, Diagonals):
        s_bar = jnp.einsum("jrc,ajmc->ram", later, u).reshape(n, -1)
        return _like(s_bar, stacked)
    # values[k, r] meets column r + offset of block `blocks[k]`.
    pad = max((abs(d) for _, d in stacked.offsets), default=0)
    padded = jnp.pad(u, [(0, 0), (0, 0), (pad, pad), (0, 0)])
    blocks = np.asarray([b for b, _ in stacked.offsets])
    columns = pad + np.asarray([d for _, d in stacked.offsets])[:, None] + np.arange(n)
    taken = padded[blocks[:, None], :, columns]  # (k, r, j, c)
    values_bar = jnp.einsum("krjc,jrc->kr", taken, later)
    return Diagonals(_like(values_bar, stacked.values), stacked.offsets, stacked.blocks)


def _times_transposed(stacked: Any, g: Array) -> Array:
    """`stacked.T @ g`, `(A n, columns)`, for a dense matrix, a `SparseMatrix`
    (its entries' products scattered to their columns) or the list of
    `_transposed_blocks` of `Diagonals` (formed once, before the adjoint's
    loop)."""
    if isinstance(stacked, list):
        return jnp.concatenate([block @ g for block in stacked])
    if isinstance(stacked, AbstractSparseMatrix):
        return stacked.rmatvec(g)
    return _dense_product(stacked, g, 0)


def _transposed_blocks(stacked: Diagonals) -> list[Diagonals]:
    """The transpose of `Diagonals` of B blocks side by side, as B `Diagonals` of
    one block each (stacked below one another): entry r of a diagonal at offset d
    sits in row r + d of its block's transpose, on its diagonal at offset -d. The
    shifted values are formed here, once; each product is then the same fused
    loop of slices as a forward one (where shifting each diagonal's products
    inside the adjoint's loop cost it a dozen operations per order; the open
    12-level oscillator's loop, 468 -> 300 us with its forward pass)."""
    n = stacked.values.shape[-1]
    pad = max((abs(d) for _, d in stacked.offsets), default=0)
    xp = np if isinstance(stacked.values, np.ndarray) else jnp
    padded = xp.pad(stacked.values, [(0, 0), (pad, pad)])
    # Every diagonal shifted by one gather (`shifted[k, r] = padded[k, pad - d_k +
    # r]`): a slice per diagonal was a kernel each to compile, inside the step's
    # backward pass (46 of the 6-site XXZ chain's gradient).
    starts = np.asarray([pad - d for _, d in stacked.offsets], dtype=np.int32)
    shifted = padded[np.arange(len(starts))[:, None], starts[:, None] + np.arange(n)]
    blocks = []
    for b in range(stacked.blocks):
        ks = [k for k, (block, _) in enumerate(stacked.offsets) if block == b]
        offsets = tuple((0, -stacked.offsets[k][1]) for k in ks)
        if ks and ks == list(range(ks[0], ks[-1] + 1)):  # (usual: by block)
            rows = shifted[ks[0] : ks[-1] + 1]
        else:
            rows = shifted[np.asarray(ks, dtype=np.int32)]  # (none: empty)
        blocks.append(Diagonals(rows, offsets, 1))
    return blocks


def _like(cotangent: Array, primal: Array) -> Array:
    """A cotangent in its primal's dtype (the real part for a real primal)."""
    if not jnp.iscomplexobj(primal):
        cotangent = cotangent.real
    return cotangent.astype(primal.dtype)


class EmbeddedParts(eqx.Module):
    """The real embeddings that `_embedded_series` forms every step, assembled once
    before compiling and held by their nonzero diagonals (`Diagonals`): of each
    $-iH_a$ side by side (`lowered`), and of each $H_a$ (`raised`, for complex
    coefficients). Known matrices only."""

    lowered: Diagonals
    raised: Diagonals


class DenseEmbedding(eqx.Module):
    """The real embeddings of each $-iH_a$ (`lowered`) and of each $H_a$
    (`raised`, for complex coefficients), `(A, 2n, 2n)` each, formed once in the
    solve's program for a tiny state (2n <= `SMALL_EMBEDDED_SIZE`), whose step
    takes them dense: formed in every step, they cost it a few operations more
    than the step's own arithmetic."""

    lowered: Any
    raised: Any


def dense_embedding(matrices: Any, xp: ModuleType = jnp) -> DenseEmbedding:
    """The `DenseEmbedding` of `(A, n, n)` matrices, in `xp` (JAX inside the
    program; NumPy for a reference)."""
    p, q = xp.real(matrices), xp.imag(matrices)
    # -iH = Q - iP: formed from the parts (no product with -1j).
    return DenseEmbedding(_embedding(q, -p, xp), _embedding(p, q, xp))


def embedded_parts(matrices: np.ndarray) -> "EmbeddedParts | None":
    """The parts of `_embedded_series` for known `(A, n, n)` matrices of a state
    above the tiny size (whose dense embeddings the solve forms in its program),
    in NumPy: `EmbeddedParts` when the diagonals pay:
    at most `MAX_DIAGONALS` and at most A n / 2 in all, where an
    entry of a diagonal (about 0.2 ns) beats the A 2n entries of a row of the
    dense stacked matrix (0.1 ns each) with room to spare. Spin chains and a few
    coupled modes have a few dozen, whatever n (the driven 6-site XXZ chain: 46
    against a dense row of 256); a random dense H has 4n - 2 per term."""
    lowered = [Diagonals.from_matrix(real_embedding(-1j * m, np)) for m in matrices]
    count = sum(d.count for d in lowered)
    if count > MAX_DIAGONALS or 2 * count > len(matrices) * matrices.shape[-1]:
        return None
    raised = [Diagonals.from_matrix(real_embedding(m, np)) for m in matrices]
    return EmbeddedParts(side_by_side(lowered), side_by_side(raised))


# The most diagonals, over all terms, a step takes: the program has one slice per
# diagonal.
MAX_DIAGONALS = 160


def _embedded_series(
    series: TermSeries,
    factor: Array,
    y0: Array,
    order: int,
    parts: "EmbeddedParts | DenseEmbedding | None" = None,
    adjoint: bool = False,
    degree: int | None = None,
) -> Array:
    """`state_series` for a small state and dense terms, in real arithmetic: the state
    as $(\\Re y, \\Im y)$ and each $-iH_a = I_a - iR_a$ ($H_a = R_a + iI_a$) as the
    real matrix $\\begin{pmatrix} I_a & R_a \\\\ -R_a & I_a \\end{pmatrix}$. The
    same operations as a complex product, but XLA's CPU products of small complex
    matrices cost about four times as much as real ones of twice the size (measured,
    n = 32: 1.15 us against 0.27 us per product). A complex coefficient
    $c = c_r + i c_i$ adds the terms $c_i H_a$ (embedded as
    $\\begin{pmatrix} R_a & -I_a \\\\ I_a & R_a \\end{pmatrix}$). `factor` holds
    $h$ with odd orders negated for $h < 0$."""
    dtype = jnp.result_type(y0, 1j)
    rdtype = real_dtype(dtype)
    n = y0.shape[0]
    rotated = jnp.iscomplexobj(series.coefficients)
    along = _along_orders(factor, series.coefficients)
    coefficients = [series.coefficients.real.astype(rdtype) * along]
    if rotated:
        coefficients.append(series.coefficients.imag.astype(rdtype) * along)
    flags = series.constant_flags()
    varying = (1 + rotated) * sum(not flag for flag in flags)
    count = series.matrices.shape[0]
    # (Per-column coefficients take the term-by-term loop: the summed generator
    # would be one per column.)
    tiny = 2 * n <= SMALL_EMBEDDED_SIZE and varying >= 2
    tiny = tiny and series.coefficients.ndim == 2 and series.column_scales is None
    # Real per-column scales scale a row's real and imaginary parts alike.
    scales = series.column_scales
    if scales is not None and rotated:
        scales = jnp.concatenate([scales, scales])
    y = y0.astype(dtype)
    start = jnp.concatenate([y.real, y.imag])

    def lowered_of(matrices: Array, parts: Any) -> Array:
        """The real embeddings `(A', 2n, 2n)`, from `parts` when they are a
        `DenseEmbedding` of these terms, else formed here."""
        if not (isinstance(parts, DenseEmbedding) and parts.lowered.shape[0] == count):
            parts = dense_embedding(matrices.astype(dtype))
        return jnp.concatenate([parts.lowered, parts.raised][: 1 + rotated])

    def loop(coefficients: Array, stacked: Any, start: Array) -> Array:
        parts = [(coefficients, stacked, flags * (1 + rotated), scales)]
        return series_loop(parts, None, None, start, order, adjoint, False, degree)

    def by_dense(coefficients: Array, matrices: Array, start: Array, parts: Any):
        # Side by side, (2n, A' 2n), as one concatenation of the blocks (not a
        # transpose of their stack: formed every step, and XLA's older CPU
        # emitters, with which small states compile, transpose slowly).
        lowered = lowered_of(matrices, parts).astype(rdtype)
        return loop(coefficients, jnp.concatenate(list(lowered), axis=1), start)

    def by_diagonals(coefficients: Array, matrices: Array, start: Array, parts: Any):
        del matrices
        stacked = side_by_side([parts.lowered, parts.raised][: 1 + rotated])
        return loop(coefficients, stacked, start)

    coefficients = jnp.concatenate(coefficients)
    if isinstance(parts, EmbeddedParts) and parts.lowered.blocks == count and not tiny:
        # Held by their diagonals: fast to run, slow to differentiate by JAX (its
        # reverse mode turns each diagonal's slice into a pad of the whole state:
        # the gradient of the driven 6-site XXZ chain took 103 ms, 20 ms with the
        # dense embedding), so a derivative takes the dense embedding, unless the
        # adjoint recursion differentiates the diagonals (8.7 -> 6.9 ms).
        series_of = by_diagonals
        if not adjoint:
            series_of = by_differentiation(by_diagonals, by_dense)
        v = series_of(coefficients, series.matrices, start, parts)
    elif tiny:
        lowered = lowered_of(series.matrices, parts).astype(rdtype)
        return _small_embedded_series(coefficients, lowered, y0, order, adjoint, degree)
    else:
        v = by_dense(coefficients, series.matrices, start, parts)
    return lax.complex(v[:, :n], v[:, n:])


# Up to this many real rows (2n: a qubit to a ququart), a step with two or more
# time-dependent terms takes `_small_embedded_series`. Measured per step (x64,
# K = 28, dense terms, each with a cosine but one): n = 3 with 4 terms 21.7 ->
# 9.0 us, n = 4 26.2 -> 11.7 us, with 2 terms (one varying) 8.0 -> 8.8 us; at
# n = 6 even, and from n = 8 on the products of the generator's series cost more
# (n = 12: 8.9 against 68 us).
SMALL_EMBEDDED_SIZE = 8


def _small_embedded_series(
    coefficients: Array,
    lowered: Array,
    y0: Array,
    order: int,
    adjoint: bool = False,
    degree: int | None = None,
) -> Array:
    """`_embedded_series` for a tiny state, with the step's generator summed
    first: $G_m = \\sum_a c_{a,m} E_a$ (one product a step), and then each order
    one product of the stacked $G_m$ with the past terms, latest first,
    $v_{j+1} = \\frac{1}{j+1} \\sum_{m \\le j} G_m v_{j-m}$, where the term-by-term
    loop spends each order on a dozen operations whose dispatch costs more than
    their arithmetic. The same sums in another order: each term is a sum of
    products whose largest has the size of the result. Where the series ends at a
    known `degree` D (a cubic spline: 3), $G_m = 0$ for $m > D$ and each order
    reads the D + 1 latest terms only (the transmon's spline gradient of
    `bench_pulse_gradients`: see the CHANGELOG)."""
    dtype = jnp.result_type(y0, 1j)
    if order == 0:
        # The state alone; the loop below would index an empty `inverse` (a
        # `fori_loop` traces its body even for no iterations).
        return y0.astype(dtype)[None]
    rdtype = real_dtype(dtype)
    n = y0.shape[0]
    rows = 2 * n
    # G_0 ... G_D: the orders that can be nonzero.
    width = order + 1 if degree is None else min(order, degree) + 1
    # generator[i, m * rows + k] = (G_m)_{ik}: the orders side by side.
    generator = jnp.einsum(
        "am,aik->imk", coefficients[:, :width].astype(rdtype), lowered.astype(rdtype)
    ).reshape(rows, width * rows)
    # The terms latest first: past[order - i] = v_i, and zeros below, so that
    # v_j, v_{j-1}, ..., v_0, 0, ... is the slice from order - j.
    # A state of several columns (kets, a propagator) steps them side by side.
    y = y0.astype(dtype).reshape(n, -1)
    # (Zeros joined around the state, not a scatter into zeros: a scatter is a
    # kernel of its own to compile.)
    start = jnp.concatenate([y.real, y.imag])[None].astype(rdtype)
    past = jnp.concatenate(
        [
            jnp.zeros((order,) + start.shape[1:], rdtype),
            start,
            jnp.zeros((order + 1,) + start.shape[1:], rdtype),
        ]
    )
    # NumPy: the adjoint's rule may not close over values of the trace.
    inverse = (1 / np.arange(1, order + 1)).astype(rdtype)

    def body(generator, j, past):
        window = lax.dynamic_slice_in_dim(past, order - j, width)
        term = generator @ window.reshape(width * rows, -1) * jnp.asarray(inverse)[j]
        return lax.dynamic_update_index_in_dim(past, term, order - j - 1, 0)

    def run(generator, past):
        past = _order_loop(order, lambda j, p: body(generator, j, p), past)
        return past[order::-1]

    v = (_small_by_adjoint(run, order, width) if adjoint else run)(generator, past)
    return lax.complex(v[:, :n], v[:, n:]).reshape((order + 1,) + y0.shape)


def _small_by_adjoint(run: Any, order: int, width: int) -> Any:
    """`run(generator, past)` of `_small_embedded_series` differentiated in reverse
    mode by its adjoint recursion (as `_by_adjoint` for `series_loop`), with
    `width` blocks $G_0 \\ldots G_{w-1}$ in the generator. With
    $g_i$ the cotangent of $v_i$ and every later order's share, from $j = K-1$
    down: $g_{j-m} \\mathrel{+}= G_m^T g_{j+1} / (j+1)$ for $m \\le j$, one product
    with the stacked $G^T$ added to a window of the cotangents, held latest first as
    the terms are; then $\\bar G_m = \\sum_j g_{j+1} v_{j-m}^T / (j+1)$."""

    @jax.custom_vjp
    def adjoint_run(generator, past):
        return run(generator, past)

    def forward(generator, past):
        v = run(generator, past)
        return v, (generator, v)

    def backward(residuals, v_bar):
        generator, v = residuals
        rows = v.shape[1]
        inverse = 1 / jnp.arange(1, order + 1, dtype=v.dtype)
        # g_i at position order - i, as the terms; zeros below.
        g = jnp.concatenate([v_bar[::-1], jnp.zeros_like(v_bar)], axis=0)

        def back(r, g):
            j = order - 1 - r
            later = lax.dynamic_index_in_dim(g, order - j - 1, keepdims=False)
            z = jnp.tensordot(generator, later, (0, 0)) * inverse[j]
            window = lax.dynamic_slice_in_dim(g, order - j, width)
            return lax.dynamic_update_slice_in_dim(
                g, window + z.reshape(window.shape), order - j, 0
            )

        g = _order_loop(order, back, g)
        # The loop overwrites the terms below `order` before reading them.
        read = (np.arange(2 * order + 2) >= order).reshape((-1, 1, 1))
        past_bar = jnp.where(read, g, 0)
        # windows[j, m] = v_{j-m} (zero for m > j), against g_{j+1} / (j+1).
        lags = np.arange(order + 1)
        index = lags[:order, None] - lags[None, :width]
        windows = jnp.where((index >= 0)[:, :, None, None], v[np.maximum(index, 0)], 0)
        later = g[order - 1 :: -1][:order] * inverse[:, None, None]
        generator_bar = jnp.einsum("jrc,jmsc->rms", later, windows).reshape(
            rows, width * rows
        )
        return generator_bar, past_bar

    adjoint_run.defvjp(forward, exact_products(backward))
    return adjoint_run


def propagator_errors(terms: TermSeries, series: Array, spread: Array) -> Array:
    """A running estimate of the relative rounding error of each coefficient of
    `state_series`: coefficient j+1 is a sum of products $h_m u_{j-m}$, each
    carrying the error of its $u$ plus the product's own rounding
    ($\\sqrt{n}\\,\\epsilon$), weighed by its size against the result's.
    `spread`: `perturbation_spread` of the same recursion. Scalars only: O(K^2)
    on the norms."""
    rdtype = real_dtype(series.dtype)
    h = jnp.sum(
        jnp.abs(terms.coefficients) * frobenius(terms.matrices, (1, 2))[:, None], axis=0
    ).astype(rdtype)
    if terms.dense is not None:
        h = h + frobenius(terms.dense, (1, 2)).astype(rdtype)
    if terms.sparse is not None:
        norms = jnp.stack([m.frobenius_norm() for m in terms.sparse.matrices])
        h = h + jnp.sum(
            jnp.abs(terms.sparse.coefficients) * norms[:, None], axis=0
        ).astype(rdtype)
    return series_errors(h, series, spread)


def perturbation_spread(run: Callable[[Array], Array], like: Array) -> Array:
    """How fast a perturbation grows through a linear recursion: `run(start)` is
    the recursion's series from a start shaped like `like`, here a fixed one of
    unit Frobenius norm (Gaussian entries from a fixed seed, complex where `like`
    is). The largest $(\\|u_m\\|\\, m!)^{1/m}$ over the orders m: the per-order
    rate of the fastest mode the start reaches (every mode, for a random start),
    a real scalar. Rounding errors are such perturbations."""
    generator = np.random.default_rng(0)
    entries = generator.standard_normal(like.shape) + 1j * generator.standard_normal(
        like.shape
    )
    if not jnp.iscomplexobj(like):
        entries = entries.real
    start = jnp.asarray(entries / np.linalg.norm(entries), like.dtype)
    sizes = _sizes(run(start))
    order = sizes.shape[0] - 1
    rdtype = sizes.dtype
    m = np.arange(1, order + 1)
    log_factorials = np.array([math.lgamma(k + 1) for k in m])
    logs = jnp.log(jnp.where(sizes[1:] > 0, sizes[1:], 1)) - jnp.log(sizes[0])
    rates = jnp.where(
        sizes[1:] > 0, (logs + log_factorials.astype(rdtype)) / m, -jnp.inf
    )
    return jnp.exp(jnp.max(rates)) if order else jnp.zeros((), rdtype)


def series_errors(h: Array, series: Array, spread: Array) -> Array:
    """The running estimate of `propagator_errors` for any linear recursion
    $u_{j+1} = \\frac{1}{j+1} \\sum_{m \\le j} \\mathcal{G}_m[u_{j-m}]$, given a bound
    `h[m]` on the size of each $\\mathcal{G}_m$ (shape `(K+1,)`). A coefficient near
    the bottom of the range is charged for underflow too (an entry below the
    smallest normal float loses up to that much, flushed to zero or subnormal),
    and one that reads zero although its parts do not, inf: a level lost to
    underflow never reports a small error.

    Each product's own rounding is charged at the bound, $\\epsilon\\, h_m
    \\|u_{j-m}\\|$. The errors carried from earlier coefficients grow as a
    perturbation does: by `spread` (`perturbation_spread`) per order where it is
    below the bound $h_0$, whose growth compounded over the orders instead, and
    read, for a damped oscillator's density matrix at order 30, 1e9 where the
    error was 2e-15 (now 1e-10)."""
    rdtype = real_dtype(series.dtype)
    info = np.finfo(rdtype)
    order = series.shape[0] - 1
    unit = float(info.eps) * math.sqrt(series.shape[1])
    # Each entry of a product sums n = `series.shape[1]` products, each of which
    # may lose up to the smallest normal float.
    n = series.shape[1]
    floor = float(info.tiny) * n * math.sqrt(math.prod(series.shape[1:]))
    sizes = _sizes(series)
    i = jnp.arange(order + 1)
    # The share of the bound by which a carried rounding error grows (1: the
    # bound's).
    share = jnp.where(h[0] > 0, jnp.minimum(spread.astype(rdtype) / h[0], 1), 1)
    share = jnp.where(jnp.isfinite(share), share, 1)

    def window_sum(carried: Array, j: Array) -> Array:
        """$\\sum_{m \\le j} |h_m|$ `carried`$_{j-m}$ (zero terms skipped)."""
        window = jnp.where(i <= j, jnp.take(carried, jnp.clip(j - i, 0, order)), 0)
        return jnp.sum(jnp.where((h > 0) & (window > 0), h * window, 0))

    def body(j, errors):
        # Rounding (grown by the share of the bound) and underflow (by the bound:
        # what a flushed entry loses is no random perturbation) carried apart. A
        # zero coefficient adds nothing if exact (error 0), inf if lost (error
        # inf): what is computed from a lost coefficient is lost too.
        rounding, underflow = errors
        lost = jnp.where(rounding + underflow > 0, jnp.inf, 0)
        rounded = window_sum(sizes * (share * rounding + unit), j)
        flushed = window_sum(jnp.where(sizes > 0, sizes * underflow, lost), j)
        size = sizes[j + 1]
        safe = (j + 1) * jnp.where(size > 0, size, 1)
        any_part = rounded + flushed > 0
        rounding = rounding.at[j + 1].set(jnp.where(any_part, rounded / safe, 0))
        flushed = jnp.where(size > 0, flushed / safe + floor * (j + 1) / safe, jnp.inf)
        underflow = underflow.at[j + 1].set(jnp.where(any_part, flushed, 0))
        return rounding, underflow

    start = jnp.zeros((order + 1,), rdtype).at[0].set(float(info.eps))
    rounding, underflow = _order_loop(order, body, (start, jnp.zeros_like(start)))
    return rounding + underflow


def _sizes(series: Array) -> Array:
    """The Frobenius norm of each coefficient, scaled by its largest entry first:
    the squares of entries below the square root of the smallest float would
    underflow and read a small coefficient as zero."""
    axes = tuple(range(1, series.ndim))
    largest = jnp.max(jnp.abs(series), axis=axes, keepdims=True)
    safe = jnp.where(largest > 0, largest, 1)
    return largest.reshape(-1) * frobenius(series / safe, axes)
