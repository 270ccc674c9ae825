"""Taylor-mode expansion of arbitrary JAX functions, by interpreting their jaxprs."""

from . import _rules_control, _rules_linear, _rules_nonlinear  # noqa: F401 (rules)
from ._api import taylor as taylor, time_series as time_series
from ._core import RULES
from ._interpreter import propagate as propagate


def supported_primitives() -> list[str]:
    """The names of the primitives that have a Taylor rule (integer- and
    boolean-valued primitives need none)."""
    return sorted(RULES)
