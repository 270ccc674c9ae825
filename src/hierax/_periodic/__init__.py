"""Periodic drives: Floquet modes, the high-frequency expansion and the
symmetries they use."""

from ._floquet import (
    FloquetBasis as FloquetBasis,
    floquet as floquet,
)
from ._high_frequency import (
    HighFrequencyExpansion as HighFrequencyExpansion,
    high_frequency_expansion as high_frequency_expansion,
)
