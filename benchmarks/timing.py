"""The one clock of the benchmark scripts: a call timed to its result's arrival
(`timed`), repeated calls (`call_times`, `median_time`), calls taking turns
(`alternating_times`), and a time read off a work-precision ladder (`time_at`)."""

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def timed(fn, *args) -> tuple[float, np.ndarray]:
    """`fn(*args)`'s wall time in seconds, until its result is on the host, and that
    result as a NumPy array."""
    start = time.perf_counter()
    out = np.asarray(jax.block_until_ready(fn(*args)))
    return time.perf_counter() - start, out


def call_times(
    fn: Callable[..., Any],
    args: tuple = (),
    calls: int = 3,
    *,
    budgets: Sequence[tuple[int, float]] = (),
    warm: bool = True,
) -> tuple[list[float], Any]:
    """Wall times in seconds of calls `fn(*args)`, each until its result is ready,
    and the last result: after a first untimed call (which compiles) if `warm`, at
    least `calls` calls, and more while some `(most, seconds)` of `budgets` has
    fewer than `most` calls taking under `seconds` in all (short calls vary most
    with the machine's load)."""
    out = jax.block_until_ready(fn(*args)) if warm else None
    times: list[float] = []

    def more() -> bool:
        spent = sum(times)
        return len(times) < calls or any(
            len(times) < most and spent < seconds for most, seconds in budgets
        )

    while more():
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return times, out


def median_time(
    fn: Callable[..., Any],
    args: tuple = (),
    calls: int = 3,
    *,
    budgets: Sequence[tuple[int, float]] = (),
    warm: bool = True,
) -> float:
    """The median of [`call_times`][]'s times (the same arguments)."""
    times, _ = call_times(fn, args, calls, budgets=budgets, warm=warm)
    return statistics.median(times)


def first_call_time(fn: Callable[[], Any]) -> float:
    """Wall time of one call of `fn()`, until its result is ready (compile and run
    when the call is the first)."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


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


def alternating_times(
    calls: dict[str, Callable[[], Any]], repeats: int
) -> dict[str, np.ndarray]:
    """Each call's wall times in seconds over `repeats` rounds in which the calls
    take turns (each until its result is ready), after two calls of each (the
    first compiles): the machine's load moves them all alike."""
    for call in calls.values():
        jax.block_until_ready(call())
        jax.block_until_ready(call())
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            jax.block_until_ready(call())
            times[name].append(time.perf_counter() - start)
    return {name: np.asarray(t) for name, t in times.items()}


def time_at(points, target):
    """The run time at final error `target`, interpolated log-log between the
    ladder points around the last crossing (the last point above the target and
    the next, so that every tighter tolerance measured also met it): (seconds,
    bound), bound saying that the loosest tolerance already met the target; None
    when the ladder ends above it."""
    above = [i for i, p in enumerate(points) if p["error"] > target]
    if not above:
        return (points[0]["seconds"], True) if points else None
    i = above[-1]
    if i + 1 == len(points):
        return None
    a, b = points[i], points[i + 1]
    la, lb = math.log(a["error"]), math.log(max(b["error"], 1e-300))
    w = (math.log(target) - la) / (lb - la)
    log_seconds = math.log(a["seconds"]) + w * (
        math.log(b["seconds"]) - math.log(a["seconds"])
    )
    return math.exp(log_seconds), False
