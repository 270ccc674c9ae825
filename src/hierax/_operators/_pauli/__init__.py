"""Pauli-string sums: operators of long chains, and their growth."""

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
    check_chain as check_chain,  # for the hierarchies, not the public API
)
