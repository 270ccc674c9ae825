"""The constant matrices of a `TimeOperator`'s terms, one class per storage: dense
(one stacked array) or sparse (one sparse matrix per term). What depends on the
storage is a method, so that no caller asks which one an operator holds."""

import abc
from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Inexact

from .._core import (
    host_method,
    is_traced,
    placed,
    to_jax,
)
from .._data import (
    AbstractSparseMatrix,
    SparseMatrix,
    SparseTerms,
    TermSeries,
    UniformSparseMatrix,
)


class AbstractTermMatrices(eqx.Module):
    """The constant matrices $H_a$ of a [`hierax.TimeOperator`][]'s terms, in one
    storage: `DenseTermMatrices` (one `(A, n, n)` array) or `SparseTermMatrices`
    (one sparse matrix per term). What depends on the storage is a method here, so
    that no caller asks which one an operator holds."""

    matrices: eqx.AbstractVar[Any]
    is_sparse: eqx.AbstractClassVar[bool]

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """The dimension $n$."""

    @host_method
    @abc.abstractmethod
    def joined(self, other: Any) -> "AbstractTermMatrices":
        """These terms followed by `other`'s (of the same storage), in their common
        dtype."""

    @abc.abstractmethod
    def series(self, coefficients: Array, constant: tuple[bool, ...]) -> TermSeries:
        """The term series with these matrices and the functions' `coefficients`
        `(A, K+1)`, sparse matrices kept sparse."""

    @host_method
    @abc.abstractmethod
    def is_hermitian(self) -> bool:
        """Whether every matrix is known here to be exactly Hermitian (concrete
        values; traced ones are not known)."""

    @host_method
    @abc.abstractmethod
    def is_conjugate_symmetric(self, signs: Sequence[int]) -> bool:
        """Whether $\\overline{H_a} = \\sigma_a H_a$ for the signs $\\sigma_a$ (+1:
        real, -1: imaginary; 0: no), as far as the known values tell."""

    @host_method
    @abc.abstractmethod
    def known_stack(self) -> np.ndarray | None:
        """The matrices as one NumPy `(A, n, n)` array where they are stored dense
        and known (not traced); `None` otherwise (nothing is made dense)."""

    @host_method
    @abc.abstractmethod
    def is_dense_or_diagonal(self) -> bool:
        """Whether the matrices are dense, or diagonal sparse ones (what the density
        kernels take)."""

    @host_method
    @abc.abstractmethod
    def density_matrices(self, xp: Any) -> tuple[list[Any], bool]:
        """For `is_dense_or_diagonal` matrices: each as the density kernels take
        it, with the array module `xp` (NumPy for known values), and whether they
        are diagonals: `(n, n)` matrices, or their `(n,)` diagonals."""

    @host_method
    @abc.abstractmethod
    def is_placed(self) -> bool:
        """Whether the entries are placed on a device (`placed`)."""

    @host_method
    @abc.abstractmethod
    def uniform(self) -> "AbstractTermMatrices":
        """These terms with each known sparse matrix whose entries are all equal
        made a `UniformSparseMatrix` (dense matrices and traced entries as they
        are); `self` when nothing changes."""

    @host_method
    @abc.abstractmethod
    def row_sum_bounds(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The largest row sum of |entries| of each matrix, computed in NumPy, as
        (dense terms' bounds, sparse terms' bounds); `None` when traced."""


class DenseTermMatrices(AbstractTermMatrices):
    """Dense term matrices: one `(A, n, n)` array."""

    matrices: Inexact[Array, "terms n n"]
    is_sparse: ClassVar[bool] = False

    @property
    def size(self) -> int:
        return self.matrices.shape[-1]

    @host_method
    def joined(self, other: Any) -> "DenseTermMatrices":
        return DenseTermMatrices(_joined(self.matrices, other.matrices))

    def series(self, coefficients: Array, constant: tuple[bool, ...]) -> TermSeries:
        return TermSeries(coefficients, self.matrices, None, constant)

    @host_method
    def is_hermitian(self) -> bool:
        m = self.known_stack()
        return m is not None and bool(
            np.array_equal(m, np.conj(np.swapaxes(m, -1, -2)))
        )

    @host_method
    def is_conjugate_symmetric(self, signs: Sequence[int]) -> bool:
        # A real dtype needs no reading; complex values are read once, sliced on
        # the host (an eager slice compiles).
        complex_ = np.issubdtype(self.matrices.dtype, np.complexfloating)
        host = None
        for k, sign in enumerate(signs):
            if sign == 0:
                return False
            if not complex_:
                if sign == 1:
                    continue
                return False
            if host is None:
                host = self.known_stack()
                if host is None:
                    return False
            part = np.imag(host[k]) if sign == 1 else np.real(host[k])
            if np.any(part != 0):
                return False
        return True

    @host_method
    def known_stack(self) -> np.ndarray | None:
        return None if is_traced(self.matrices) else np.asarray(self.matrices)

    @host_method
    def is_dense_or_diagonal(self) -> bool:
        return True

    @host_method
    def density_matrices(self, xp: Any) -> tuple[list[Any], bool]:
        return list(xp.asarray(self.matrices)), False

    @host_method
    def is_placed(self) -> bool:
        return placed(self.matrices)

    @host_method
    def uniform(self) -> "DenseTermMatrices":
        return self

    @host_method
    def row_sum_bounds(self) -> tuple[np.ndarray, np.ndarray] | None:
        if is_traced(self.matrices):
            return None
        return _row_sum_bounds(self.matrices), np.zeros((0,))


class SparseTermMatrices(AbstractTermMatrices):
    """Sparse term matrices, one per term, kept sparse."""

    matrices: tuple[AbstractSparseMatrix, ...]
    is_sparse: ClassVar[bool] = True

    @property
    def size(self) -> int:
        return self.matrices[0].shape[-1]

    @host_method
    def joined(self, other: Any) -> "SparseTermMatrices":
        matrices = self.matrices + other.matrices
        dtype = jnp.result_type(*[m.dtype for m in matrices])
        return SparseTermMatrices(tuple(m.astype(dtype) for m in matrices))

    def series(self, coefficients: Array, constant: tuple[bool, ...]) -> TermSeries:
        n, dtype = self.size, coefficients.dtype
        return TermSeries(
            jnp.zeros((0, coefficients.shape[-1]), dtype),
            jnp.zeros((0, n, n), self.matrices[0].dtype),
            None,
            (),
            SparseTerms(coefficients, self.matrices, constant),
        )

    @host_method
    def is_hermitian(self) -> bool:
        return all(matrix.is_hermitian() for matrix in self.matrices)

    @host_method
    def is_conjugate_symmetric(self, signs: Sequence[int]) -> bool:
        del signs
        return False  # not read for sparse terms

    @host_method
    def known_stack(self) -> np.ndarray | None:
        return None

    @host_method
    def is_dense_or_diagonal(self) -> bool:
        return all(m.diagonal for m in self.matrices)

    @host_method
    def density_matrices(self, xp: Any) -> tuple[list[Any], bool]:
        return [xp.sum(xp.asarray(m.values), axis=1) for m in self.matrices], True

    @host_method
    def is_placed(self) -> bool:
        return any(placed(m.values) for m in self.matrices)

    @host_method
    def uniform(self) -> "SparseTermMatrices":
        matrices = tuple(_uniform(m) for m in self.matrices)
        if all(a is b for a, b in zip(matrices, self.matrices)):
            return self
        return SparseTermMatrices(matrices)

    @host_method
    def row_sum_bounds(self) -> tuple[np.ndarray, np.ndarray] | None:
        if any(is_traced(m.values) for m in self.matrices):
            return None
        bounds = [_row_sum_bounds(m.values) for m in self.matrices]
        return np.zeros((0,)), np.concatenate(bounds)


def _joined(a: Array, b: Array) -> Array:
    """Two `(A, n, n)` stacks of checked matrices, one after the other, in their
    common dtype (in NumPy when concrete)."""
    dtype = jnp.result_type(a.dtype, b.dtype)
    if placed(a) or placed(b):
        return jnp.concatenate([a.astype(dtype), b.astype(dtype)])
    return to_jax(np.concatenate([np.asarray(a), np.asarray(b)]).astype(dtype))


def _uniform(matrix: AbstractSparseMatrix) -> AbstractSparseMatrix:
    """A known sparse matrix whose entries are all equal as a `UniformSparseMatrix`
    (its products then need one multiplication per row); read from the values of
    each call, so a matrix whose entries stop being equal compiles a new program."""
    if (
        not isinstance(matrix, SparseMatrix)
        or matrix.diagonal
        or placed(matrix.values)
        or matrix.values.size == 0
    ):
        return matrix
    values = np.asarray(matrix.values)
    if not np.all(values == values.flat[0]):
        return matrix
    return UniformSparseMatrix(matrix.values, matrix.columns)


def _row_sum_bounds(values: Any) -> np.ndarray:
    """The largest row sum of |entries| of an `(A, n, n)` stack (one per matrix)
    or of a sparse matrix's `(n, width)` values (one number)."""
    rows = np.sum(np.abs(np.asarray(values)), axis=-1)
    return np.max(rows, axis=-1).reshape(-1)
