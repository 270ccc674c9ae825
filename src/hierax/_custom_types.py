"""jaxtyping aliases shared by the modules of hierax."""

import numpy as np
from beartype import beartype
from jaxtyping import Array, ArrayLike, Inexact, ScalarLike, Shaped, jaxtyped


# A scalar time, a real or complex number or 0-d array. (Annotated as broadly as any
# array so that the precise checks in `_validation.as_time` give the error message.)
TimeLike = ArrayLike
# A Taylor order: a non-negative Python or NumPy int (checked by `check_order`).
OrderLike = int | np.integer
# Normalised Taylor coefficients of a scalar time function, orders 0..K.
ScalarSeries = Inexact[Array, " order_plus_1"]
# Normalised Taylor coefficients of an (n, n) operator, orders 0..K.
OperatorSeries = Inexact[Array, "order_plus_1 n n"]

__all__ = [
    "Array",
    "ArrayLike",
    "OperatorSeries",
    "OrderLike",
    "ScalarLike",
    "ScalarSeries",
    "Shaped",
    "TimeLike",
    "typechecked",
]


def typechecked(fn):
    """Check a public function's jaxtyping annotations at run time with beartype.

    Under `jit` the check runs once per trace and costs nothing afterwards.
    """
    return jaxtyped(typechecker=beartype)(fn)
