"""`hierax.TaylorOptions`: the settings of a Taylor solve (tolerances, order, step
control, `max_steps`, adjoint) in one object, which `sesolve`, `mesolve` and
`floquet` take as `options=`."""

import math
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jaxtyping import Array, Real

from .._core import MAX_ORDER, check_bool, to_jax


_API = "hierax.TaylorOptions"

# Adjoints that differentiate through the solver's own steps; a backsolve adjoint
# would integrate an adjoint equation that is not a Schrödinger equation.
ADJOINTS = (
    diffrax.RecursiveCheckpointAdjoint,
    diffrax.DirectAdjoint,
    diffrax.ForwardMode,
)

# The step-size control's defaults. The estimate goes as (|H| h)^K, so at high
# order a small rise of |H(t)| between steps (a pulse, h(t) = 1 + 0.5 sin 2t)
# multiplies it many times over and the plain integral controller rejected about
# one step in five on the driven Ising chain; the proportional and derivative parts
# follow the trend. Measured (Ising chain, K = 26, error 1e-10): 525 steps instead
# of 567, rejections 110 -> 60; the transmon is unchanged within 3%.
SAFETY = 0.9
PCOEFF, ICOEFF, DCOEFF = 0.3, 0.6, 0.1

DEFAULT_RTOL, DEFAULT_ATOL, DEFAULT_MAX_STEPS = 1e-8, 1e-10, 100_000


class TaylorOptions(eqx.Module):
    """How a Taylor solve steps: the tolerances on each step's truncation error,
    the order $K$ of the series, fixed or adaptive steps and the gains of the
    adaptive step control, the most steps, and how to differentiate. One object
    for [`hierax.sesolve`][], [`hierax.mesolve`][] and [`hierax.floquet`][]
    (`options=`), the way a diffrax stepsize controller carries its own settings:
    build it once, pass it to every solve, batch it with `jax.vmap` over `rtol`.

    The tolerances and `dt` are arrays: a new value (or a traced one, inside a
    `jax.jit` or `jax.vmap`) compiles nothing. The order, the gains, `max_steps`
    and the adjoint shape the compiled solve and are static: a new value compiles
    a new one.
    """

    rtol: Real[Array, ""]
    atol: Real[Array, ""]
    order: int | None = eqx.field(static=True)
    dt: Real[Array, ""] | None
    safety: float = eqx.field(static=True)
    pcoeff: float = eqx.field(static=True)
    icoeff: float = eqx.field(static=True)
    dcoeff: float = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    adjoint: diffrax.AbstractAdjoint | None = eqx.field(static=True)
    throw: bool = eqx.field(static=True)

    def __init__(
        self,
        *,
        rtol: Any = DEFAULT_RTOL,
        atol: Any = DEFAULT_ATOL,
        # (`Any`: each is checked below with an error naming the field.)
        order: Any = None,
        dt: Any = None,
        safety: Any = SAFETY,
        pcoeff: Any = PCOEFF,
        icoeff: Any = ICOEFF,
        dcoeff: Any = DCOEFF,
        max_steps: Any = DEFAULT_MAX_STEPS,
        adjoint: Any = None,
        throw: Any = True,
    ):
        """**Arguments:**

        - `rtol`, `atol`: tolerances on each step's truncation error, elementwise
            `atol + rtol * |y|` as in diffrax and QuTiP; positive real scalars
            (numbers or arrays, traced ones too).
        - `order`: the order K of the series, an int >= 1; `None` (the default)
            for 28 in float64 and 16 in float32, whatever the tolerance.
        - `dt`: a fixed step (a positive real scalar): the span is cut into equal
            steps no longer than `dt` (stopping at the knots of sampled pulses
            too), and the tolerances then only bound each
            step's error estimate (see [`hierax.sesolve`][]). `None` (the
            default) for adaptive steps.
        - `safety`, `pcoeff`, `icoeff`, `dcoeff`: the adaptive steps' PID
            controller (`diffrax.PIDController`'s names), on the largest entry
            of the error estimate: `safety` in (0, 1], the gains finite and
            >= 0 with `pcoeff + icoeff` > 0. The defaults (0.9, 0.3, 0.6, 0.1)
            follow the estimate's steep rise with |H| at high order.
        - `max_steps`: the most steps a solve may take (an int >= 1); past that
            it raises a `ValueError` naming `max_steps`.
        - `adjoint`: how to differentiate, `diffrax.RecursiveCheckpointAdjoint()`
            (`None`, the default), `diffrax.DirectAdjoint()` or
            `diffrax.ForwardMode()` (for `jax.jvp`).
        - `throw`: whether a failed check of the solve's values raises (`True`,
            the default: from Python a `ValueError`, inside a `jax.jit` an error
            at run time by a host callback) or is returned in the solution's
            `failure` (`False`, as diffrax's `throw=False`): a
            [`hierax.Failure`][], with the states, final state and expectation
            values nan where a check failed. The program then holds no host
            callback, which on an accelerator costs every call of a `jax.jit`
            that holds one about 2 ms (a TPU v5e). (With more than two `times`,
            diffrax's own checks of the save times stay: host callbacks too.)
            `floquet` returns it in its basis' `failure`.
        """
        self.rtol = positive_value(rtol, "rtol", _API)
        self.atol = positive_value(atol, "atol", _API)
        self.order = None if order is None else check_order(order, _API)
        self.dt = None if dt is None else positive_value(dt, "dt", _API)
        gains = _check_gains(safety, pcoeff, icoeff, dcoeff)
        self.safety, self.pcoeff, self.icoeff, self.dcoeff = gains
        self.max_steps = check_max_steps(max_steps, _API)
        self.adjoint = check_adjoint(adjoint, _API)
        self.throw = check_bool(throw, "throw", _API)


def positive_value(x: Any, name: str, api: str) -> Array:
    """A positive real scalar as an array. Numbers (and NumPy values) are checked
    here and placed once per value (`to_jax`, without an eager JAX operation);
    JAX arrays, concrete or traced, are checked by shape and dtype here. The
    compiled solve checks every value again (a JAX array's there only)."""
    if isinstance(x, jax.Array | Tracer):
        if x.ndim != 0 or not (
            jnp.issubdtype(x.dtype, jnp.floating)
            or jnp.issubdtype(x.dtype, jnp.integer)
        ):
            raise ValueError(
                f"`{api}`: `{name}` must be a real scalar, got {x.dtype} of shape "
                f"{tuple(x.shape)}."
            )
        return x
    return to_jax(check_positive(x, name, api))


def check_positive(x: Any, name: str, api: str) -> float:
    if isinstance(x, bool | np.bool_):
        raise TypeError(f"`{api}`: `{name}` must be a positive number, got {x!r}.")
    try:
        value = float(x)
    except (TypeError, ValueError, jax.errors.ConcretizationTypeError):
        raise TypeError(
            f"`{api}`: `{name}` must be a concrete positive number, got {x!r}."
        ) from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"`{api}`: `{name}` must be positive and finite, got {x}.")
    return value


def check_order(order: Any, api: str) -> int:
    if isinstance(order, bool) or not isinstance(order, int | np.integer):
        raise TypeError(
            f"`{api}`: `order` must be a Python int >= 1 (or None), got "
            f"{type(order).__name__}."
        )
    if not 1 <= order <= MAX_ORDER:
        raise ValueError(
            f"`{api}`: `order` must be an int from 1 to {MAX_ORDER:,}, got {order}."
        )
    return int(order)


def check_max_steps(max_steps: Any, api: str) -> int:
    # (A NumPy integer is an int; a bool is not.)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int | np.integer):
        raise ValueError(
            f"`{api}`: `max_steps` must be an int >= 1, got "
            f"{type(max_steps).__name__} {max_steps!r}."
        )
    if max_steps < 1:
        raise ValueError(f"`{api}`: `max_steps` must be an int >= 1, got {max_steps}.")
    return int(max_steps)


def check_adjoint(adjoint: Any, api: str) -> diffrax.AbstractAdjoint | None:
    if adjoint is not None and not isinstance(adjoint, ADJOINTS):
        raise ValueError(
            f"`{api}`: `adjoint` must be one of "
            f"{', '.join('diffrax.' + a.__name__ + '()' for a in ADJOINTS)}, got "
            f"{type(adjoint).__name__}: the Taylor solver differentiates through its "
            "own steps."
        )
    return adjoint


def _check_gains(*gains: Any) -> tuple[float, ...]:
    """The step control's safety factor and gains as Python floats: they are
    static (diffrax's controller skips the power of a gain that is a zero
    number, and a default solve compiles to the program it always did)."""
    values = []
    for name, x in zip(("safety", "pcoeff", "icoeff", "dcoeff"), gains, strict=True):
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise TypeError(
                f"`{_API}`: `{name}` must be a Python number (it shapes the "
                f"compiled step control), got {type(x).__name__}."
            )
        if not math.isfinite(x) or x < 0:
            raise ValueError(f"`{_API}`: `{name}` must be finite and >= 0, got {x}.")
        values.append(float(x))
    safety, pcoeff, icoeff, _ = values
    if not 0 < safety <= 1:
        raise ValueError(f"`{_API}`: `safety` must be in (0, 1], got {safety}.")
    if pcoeff + icoeff <= 0:
        raise ValueError(
            f"`{_API}`: `pcoeff + icoeff` must be positive (the step size would "
            f"never follow the error), got {pcoeff} + {icoeff}."
        )
    return tuple(values)
