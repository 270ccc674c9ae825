"""Compilation of the public calls: `eqx.filter_jit` semantics with a fast path."""

import functools
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


def module_jit(fn: Callable) -> Callable:
    """Compile `fn(module, *args, **static_kwargs)` once per structure.

    Behaves like `eqx.filter_jit` (array leaves traced, everything else static), but
    when every leaf of the module is already an array (the usual case)
    it dispatches through `jax.jit` directly, which costs a few microseconds instead
    of the tens that filtering the pytree costs on every call. Keyword arguments are
    static (Python bools and the like). Python scalars passed positionally are traced
    by both paths, so changing a time or a parameter value never retraces.
    """
    filtered = eqx.filter_jit(fn)
    direct: dict[tuple[str, ...], Callable] = {}

    @functools.wraps(fn)
    def call(*args, **static):
        try:
            return dispatch(*args, **static)
        except ValueError as error:
            if "incompatible devices" not in str(error):
                raise
            devices = sorted(
                {
                    str(device)
                    for leaf in jax.tree_util.tree_leaves(args)
                    if isinstance(leaf, jax.Array)
                    for device in leaf.devices()
                }
            )
            raise ValueError(
                f"hierax: the arrays of one call live on different devices "
                f"({', '.join(devices)}); put the module and its arguments on one "
                "device (`jax.device_put(x, device)`) or give them one sharding. "
                f"JAX reported: {error}"
            ) from None

    def dispatch(*args, **static):
        module, rest = args[0], args[1:]
        # Only array leaves in the module (a Python int or bool field there is static
        # under filtering, and must stay so); the other arguments are times and
        # states, which may be Python numbers.
        if all(
            isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(module)
        ) and all(
            isinstance(leaf, (jax.Array, np.ndarray, np.generic))
            or type(leaf) in (float, int, complex)
            for leaf in jax.tree_util.tree_leaves(rest)
        ):
            key = tuple(sorted(static))
            if key not in direct:
                direct[key] = jax.jit(fn, static_argnames=key)
            return direct[key](*args, **static)
        # Python scalars would be static under filtering: trace them as arrays.
        args = tuple(
            jnp.asarray(a) if isinstance(a, (float, complex, int)) else a for a in args
        )
        return filtered(*args, **static)

    return call
