"""Wall-clock helpers of `hierax seed` (and of the benchmarks in `benchmarks/`)."""

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def median_call_time(
    fn: Callable[[], Any],
    *,
    min_calls: int = 5,
    max_calls: int = 2000,
    budget: float = 0.5,
) -> tuple[float, int]:
    """Median wall time of `fn()` (blocked until ready) over repeated calls.

    `fn` is called once untimed first (it may compile). Calls continue until both
    `min_calls` calls and `budget` seconds are reached, or `max_calls`.

    **Returns:**

    `(median seconds per call, number of timed calls)`.
    """
    jax.block_until_ready(fn())
    times: list[float] = []
    spent = 0.0
    while len(times) < max_calls and (len(times) < min_calls or spent < budget):
        tick = time.perf_counter()
        jax.block_until_ready(fn())
        elapsed = time.perf_counter() - tick
        times.append(elapsed)
        spent += elapsed
    return statistics.median(times), len(times)


def first_call_time(fn: Callable[[], Any]) -> float:
    """Wall time of one call of `fn()`, blocked until ready (compile + run when the
    call is the first)."""
    tick = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - tick


def warm_up() -> None:
    """Start the backend and XLA's compiler on an unrelated program, so that the
    first method measured does not pay the process's one-time costs."""
    x = jnp.eye(2, dtype=jnp.result_type(complex))
    jax.block_until_ready(jax.jit(lambda a: a @ a + jnp.cos(a))(x))


def format_seconds(seconds: float) -> str:
    """A duration with a unit that suits it: us, ms or s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"
