"""Exact Taylor coefficients of an arbitrary callable operator t -> (n, n)."""

from collections.abc import Callable

import jax.numpy as jnp
from jax.experimental import jet
from jaxtyping import Array

from ._series import factorial_scale


def function_series(fn: Callable[[Array], Array], t: Array, order: int) -> Array:
    """Normalised Taylor coefficients of `fn` at `t`, shape `(order + 1, *out)`."""
    value = jnp.asarray(fn(t))
    if order == 0:
        return value[None]
    dtype = jnp.result_type(t, float)
    t = jnp.asarray(t, dtype)
    direction = [jnp.ones((), dtype)] + [jnp.zeros((), dtype)] * (order - 1)
    primal, series = jet.jet(fn, (t,), (direction,))
    stacked = jnp.stack([jnp.asarray(primal)] + [jnp.asarray(s) for s in series])
    return factorial_scale(stacked, power=-1)
