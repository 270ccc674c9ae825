"""Time evolution with the Taylor method: diffrax terms, solver, `sesolve` and
`mesolve`."""

from ._mesolve import mesolve as mesolve
from ._options import TaylorOptions as TaylorOptions
from ._resolution import callable_tangents as callable_tangents  # for floquet
from ._sesolve import (
    schrodinger_solve as schrodinger_solve,  # for floquet
    sesolve as sesolve,
)
from ._solution import Solution as Solution
from ._solver import (
    TaylorSolver as TaylorSolver,
    default_order as default_order,  # for floquet
)
from ._term import LindbladTerm as LindbladTerm, SchrodingerTerm as SchrodingerTerm
