"""The one clock of the benchmark scripts: a call timed to its result's arrival
(`timed`, `time_call`), repeated calls (`call_times`, `median_time`,
`first_and_median`), calls taking turns (`alternating_times`), a compile in its two
phases (`compile_phases`), a stretch of a script's own work (`Stopwatch`), and a
time read off a work-precision ladder (`time_at`).

No benchmark reads `time.perf_counter` itself (a test checks it): every time it
reports goes through this module, so that all of them start and stop alike.
"""

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


class Stopwatch:
    """The wall time of a stretch of a script (a reference, a section, the whole
    run), not of one call: started when made, read any number of times."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        """Seconds since the stopwatch was made."""
        return time.perf_counter() - self.start


def time_call(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """`fn(*args)`'s wall time in seconds, until every array in its result is
    ready, and that result as it is (any pytree, or a host value)."""
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - start, out


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
    return time_call(fn)[0]


def first_and_median(
    fn: Callable[..., Any], args: tuple = (), repeats: int = 3
) -> tuple[float, float, np.ndarray]:
    """The first call's time (compile included) and the median of `repeats` more,
    each by [`timed`][] (until the result is on the host), and the first result."""
    first, out = timed(fn, *args)
    median = statistics.median(timed(fn, *args)[0] for _ in range(repeats))
    return first, median, out


def compile_phases(jitted: Any, args: tuple) -> tuple[float, float, Any]:
    """A `jax.jit` function's ahead-of-time compile at `args` in its two phases:
    tracing + lowering and XLA's compile (seconds each), and the compiled
    program."""
    start = time.perf_counter()
    lowered = jitted.trace(*args).lower()
    middle = time.perf_counter()
    compiled = lowered.compile()
    return middle - start, time.perf_counter() - middle, compiled


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
    calls: dict[str, Callable[[], Any]],
    repeats: int,
    *,
    warm: int = 2,
    batch: dict[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """Each call's wall times in seconds over `repeats` rounds in which the calls
    take turns, after `warm` untimed calls of each (the first compiles): the
    machine's load moves them all alike. A call named in `batch` runs that many
    times in a row per round, only the last waited for, and its time is the
    round's over the count (a per-call time for calls too short to time alone);
    the others run once per round, until their result is ready."""
    batch = batch or {}
    for call in calls.values():
        for _ in range(warm):
            jax.block_until_ready(call())
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            count, out = batch.get(name, 1), None
            start = time.perf_counter()
            for _ in range(count):
                out = call()
            jax.block_until_ready(out)
            times[name].append((time.perf_counter() - start) / count)
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


def at_targets(points, targets) -> dict:
    """For each target final error (keyed `f"{target:.0e}"`): the time read off a
    ladder of points (dicts with "rtol", "error", "seconds"; a point marked
    "failed" has no error and is left out) by `time_at`, whether the loosest
    tolerance already met it (`bound`), and the loosest point that met it."""
    points = sorted(
        (p for p in points if not p.get("failed", False)), key=lambda p: -p["rtol"]
    )
    result = {}
    for target in targets:
        hit = time_at(points, target)
        met = [p for p in points if p["error"] <= target]
        result[f"{target:.0e}"] = dict(
            seconds=None if hit is None else hit[0],
            bound=None if hit is None else hit[1],
            loosest_met=None if not met else met[0],
        )
    return result
