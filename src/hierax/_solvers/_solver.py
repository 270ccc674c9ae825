"""The Taylor method as a diffrax solver: each step sums the exact series of the
state, carried in the step's own time scale, which the term gives
(`AbstractTaylorTerm.taylor_terms`)."""

from typing import Any, ClassVar

import diffrax
import equinox as eqx
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Inexact, PyTree

from .._core import check_bool, on_backend
from ._term import AbstractTaylorTerm, UnitTimeTerm


class TaylorInterpolation(diffrax.AbstractLocalInterpolation):
    """Dense output over one step of [`hierax.TaylorSolver`][]: the step's own series,
    $y(t_0 + \\theta h) = e^{r \\theta} \\sum_j v_j \\theta^j$ for
    $0 \\le \\theta \\le 1$, as accurate anywhere in the step as at its end."""

    t0: Array
    t1: Array
    terms: Inexact[Array, "order_plus_1 n *rest"]
    rate: Array

    def evaluate(
        self, t0: ArrayLike, t1: ArrayLike | None = None, left: bool = True
    ) -> Array:
        del left
        if t1 is not None:
            return self.evaluate(t1) - self.evaluate(t0)
        span = self.t1 - self.t0
        theta = (jnp.asarray(t0) - self.t0) / jnp.where(span == 0, 1, span)
        return jnp.exp(self.rate * theta) * horner(self.terms, theta)


class TaylorSolver(diffrax.AbstractAdaptiveSolver):
    """The Taylor method of order $K$ for the Schrödinger equation: a step from $t$
    to $t + h$ sums the exact series of the state,
    $y(t + h) \\approx \\sum_{j=0}^{K} v_j$, $v_j = y^{(j)}(t)\\, h^j / j!$. The
    terms follow the recursion of [`hierax.PropagatorDerivatives`][] in the step's
    own time scale, $v_{j+1} = -\\frac{ih}{j+1} \\sum_{m \\le j} h_m v_{j-m}$ with
    $h_m$ the series of $\\tau \\mapsto H(t + h\\tau)$
    (`AbstractTimeOperator.term_series`): a few matrix products per
    order, and no power of $h$ or factorial is ever formed, so nothing overflows or
    underflows in float32.

    The error estimate is the size of the last two terms,
    $\\max(|v_{K-1}|, |v_K|)$ elementwise (Jorba and Zou's control), times the
    tail of the series they leave at the steps it takes (`truncation_estimate`),
    so a `diffrax.PIDController` with its default integral control sets the next
    step to where the truncation error meets the tolerance. Dense output
    (`SaveAt(ts=...)`, `SaveAt(dense=True)`) evaluates the step's own series, so
    saving at many times costs no extra steps and no accuracy.

    With a [`hierax.LindbladTerm`][] the state is a density matrix and the terms
    are those of its series, computed as [`hierax.DensityMatrixDerivatives`][]
    computes them, in the step's own time scale; the error estimate, dense output
    and step control are the same.

    Use it with a [`hierax.SchrodingerTerm`][] or a [`hierax.LindbladTerm`][].
    Supported adjoints are `diffrax.RecursiveCheckpointAdjoint` (the default),
    `diffrax.DirectAdjoint` and `diffrax.ForwardMode`.

    !!! example

        ```python
        term = hierax.SchrodingerTerm(hierax.Cos(1.0) * sx + sz)
        solution = diffrax.diffeqsolve(
            term, hierax.TaylorSolver(20), t0=0.0, t1=10.0, dt0=0.1, y0=psi0,
            stepsize_controller=diffrax.PIDController(rtol=1e-10, atol=1e-12),
        )
        ```

    ??? cite "Reference"

        ```bibtex
        @article{jorba2005software,
            title={A software package for the numerical integration of ODEs by means
                   of high-order Taylor methods},
            author={Jorba, {\\`A}ngel and Zou, Maorong},
            journal={Experimental Mathematics},
            volume={14},
            number={1},
            pages={99--117},
            year={2005}
        }
        ```
    """

    taylor_order: int = eqx.field(static=True)
    adjoint_steps: bool = eqx.field(static=True)
    resolve_functions: bool = eqx.field(static=True)
    # The operators' `term_norms`, which `sesolve` and `mesolve` set (computed before
    # compiling), for `generator_remainder`; without them it forms the matrices.
    generator_norms: Any = None

    # Any `AbstractTaylorTerm`: `_unwrap` checks, with a message.
    term_structure: ClassVar = diffrax.AbstractTerm
    interpolation_cls: ClassVar = TaylorInterpolation

    def __init__(
        self, order: int, adjoint_steps: bool = False, resolve_functions: bool = True
    ):
        """**Arguments:**

        - `order`: the order $K$ of the series, a Python int >= 1. It also sets the
            order of the error estimate; [`hierax.sesolve`][] uses 28 in float64 and
            16 in float32 unless told.
        - `adjoint_steps`: differentiate each step in reverse mode by the adjoint
            of its recursion (one backward loop of the forward loop's size, where
            JAX's transpose of the loop costs about four forward loops), for
            `diffrax.RecursiveCheckpointAdjoint`, which [`hierax.sesolve`][] and
            [`hierax.mesolve`][] then use. Forward mode (`jax.jvp`,
            `diffrax.ForwardMode`) through such a step is refused, so it is off
            by default.
        - `resolve_functions`: also keep each step short enough to resolve every
            time-dependent function of the equation at amplitude 1, so that a
            derivative with respect to an amplitude at or near 0 is as accurate
            as the values (at amplitude 0 the state does not move and its own
            estimate would let one step span the whole interval). On by default;
            [`hierax.sesolve`][] and [`hierax.mesolve`][] turn it off when no value
            of the equation is traced, where nothing can be differentiated.
        """
        api = "hierax.TaylorSolver"
        self.taylor_order = check_taylor_order(order, api)
        self.adjoint_steps = check_bool(adjoint_steps, "adjoint_steps", api)
        self.resolve_functions = check_bool(resolve_functions, "resolve_functions", api)
        self.generator_norms = None

    def order(self, terms: PyTree) -> int:
        del terms
        return self.taylor_order

    def error_order(self, terms: PyTree) -> int:
        del terms
        return self.taylor_order

    def init(self, terms, t0, t1, y0, args) -> None:
        del terms, t0, t1, y0, args
        return None

    @on_backend("hierax.TaylorSolver")
    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del solver_state, made_jump
        term, direction, start, span = _unwrap(terms)
        # diffrax integrates in s = direction * t (or in the unit time of a
        # `UnitTimeTerm`); the series is in physical time.
        time = start + span * (direction * t0)
        step = span * (direction * (t1 - t0))
        v, rate = term.taylor_terms(
            time, step, y0, self.taylor_order, args, self.adjoint_steps
        )
        phase = jnp.exp(rate)
        y1 = phase * jnp.sum(v, axis=0)
        y_error = truncation_estimate(v)
        # The time functions at amplitude 1, read as that share of the state: a
        # derivative with respect to an amplitude near 0 needs them resolved
        # (`_resolution`).
        share = (
            term.function_truncation(time, step, self.taylor_order, args)
            if self.resolve_functions
            else None
        )
        if share is not None:
            scale = jnp.abs(lax.stop_gradient(y0)).astype(y_error.dtype)
            y_error = jnp.maximum(y_error, share.astype(y_error.dtype) * scale)
        # What the series at `time` cannot show of the generator over the step (a
        # Gaussian pulse ahead, seen from far in its tail: `_remainder`).
        unseen = term.generator_remainder(
            time, step, self.taylor_order, args, self.generator_norms
        )
        if unseen is not None:
            moved = lax.stop_gradient(jnp.abs(step) * unseen * jnp.abs(y0))
            y_error = jnp.maximum(y_error, moved.astype(y_error.dtype))
        y_error = y_error * jnp.abs(phase)
        dense_info = dict(terms=v, rate=rate)
        return y1, y_error, dense_info, None, diffrax.RESULTS.successful

    @on_backend("hierax.TaylorSolver")
    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)


def _unwrap(
    terms: Any,
) -> tuple[AbstractTaylorTerm, Array, Array, Array]:
    """The `AbstractTaylorTerm` (a `SchrodingerTerm`, a `LindbladTerm`) inside the
    time-reversal wrapper
    diffrax puts around every term, the direction of integration, and the map
    $t = $ `start + span * s` of a `UnitTimeTerm` (0 and 1 without one)."""
    direction = jnp.ones((), int)
    start, span = jnp.zeros(()), jnp.ones(())
    while not isinstance(terms, AbstractTaylorTerm):
        if isinstance(terms, UnitTimeTerm):
            start, span, terms = terms.start, terms.span, terms.term
            continue
        # diffrax's `WrapTerm(term, direction)`; adjoint wrappers carry no direction.
        if not (hasattr(terms, "term") and hasattr(terms, "direction")):
            raise TypeError(
                "`hierax.TaylorSolver` steps a `hierax.SchrodingerTerm` or a "
                f"`hierax.LindbladTerm`, got "
                f"`{type(terms).__name__}`. Backsolve adjoints are not supported: use "
                "`diffrax.RecursiveCheckpointAdjoint()` (the default), "
                "`diffrax.DirectAdjoint()` or `diffrax.ForwardMode()`."
            )
        direction = direction * terms.direction
        terms = terms.term
    return terms, direction, start, span


def horner(terms: Array, theta: ArrayLike) -> Array:
    """$\\sum_j v_j \\theta^j$ by Horner's rule."""
    theta = jnp.asarray(theta).astype(terms.dtype)
    body = lambda total, v: (total * theta + v, None)
    total, _ = lax.scan(body, terms[-1], terms[:-1], reverse=True)
    return total


# The tail a step's last two terms leave: where the terms decay at rho per order,
# sum_{j > K} v_j is about rho^2 / (1 - rho) times max(|v_{K-1}|, |v_K|), and the
# steps the default orders take run at rho = x / K = rtol^(1/K) / e: at order 28,
# 0.22 at rtol 1e-6 (a tail of 0.06) to 0.27 at 1e-4 (0.10) and 0.31 at 1e-2
# (0.14). The last two terms alone put final errors 100-1000x below `rtol`
# (measured on five systems against DOP853); this factor, 2-50x. A constant, not
# the decay read from the terms: an estimate that moves with rho grows as h^(K+2)
# and the PID, tuned to h^K, then took an extra step after each very accurate one
# (an open Ising chain, 6 steps where 5 do) or, told K + 2, let the steps that
# resolve a drive at amplitude 0 grow (its gradient 3.9e-10 -> 1.2e-8 off at rtol
# 1e-10).
TAIL = 0.1


def truncation_estimate(terms: Array) -> Array:
    """The truncation error of the sum $\\sum_{j \\le K} v_j$, elementwise: the size
    of the last two terms, $\\max(|v_{K-1}|, |v_K|)$ (Jorba and Zou's control: two
    terms, so that a series whose odd or even terms vanish is not taken for
    converged), times the tail they leave at the steps the Taylor method takes
    (`TAIL`, from order 4 on). It steers the step size only, so it carries no
    gradient."""
    terms = lax.stop_gradient(terms)
    order = terms.shape[0] - 1
    if order == 1:
        return jnp.abs(terms[1])
    last = jnp.maximum(jnp.abs(terms[order - 1]), jnp.abs(terms[order]))
    return last * TAIL if order >= 4 else last


def default_order(dtype: Any) -> int:
    """The series order of a solve that gives none: one per precision, whatever
    the tolerance, so that `rtol` and `atol` are values of the compiled program
    and a new tolerance never recompiles (the step size follows the tolerance).

    A step costs a few matrix products per order and goes about
    $x = \\|H\\| h \\approx K (\\mathrm{rtol})^{1/K} / e$ far, so high orders pay.
    Measured (x64, 2 cores; work = order x steps against the old choice,
    $\\lceil -\\ln \\mathrm{rtol} \\rceil + 2$ at most 30, at rtol 1e-4 ... 1e-12):
    sesolve on a lab-frame transmon over 240 periods and the driven 5-site Ising
    chain -8% ... +3% (the transmon at 1e-4 in 528 steps instead of 1264: the old
    order, 12, was too low); a Lambda system with two Gaussian pulses +47% at 1e-4
    and +14% at 1e-6 (a dozen steps: the call costs more than the work), within 4%
    below; mesolve on a transmon with T1/T2 and a 4-site dephasing chain
    -3% ... -23%. At tight tolerances $x \\lesssim 4$, where the
    series' largest term, about $e^x$, costs two digits to rounding; at loose ones
    $x$ grows (8 at 1e-4) and $e^x \\varepsilon$ (1e-12) stays far below the
    tolerance. In float32, 16: the order the old rule took at 1e-6, near the
    float32 floor, where $e^x \\varepsilon$ is about `rtol` (smaller steps keep $x$
    small; a higher order would let it grow).
    """
    return 28 if float(jnp.finfo(dtype).eps) < 1e-10 else 16


def check_taylor_order(order: Any, api: str) -> int:
    if isinstance(order, bool) or not isinstance(order, int | np.integer):
        raise TypeError(
            f"`{api}`: `order` must be a Python int >= 1, got {type(order).__name__}."
        )
    if order < 1:
        raise ValueError(f"`{api}`: `order` must be >= 1, got {order}.")
    return int(order)
