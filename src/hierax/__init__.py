"""hierax: exact operator hierarchies of time-dependent quantum systems, in JAX."""

from importlib.metadata import version as _version

from ._core import (
    Failure as Failure,
    matmul_precision as matmul_precision,
)
from ._data import (
    SparseMatrix as SparseMatrix,
    kron as kron,
    site_operator as site_operator,
)
from ._hierarchies import (
    AbstractHierarchy as AbstractHierarchy,
    DensityMatrixDerivatives as DensityMatrixDerivatives,
    HeisenbergHierarchy as HeisenbergHierarchy,
    LindbladHierarchy as LindbladHierarchy,
    NestedCommutators as NestedCommutators,
    PropagatorDerivatives as PropagatorDerivatives,
    Recursion as Recursion,
)
from ._operators import (
    AbstractTimeOperator as AbstractTimeOperator,
    CallableOperator as CallableOperator,
    LanczosCoefficients as LanczosCoefficients,
    OperatorSum as OperatorSum,
    PauliHierarchy as PauliHierarchy,
    PauliSum as PauliSum,
    PauliTimeSum as PauliTimeSum,
    ScaledOperator as ScaledOperator,
    TimeOperator as TimeOperator,
    as_operator as as_operator,
    autocorrelation_series as autocorrelation_series,
    lanczos as lanczos,
    moments as moments,
    shard_rows as shard_rows,
)
from ._periodic import (
    FloquetBasis as FloquetBasis,
    HighFrequencyExpansion as HighFrequencyExpansion,
    floquet as floquet,
    high_frequency_expansion as high_frequency_expansion,
)
from ._solvers import (
    LindbladTerm as LindbladTerm,
    SchrodingerTerm as SchrodingerTerm,
    Solution as Solution,
    TaylorOptions as TaylorOptions,
    TaylorSolver as TaylorSolver,
    mesolve as mesolve,
    sesolve as sesolve,
)
from ._taylor import (
    taylor as taylor,
)
from ._time import (
    AbstractTimeFunction as AbstractTimeFunction,
    CallableTimeFunction as CallableTimeFunction,
    Constant as Constant,
    Cos as Cos,
    CubicSpline as CubicSpline,
    Exp as Exp,
    Gaussian as Gaussian,
    PiecewiseConstant as PiecewiseConstant,
    PiecewiseLinear as PiecewiseLinear,
    Polynomial as Polynomial,
    Sin as Sin,
    TimeFunctionProduct as TimeFunctionProduct,
    TimeFunctionSum as TimeFunctionSum,
)


__version__ = _version("hierax")
