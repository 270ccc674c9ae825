"""Rewrites of operators before a solve, and the bounds that start it: queries
answered by the operator's type (`functools.singledispatch`), each computed in
NumPy before compiling when the matrices are known."""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike

from .._core import content_key, is_traced, placed, to_jax
from .._data import (
    SparseMatrix,
    dense_to_sparse,
    identity,
    real_dtype,
    result_dtype,
)
from .._time import AbstractTimeFunction, Constant
from ._term_matrices import (
    AbstractTermMatrices,
    DenseTermMatrices,
    SparseTermMatrices,
)
from ._time_operators import (
    AbstractTimeOperator,
    OperatorSum,
    ScaledOperator,
    TimeOperator,
    as_time_operator,
    summands,
)


def real_terms(
    operator: AbstractTimeOperator,
    diagonal: bool = False,
    split: bool = True,
    sparse: float | None = None,
) -> AbstractTimeOperator:
    """The same operator with every dense term's matrix in real arithmetic: a known
    (not traced) complex matrix $M = R + iI$ becomes the terms $f R$ and $(if) I$,
    with a zero part dropped, and the dense terms of a sum are gathered into one
    `TimeOperator`. A complex product costs four real ones; a real matrix times a
    complex vector costs two, so a Hamiltonian with real or imaginary matrices (the
    Pauli and ladder operators) steps in half the work, and no product costs more.
    With `diagonal`, known diagonal matrices become diagonal `SparseMatrix` terms
    (gathered into a second `TimeOperator`), which the density kernel applies
    elementwise. With `sparse` (a share of entries, the backend's choice:
    `_core._choices`), each known matrix (after the split, and not placed on a
    device) with at most that share of nonzero entries becomes a
    `SparseMatrix` term, also inside a scaled operator $f(t) H$ (a traced scale of
    a known H, under `jax.grad`): a many-body Hamiltonian given as NumPy arrays has
    a few nonzeros per row. Its structure is read from the values, so a matrix
    whose zeros change compiles a new program; for a state of several columns, or
    states mapped by `jax.vmap`, the step takes those with more nonzeros in a row
    dense again (`schrodinger_terms`). Without `split`, matrices keep their dtype:
    below a few dozen rows, the real and imaginary halves cost more to assemble
    than they save. Traced matrices (a gradient with respect to them) are left as
    they are."""
    functions, matrices, rest = [], [], []
    diagonal_functions, diagonals = [], []
    sparse_functions, sparse_matrices = [], []
    rescaled = False
    for op in summands(operator):
        if sparse is not None and isinstance(op, ScaledOperator):
            inner = real_terms(op.operator, diagonal, split, sparse)
            rescaled = rescaled or inner is not op.operator
            rest.append(
                op if inner is op.operator else ScaledOperator(op.function, inner)
            )
            continue
        terms = as_time_operator(op)
        stacked = None if terms is None else terms.term_matrices.known_stack()
        if terms is None or stacked is None:
            rest.append(op)
            continue
        op = terms
        n = stacked.shape[-1]
        off_diagonal = ~np.eye(n, dtype=bool)
        # The share of nonzeros up to which a matrix is applied by its nonzeros
        # (-1: none is).
        share = -1.0 if sparse is None or placed(op.matrices) else sparse

        def add(
            function: AbstractTimeFunction, matrix: np.ndarray, share=share
        ) -> None:
            if np.count_nonzero(matrix) <= share * matrix.size:
                sparse_functions.append(function)
                sparse_matrices.append(dense_to_sparse(matrix))
            else:
                functions.append(function)
                matrices.append(matrix)

        for function, matrix in zip(op.functions, stacked):
            if diagonal and not np.any(matrix[off_diagonal]):
                diagonal_functions.append(function)
                diagonals.append(np.diagonal(matrix))
                continue
            if not split:
                add(function, matrix)
                continue
            real, imaginary = matrix.real, matrix.imag
            if np.any(real) or not np.any(imaginary):
                add(function, real)
            if np.any(imaginary):
                add(1j * function, imaginary)
    gathered = []
    if matrices:
        gathered.append(TimeOperator(functions, [to_jax(m) for m in matrices]))
    if diagonals:
        n = diagonals[0].shape[0]
        columns = np.arange(n)[:, None]
        diagonal_matrices = [
            SparseMatrix(to_jax(np.asarray(d)[:, None]), columns, diagonal=True)
            for d in diagonals
        ]
        gathered.append(TimeOperator(diagonal_functions, diagonal_matrices))
    if sparse_matrices:
        gathered.append(TimeOperator(sparse_functions, sparse_matrices))
    if not gathered and not rescaled:
        return operator
    parts = [*gathered, *rest]
    return parts[0] if len(parts) == 1 else OperatorSum(parts)


def merge_equal_terms(operator: AbstractTimeOperator) -> AbstractTimeOperator:
    """The same operator with the terms of each dense `TimeOperator` whose known
    matrices are equal merged into one, with the sum of their functions:
    $f_1 M + f_2 M = (f_1 + f_2) M$, one product per step instead of two (a drive
    of several tones through one coupling, written term by term). Traced matrices
    and sparse terms are left as they are; so is an operator with no repeat."""
    parts = summands(operator)
    merged = [_merged(op) for op in parts]
    if all(m is op for m, op in zip(merged, parts)):
        return operator
    return merged[0] if len(merged) == 1 else OperatorSum(merged)


def _merged(operator: AbstractTimeOperator) -> AbstractTimeOperator:
    terms = as_time_operator(operator)
    if terms is None or len(terms.functions) < 2:
        return operator
    stacked = terms.term_matrices.known_stack()
    if stacked is None:
        return operator
    stacked = np.ascontiguousarray(stacked)
    groups: dict[Any, list[int]] = {}
    for a, matrix in enumerate(stacked):
        # Found by a digest of the content (`content_key`), confirmed entry by entry.
        key = content_key(matrix)
        while key in groups and not np.array_equal(stacked[groups[key][0]], matrix):
            key += ("again",)
        groups.setdefault(key, []).append(a)
    if len(groups) == len(terms.functions):
        return operator
    functions = [
        functools.reduce(lambda f, g: f + g, [terms.functions[a] for a in group])
        for group in groups.values()
    ]
    kept = stacked[np.asarray([group[0] for group in groups.values()])]
    return TimeOperator(functions, to_jax(kept))


@functools.singledispatch
def split_constant_trace(
    operator: AbstractTimeOperator,
) -> tuple[AbstractTimeOperator, Array]:
    """$H = H_0 + c\\,\\mathbb{1}$ with every constant term of H traceless in $H_0$.

    Only terms with a constant time function are shifted (each by its own trace, so
    the sum of the shifts is $c$ exactly and no term changes its time function); a
    callable or a time-dependent term keeps its trace, which is then expanded in
    series like the rest of H.
    """
    return operator, to_jax(np.zeros((), jnp.result_type(1j)))


@split_constant_trace.register
def _(operator: OperatorSum) -> tuple[AbstractTimeOperator, Array]:
    parts = [split_constant_trace(op) for op in operator.operators]
    shift = sum((c for _, c in parts[1:]), parts[0][1])
    return OperatorSum([op for op, _ in parts]), shift


@split_constant_trace.register
def _(operator: TimeOperator) -> tuple[AbstractTimeOperator, Array]:
    return _split_terms(operator.term_matrices, operator)


@functools.singledispatch
def _split_terms(
    terms: AbstractTermMatrices, operator: TimeOperator
) -> tuple[AbstractTimeOperator, Array]:
    """`split_constant_trace` of a `TimeOperator` whose matrices are `terms`."""
    raise NotImplementedError(type(terms).__name__)


@_split_terms.register
def _(
    terms: DenseTermMatrices, operator: TimeOperator
) -> tuple[AbstractTimeOperator, Array]:
    n = terms.size
    dtype = jnp.result_type(terms.matrices.dtype, 1j)
    stacked = terms.known_stack()
    if stacked is not None:
        # Known matrices: the traces in NumPy, and nothing to do for traceless
        # constant terms (Pauli strings): no eager JAX operation on every call
        # (each kind of which compiles a small program the first time: together
        # a third of a second of a first solve).
        traces = np.trace(stacked, axis1=-2, axis2=-1) / n
        constant = [
            f.is_constant and t != 0 for f, t in zip(operator.functions, traces)
        ]
        if not any(constant):
            return operator, to_jax(np.zeros((), dtype))
        values = [
            known_value(f) if c else 0 for f, c in zip(operator.functions, constant)
        ]
        if all(v is not None for v in values):
            eye = np.eye(n, dtype=stacked.dtype)
            shifted = stacked - np.asarray(constant)[:, None, None] * (
                traces[:, None, None] * eye
            )
            shift = sum(v * t for v, t, c in zip(values, traces, constant) if c)
            return (
                TimeOperator(operator.functions, to_jax(shifted)),
                to_jax(shift, dtype),
            )
    # Traced matrices, or a constant whose value is traced: with JAX operations.
    shift: Any = np.zeros((), dtype)
    shifted = []
    for function, matrix in zip(operator.functions, terms.matrices):
        if function.is_constant:
            trace = jnp.trace(matrix) / n
            matrix = matrix - trace * jnp.eye(n, dtype=matrix.dtype)
            shift = shift + _shift(function, trace, dtype)
        shifted.append(matrix)
    return TimeOperator(operator.functions, shifted), to_jax(shift)


@_split_terms.register
def _(
    terms: SparseTermMatrices, operator: TimeOperator
) -> tuple[AbstractTimeOperator, Array]:
    # Known sparse matrices and known constants: in NumPy (the sparse arithmetic
    # stays in NumPy for NumPy scalars).
    n = terms.size
    dtype = jnp.result_type(terms.matrices[0].dtype, 1j)
    shift: Any = np.zeros((), dtype)
    shifted = []
    for function, matrix in zip(operator.functions, terms.matrices):
        if function.is_constant:
            trace = matrix.trace()
            trace = (trace if placed(trace) else np.asarray(trace)) / n
            matrix = matrix - trace * identity(n, matrix.dtype)
            shift = shift + _shift(function, trace, dtype)
        shifted.append(matrix)
    return TimeOperator(operator.functions, shifted), to_jax(shift)


def _shift(function: AbstractTimeFunction, trace: Any, dtype: Any) -> Any:
    """A constant term's share of the shift: its value times its matrix's trace."""
    value = known_value(function)
    if value is None or placed(trace):
        # Its series at 0, not `function(0.0)`: that public call checks its time
        # in a program of its own, whose host callback stayed in every solve of
        # traced matrices (`floquet(..., throw=False)` must hold none).
        value = function.series(jnp.asarray(0.0), 0, None)[0]
    return (value * trace).astype(dtype)


def known_value(function: AbstractTimeFunction) -> Any:
    """The value of a `Constant` with a known (not traced) value, as NumPy; `None`
    for any other time function."""
    if isinstance(function, Constant) and not is_traced(function.value):
        return np.asarray(function.value)
    return None


def jump_times(*operators: Any) -> Array | None:
    """The knots of every sampled time function in `operators` (splines and
    piecewise functions expose them as `knots`), also inside sums and products of
    time functions: where the series before and after differ, so a step-size
    controller must stop there. `None` when there are none."""
    knots = _knots(operators)
    if not knots:
        return None
    dtype = jnp.result_type(*knots)
    return jnp.concatenate([jnp.ravel(k).astype(dtype) for k in knots])


def _knots(tree: Any) -> list[Array]:
    found = []
    leaves = jax.tree_util.tree_leaves(
        tree, is_leaf=lambda x: isinstance(x, AbstractTimeFunction) and x is not tree
    )
    for leaf in leaves:
        if isinstance(leaf, AbstractTimeFunction):
            knots = getattr(leaf, "knots", None)
            found.extend([knots] if knots is not None else _knots(leaf))
    return found


@functools.singledispatch
def uniform_products(operator: Any) -> Any:
    """`operator` with each `SparseMatrix` of its `TimeOperator`s whose entries are
    known (not traced, not placed on a device) and all equal made a
    `UniformSparseMatrix`. Decided from the values of each call, so a matrix whose
    entries stop being equal compiles a new program, and a traced one (a gradient
    with respect to its entries) keeps every entry."""
    return operator


@uniform_products.register
def _(operator: OperatorSum) -> Any:
    parts = [uniform_products(op) for op in operator.operators]
    if all(a is b for a, b in zip(parts, operator.operators)):
        return operator
    return OperatorSum(parts)


@uniform_products.register
def _(operator: TimeOperator) -> Any:
    terms = operator.term_matrices.uniform()
    if terms is operator.term_matrices:
        return operator
    return TimeOperator(operator.functions, terms)


class TermNorms(NamedTuple):
    """Infinity-norm bounds of an operator's matrices, known before compiling, one
    per term in the order of its `sparse_series`: `dense` for its dense terms,
    `sparse` (row-sum bounds) for its sparse ones."""

    dense: np.ndarray
    sparse: np.ndarray


@functools.singledispatch
def term_norms(operator: AbstractTimeOperator) -> TermNorms | None:
    """The `TermNorms` of an operator made of `TimeOperator`s with known (not
    traced) matrices, computed in NumPy; `None` for any other operator (a callable,
    traced matrices)."""
    del operator
    return None


def _summed_norms(parts: Any) -> TermNorms | None:
    norms = [term_norms(op) for op in parts]
    if any(p is None for p in norms):
        return None
    return TermNorms(
        np.concatenate([p.dense for p in norms if p is not None]),
        np.concatenate([p.sparse for p in norms if p is not None]),
    )


@term_norms.register
def _(operator: OperatorSum) -> TermNorms | None:
    return _summed_norms(operator.operators)


@term_norms.register
def _(operator: ScaledOperator) -> TermNorms | None:
    return _summed_norms((operator.operator,))


@term_norms.register
def _(operator: TimeOperator) -> TermNorms | None:
    bounds = operator.term_matrices.row_sum_bounds()
    return None if bounds is None else TermNorms(*bounds)


def operator_bound(
    operator: AbstractTimeOperator, t: ArrayLike, norms: TermNorms | None = None
) -> Array:
    """An upper bound on $\\|H(t)\\|_\\infty$ (>= the spectral norm for Hermitian
    H): exact for the dense part, a sum of row-sum bounds for sparse terms (never
    formed densely). With the matrices' `norms` (`term_norms`) the bound is
    $\\sum_a |f_a(t)|\\, \\|H_a\\|_\\infty$, which compiles to a few scalar
    operations instead of a reduction over every matrix (each a kernel of its
    own: 7-8 ms of compile apiece on a CPU)."""
    series = operator.sparse_series(jnp.asarray(t), 0, None)
    rdtype = real_dtype(result_dtype(series))
    sparse = series.sparse
    if (
        norms is not None
        and series.dense is None
        and norms.dense.shape[0] == series.coefficients.shape[0]
        and norms.sparse.shape[0] == (0 if sparse is None else len(sparse.matrices))
    ):
        size = jnp.sum(jnp.abs(series.coefficients[:, 0]) * norms.dense.astype(rdtype))
        if sparse is not None:
            weights = jnp.abs(sparse.coefficients[:, 0])
            size = size + jnp.sum(weights * norms.sparse.astype(rdtype))
        return size.astype(rdtype)
    size = jnp.zeros((), rdtype)
    if series.coefficients.shape[0] or series.dense is not None:
        dense = series._replace(sparse=None).full()[0]
        size = size + jnp.max(jnp.sum(jnp.abs(dense), axis=-1))
    if sparse is not None:
        for c, matrix in zip(sparse.coefficients, sparse.matrices):
            size = size + jnp.abs(c[0]) * matrix.row_sum_bound()
    return size
