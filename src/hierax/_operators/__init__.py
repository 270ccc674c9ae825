"""Operators: time-dependent operators, their structure (dense, sparse, Pauli
sums), conversions from other libraries, rewrites and sharding."""

from ._interop import (
    as_matrices as as_matrices,
    as_matrix as as_matrix,
    as_state as as_state,
)
from ._pauli import (
    LanczosCoefficients as LanczosCoefficients,
    PauliHierarchy as PauliHierarchy,
    PauliSum as PauliSum,
    PauliTimeSum as PauliTimeSum,
    autocorrelation_series as autocorrelation_series,
    commutator_recursion as commutator_recursion,
    lanczos as lanczos,
    moments as moments,
    pauli_recursion as pauli_recursion,
)
from ._rewrites import (
    TermNorms as TermNorms,
    jump_times as jump_times,
    known_value as known_value,
    merge_equal_terms as merge_equal_terms,
    operator_bound as operator_bound,
    real_terms as real_terms,
    split_constant_trace as split_constant_trace,
    term_norms as term_norms,
    uniform_products as uniform_products,
)
from ._sharding import (
    shard_rows as shard_rows,
)
from ._time_operators import (
    AbstractTimeOperator as AbstractTimeOperator,
    CallableOperator as CallableOperator,
    OperatorSum as OperatorSum,
    ScaledOperator as ScaledOperator,
    TimeOperator as TimeOperator,
    apply_at_order_zero as apply_at_order_zero,
    as_operator as as_operator,
    as_time_operator as as_time_operator,
    bind_args as bind_args,
    check_jump_operators as check_jump_operators,
    function_series as function_series,
    jump_list as jump_list,
    series_degree as series_degree,
    summands as summands,
    time_operators as time_operators,
    to_operator as to_operator,
)
