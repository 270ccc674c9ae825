"""Scalar functions of time with closed-form Taylor series.

Every time function answers one question, [`hierax.AbstractTimeFunction.series`][]:
the normalised Taylor coefficients of $\\sigma \\mapsto f(t + s\\sigma)$ for a time
scale $s$. The public `taylor` and `__call__` validate their arguments once, in the
base, and ask `series`.
"""

import abc
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Inexact, PyTree

from .._core import (
    OrderLike,
    ScalarSeries,
    Time,
    TimeLike,
    as_numeric_array,
    as_time,
    backend_choices,
    check_order,
    check_time_finite,
    int_as_float,
    is_traced,
    module_jit,
    placed,
    run_checked,
    to_jax,
    trace_callable,
    typechecked,
)
from .._data import (
    binade,
    exp,
    power_series,
    real_dtype,
    scalar_cauchy_product,
    times_exp,
    two_product,
)
from .._taylor import function_name
from ._function_series import callable_series


def _parameter(x: Any, name: str, api: str, real: bool = False) -> Array:
    """A scalar parameter: numeric, finite where its value is known, real if asked.
    A Python int is the Python float it equals (weakly typed, as that float is):
    `Cos(4)` and `Cos(4.0)` are then one program, where an int became a strong
    float array, a different type to `jax.jit`, and compiled a solve again."""
    if isinstance(x, int) and not isinstance(x, bool):
        x = int_as_float(x, api, f"`{name}`")
    array = as_numeric_array(x, name, api, finite=True)
    if real and jnp.iscomplexobj(array):
        raise TypeError(f"`{api}`: `{name}` must be real, got dtype {array.dtype}.")
    if array.ndim != 0:
        raise ValueError(
            f"`{api}`: `{name}` must be a scalar, got shape {tuple(array.shape)}; "
            "use `jax.vmap` to batch over parameters."
        )
    return array


class AbstractTimeFunction(eqx.Module):
    """A scalar function of time $f(t)$ whose Taylor series hierax can compute.

    Subclasses implement one method, [`hierax.AbstractTimeFunction.series`][].
    Calling the object gives the value, `taylor` the series. Time functions combine
    with `+`, `-`, `*` and numbers, and a time function times a square matrix is a
    [`hierax.TimeOperator`][].

    A number in this arithmetic, a Python number or a NumPy scalar (or 0-d NumPy
    array), scales the function in the function's own precision, as a Python
    number does in JAX: its value is kept exactly and its dtype is not imposed, so
    `np.float32(0.5) * hierax.Cos(w)` is float64 under x64 (the factor is
    float32's nearest value to 0.5, widened exactly), and
    `np.float64(2) * hierax.Cos(np.float32(w))` stays float32. A NumPy scalar is
    most often a by-product (an entry of a data array, `np.sqrt(2)`), not a
    choice of precision; choose one with the parameters themselves
    (`hierax.Cos(np.float32(w), amplitude=np.float32(a))`) or with a JAX array
    factor, which promotes by JAX's rules. An int parameter is the float it
    equals: `hierax.Cos(4)` is `hierax.Cos(4.0)`, the same compiled program.

    """

    # Let numpy arrays hand `ndarray * f` to us instead of broadcasting.
    __array_ufunc__ = None

    @abc.abstractmethod
    def series(self, t: Time, order: int, time_scale: Array | None) -> Array:
        """The normalised Taylor coefficients of $\\sigma \\mapsto f(t + s\\sigma)$.

        Called with arguments already checked: `t` a finite 0-d array, `order` a
        non-negative int, `time_scale` $s$ a positive real 0-d array or `None`
        (meaning 1). Coefficient $j$ is $f^{(j)}(t)\\, s^j / j!$. Fold $s$ into the
        recurrence rather than multiplying by $s^j$ afterwards: the hierarchies
        choose $s$ so that these coefficients stay in floating-point range where
        $f^{(j)}(t) / j!$ alone would not.

        **Returns:** shape `(order + 1,)`.
        """

    @property
    @abc.abstractmethod
    def is_constant(self) -> bool:
        """Whether $f$ is constant in time (known from its structure, not values)."""

    @property
    def series_degree(self) -> int | None:
        """The highest order at which a series of $f$ can be nonzero, wherever it is
        taken (known from its structure, not values), or `None` where it may go on
        forever: 0 for a constant and a piecewise-constant pulse, $D$ for a
        polynomial of degree $D$, 3 for a cubic spline (the solvers stop at its
        knots, so each step's series is one segment's). The solvers then end their
        Cauchy products over the orders there. A subclass whose series ends
        says so here."""
        return 0 if self.is_constant else None

    @property
    def has_constant_series(self) -> bool:
        """Whether every series of $f$ vanishes above order 0, wherever it is
        taken (`series_degree` 0): a constant, and a piecewise-constant pulse,
        whose series at any time is its value there (the solvers stop at its
        edges). The kernels then apply its term as a constant over a step, its
        value times the state's latest order, with no Cauchy product over the
        orders (`TermSeries.constant`)."""
        return self.series_degree == 0

    @typechecked
    def taylor(self, t: TimeLike, order: OrderLike) -> ScalarSeries:
        """Normalised Taylor coefficients of $f$ at $t$.

        **Arguments:**

        - `t`: the time, a scalar.
        - `order`: the highest order $K$, a non-negative Python int.

        **Returns:**

        An array of shape `(order + 1,)` holding $f^{(j)}(t) / j!$ for
        $j = 0, \\ldots, K$.
        """
        api = f"hierax.{type(self).__name__}.taylor"
        order = check_order(order, api)
        t = as_time(t, api, canonical=False, in_program=True)
        return run_checked(_taylor, self, t, order=order)

    @typechecked
    def __call__(self, t: TimeLike) -> Array:
        """The value of the function.

        **Arguments:**

        - `t`: the time, a scalar.

        **Returns:**

        $f(t)$, a 0-d array.
        """
        api = f"hierax.{type(self).__name__}(...)(t)"
        t = as_time(t, api, canonical=False, in_program=True)
        return run_checked(_value, self, t)

    def __add__(self, other: Any) -> "AbstractTimeFunction":
        term = _as_time_function_or_none(other)
        if term is None:
            return _not_a_sum(self, other, "+")
        return TimeFunctionSum((self, term))

    def __radd__(self, other: Any) -> "AbstractTimeFunction":
        term = _as_time_function_or_none(other)
        if term is None:
            return _not_a_sum(self, other, "+", reflected=True)
        return TimeFunctionSum((term, self))

    def __neg__(self) -> "AbstractTimeFunction":
        return _times(Constant(-1.0), self)

    def __sub__(self, other: Any) -> "AbstractTimeFunction":
        term = _as_time_function_or_none(other)
        if term is None:
            return _not_a_sum(self, other, "-")
        return self + (-term)

    def __rsub__(self, other: Any) -> "AbstractTimeFunction":
        term = _as_time_function_or_none(other)
        if term is None:
            return _not_a_sum(self, other, "-", reflected=True)
        return (-self) + term

    def __mul__(self, other: Any) -> Any:
        factor = _as_time_function_or_none(other)
        if factor is not None:
            return _times(self, factor)
        return _times_operator(self, other)

    def __rmul__(self, other: Any) -> Any:
        factor = _as_time_function_or_none(other)
        if factor is not None:
            return _times(factor, self)
        return _times_operator(self, other)

    def _scaled(self, factor: Array) -> "AbstractTimeFunction | None":
        """$c f$ for a constant $c$ (a 0-d array) as a function of this kind (its
        amplitude times $c$), or `None` where there is none: then `c * f` is a
        `TimeFunctionProduct`."""
        return None


def _times(left: AbstractTimeFunction, right: AbstractTimeFunction) -> Any:
    """`left * right`, a constant factor folded into the other's amplitude where it
    has one (`2 * Cos(w)` is `Cos(w, amplitude=2)`): a solve computes one series
    per step where a product is two series and their product, and functions of
    one kind are summed as one vectorised series (`_operators.function_series`),
    so a drive scaled by a traced number, `a * Cos(w)`, costs what `Cos(w)` does."""
    if isinstance(right, Constant):
        folded = left._scaled(right.value)
        if folded is not None:
            return folded
    if isinstance(left, Constant):
        folded = right._scaled(left.value)
        if folded is not None:
            return folded
    return TimeFunctionProduct(left, right)


def scaled_field(function: Any, name: str, factor: Array) -> Any:
    """`function` with its array field `name` times `factor`: in NumPy where both
    are known (no eager JAX operation, which compiles a small program the first
    time), in the dtype JAX's promotion gives, weakly typed where both are."""
    value = getattr(function, name)
    if placed(value) or placed(factor):
        product = factor * value
    else:
        dtype = jnp.result_type(factor, value)
        product = np.asarray(factor).astype(dtype) * np.asarray(value).astype(dtype)
        weak = getattr(factor, "weak_type", False) and getattr(
            value, "weak_type", False
        )
        product = to_jax(product.item() if weak and product.ndim == 0 else product)
    return eqx.tree_at(lambda f: getattr(f, name), function, product)


# `f * M` for a matrix or operator M is an operator. The operators module, which comes
# after this one, registers the constructor here, so the imports point one way.
_OPERATOR_PRODUCT: list[Callable[[AbstractTimeFunction, Any], Any]] = []


# The public evaluations, compiled once per structure like the hierarchies.
# A time given as a JAX array is checked inside them (`as_time(in_program=True)`
# does not read it back from the device).
_value = module_jit(
    lambda f, t: f.series(
        check_time_finite(t, f"hierax.{type(f).__name__}(...)(t)"), 0, None
    )[0]
)
_taylor = module_jit(
    lambda f, t, order: f.series(
        check_time_finite(t, f"hierax.{type(f).__name__}.taylor"), order, None
    )
)


def register_operator_product(fn: Callable[[AbstractTimeFunction, Any], Any]) -> None:
    _OPERATOR_PRODUCT[:] = [fn]


def _times_operator(function: AbstractTimeFunction, other: Any) -> Any:
    return _OPERATOR_PRODUCT[0](function, other)


def _not_a_sum(
    function: AbstractTimeFunction, other: Any, sign: str, reflected: bool = False
) -> Any:
    """A time function plus a matrix (an array, a sparse, QuTiP or dynamiqs matrix)
    is a mistake with one usual fix, said here; anything else is left to `other`."""
    shape = getattr(other, "shape", None)
    if not isinstance(shape, tuple) or len(shape) < 1:
        return NotImplemented
    name = type(function).__name__
    api = f"... {sign} hierax.{name}" if reflected else f"hierax.{name} {sign} ..."
    raise TypeError(
        f"`{api}`: cannot {'add' if sign == '+' else 'subtract'} a scalar time "
        "function and a matrix "
        f"(got {type(other).__name__} of shape {shape}); multiply the function by "
        f"its matrix first, e.g. `hierax.{name}(...) * sigma_x {sign} sigma_z`."
    )


def _as_time_function_or_none(x: Any) -> "AbstractTimeFunction | None":
    """A number (or 0-d array) becomes a `Constant`; anything else is not a scalar."""
    if isinstance(x, AbstractTimeFunction):
        return x
    if isinstance(x, bool):
        return None
    if hasattr(x, "shape") and hasattr(x, "dtype") and x.shape == ():
        # Numbers only: a 0-d object array (`np.asarray` of a sparse matrix) is an
        # operand of another kind, which the product then names.
        if not np.issubdtype(np.dtype(x.dtype), np.number):
            return None
        if isinstance(x, np.generic | np.ndarray):
            # A NumPy scalar (`np.float64` too, a Python float's subclass) is a
            # number as a Python one is, its value weakly typed: a strong float32
            # factor made `np.float32(2) * Cos(w)` float32 under x64.
            return Constant(_numpy_number(x))
        return Constant(x)
    if isinstance(x, (int, float, complex)):
        return Constant(x)
    return None


def _numpy_number(x: np.generic | np.ndarray) -> Any:
    """A 0-d NumPy number as the Python number of its value (exact: a Python float
    and complex hold float32's and float64's values), or as itself where Python
    has none (long double)."""
    value = x.item()
    return value if isinstance(value, int | float | complex) else x


def as_time_function(x: Any, name: str, api: str) -> AbstractTimeFunction:
    """`x` as a time function (numbers become constants), or a TypeError naming it."""
    function = _as_time_function_or_none(x)
    if function is None:
        raise TypeError(
            f"`{api}`: `{name}` must be a time function (e.g. `hierax.Cos()`) or a "
            f"number, got {type(x).__name__}."
        )
    return function


class Constant(AbstractTimeFunction):
    """The constant function $f(t) = c$."""

    value: Inexact[Array, ""]

    def __init__(self, value: ArrayLike):
        """**Arguments:**

        - `value`: the constant $c$, a real or complex scalar.
        """
        self.value = _parameter(value, "value", "hierax.Constant")

    @property
    def is_constant(self) -> bool:
        return True

    def _scaled(self, factor):
        return scaled_field(self, "value", factor)

    def series(self, t, order, time_scale):
        value = jnp.asarray(self.value, jnp.result_type(self.value, t))
        # One pad, not a scatter into zeros: a program holds one of these per
        # constant term, and a scatter traces to eight operations.
        return lax.pad(value.reshape(1), jnp.zeros((), value.dtype), ((0, order, 0),))


# `Polynomial`s of up to this many coefficients sum their series in straight-line code.
_UNROLLED_WIDTH = 16


class Polynomial(AbstractTimeFunction):
    """A polynomial $f(t) = \\sum_{i=0}^{D} a_i t^i$ (coefficients in ascending
    order, as in `numpy.polynomial`)."""

    coefficients: Inexact[Array, " degree_plus_1"]

    def __init__(self, coefficients: ArrayLike):
        """**Arguments:**

        - `coefficients`: $a_0, \\ldots, a_D$, a 1-d real or complex array.
        """
        api = "hierax.Polynomial"
        array = as_numeric_array(coefficients, "coefficients", api, finite=True)
        if array.ndim != 1 or array.shape[0] == 0:
            raise ValueError(
                f"`{api}`: `coefficients` must be a non-empty 1-d array (a_0, ..., "
                f"a_D), got shape {tuple(array.shape)}."
            )
        self.coefficients = array

    @property
    def is_constant(self) -> bool:
        return self.coefficients.shape[0] == 1

    @property
    def series_degree(self) -> int:
        return self.coefficients.shape[0] - 1

    def _scaled(self, factor):
        return scaled_field(self, "coefficients", factor)

    def series(self, t, order, time_scale):
        a = self.coefficients
        dtype = jnp.result_type(a, t)
        a = a.astype(dtype)
        s = jnp.ones((), dtype) if time_scale is None else time_scale.astype(dtype)
        width = a.shape[0]

        # Horner's rule on series: q <- q * (t + s sigma) + a_i, from a_D down. No
        # power of t or s is formed, so nothing overflows before the result does,
        # and every coefficient keeps its derivative (no mask at exact zeros).
        first = np.arange(width) == 0

        def step(q, a_i):
            shifted = jnp.concatenate([jnp.zeros((1,), dtype), q[:-1]])
            return t * q + s * shifted + jnp.where(first, a_i, 0), None

        # Unrolled for the usual low degrees: a loop is a program of its own, with
        # its own kernels to compile, in every step and in the first step's bound.
        unroll = width <= _UNROLLED_WIDTH
        q, _ = lax.scan(step, jnp.zeros((width,), dtype), a[::-1], unroll=unroll)
        if order < width:
            return q[: order + 1]
        return jnp.concatenate([q, jnp.zeros((order + 1 - width,), dtype)])


def _phase(rate: Array, t: Time, phase: Array | None) -> tuple[Array, Array]:
    """`(cos x, sin x)` for $x = \\text{rate}\\cdot t + \\text{phase}$, accurate at
    large $t$: the product is split into its rounded value and its exact rounding
    error (Dekker), and the phase is added by the angle-addition formulas, so the
    angle is never rounded to working precision as one sum."""
    if jnp.iscomplexobj(t):  # holomorphic use: no splitting for complex times
        x = rate * t + (0 if phase is None else phase)
        return jnp.cos(x), jnp.sin(x)
    p, error = two_product(rate, jnp.asarray(t))
    small = error if phase is None else error + phase
    cos_p, sin_p, cos_e, sin_e = jnp.cos(p), jnp.sin(p), jnp.cos(small), jnp.sin(small)
    return cos_p * cos_e - sin_p * sin_e, sin_p * cos_e + cos_p * sin_e


def _sinusoid(function: "Cos | Sin", t, order, time_scale, quarter_turns: int):
    """$A\\, (\\omega s)^j / j!\\, \\cos(\\omega t + \\varphi + (j + q)\\pi/2)$, the
    rotation by quarter turns taken exactly from the cycle (c, -s, -c, s)."""
    dtype = jnp.result_type(function.amplitude, function.frequency, function.phase, t)
    cos_x, sin_x = _phase(function.frequency, t, function.phase)
    # The cycle as c * (1, 0, -1, 0) + s * (0, -1, 0, 1): exact (each product is
    # by 0 or +-1), and elementwise, where indexing the stacked cycle is a gather
    # (a kernel of its own to compile).
    turns = (np.arange(order + 1) + quarter_turns) % 4
    on_cos = np.array([1.0, 0.0, -1.0, 0.0])[turns]
    on_sin = np.array([0.0, -1.0, 0.0, 1.0])[turns]
    cycle = cos_x * on_cos.astype(cos_x.dtype) + sin_x * on_sin.astype(sin_x.dtype)
    rate = function.frequency if time_scale is None else function.frequency * time_scale
    series = function.amplitude * power_series(rate, order) * cycle
    return series.astype(dtype)


class Cos(AbstractTimeFunction):
    """$f(t) = A \\cos(\\omega t + \\varphi)$."""

    frequency: Inexact[Array, ""]
    phase: Inexact[Array, ""]
    amplitude: Inexact[Array, ""]

    def __init__(
        self,
        frequency: ArrayLike = 1.0,
        phase: ArrayLike = 0.0,
        amplitude: ArrayLike = 1.0,
    ):
        """**Arguments:**

        - `frequency`: the angular frequency $\\omega$ (real).
        - `phase`: the phase $\\varphi$ (real).
        - `amplitude`: the amplitude $A$ (real or complex).
        """
        api = "hierax.Cos"
        self.frequency = _parameter(frequency, "frequency", api, real=True)
        self.phase = _parameter(phase, "phase", api, real=True)
        self.amplitude = _parameter(amplitude, "amplitude", api)

    @property
    def is_constant(self) -> bool:
        return False

    def _scaled(self, factor):
        return scaled_field(self, "amplitude", factor)

    def series(self, t, order, time_scale):
        return _sinusoid(self, t, order, time_scale, 0)


class Sin(AbstractTimeFunction):
    """$f(t) = A \\sin(\\omega t + \\varphi)$."""

    frequency: Inexact[Array, ""]
    phase: Inexact[Array, ""]
    amplitude: Inexact[Array, ""]

    def __init__(
        self,
        frequency: ArrayLike = 1.0,
        phase: ArrayLike = 0.0,
        amplitude: ArrayLike = 1.0,
    ):
        """**Arguments:**

        - `frequency`: the angular frequency $\\omega$ (real).
        - `phase`: the phase $\\varphi$ (real).
        - `amplitude`: the amplitude $A$ (real or complex).
        """
        api = "hierax.Sin"
        self.frequency = _parameter(frequency, "frequency", api, real=True)
        self.phase = _parameter(phase, "phase", api, real=True)
        self.amplitude = _parameter(amplitude, "amplitude", api)

    @property
    def is_constant(self) -> bool:
        return False

    def _scaled(self, factor):
        return scaled_field(self, "amplitude", factor)

    def series(self, t, order, time_scale):
        # sin(x) = cos(x - pi/2): three quarter turns ahead.
        return _sinusoid(self, t, order, time_scale, 3)


class Exp(AbstractTimeFunction):
    """$f(t) = A e^{\\lambda t}$, with a real or complex rate $\\lambda$."""

    rate: Inexact[Array, ""]
    amplitude: Inexact[Array, ""]

    def __init__(self, rate: ArrayLike, amplitude: ArrayLike = 1.0):
        """**Arguments:**

        - `rate`: $\\lambda$, real or complex (e.g. `-1j * omega` for a phase factor).
        - `amplitude`: $A$, real or complex.
        """
        api = "hierax.Exp"
        self.rate = _parameter(rate, "rate", api)
        self.amplitude = _parameter(amplitude, "amplitude", api)

    @property
    def is_constant(self) -> bool:
        return False

    def _scaled(self, factor):
        return scaled_field(self, "amplitude", factor)

    def series(self, t, order, time_scale):
        dtype = jnp.result_type(self.rate, self.amplitude, t, 1.0)
        rate = self.rate if time_scale is None else self.rate * time_scale
        if jnp.iscomplexobj(t):  # holomorphic use
            value = exp(self.rate * t)
            return (self.amplitude * value * power_series(rate, order)).astype(dtype)
        # The growth e^{a t}, a = Re(rate), applied last as a real factor
        # (`times_exp`), to a real rate's series too: e^{a t} alone overflows or
        # underflows where A e^{a t} (a t)^j / j! need not (it read inf for
        # 1e-30 e^{100 t} in float32, 0 for 1e300 e^{-800 t}), and its inf times a
        # complex amplitude or phase was inf - inf = nan.
        series = self.amplitude * power_series(rate, order)
        if jnp.iscomplexobj(self.rate):
            # The phase e^{i b t} kept exact at large t.
            cos_x, sin_x = _phase(self.rate.imag, t, None)
            series = series * lax.complex(cos_x, sin_x)
        return times_exp(series.astype(dtype), self.rate.real * t)


class Gaussian(AbstractTimeFunction):
    """$f(t) = A \\exp\\!\\big(-(t - \\mu)^2 / (2 w^2)\\big)$.

    The series uses the probabilists' Hermite recurrence
    $\\mathrm{He}_{j+1}(x) = x\\,\\mathrm{He}_j(x) - j\\,\\mathrm{He}_{j-1}(x)$ with
    $x = (t - \\mu)/w$ and the factor $(-1)^j s^j / (w^j j!)$ folded into each step.
    The recurrence is renormalised as it runs and the Gaussian factor is applied in
    log space at the end, so far tails and high orders give finite values or
    honest zeros and infinities, never nan.
    """

    mean: Inexact[Array, ""]
    width: Inexact[Array, ""]
    amplitude: Inexact[Array, ""]

    def __init__(
        self, mean: ArrayLike = 0.0, width: ArrayLike = 1.0, amplitude: ArrayLike = 1.0
    ):
        """**Arguments:**

        - `mean`: the centre $\\mu$ (real).
        - `width`: the standard deviation $w$ (real, non-zero).
        - `amplitude`: $A$, real or complex.
        """
        api = "hierax.Gaussian"
        self.mean = _parameter(mean, "mean", api, real=True)
        self.width = _parameter(width, "width", api, real=True)
        self.amplitude = _parameter(amplitude, "amplitude", api)
        if not is_traced(self.width) and float(self.width) == 0:
            raise ValueError(f"`{api}`: `width` must be non-zero, got 0.")

    @property
    def is_constant(self) -> bool:
        return False

    def _scaled(self, factor):
        return scaled_field(self, "amplitude", factor)

    def series(self, t, order, time_scale):
        dtype = jnp.result_type(self.mean, self.width, t, 1.0)
        x = (t - self.mean) / self.width
        step_scale = (1 if time_scale is None else time_scale) / self.width
        m, exponents = _hermite_terms(
            x.astype(dtype),
            jnp.asarray(step_scale, dtype),
            order,
            backend_choices().unroll_scalar_series,
        )
        # (ln 2 as a Python number: rounded once, not by the backend's `log`.)
        log_factor = exponents * math.log(2.0) - x**2 / 2
        if jnp.iscomplexobj(log_factor):  # complex t: exp(-x^2/2) has a phase
            m = m * jnp.exp(1j * jnp.imag(log_factor))
            log_factor = jnp.real(log_factor)
        return self.amplitude * times_exp(m, log_factor)


# Its own program (inlined by XLA): a solve traces a Gaussian's series several
# times with the same shapes (each step's series, the first step's bound, the
# lockstep's second trace), and JAX traces the loop once for all of them.
@functools.partial(jax.jit, static_argnames=("order", "unroll"))
def _hermite_terms(
    x: Array, step_scale: Array, order: int, unroll: bool = False
) -> tuple[Array, Array]:
    """`(m, e)` with $g_j = m_j 2^{e_j}$, j = 0 ... `order`: the Taylor
    coefficients of $e^{x^2/2} e^{-(x + c\\tau)^2/2}$ in $\\tau$, c = `step_scale`.

    g_j = (-1)^j He_j(x) c^j / j! obeys g_{j+1} = -(x g_j c + g_{j-1} c^2) / (j + 1).
    With two exact powers of two read once from the bits (`binade`), s <= max(1,
    |x|) < 2s and c = c' 2^k with |c'| in [1, 2), m_j = g_j / (s 2^k)^j obeys
    m_{j+1} = -((x/s) c' m_j + c'^2 m_{j-1} / s^2) / (j + 1): |x/s| < 2 and
    |He_j(x)| / s^j grows no faster than 2^j sqrt(j!). Carried scaled by fixed
    powers of two (below), and e_j = j (k + log2 s) + n_j, all exact. (A rescale
    by a power of two read from the values at every order, built from `log2`,
    was 137 instructions of a qubit's solve program against 108: each operation
    in the loop is a step of XLA's CPU runtime.) The scales carry no gradient:
    they cancel in g = m 2^e. `unroll`: the recurrence as straight-line code
    (`BackendChoices.unroll_scalar_series`)."""
    dtype, rdtype = x.dtype, real_dtype(x.dtype)
    one = jnp.ones((), dtype)
    if order == 0:  # (the value alone, as the first step's bound takes it)
        return one[None], jnp.zeros((1,), rdtype)
    s, log_s = binade(jnp.maximum(jnp.abs(x), 1.0).astype(rdtype))
    magnitude = jnp.abs(step_scale).astype(rdtype)
    normal = magnitude >= np.finfo(rdtype).tiny  # (a subnormal c: c^j vanishes)
    power, k = binade(jnp.where(normal, magnitude, 1.0))
    ratio = x / s.astype(dtype)
    c = step_scale / power.astype(step_scale.dtype)
    inverse_square = (1 / (s * s)).astype(dtype)
    a, b = -ratio * c, -(c * c) * inverse_square

    # The recurrence carries m'_j = m_j / 2^{n_j} (`_hermite_shifts`): m_j falls
    # like 1/j! far in the tails and like 1/sqrt(j!) near the centre, and
    # underflowed where the coefficients are well in range (float32 from order 31
    # at x = 8, float64 from 173); scaled, it stays in float32's range to order 62
    # and float64's to 400 at any x. The powers of two are exact and folded into
    # the recurrence's constants (no operation added to its loop, whose every
    # operation is a step of XLA's CPU runtime) and into the exponents.
    n = _hermite_shifts(order)
    j = np.arange(order)
    inverse = 1.0 / (j + 1)
    current = (np.exp2(n[1:-1] - n[2:]) * inverse).astype(rdtype)  # n_j - n_{j+1}
    previous = (np.exp2(n[:-2] - n[2:]) * inverse).astype(rdtype)  # n_{j-1} - ...

    def step(carry, xs):
        m_prev, m = carry
        u, w = xs
        m_next = a * m * u + b * m_prev * w
        return (m, m_next), m_next

    _, rest = lax.scan(
        step, (jnp.zeros((), dtype), one), (current, previous), unroll=unroll
    )
    exponents = jnp.asarray(np.arange(order + 1, dtype=rdtype)) * (k + log_s)
    exponents = exponents + jnp.asarray(n[1:].astype(rdtype))
    return jnp.concatenate([one[None], rest]), exponents.astype(rdtype)


def _hermite_shifts(order: int) -> np.ndarray:
    """n_{-1}, n_0, ..., n_K (n_{-1} = n_0 = 0): the scale `_hermite_terms`
    carries its terms in, the integers nearest 0.404 j - 0.764 log2(j!). A fit
    (to 13 in log2) of the middle of log2 max(|m_j|, |m_{j-1}|) over x in [0, 40]
    and c' in [1, 2), whose spread is 139 at j = 40 and 216 at 60: float32's 252
    holds it to order 62, float64's to 400 (computed with an exact renormalising
    recurrence in float64)."""
    j = np.arange(order + 1)
    log2_factorial = np.array([math.lgamma(i + 1) for i in j]) / math.log(2)
    return np.concatenate([[0.0], np.round(0.404 * j - 0.764 * log2_factorial)])


def largest_degree(degrees: Sequence[int | None]) -> int | None:
    """The `series_degree` of a sum of series of these degrees: the largest, `None`
    where one is unknown."""
    known = [d for d in degrees if d is not None]
    return max(known) if len(known) == len(degrees) else None


def product_degree(left: int | None, right: int | None) -> int | None:
    """The `series_degree` of the Cauchy product of two series: the sum of theirs,
    `None` where one is unknown."""
    return None if left is None or right is None else left + right


class TimeFunctionSum(AbstractTimeFunction):
    """The sum $f(t) = \\sum_i f_i(t)$ of time functions (what `f + g` builds)."""

    terms: tuple[AbstractTimeFunction, ...]

    def __init__(self, terms):
        """**Arguments:**

        - `terms`: a sequence of [`hierax.AbstractTimeFunction`][]s.
        """
        flat = []
        for i, term in enumerate(terms):
            if isinstance(term, TimeFunctionSum):
                flat.extend(term.terms)
            elif isinstance(term, AbstractTimeFunction):
                flat.append(term)
            else:
                raise TypeError(
                    f"`hierax.TimeFunctionSum`: `terms[{i}]` must be a time "
                    f"function, got {type(term).__name__}."
                )
        self.terms = tuple(flat)

    @property
    def is_constant(self) -> bool:
        return all(term.is_constant for term in self.terms)

    @property
    def series_degree(self) -> int | None:
        return largest_degree([term.series_degree for term in self.terms])

    def _scaled(self, factor):
        terms = [term._scaled(factor) for term in self.terms]
        if any(term is None for term in terms):
            return None
        return TimeFunctionSum(terms)

    def series(self, t, order, time_scale):
        return self.combine([term.series(t, order, time_scale) for term in self.terms])

    @property
    def factors(self) -> tuple[AbstractTimeFunction, ...]:
        """The functions whose series `combine` takes (see
        `_operators.function_series`)."""
        return self.terms

    def combine(self, parts: list[Array]) -> Array:
        """The series of the sum from those of its terms."""
        dtype = jnp.result_type(*parts)
        zero = jnp.zeros(parts[0].shape, dtype)
        return sum((p.astype(dtype) for p in parts), zero)


class TimeFunctionProduct(AbstractTimeFunction):
    """The product $f(t) = g(t)\\,h(t)$ of two time functions (what `g * h` builds;
    a number times a function with an amplitude, values or coefficients is instead
    that function with them scaled); its series is the Cauchy product of theirs.

    """

    left: AbstractTimeFunction
    right: AbstractTimeFunction

    def __init__(self, left: Any, right: Any):
        """**Arguments:**

        - `left`, `right`: the two factors (time functions or numbers).
        """
        api = "hierax.TimeFunctionProduct"
        self.left = as_time_function(left, "left", api)
        self.right = as_time_function(right, "right", api)

    @property
    def is_constant(self) -> bool:
        return self.left.is_constant and self.right.is_constant

    @property
    def series_degree(self) -> int | None:
        return product_degree(self.left.series_degree, self.right.series_degree)

    def _scaled(self, factor):
        left = self.left._scaled(factor)
        if left is not None:
            return TimeFunctionProduct(left, self.right)
        right = self.right._scaled(factor)
        return None if right is None else TimeFunctionProduct(self.left, right)

    def series(self, t, order, time_scale):
        return self.combine(
            [
                self.left.series(t, order, time_scale),
                self.right.series(t, order, time_scale),
            ]
        )

    @property
    def factors(self) -> tuple[AbstractTimeFunction, ...]:
        """The functions whose series `combine` takes (see
        `_operators.function_series`)."""
        return (self.left, self.right)

    def combine(self, parts: list[Array]) -> Array:
        """The series of the product from those of its two factors."""
        a, b = parts
        if isinstance(self.left, Constant):
            return a[0] * b
        if isinstance(self.right, Constant):
            return a * b[0]
        dtype = jnp.result_type(a, b)
        return scalar_cauchy_product(a.astype(dtype), b.astype(dtype))


class CallableTimeFunction(AbstractTimeFunction):
    """Any JAX-traceable scalar function of time, $t \\mapsto f(t)$: a hand-written
    envelope, or an Equinox module such as a small neural network, whose parameters
    are then trained with the rest of a model. Its series is exact, computed by
    [`hierax.taylor`][]'s transform.

    A function built with `takes_args=True` is called as `fn(t, args)`, as a
    diffrax vector field is: `args` is a field of this object (dynamic, so a new
    value never retraces), and [`hierax.SchrodingerTerm`][] and
    [`hierax.LindbladTerm`][] replace it with the `args` given to
    `diffrax.diffeqsolve`. The series is in $t$ alone: `args` are held fixed.
    Float and complex numbers in `args` are held as JAX arrays; ints and other
    objects are static (a new one compiles again).

    `fn` is traced once per structure and its compiled program is kept by the
    identity of `fn`: a value it reads from outside (a global, a closed-over
    variable, a NumPy array changed in place) is frozen into that program, and a
    new value there is not seen, as with `jax.jit`. Give what changes as `args`
    (or as a traced value of the enclosing `jax.jit`).

    """

    fn: Callable[..., Array]
    args: PyTree
    takes_args: bool = eqx.field(static=True)

    def __init__(
        self,
        fn: Callable[..., Array],
        *,
        takes_args: bool = False,
        args: PyTree = None,
    ):
        """**Arguments:**

        - `fn`: a callable taking a scalar time array (and `args`, with
            `takes_args=True`) and returning a float or complex scalar (a 0-d
            array, or a 1-element array).
        - `takes_args`: whether `fn` is called as `fn(t, args)` rather than `fn(t)`.
        - `args`: with `takes_args=True`, the `args` passed to `fn`: an example
            pytree, required, with which `fn` is checked here and which a direct
            call (`f(t)`, `f.taylor(t, K)`) uses; a diffrax solve of a hierax term
            passes its own `args` instead. `None` (and refused) otherwise.
        """
        api = "hierax.CallableTimeFunction"
        self.takes_args = check_takes_args(takes_args, args, api)
        self.fn = fn
        self.args = held_args(args)
        out = trace_callable(self._function_of_time(api), "fn", api)
        if not isinstance(out, jax.ShapeDtypeStruct) or out.shape not in ((), (1,)):
            raise ValueError(
                f"`{api}`: `fn` must return a scalar, got "
                f"{getattr(out, 'shape', type(out).__name__)}."
            )
        if not jnp.issubdtype(out.dtype, jnp.inexact) or out.dtype in (
            jnp.float16,
            jnp.bfloat16,
        ):
            raise TypeError(
                f"`{api}`: `fn` must return float32/64 or complex64/128, got "
                f"{out.dtype}."
            )

    @property
    def is_constant(self) -> bool:
        return False

    def with_args(self, args: PyTree) -> "CallableTimeFunction":
        """The function with `args` in place of its own (for `takes_args=True`).

        **Arguments:**

        - `args`: the pytree passed to `fn` as its second argument.

        **Returns:** a new `hierax.CallableTimeFunction`.
        """
        api = "hierax.CallableTimeFunction.with_args"
        if not self.takes_args:
            raise TypeError(
                f"`{api}`: this function's `fn` takes no `args` (built with "
                "`takes_args=False`)."
            )
        return eqx.tree_at(
            lambda f: f.args, self, held_args(args), is_leaf=lambda x: x is None
        )

    def _function_of_time(self, api: str) -> Callable[[Array], Array]:
        """`fn` as a function of time alone, with `args` bound where it takes them."""
        return bound_args(self.fn, self.takes_args, self.args, api)

    def series(self, t, order, time_scale):
        api = "hierax.CallableTimeFunction"
        fn = self._function_of_time(api)
        out = callable_series(fn, t, order, time_scale, api)
        return out.reshape(order + 1)


def held_args(args: PyTree) -> PyTree:
    """`args` with its float and complex numbers (Python or NumPy) as JAX arrays:
    dynamic fields, so that a new value compiles nothing (a Python float in a
    module's field is static, and each new one compiled the solve again). Ints,
    bools and other objects stay as they are (they may size arrays or steer
    Python control flow): a new one compiles again."""

    def held(x: Any) -> Any:
        if isinstance(x, float | complex):  # (a bool is an int, not a float)
            return to_jax(x)
        if isinstance(x, np.ndarray | np.generic) and np.issubdtype(
            x.dtype, np.inexact
        ):
            return to_jax(x)
        return x

    return jax.tree.map(held, args)


def check_takes_args(takes_args: Any, args: PyTree, api: str) -> bool:
    """`takes_args` checked to be a bool, with the example `args` a callable that
    takes them needs (and none for one that does not)."""
    if not isinstance(takes_args, bool):
        raise TypeError(
            f"`{api}(takes_args=...)` must be a bool, got {type(takes_args).__name__}."
        )
    if takes_args and args is None:
        raise ValueError(
            f"`{api}(takes_args=True)` needs an example `args=` (the pytree "
            "`fn(t, args)` reads, such as `{'w': 1.0}`): `fn` is checked with it, "
            "and a direct call uses it; a diffrax solve of a hierax term passes "
            "its own `args` in its place."
        )
    if not takes_args and args is not None:
        raise ValueError(
            f"`{api}`: `args=` is only read by a `fn` built with `takes_args=True` "
            "(called as `fn(t, args)`)."
        )
    return takes_args


def bound_args(
    fn: Callable[..., Array], takes_args: bool, args: PyTree, api: str
) -> Callable[[Array], Array]:
    """`fn` as a function of time alone: `t -> fn(t, args)` where it takes `args`
    (named as `fn`, for the Taylor transform's messages), `fn` itself otherwise."""
    if not takes_args:
        return fn
    if args is None:
        raise ValueError(
            f"`{api}`: `fn` takes `args` (`takes_args=True`) but none are set; set "
            "them with `.with_args(args)`, or pass `args=` to `diffrax.diffeqsolve` "
            "with a `hierax.SchrodingerTerm` or `hierax.LindbladTerm`."
        )

    def bound(t: Any) -> Any:
        return fn(t, args)

    bound.__name__ = function_name(fn)
    return bound
