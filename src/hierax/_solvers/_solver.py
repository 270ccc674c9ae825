"""The Taylor method as a diffrax solver: each step sums the exact series of the
state, from [`hierax.PropagatorDerivatives`][]."""

import math
from typing import Any, ClassVar

import diffrax
import equinox as eqx
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Inexact, PyTree

from .._hierarchies import PropagatorDerivatives
from ._term import SchrodingerTerm


class TaylorInterpolation(diffrax.AbstractLocalInterpolation):
    """Dense output over one step of [`hierax.TaylorSolver`][]: the step's own series,
    $y(t_0 + s) = e^{r s} \\sum_j a_j s^j$, as accurate anywhere in the step as at
    its end."""

    t0: Array
    t1: Array
    coefficients: Inexact[Array, "order_plus_1 n *rest"]
    rate: Array

    def evaluate(
        self, t0: ArrayLike, t1: ArrayLike | None = None, left: bool = True
    ) -> Array:
        del left
        if t1 is not None:
            return self.evaluate(t1) - self.evaluate(t0)
        s = jnp.asarray(t0) - self.t0
        return jnp.exp(self.rate * s) * horner(self.coefficients, s)


class TaylorSolver(diffrax.AbstractAdaptiveSolver):
    """The Taylor method of order $K$ for the Schrödinger equation: a step from $t$
    to $t + h$ sums the exact normalised series of the state,
    $y(t + h) \\approx \\sum_{j=0}^{K} y_j h^j$, $y_j = y^{(j)}(t)/j!$, which
    [`hierax.PropagatorDerivatives`][] computes from $y(t)$ with a few matrix
    products per order.

    The error estimate is the size of the last two terms,
    $\\max(|y_{K-1}| h^{K-1}, |y_K| h^K)$ elementwise (Jorba and Zou's control), so
    a `diffrax.PIDController` with its default integral control sets the next step
    to where those terms meet the tolerance. Dense output (`SaveAt(ts=...)`,
    `SaveAt(dense=True)`) evaluates the step's own series, so saving at many times
    costs no extra steps and no accuracy.

    Use it with a [`hierax.SchrodingerTerm`][]. Supported adjoints are
    `diffrax.RecursiveCheckpointAdjoint` (the default), `diffrax.DirectAdjoint` and
    `diffrax.ForwardMode`.

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

    term_structure: ClassVar = SchrodingerTerm
    interpolation_cls: ClassVar = TaylorInterpolation

    def __init__(self, order: int):
        """**Arguments:**

        - `order`: the order $K$ of the series, a Python int >= 1. It also sets the
            order of the error estimate; [`hierax.sesolve`][] chooses it from the
            tolerance.
        """
        self.taylor_order = check_taylor_order(order, "hierax.TaylorSolver")

    def order(self, terms: PyTree) -> int:
        del terms
        return self.taylor_order

    def error_order(self, terms: PyTree) -> int:
        del terms
        return self.taylor_order

    def init(self, terms, t0, t1, y0, args) -> None:
        del terms, t0, t1, y0, args
        return None

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del args, solver_state, made_jump
        term, direction = _unwrap(terms)
        # diffrax integrates in s = direction * t; the series is in physical time.
        series = PropagatorDerivatives(term.hamiltonian, self.taylor_order).normalised(
            direction * t0, y0
        )
        # The state's dtype is the solve's precision (diffrax carries it unchanged).
        dtype = jnp.result_type(y0, 1j)
        signs = jnp.where(jnp.arange(self.taylor_order + 1) % 2 == 0, 1, direction)
        coefficients = series.astype(dtype) * signs.reshape(
            (-1,) + (1,) * y0.ndim
        ).astype(dtype)
        rate = (-1j * direction * term.energy_shift).astype(dtype)
        h = t1 - t0
        y1 = jnp.exp(rate * h) * horner(coefficients, h)
        y_error = truncation_estimate(coefficients, h) * jnp.abs(jnp.exp(rate * h))
        dense_info = dict(coefficients=coefficients, rate=rate)
        return y1, y_error, dense_info, None, diffrax.RESULTS.successful

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)


def _unwrap(terms: Any) -> tuple[SchrodingerTerm, Array]:
    """The `SchrodingerTerm` inside the time-reversal wrapper diffrax puts around
    every term, and the direction of integration."""
    direction = jnp.ones((), int)
    while not isinstance(terms, SchrodingerTerm):
        # diffrax's `WrapTerm(term, direction)`; adjoint wrappers carry no direction.
        if not (hasattr(terms, "term") and hasattr(terms, "direction")):
            raise TypeError(
                "`hierax.TaylorSolver` steps a `hierax.SchrodingerTerm`, got "
                f"`{type(terms).__name__}`. Backsolve adjoints are not supported: use "
                "`diffrax.RecursiveCheckpointAdjoint()` (the default), "
                "`diffrax.DirectAdjoint()` or `diffrax.ForwardMode()`."
            )
        direction = direction * terms.direction
        terms = terms.term
    return terms, direction


def horner(coefficients: Array, s: ArrayLike) -> Array:
    """$\\sum_j a_j s^j$ by Horner's rule (no power $s^j$ is formed, so nothing
    overflows for long steps in float32)."""
    s = jnp.asarray(s).astype(coefficients.dtype)
    body = lambda total, a: (total * s + a, None)
    total, _ = lax.scan(body, coefficients[-1], coefficients[:-1], reverse=True)
    return total


def truncation_estimate(coefficients: Array, h: ArrayLike) -> Array:
    """$\\max(|a_{K-1}|\\,|h|^{K-1}, |a_K|\\,|h|^K)$ elementwise (the last term alone
    for K = 1), formed in logarithms so that no power of h overflows. It steers the
    step size only, so it carries no gradient."""
    coefficients = lax.stop_gradient(coefficients)
    log_h = jnp.log(jnp.abs(lax.stop_gradient(jnp.asarray(h))))
    order = coefficients.shape[0] - 1

    def term(j):
        size = jnp.abs(coefficients[j])
        # log(0) = -inf gives exp(-inf) = 0: a vanishing coefficient is no error.
        return jnp.exp(jnp.log(size) + j * log_h.astype(size.dtype))

    if order == 1:
        return term(1)
    return jnp.maximum(term(order - 1), term(order))


def order_for_tolerance(tolerance: float, dtype: Any) -> int:
    """The series order for a local tolerance.

    Jorba and Zou's optimum, $K \\approx -\\tfrac12 \\ln \\varepsilon + 1$, assumes
    an O(K^2) cost per step; here a step costs a few matrix products per order, so
    a step of order K goes about K / (e^2 ||H||) far and higher orders pay: we take
    about twice theirs. The cap keeps $x = \\|H\\| h$ below about 4, where the
    largest term of the series, about $e^x$, costs no more than two digits to
    rounding (30 in float64, 18 in float32).
    """
    eps = float(jnp.finfo(dtype).eps)
    cap = 30 if eps < 1e-10 else 18
    tolerance = max(float(tolerance), eps)
    return min(cap, max(4, math.ceil(-math.log(tolerance) + 2)))


def check_taylor_order(order: Any, api: str) -> int:
    if isinstance(order, bool) or not isinstance(order, int | np.integer):
        raise TypeError(
            f"`{api}`: `order` must be a Python int >= 1, got {type(order).__name__}."
        )
    if order < 1:
        raise ValueError(f"`{api}`: `order` must be >= 1, got {order}.")
    return int(order)
