"""The bottom layer: arrays and their placement, the backend's precision, caches,
types, the one compile policy and the checks of inputs."""

from ._arrays import (
    complex_dtype as complex_dtype,
    float_dtype as float_dtype,
    is_traced as is_traced,
    placed as placed,
    placement as placement,
    to_jax as to_jax,
)
from ._backend import (
    exact_products as exact_products,
    matmul_precision as matmul_precision,
    on_backend as on_backend,
    run_checked as run_checked,
)
from ._cache import (
    GENERATOR_NORMS as GENERATOR_NORMS,
    MESOLVE_STACKED_TERMS as MESOLVE_STACKED_TERMS,
    MESOLVE_TERMS as MESOLVE_TERMS,
    OPTIONS_BUILT as OPTIONS_BUILT,
    PERIOD_SOLVERS as PERIOD_SOLVERS,
    SESOLVE_TERMS as SESOLVE_TERMS,
    VERIFIED_PERIODS as VERIFIED_PERIODS,
    content_key as content_key,
    flatten_module as flatten_module,
)
from ._checks import (
    Failure as Failure,
    at_top_level as at_top_level,
    failure as failure,
    raise_if as raise_if,
    returned_failure as returned_failure,
)
from ._choices import backend_choices as backend_choices
from ._custom_types import (
    OperatorSeries as OperatorSeries,
    OrderLike as OrderLike,
    ScalarSeries as ScalarSeries,
    Time as Time,
    TimeLike as TimeLike,
    typechecked as typechecked,
)
from ._host_method import host_method as host_method
from ._jit import (
    by_batching as by_batching,
    by_differentiation as by_differentiation,
    in_blocks as in_blocks,
    module_jit as module_jit,
    run_if as run_if,
)
from ._validation import (
    MAX_ORDER as MAX_ORDER,
    as_numeric_array as as_numeric_array,
    as_period as as_period,
    as_sequence as as_sequence,
    as_square_matrix as as_square_matrix,
    as_time as as_time,
    as_time_array as as_time_array,
    built_for as built_for,
    check_bool as check_bool,
    check_finite as check_finite,
    check_order as check_order,
    check_time_finite as check_time_finite,
    int_as_float as int_as_float,
    is_int as is_int,
    object_hint as object_hint,
    refuse_non_matrix as refuse_non_matrix,
    trace_callable as trace_callable,
)
