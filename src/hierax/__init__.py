"""hierax: exact operator hierarchies of time-dependent quantum systems, in JAX."""

from importlib.metadata import version as _version

from ._backend import matmul_precision as matmul_precision
from ._floquet import FloquetBasis as FloquetBasis, floquet as floquet
from ._hierarchies import (
    AbstractHierarchy as AbstractHierarchy,
    HeisenbergHierarchy as HeisenbergHierarchy,
    NestedCommutators as NestedCommutators,
    PropagatorDerivatives as PropagatorDerivatives,
)
from ._high_frequency import (
    HighFrequencyExpansion as HighFrequencyExpansion,
    high_frequency_expansion as high_frequency_expansion,
)
from ._lindblad import (
    DensityMatrixDerivatives as DensityMatrixDerivatives,
    LindbladHierarchy as LindbladHierarchy,
)
from ._operators import (
    AbstractTimeOperator as AbstractTimeOperator,
    CallableOperator as CallableOperator,
    OperatorSum as OperatorSum,
    ScaledOperator as ScaledOperator,
    TimeOperator as TimeOperator,
    as_operator as as_operator,
)
from ._pauli import (
    LanczosCoefficients as LanczosCoefficients,
    PauliHierarchy as PauliHierarchy,
    PauliSum as PauliSum,
    PauliTimeSum as PauliTimeSum,
    autocorrelation_series as autocorrelation_series,
    lanczos as lanczos,
    moments as moments,
)
from ._recursion import Recursion as Recursion
from ._sharding import shard_rows as shard_rows
from ._solvers import (
    LindbladTerm as LindbladTerm,
    SchrodingerTerm as SchrodingerTerm,
    Solution as Solution,
    TaylorOptions as TaylorOptions,
    TaylorSolver as TaylorSolver,
    mesolve as mesolve,
    sesolve as sesolve,
)
from ._sparse import (
    SparseMatrix as SparseMatrix,
    kron as kron,
    site_operator as site_operator,
)
from ._splines import (
    CubicSpline as CubicSpline,
    PiecewiseConstant as PiecewiseConstant,
    PiecewiseLinear as PiecewiseLinear,
)
from ._taylor import taylor as taylor
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
)


__version__ = _version("hierax")
