"""Pauli-string sums: operators of long chains, and their growth."""

from ._choice import (
    commutator_recursion as commutator_recursion,
    pauli_recursion as pauli_recursion,
)
from ._growth import (
    LanczosCoefficients as LanczosCoefficients,
    autocorrelation_series as autocorrelation_series,
    lanczos as lanczos,
    moments as moments,
)
from ._hierarchy import PauliHierarchy as PauliHierarchy
from ._sum import (
    PauliSum as PauliSum,
    PauliTimeSum as PauliTimeSum,
)
