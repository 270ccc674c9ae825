"""The values the Taylor interpreter carries, and the table of primitive rules.

Every variable of the interpreted jaxpr is either a `Series` (its normalised
Taylor coefficients $x_0, \\ldots, x_K$ on a leading axis of length $K+1$) or a plain
value, which stands for a series whose coefficients above order 0 all vanish. Values
that do not depend on the input series (weights, masks, closed-over arrays) therefore
cost exactly what they cost in the original program.
"""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np


class Series:
    """The Taylor coefficients of one variable, shape `(K + 1, *aval.shape)`."""

    __slots__ = ("coeffs",)

    def __init__(self, coeffs: Any):
        self.coeffs = coeffs

    @property
    def primal(self) -> Any:
        return self.coeffs[0]

    def __repr__(self) -> str:
        return f"Series({self.coeffs!r})"


class Context:
    """What every rule needs besides its operands: the order and, for error messages,
    the public call and the name of the function being expanded."""

    __slots__ = ("api", "fn_name", "order")

    def __init__(self, order: int, api: str, fn_name: str):
        self.order = order
        self.api = api
        self.fn_name = fn_name

    def unsupported(self, primitive: str, why: str = "") -> NotImplementedError:
        message = (
            f"{self.api}: primitive '{primitive}' in function {self.fn_name} has no "
            "Taylor rule"
        )
        message += f" ({why})." if why else "."
        return NotImplementedError(message)


# Rules are keyed by primitive name, because some primitives change names between JAX
# versions (`pjit` became `jit`). A rule is called as `rule(ctx, eqn, invals)` when at
# least one operand is a `Series`, and returns one value, or a list of values when the
# primitive has multiple results.
RULES: dict[str, Callable] = {}


def register(*names: str) -> Callable[[Callable], Callable]:
    def decorator(rule: Callable) -> Callable:
        for name in names:
            RULES[name] = rule
        return rule

    return decorator


def is_series(x: Any) -> bool:
    return isinstance(x, Series)


def primal(x: Any) -> Any:
    return x.coeffs[0] if isinstance(x, Series) else x


def is_inexact(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.inexact))


def lift(order: int, x: Any, aval: Any = None) -> Any:
    """The coefficient array of `x`: a `Series` as it is, a plain value as itself at
    order 0 followed by zeros."""
    if isinstance(x, Series):
        return x.coeffs
    if aval is not None:
        x = jnp.asarray(x, dtype=aval.dtype)
        x = jnp.broadcast_to(x, aval.shape)
    else:
        x = jnp.asarray(x)
    rest = jnp.zeros((order,) + x.shape, x.dtype)
    return jnp.concatenate([x[None], rest], axis=0)


def real_dtype(dtype: Any) -> Any:
    return np.dtype(jnp.finfo(dtype).dtype)
