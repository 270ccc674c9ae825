"""Exact Taylor coefficients of an arbitrary callable t -> array, for the operators and
time functions built from callables."""

from collections.abc import Callable

import jax.numpy as jnp
from jaxtyping import Array

from ._taylor import propagate, time_series


def function_series(
    fn: Callable[[Array], Array],
    t: Array,
    order: int,
    api: str = "hierax",
    scale: Array | None = None,
) -> Array:
    """Normalised Taylor coefficients of `fn` at `t`, shape `(order + 1, *out)`,
    by [`hierax.taylor`][]'s transform: the traced program does not grow with the
    order. With `scale`, the series of $s \\mapsto f(t + \\text{scale}\\,s)$ (the input
    series of time is $(t, \\text{scale}, 0, \\ldots)$)."""
    t = jnp.asarray(t)
    t = t.astype(jnp.result_type(t, float))
    series = time_series(t, order)
    if scale is not None and order >= 1:
        series = series.at[1].set(scale)
    return jnp.asarray(propagate(fn, series, api=api))
