"""Data structures with their arithmetic: truncated series and sparse matrices."""

from ._series import (
    TermSeries as TermSeries,
    binade as binade,
    exact_exp2 as exact_exp2,
    exp as exp,
    frobenius as frobenius,
    lower_toeplitz as lower_toeplitz,
    power_series as power_series,
    real_dtype as real_dtype,
    result_dtype as result_dtype,
    reversed_window as reversed_window,
    scalar_cauchy_product as scalar_cauchy_product,
    times_exp as times_exp,
    two_product as two_product,
)
from ._sparse import (
    AbstractSparseMatrix as AbstractSparseMatrix,
    SparseMatrix as SparseMatrix,
    SparseTerms as SparseTerms,
    UniformSparseMatrix as UniformSparseMatrix,
    apply_terms as apply_terms,
    as_sparse as as_sparse,
    available_memory as available_memory,
    dense_to_sparse as dense_to_sparse,
    densified as densified,
    from_coo as from_coo,
    identity as identity,
    is_sparse as is_sparse,
    kron as kron,
    site_operator as site_operator,
    sparse_products as sparse_products,
)
