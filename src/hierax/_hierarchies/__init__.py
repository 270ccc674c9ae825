"""The hierarchies: a base with its engines, Heisenberg, propagator, nested
commutators, Lindblad, user recursions and the time scale."""

from ._base import AbstractHierarchy as AbstractHierarchy
from ._heisenberg import HeisenbergHierarchy as HeisenbergHierarchy
from ._lindblad import (
    DensityMatrixDerivatives as DensityMatrixDerivatives,
    LindbladHierarchy as LindbladHierarchy,
)
from ._nested import NestedCommutators as NestedCommutators
from ._propagator import PropagatorDerivatives as PropagatorDerivatives
from ._recursion import Recursion as Recursion
