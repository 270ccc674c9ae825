"""The one clock of the benchmark scripts: a call timed to its result's arrival."""

import time

import jax
import numpy as np


def timed(fn, *args) -> tuple[float, np.ndarray]:
    """`fn(*args)`'s wall time in seconds, until its result is on the host, and that
    result as a NumPy array."""
    start = time.perf_counter()
    out = np.asarray(jax.block_until_ready(fn(*args)))
    return time.perf_counter() - start, out
