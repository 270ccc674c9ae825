"""The hierarchies: closed systems, Lindblad, user recursions and the time scale."""

from ._closed import (
    AbstractHierarchy as AbstractHierarchy,
    HeisenbergHierarchy as HeisenbergHierarchy,
    NestedCommutators as NestedCommutators,
    PropagatorDerivatives as PropagatorDerivatives,
)
from ._lindblad import (
    DensityMatrixDerivatives as DensityMatrixDerivatives,
    LindbladHierarchy as LindbladHierarchy,
)
from ._recursion import (
    Recursion as Recursion,
)
