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

Functions with no amplitude (a callable, a sampled pulse) are read as they are:
sampled pulses' series end within a segment (no truncation), and a callable that
is identically zero at the point of a derivative is not seen.
"""

from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from .._operators import bind_args, function_series
from .._time import (
    AbstractTimeFunction,
    TimeFunctionProduct,
    TimeFunctionSum,
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


def equation_truncation(
    operators: Any, args: Any, t: Array, step: Array, order: int
) -> Array | None:
    """`function_truncation` of the time-dependent functions of `operators` (with
    the user's `args` bound) over a step of length `step` from `t`."""
    functions = time_dependent_functions(bind_args(operators, args), order)
    return function_truncation(functions, t, order, jnp.abs(step))


def function_truncation(
    functions: list[AbstractTimeFunction], t: Array, order: int, scale: Array
) -> Array | None:
    """`_truncation`, `None` without functions (or below order 2)."""
    if not functions or order < 2:
        return None
    # No derivative flows in (it steers the step size only): differentiating the
    # step then leaves this part alone, where linearising it cost a gradient
    # test's compile about a quarter more.
    functions, t, scale = jax.tree.map(
        lambda x: jax.lax.stop_gradient(x) if eqx.is_array(x) else x,
        (functions, t, scale),
    )
    return _truncation(functions, t, order, scale)


@eqx.filter_jit
def _truncation(
    functions: list[AbstractTimeFunction], t: Array, order: int, scale: Array
) -> Array:
    """$\\max(|f_{K-1}|, |f_K|)$ over `functions`' series at `t` in the time scale
    `scale` (a step's length), K = `order`. A real scalar, with no gradient (it
    steers the step size). Behind a jit boundary: diffrax traces a step twice,
    and the second trace reuses the first's (the Rabi sweep's first trace under
    `jax.vmap` took 0.69 s without, 0.47 s with, as before the check)."""
    # The step's own scale, as `schrodinger_terms` forms it: the same operands, so
    # that XLA computes the functions' shared series once (a Gaussian's is a loop
    # over the orders; measured on a qubit's step: 7.7 -> 14.4 us with another).
    scale = jnp.where(scale > 0, scale, 1)
    lasts = []
    for s in function_series(functions, t, order, scale):
        s = jnp.abs(s).reshape(order + 1, -1)
        lasts.append(jnp.max(jnp.maximum(s[order - 1], s[order])))
    return jnp.max(jnp.stack(lasts))
