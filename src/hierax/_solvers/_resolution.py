"""How well a step resolves the time functions of its equation, whatever their
amplitudes: the part of the step's error estimate that keeps derivatives with
respect to an amplitude as accurate as the values.

A step's own estimate reads the state's terms, which carry each drive's amplitude.
At an amplitude near 0 the state barely moves, the estimate is near 0 and the
controller grows the step to the end of the interval; but the derivative with
respect to that amplitude is the solve driven by the function at amplitude 1, which
such a step does not resolve. Measured before this check: the gradient of a
transition amplitude with respect to the amplitude of `a * Cos(1.3) * sx` at a = 0
over T = 20 was 5.3e9 instead of -0.59 (one step of order 28 over 26 radians), and
off by 2e-7 at T = 5 (rtol 1e-10).

So each step also reads the truncation of every time-dependent function's own
series at amplitude 1, $\\max(|f_{K-1}|, |f_K|)$ (`function_truncation`), and the
solver counts it as an error of that share of the state (`TaylorSolver`). At
amplitude 1, not relative to the series' largest term: in a Gaussian's tail the
function and what it contributes are negligible, and a relative test there took
29 steps over 20 widths at a = 0. With the orders used (K = 16 to 28) a factor
$1/a$ in an error moves the step by $a^{1/K}$ only: a drive at amplitude 0.4 is
resolved already, at 1e-3 the steps are about 1.3 times shorter.

Sampled pulses are read as they are: their series end within a segment (no
truncation). A callable (a `CallableTimeFunction`, a `CallableOperator`) has no
amplitude to set to 1, but its derivative with respect to a traced value it reads
(`lambda t: p * g(t)`, a network's weights, its `args`) is the solve driven by the
callable's derivative with respect to that value, which at p = 0 is g while the
callable is 0. So the values a callable reads that could be differentiated are
found by `equinox.filter_closure_convert` (closed-over tracers, traced fields and
`args`), and each step also reads the truncation of the callable's derivative
along one fixed direction over all of them (`CallableTangents`, `_direction`): for
`p * g`, between 0.5 g and g. Measured before: at p = 0 the gradient of a qubit's
transition amplitude under a Gaussian drive was 1.9e11 for -3.02, and 1e-3 off at
p = 1e-8 (rtol 1e-10).
"""

import math
from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jaxtyping import Array

from .._operators import CallableOperator, bind_args, function_series
from .._taylor import function_name
from .._time import (
    AbstractTimeFunction,
    CallableTimeFunction,
    TimeFunctionProduct,
    TimeFunctionSum,
    callable_series,
)


def time_dependent_functions(tree: Any, order: int) -> list[AbstractTimeFunction]:
    """The time-dependent functions of `tree` (operators, a term) whose series of
    order `order` may be truncated (they may go past order K - 2), sums and
    products taken apart into their factors, each at amplitude 1 where it has a
    linear one."""
    found: list[AbstractTimeFunction] = []

    def visit(function: AbstractTimeFunction) -> None:
        if isinstance(function, TimeFunctionSum | TimeFunctionProduct):
            for factor in function.factors:
                visit(factor)
        elif function.series_degree is None or function.series_degree > order - 2:
            # (A piecewise-constant pulse's series ends at order 0, a cubic
            # spline's at 3: their last two terms are zero, so nothing to resolve
            # and no series to compute in every step.)
            found.append(_at_unit_amplitude(function))

    is_function = lambda x: isinstance(x, AbstractTimeFunction)  # noqa: E731
    for leaf in jax.tree.leaves(tree, is_leaf=is_function):
        if is_function(leaf):
            visit(leaf)
    return found


def has_linear_amplitude(function: AbstractTimeFunction) -> bool:
    """Whether the function is its `amplitude` times the function at amplitude 1:
    a kind whose `_scaled` folds a factor into its amplitude is linear in it."""
    return (
        getattr(function, "amplitude", None) is not None
        and type(function)._scaled is not AbstractTimeFunction._scaled
    )


def _at_unit_amplitude(function: AbstractTimeFunction) -> AbstractTimeFunction:
    if not has_linear_amplitude(function):
        return function
    amplitude = cast(Any, function).amplitude  # (`has_linear_amplitude`: it has one)
    return eqx.tree_at(lambda f: f.amplitude, function, jnp.ones_like(amplitude))


class CallableTangents(eqx.Module):
    """The derivative of a callable's series (a `CallableTimeFunction`'s, a
    `CallableOperator`'s) with respect to the values it reads that could be
    differentiated: `fn` is the callable of time with every array it reads hoisted
    into `fn.consts` (`equinox.filter_closure_convert`), and `traced` marks those
    that are traced. One derivative, along a fixed direction over all of them
    (`_direction`): for `lambda t: p * g(t)`, between 0.5 g and g."""

    fn: Any
    traced: tuple[int, ...] = eqx.field(static=True)
    name: str = eqx.field(static=True)
    api: str = eqx.field(static=True)

    def series(self, t: Array, order: int, time_scale: Array) -> Array:
        """The derivative of the callable's series along `_direction`, shape
        `(order + 1, ...)`: the series of the callable's derivative (its
        program's Taylor transform: 139 us for a network pulse's, where the
        derivative of its series took 189 and the series alone 78), or, where
        that program has a step the transform cannot expand, the derivative of
        the series."""
        consts = list(self.fn.consts)
        direction = [jnp.zeros_like(c) for c in consts]
        for i in self.traced:
            direction[i] = _direction(consts[i], i)

        def with_consts(values: list[Array]) -> Any:
            return eqx.tree_at(lambda f: f.consts, self.fn, values)

        def derivative(s: Array) -> Array:
            at = lambda values: with_consts(values)(s)  # noqa: E731
            return jax.jvp(at, (consts,), (direction,))[1]

        def of(values: list[Array]) -> Array:
            fn = with_consts(values)

            def at(s: Array) -> Array:
                return fn(s)

            at.__name__ = self.name
            return callable_series(at, t, order, time_scale, self.api)

        derivative.__name__ = self.name
        try:
            return callable_series(derivative, t, order, time_scale, self.api)
        except NotImplementedError:
            return jax.jvp(of, (consts,), (direction,))[1]


def _direction(value: Array, index: int) -> Array:
    """A fixed direction for the traced array `value` (the `index`th the callable
    reads): entries of random sign and size between 0.5 and 1, over the square
    root of the array's size, so its norm is between 0.5 and 1. One derivative
    along all arrays together costs one more series per step where one per array
    cost as many (a network pulse's gradient, six arrays, with the derivative
    of the series: about 3.2 ms a call before the check, 5.5-6.5 ms with one
    derivative, 13.5 ms with one per array); the random sizes keep the parts of
    `(p - q) * g` from cancelling at p = q = 0, as equal ones would."""
    generator = np.random.default_rng(index)
    size = max(value.size, 1)
    entries = generator.uniform(0.5, 1.0, size) * generator.choice([-1.0, 1.0], size)
    return jnp.asarray(entries.reshape(value.shape) / math.sqrt(size), value.dtype)


def callable_tangents(tree: Any, t: Array) -> list[CallableTangents]:
    """A `CallableTangents` for each callable of `tree` (operators, a term) that
    reads a traced float or complex value (of `jax.grad`, `jax.jvp`, `jax.jit`,
    `jax.vmap`: in its closure, its fields or its `args`); `t` gives the time's
    type."""
    found = []
    example = jnp.zeros((), jnp.result_type(t, float))
    for leaf in jax.tree.leaves(tree, is_leaf=_is_callable):
        if not _is_callable(leaf):
            continue
        api = f"hierax.{type(leaf).__name__}"
        fn = leaf._function_of_time(api)
        converted = eqx.filter_closure_convert(fn, example)
        consts = getattr(converted, "consts", ())
        traced = tuple(
            i
            for i, c in enumerate(consts)
            if isinstance(c, Tracer) and jnp.issubdtype(c.dtype, jnp.inexact)
        )
        if traced:
            found.append(CallableTangents(converted, traced, function_name(fn), api))
    return found


def _is_callable(x: Any) -> bool:
    return isinstance(x, CallableTimeFunction | CallableOperator)


def equation_truncation(
    operators: Any, args: Any, t: Array, step: Array, order: int
) -> Array | None:
    """`function_truncation` of the time-dependent functions of `operators` (with
    the user's `args` bound), and of their callables' derivatives, over a step of
    length `step` from `t`."""
    operators = bind_args(operators, args)
    functions = time_dependent_functions(operators, order)
    tangents = callable_tangents(operators, t)
    return function_truncation(functions, t, order, jnp.abs(step), tuple(tangents))


def function_truncation(
    functions: list[AbstractTimeFunction],
    t: Array,
    order: int,
    scale: Array,
    tangents: tuple[CallableTangents, ...] = (),
) -> Array | None:
    """`_truncation`, `None` without functions or tangents (or below order 2)."""
    if not (functions or tangents) or order < 2:
        return None
    # No derivative flows in (it steers the step size only): differentiating the
    # step then leaves this part alone, where linearising it cost a gradient
    # test's compile about a quarter more.
    functions, tangents, t, scale = jax.tree.map(
        lambda x: jax.lax.stop_gradient(x) if eqx.is_array(x) else x,
        (functions, tangents, t, scale),
    )
    return _truncation(functions, tangents, t, order, scale)


@eqx.filter_jit
def _truncation(
    functions: list[AbstractTimeFunction],
    tangents: tuple[CallableTangents, ...],
    t: Array,
    order: int,
    scale: Array,
) -> Array:
    """$\\max(|f_{K-1}|, |f_K|)$ over `functions`' and `tangents`' series at `t` in
    the time scale `scale` (a step's length), K = `order`. A real scalar, with no
    gradient (it steers the step size). Behind a jit boundary: diffrax traces a
    step twice, and the second trace reuses the first's (the Rabi sweep's first
    trace under `jax.vmap` took 0.69 s without, 0.47 s with, as before the
    check)."""
    # The step's own scale, as `schrodinger_terms` forms it: the same operands, so
    # that XLA computes the functions' shared series once (a Gaussian's is a loop
    # over the orders; measured on a qubit's step: 7.7 -> 14.4 us with another).
    scale = jnp.where(scale > 0, scale, 1)
    lasts = []
    series = function_series(functions, t, order, scale) if functions else []
    series += [tangent.series(t, order, scale) for tangent in tangents]
    for s in series:
        s = jnp.abs(s).reshape(order + 1, -1)
        lasts.append(jnp.max(jnp.maximum(s[order - 1], s[order])))
    return jnp.max(jnp.stack(lasts))
