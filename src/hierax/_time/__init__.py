"""Functions of time: the built-in ones, splines and their Taylor series."""

from ._function_series import (
    callable_series as callable_series,
)
from ._majorants import (
    hides_its_peak as hides_its_peak,
    remainder_bound as remainder_bound,
)
from ._splines import (
    CubicSpline as CubicSpline,
    PiecewiseConstant as PiecewiseConstant,
    PiecewiseLinear as PiecewiseLinear,
)
from ._time_functions import (
    AbstractTimeFunction as AbstractTimeFunction,
    CallableTimeFunction as CallableTimeFunction,
    Constant as Constant,
    Cos as Cos,
    Exp as Exp,
    Gaussian as Gaussian,
    Polynomial as Polynomial,
    Sin as Sin,
    TimeFunctionProduct as TimeFunctionProduct,
    TimeFunctionSum as TimeFunctionSum,
    as_time_function as as_time_function,
    bound_args as bound_args,
    check_takes_args as check_takes_args,
    held_args as held_args,
    largest_degree as largest_degree,
    product_degree as product_degree,
    register_operator_product as register_operator_product,
)
