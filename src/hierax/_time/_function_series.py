"""Exact Taylor coefficients of an arbitrary callable t -> array, for the operators and
time functions built from callables."""

from collections.abc import Callable

import jax.numpy as jnp
from jaxtyping import Array

from .._core import Time
from .._taylor import expand, function_name, time_series


def callable_series(
    fn: Callable[[Array], Array],
    t: Time,
    order: int,
    time_scale: Array | None,
    api: str,
) -> Array:
    """Normalised Taylor coefficients of $\\sigma \\mapsto f(t + s\\sigma)$, shape
    `(order + 1, *out)`, by [`hierax.taylor`][]'s transform (the input series of
    time is $(t, s, 0, \\ldots)$), so the traced program does not grow with the
    order. `api` names the public call in the transform's error messages."""
    t = jnp.asarray(t)
    t = t.astype(jnp.result_type(t, float))
    series = time_series(t, order)
    if time_scale is not None and order >= 1:
        series = series.at[1].set(time_scale.astype(series.dtype))
    return jnp.asarray(expand(fn, series, api=api, fn_name=function_name(fn)))
