"""The one clock of the benchmark scripts: a call timed to its result's arrival."""

import statistics
import time

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
