"""The one clock of the benchmark scripts: a call timed to its result's arrival."""

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np


def timed(fn, *args) -> tuple[float, np.ndarray]:
    """`fn(*args)`'s wall time in seconds, until its result is on the host, and that
    result as a NumPy array."""
    start = time.perf_counter()
    out = np.asarray(jax.block_until_ready(fn(*args)))
    return time.perf_counter() - start, out


def median_time(fn, args: tuple, repeats: int) -> float:
    """The median wall time in seconds of `repeats` calls `fn(*args)`, each until
    its result is ready, after a first call (which compiles)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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
