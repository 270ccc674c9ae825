"""The result of [`hierax.sesolve`][]."""

from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Int, Real, Shaped

from .._core import Failure, is_traced, module_jit


class Solution(eqx.Module):
    """The states of a solve at the requested times, the final one apart, their
    expectation values, the work it took, and (with `dense=True`) the solution
    anywhere in between.

    A `Solution` is a pytree of arrays: it passes through `jax.jit`, and
    `jax.vmap` over a solve gives one with a leading batch axis on every field.
    """

    times: Real[Array, " times"]
    states: Shaped[Array, "times n *rest"]
    final_state: Shaped[Array, " n *rest"]
    expects: Shaped[Array, "ops times *kets"] | None
    stats: dict[str, Int[Array, ""]]
    order: int = eqx.field(static=True)
    interpolation: diffrax.DenseInterpolation | None
    failure: Failure | None

    def __init__(
        self,
        times: Array,
        states: Array,
        expects: Array | None,
        stats: dict[str, Array],
        order: int,
        interpolation: diffrax.DenseInterpolation | None = None,
        final_state: Array | None = None,
        failure: Failure | None = None,
    ):
        """**Arguments:**

        - `times`: the times of the saved states, shape `(T,)`.
        - `states`: the states there, shape `(T, *state.shape)`.
        - `expects`: the expectation values $\\langle \\psi | O | \\psi \\rangle$ of
            the observables at those times, shape `(E, T)` for a state vector and
            `(E, T, m)` for m states as columns; `None` without observables.
        - `stats`: the numbers of steps: `num_steps`, `num_accepted_steps`,
            `num_rejected_steps`, and `max_steps`.
        - `order`: the order of the Taylor series used.
        - `interpolation`: the dense output, or `None` when not requested.
        - `final_state`: the state at the last time, `states[-1]` when not given.
            `sesolve` and `mesolve` take it inside their compiled program, so
            reading it costs nothing (indexing `states[-1]` from Python is an
            eager JAX operation of its own: 0.1-0.3 ms, as much as a short solve).
        - `failure`: with `throw=False`, the solve's first failed check (a
            [`hierax.Failure`][]: `failure.succeeded`, `failure.throw()`), the
            states nan where it failed; `None` with `throw=True` (the default),
            where a failed check raises instead.
        """
        self.times = times
        self.states = states
        self.final_state = states[-1] if final_state is None else final_state
        self.expects = expects
        self.stats = stats
        self.order = order
        self.interpolation = interpolation
        self.failure = failure

    def evaluate(self, t: ArrayLike) -> Array:
        """The state at any time in the solve's span, from the series of the step
        that covers it (as accurate as the saved states). Needs `dense=True`.

        **Arguments:**

        - `t`: a time, or an array of times of any shape, each within the solved
            span `[times[0], times[-1]]`. A time outside it (or nan) is refused: a
            number or a NumPy array here, a JAX array (concrete or traced) by an
            error at run time (`eqx.error_if`, inside any `jax.jit`).

        **Returns:**

        The state(s), shape `(*t.shape, *state.shape)`.
        """
        if self.interpolation is None:
            raise ValueError(
                "`hierax.Solution.evaluate`: this solution has no dense output; "
                "solve with `hierax.sesolve(..., dense=True)`."
            )
        # Numbers and JAX arrays as they are (a Python number stays weakly typed),
        # sequences as NumPy arrays: all traced by the one compiled call.
        if not isinstance(t, (jax.Array, int, float, complex)) or isinstance(t, bool):
            t = np.asarray(t)
        _check_kind(t)
        if not isinstance(t, jax.Array):
            _check_span(t, self.times)
        return _evaluate(self.interpolation, t, self.times)


def _check_kind(t: Any) -> None:
    """Refuse times that are not real numbers (strings, bools, objects, complex),
    by their dtype: a Python number's, a NumPy array's, a JAX array's (traced or
    not)."""
    kind = np.dtype(t.dtype).kind if hasattr(t, "dtype") else np.asarray(t).dtype.kind
    if kind == "c":
        raise ValueError(
            f"`hierax.Solution.evaluate`: `t` must be real, got {np.asarray(t)}."
        )
    if kind not in "iuf":
        shown = f"dtype {t.dtype}" if isinstance(t, jax.Array) else repr(t)
        raise TypeError(
            f"`hierax.Solution.evaluate`: `t` must be a real time or array of "
            f"times, got {shown}."
        )


def _check_span(t: Any, times: Array) -> None:
    """Refuse host times (numbers, NumPy arrays) outside the solved span, read
    from the solution's `times` (a JAX array keeps its host copy once read)."""
    if is_traced(times) or times.ndim != 1:
        return  # checked inside the compiled call
    # (Keeping the span by the identity of `times` saved 2.6 us of 70, 3.8%.)
    ends = np.asarray(times)
    span = (float(ends[0]), float(ends[-1]))
    try:
        values = np.asarray(t, float)
    except (TypeError, ValueError):
        raise TypeError(
            f"`hierax.Solution.evaluate`: `t` must be a real time or array of "
            f"times, got {t!r}."
        ) from None
    inside = (values >= span[0]) & (values <= span[1])
    if not np.all(inside):
        bad = values[~inside].flat[0]
        raise ValueError(
            f"`hierax.Solution.evaluate`: `t` must lie in the solved span "
            f"[{span[0]}, {span[1]}], got {bad}; the series of a step holds only "
            "within its step."
        )


def _evaluate_impl(
    interpolation: diffrax.DenseInterpolation, t: Any, times: Array
) -> Array:
    t = jnp.asarray(t)
    if not jnp.issubdtype(t.dtype, jnp.floating):
        # Integer (or bool) times: diffrax's interpolation needs a real time.
        t = t.astype(times.dtype)
    # Outside the span diffrax's buffers hold no step: its answer is nan.
    inside = (t >= times[0]) & (t <= times[-1])
    t = eqx.error_if(
        t,
        ~jnp.all(inside),
        "`hierax.Solution.evaluate`: `t` must lie in the solved span "
        "[times[0], times[-1]] (and not be nan).",
    )
    states = jax.vmap(interpolation.evaluate)(t.reshape(-1))
    return states.reshape(t.shape + states.shape[1:])


_evaluate = module_jit(_evaluate_impl)
