"""Time evolution with the Taylor method: diffrax terms, solver, and `sesolve`."""

from ._sesolve import sesolve as sesolve
from ._solution import Solution as Solution
from ._solver import TaylorSolver as TaylorSolver
from ._term import SchrodingerTerm as SchrodingerTerm
