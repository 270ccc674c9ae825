"""Run-time checks of the values of a compiled call, and where a failed one is
raised.

A compiled program cannot raise. Inside a trace (a user's `jax.jit`, `jax.vmap`,
`jax.grad`) a failed check is raised by `eqx.branched_error_if`: a host callback in
the program. A call from Python with concrete values can instead return its
first failed check (`Failure`) beside its result, and the call raises on the host
(`module_jit`): the program holds none of hierax's callbacks (a solve saving
more than two times keeps diffrax's own checks of them). (Where the backend
chooses it,
`BackendChoices.host_checks`: a TPU, not a CPU.) That matters on an accelerator,
where any host callback costs a call about 1.9 ms whether it runs or not (a TPU
v5e, `benchmarks/results/tpu-v5e/step-latency-callbacks-20261206.json`) and
keeps the program out of JAX's persistent compilation cache (the key JAX hashes
holds the callback's Python pointer, new in every process: a `lanczos` program
compiled for 13-16 s in every process, and 0.26 s from the cache without
callbacks, `devices-persistent-cache-*-20261206.json`); and at trace time, where each
`eqx.error_if` walks the Python stack (about 18 ms a check on the CPU).

Only checks at the top level of the program a `module_jit` call traces are
collected (values of that trace): a check inside a loop's body, a branch, a
custom rule or a program of its own keeps `eqx.error_if` (a collected value of
an inner trace would escape it).
"""

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int


# The program being traced from Python (its trace) and its failed checks so far,
# each group's index of its first failed check (-1: none) with the group's
# messages; `None` where no program collects.
_COLLECTED: contextvars.ContextVar[
    tuple[Any, list[tuple[Array, tuple[str, ...]]]] | None
] = contextvars.ContextVar("hierax_collected_checks", default=None)


def _current_trace() -> Any:
    return jax.extend.core.find_top_trace(())


class Failure(eqx.Module):
    """The first failed check of a call, returned instead of raised: what a
    solve with `throw=False` gives in its [`hierax.Solution`][]'s `failure`
    (and what a program traced from Python returns beside its result, for the
    call to raise on the host).

    `code` is the index of the first failed check in `messages`, -1 where none
    failed; under `jax.vmap` it has the batch's axes, one code per element. The
    messages are static: they come back with the output's structure, as traced.
    """

    code: Int[Array, "*batch"]
    messages: tuple[str, ...] = eqx.field(static=True)

    @property
    def succeeded(self) -> Bool[Array, "*batch"]:
        """Where every check passed (per element under `jax.vmap`)."""
        return self.code < 0

    def throw(self) -> None:
        """Raise the `ValueError` the call would have raised with `throw=True`, for
        the first element (in row-major order) whose check failed; nothing where
        all passed. Reads the codes on the host: call it outside `jax.jit`."""
        codes = np.asarray(self.code).reshape(-1)
        failed = codes[codes >= 0]
        if failed.size:
            raise ValueError(self.messages[int(failed[0])])


def raise_if(
    x: Any, failed: Sequence[Any], messages: Sequence[str], safe: Any = None
) -> Any:
    """`x`, with an error carrying `messages[i]` for the first `failed[i]` (scalar
    bools) that holds: raised when the call returns to Python (the program's
    failure code) or at run time by `eqx.branched_error_if` (see the module's
    docstring). All of a call's checks in one (one branch and one callback, one
    walk of the stack, instead of one per check).

    A collected check lets the program run on to its end before the call raises:
    where what follows would run long, or trip a check of its own, on the values
    that failed (a solve's steps on decreasing times), `safe` (a pytree like `x`)
    takes their place when a check fails."""
    collecting = _COLLECTED.get()
    # Collected only at the top level of the program that collects: a check in a
    # loop's body, a branch or a program of its own is a value of another trace.
    if collecting is None or collecting[0] is not _current_trace():
        # Each check over the whole batch first (under `jax.vmap`; as diffrax
        # does, with equinox's `unvmap_any`): equinox takes the largest index over
        # a batched one, which a batch of zero elements (valid JAX) has none of, a
        # raw `ValueError` before any check ran. The index is then the first check
        # that fails for any element.
        index, any_failed = _first([eqxi.unvmap_any(jnp.asarray(p)) for p in failed])
        return eqx.branched_error_if(x, any_failed, index, list(messages))
    index, any_failed = _first(failed)
    collecting[1].append((jnp.where(any_failed, index, -1), tuple(messages)))
    if safe is None:
        return x
    return jax.tree.map(lambda s, v: jnp.where(any_failed, s, v), safe, x)


def returned_failure(failed: Sequence[Any], messages: Sequence[str]) -> Failure:
    """The first of the checks `failed` (scalar bools) that holds, as a `Failure`
    (code -1 where none does): returned by a call with `throw=False`, not raised.
    """
    if not failed:
        return Failure(jnp.asarray(-1, jnp.int32), ())
    index, any_failed = _first(failed)
    return Failure(jnp.where(any_failed, index, -1).astype(jnp.int32), tuple(messages))


def _first(failed: Sequence[Any]) -> tuple[Array, Array]:
    """The index of the first of the scalar bools `failed` that holds (0 where
    none does), and whether any holds."""
    flags = [jnp.asarray(p).reshape(()) for p in failed]
    index = jnp.asarray(0)
    for i in reversed(range(len(flags))):
        index = jnp.where(flags[i], i, index)
    any_failed = flags[0]
    for p in flags[1:]:
        any_failed = any_failed | p
    return index, any_failed


def at_top_level() -> bool:
    """Whether nothing is being traced (JAX's current trace is the eager one): a
    call's values may be concrete inside a trace too, closed over by a user's
    `jax.jit`."""
    return type(_current_trace()).__name__ == "EvalTrace"


@contextlib.contextmanager
def collecting() -> Iterator[list[tuple[Array, tuple[str, ...]]]]:
    """Collect the checks traced at the top level of the program being traced (one
    traced from Python); `failure` of what was collected is its `Failure`."""
    found: list[tuple[Array, tuple[str, ...]]] = []
    token = _COLLECTED.set((_current_trace(), found))
    try:
        yield found
    finally:
        _COLLECTED.reset(token)


def failure(found: Sequence[tuple[Array, tuple[str, ...]]]) -> Failure:
    """The first failed check of the collected `found` (each group's index of its
    first failed check, -1 where none, and its messages), in one `Failure`."""
    code = jnp.asarray(-1, jnp.int32)
    offset = sum(len(m) for _, m in found)
    for index, group in reversed(found):
        offset -= len(group)
        code = jnp.where(index >= 0, offset + index, code).astype(jnp.int32)
    return Failure(code, tuple(m for _, group in found for m in group))
