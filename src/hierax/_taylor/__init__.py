"""Taylor-mode expansion of arbitrary JAX functions, by interpreting their jaxprs."""

from . import (  # noqa: F401 (rules)
    _rules_control,
    _rules_custom,
    _rules_linalg,
    _rules_linear,
    _rules_nonlinear,
    _rules_sort,
    _rules_special,
)
from ._api import taylor as taylor, time_series as time_series
from ._core import RULES
from ._interpreter import expand as expand, function_name as function_name
from ._recurrences import derivative as derivative


def supported_primitives() -> list[str]:
    """The names of the primitives that have a Taylor rule (integer- and
    boolean-valued primitives need none)."""
    return sorted(RULES)
