"""What a compiled call needs from the backend it runs on: the precision of its matrix
products, and a refusal of 64-bit mode where XLA cannot compile it (a TPU).

Precision. A TPU computes a float32 matrix product at JAX's default precision in one
bfloat16 pass (8 bits of mantissa), and GPUs with TF32 do the same kind of thing: a
32-level hierarchy at order 20 lost three digits that way (measured on a TPU v5e).
Every hierax call therefore traces its program inside
`jax.default_matmul_precision(...)`: each `dot_general` in it records the precision
chosen here, "highest" unless the user opts out with
[`hierax.matmul_precision`][], and a user's global `jax_default_matmul_precision`
does not reach it. On a CPU every precision computes the same products. Because the
choice is a JAX context, JAX's compile caches (and a user's own `jax.jit`) key
programs by it: a program traced under one choice is never reused under another.

64-bit mode. XLA's TPU compiler aborts the Python process (SIGABRT, no exception) on
the float64 -> complex128 conversions of any complex64/complex128 computation with
`jax_enable_x64` on. hierax refuses such a call, naming the backend, before anything
is compiled.
"""

import contextlib
import contextvars
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, Literal, get_args

import equinox as eqx
import jax
from jax.core import Tracer

from . import _choices
from ._cache import BACKENDS_PRESENT


PrecisionName = Literal[
    "highest", "float32", "high", "bfloat16_3x", "tensorfloat32", "default", "bfloat16"
]

# JAX's names of `lax.Precision`, which `jax.default_matmul_precision` accepts:
# HIGHEST ("highest", "float32"), HIGH ("high", "bfloat16_3x", "tensorfloat32"),
# DEFAULT ("default", "bfloat16").
_PRECISIONS: tuple[str, ...] = get_args(PrecisionName)

_chosen: contextvars.ContextVar[str] = contextvars.ContextVar(
    "hierax_matmul_precision", default="highest"
)


@contextlib.contextmanager
def matmul_precision(precision: PrecisionName | str) -> Iterator[None]:
    """The precision of hierax's matrix products inside the `with` block.

    hierax computes every matrix product at the highest precision of its dtype by
    default, whatever JAX's global `jax_default_matmul_precision` says: on a TPU
    (and on GPUs with TF32) JAX's default rounds float32 operands to bfloat16
    passes, which cost hierarchies three digits. Use this block to trade digits
    for speed on such a device, e.g. `"default"` (one bfloat16 pass on a TPU) or
    `"high"` (three passes, about float32's accuracy for well-scaled operands).
    On a CPU all choices compute the same products.

    The block is also JAX's `jax.default_matmul_precision(precision)`, so products
    of your own code inside it follow the same choice, and programs traced inside
    it are compiled apart from those traced outside (no stale program is reused).

    **Arguments:**

    - `precision`: one of JAX's names: `"highest"` or `"float32"` (the default),
      `"high"`, `"bfloat16_3x"` or `"tensorfloat32"`, `"default"` or `"bfloat16"`.

    !!! example
        ```python
        with hierax.matmul_precision("default"):
            levels = hierarchy(t)   # faster on a TPU, about 3 digits in complex64
        ```
    """
    if not isinstance(precision, str) or precision not in _PRECISIONS:
        raise ValueError(
            "`hierax.matmul_precision`: `precision` must be one of "
            f"{', '.join(repr(p) for p in _PRECISIONS)}, got {precision!r}."
        )
    token = _chosen.set(precision)
    try:
        with jax.default_matmul_precision(precision):
            yield
    finally:
        _chosen.reset(token)


def chosen_precision() -> str:
    """The precision hierax's products are traced with here (see the module)."""
    return _chosen.get()


def products_context() -> Any:
    """The context in which a hierax program is traced: its products at the chosen
    precision."""
    return jax.default_matmul_precision(_chosen.get())


def _platform(args: tuple) -> str:
    """The platform a call will run on: that of its first concrete JAX array among
    `args` (searched one level deep), else the default device's."""
    for arg in args:
        for leaf in arg if isinstance(arg, (tuple, list)) else (arg,):
            if isinstance(leaf, jax.Array) and not isinstance(leaf, Tracer):
                try:
                    return next(iter(leaf.sharding.device_set)).platform
                except Exception:  # a deleted or donated array: decide by default
                    break
    return _choices.default_platform()


def _tpu_in_process() -> bool:
    """Whether this process has a TPU at all (asked once, after JAX has started,
    and kept in `BACKENDS_PRESENT`)."""
    hit = BACKENDS_PRESENT.get("tpu")
    if hit is None:
        try:
            present = bool(jax.devices("tpu"))
        except RuntimeError:  # no TPU backend here
            present = False
        hit = BACKENDS_PRESENT.put("tpu", present)
    return hit


# The seam tests use to act as if on another backend (CI has no accelerator).
platform_of: Callable[[tuple], str] = _platform


def refuse_unsupported_backend(api: str | Callable[[], str], args: tuple = ()) -> None:
    """Raise before anything is compiled where the backend cannot compile the call:
    64-bit mode on a TPU (see the module). `api`: the call's name, or a function
    that gives it (called only to raise)."""
    if not jax.config.read("jax_enable_x64"):
        return
    if platform_of is _platform and not _tpu_in_process():
        return  # (the common case, on every call: nothing here can run on a TPU)
    platform = platform_of(args)
    if platform == "tpu":
        api = api if isinstance(api, str) else api()
        raise ValueError(
            f"`{api}`: 64-bit mode (`jax_enable_x64`) is not supported on a TPU. "
            "XLA's TPU compiler has no float64 -> complex128 conversion, which every "
            "complex computation in 64-bit mode needs, and it aborts the Python "
            "process instead of raising, so hierax refuses before compiling. Use "
            "complex64 with x64 off (hierax's float32 products run at the highest "
            "precision there: about 1e-5 relative error), or compute on the CPU, "
            "e.g. inside `with jax.default_device(jax.devices('cpu')[0]):` or with "
            "`JAX_PLATFORMS=cpu`."
        )


def on_backend(api: str) -> Callable[[Callable], Callable]:
    """Decorate a public call (or a method a user's own diffrax solve calls): refuse
    what its backend cannot compile, then run it with its products at the chosen
    precision, including products computed eagerly and programs traced later from
    inside it (a derivative's backward pass traces the steps again). A check of a
    value that fails inside the compiled call is raised as a one-line
    `ValueError`."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            refuse_unsupported_backend(api, args)
            return run_checked(exact, *args, **kwargs)

        exact = exact_products(fn)
        return call

    return decorate


def exact_products(fn: Callable) -> Callable:
    """`fn` with its products at the chosen precision wherever it is traced: for
    functions JAX traces after the call that defined them returned (the backward
    rule of a `jax.custom_vjp`, traced when the derivative is transposed)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with products_context():
            return fn(*args, **kwargs)

    return call


# Where equinox's run-time error puts the message of a failed `eqx.error_if` in the
# text of the error JAX raises, and where its own advice begins.
# (`eqx.filter_jit` re-raises it as its own error, whose advice follows a rule.)
_RUNTIME_MARKER = "EquinoxRuntimeError: `hierax"
_RUNTIME_ENDS = ("\n\n\n", "\n\n---")


def runtime_message(error: BaseException) -> str | None:
    """The message of a hierax check that failed inside a compiled program, from the
    run-time error JAX raised for it (a long text: the callback's traceback and
    equinox's advice around one line of ours); None for any other error."""
    text = f"{type(error).__name__}: {error}"
    start = text.find(_RUNTIME_MARKER)
    if start < 0:
        return None
    start += len(_RUNTIME_MARKER) - len("`hierax")
    ends = [e for e in (text.find(end, start) for end in _RUNTIME_ENDS) if e >= 0]
    return text[start : min(ends) if ends else None].strip()


def run_checked(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` (a compiled call), with a failed check of a value (a
    nan in a state on the device) raised as the `ValueError` it is, with its message
    alone: JAX's run-time error wraps it in a traceback of the callback and
    equinox's advice. (Where a device reports errors only when a result is read,
    JAX's error comes then, from the read.)"""
    try:
        return fn(*args, **kwargs)
    # (JAX's cached dispatch raises the run-time error as a plain `ValueError`, and
    # a call compiled by `eqx.filter_jit` as an `EquinoxRuntimeError`.)
    except (jax.errors.JaxRuntimeError, ValueError, eqx.EquinoxRuntimeError) as error:
        message = runtime_message(error)
        if message is None:
            raise
        raise ValueError(message) from None


class _QuietChecks(logging.Filter):
    """Drops JAX's log record of a failed callback when it is a hierax check: the
    record repeats, with a traceback, the message that the error itself carries."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or runtime_message(error) is None


logging.getLogger("jax._src.callback").addFilter(_QuietChecks())
