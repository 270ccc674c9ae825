"""Exact Taylor coefficients of an arbitrary callable t -> array, for the operators and
time functions built from callables."""

from collections.abc import Callable

import jax.numpy as jnp
from jaxtyping import Array

from ._taylor import propagate, time_series


def function_series(
    fn: Callable[[Array], Array], t: Array, order: int, api: str = "hierax"
) -> Array:
    """Normalised Taylor coefficients of `fn` at `t`, shape `(order + 1, *out)`,
    by [`hierax.taylor`][]'s transform: the traced program does not grow with the
    order."""
    t = jnp.asarray(t)
    t = t.astype(jnp.result_type(t, float))
    return jnp.asarray(propagate(fn, time_series(t, order), api=api))
