"""Scalar time functions with closed-form Taylor series."""

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Inexact

from ._custom_types import OrderLike, ScalarSeries, TimeLike, typechecked
from ._function_series import function_series
from ._series import power_series, real_dtype, scalar_cauchy_product, times_powers
from ._validation import as_numeric_array, check_order, trace_callable


def _parameter(x: Any, name: str, api: str, real: bool = False) -> Array:
    array = as_numeric_array(x, name, api)
    if real and jnp.iscomplexobj(array):
        raise TypeError(f"`{api}`: `{name}` must be real, got dtype {array.dtype}.")
    if array.ndim != 0:
        raise ValueError(
            f"`{api}`: `{name}` must be a scalar, got shape {tuple(array.shape)}; "
            "use `jax.vmap` to batch over parameters."
        )
    return array


def _time(t: Any) -> Array:
    return jnp.asarray(t)


class AbstractCoefficient(eqx.Module):
    """A scalar function of time $f(t)$ whose Taylor series is known in closed form.

    Subclasses provide [`hierax.AbstractCoefficient.taylor`][]; calling the object
    gives the value. Coefficients combine with `+`, `-`, `*` and numbers, and a
    coefficient times a square matrix is a [`hierax.TimeOperator`][].
    """

    # Let numpy arrays hand `ndarray * coefficient` to us instead of broadcasting.
    __array_ufunc__ = None

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
        return self.scaled_taylor(t, order, None)

    def scaled_taylor(self, t: TimeLike, order: OrderLike, scale) -> ScalarSeries:
        """The series of $s \\mapsto f(t + \\text{scale}\\cdot s)$: coefficient j is
        $f^{(j)}(t)\\,\\text{scale}^j / j!$ (`scale=None` means 1).

        The hierarchies use it to keep very high orders within floating-point
        range (their `time_scale`). A subclass implements this method, or only
        `taylor`: the closed forms fold the scale into their recurrences, and this
        default multiplies afterwards.
        """
        if type(self).taylor is AbstractCoefficient.taylor:
            raise NotImplementedError(
                f"`{type(self).__name__}` must implement `taylor` or `scaled_taylor`."
            )
        return times_powers(self.taylor(t, order), scale)

    @property
    @abc.abstractmethod
    def is_constant(self) -> bool:
        """Whether $f$ is constant in time (known from its structure, not values)."""

    def __call__(self, t: TimeLike) -> Array:
        """The value of the function.

        **Arguments:**

        - `t`: the time, a scalar.

        **Returns:**

        $f(t)$, a 0-d array.
        """
        return self.taylor(t, 0)[0]

    def __add__(self, other):
        other = _as_coefficient_or_none(other)
        if other is None:
            return _operator_fallback(self, "__add__", other)
        return CoefficientSum((self, other))

    def __radd__(self, other):
        other = _as_coefficient_or_none(other)
        if other is None:
            return NotImplemented
        return CoefficientSum((other, self))

    def __neg__(self):
        return CoefficientProduct(Constant(-1.0), self)

    def __sub__(self, other):
        return self + (-other)

    def __rsub__(self, other):
        return (-self) + other

    def __mul__(self, other):
        coefficient = _as_coefficient_or_none(other)
        if coefficient is not None:
            return CoefficientProduct(self, coefficient)
        return _times_operator(self, other)

    def __rmul__(self, other):
        coefficient = _as_coefficient_or_none(other)
        if coefficient is not None:
            return CoefficientProduct(coefficient, self)
        return _times_operator(self, other)


def _times_operator(coefficient, other):
    """`f * M` for a matrix M is a one-term `TimeOperator`; `f * H` for an operator H
    is a `ScaledOperator`."""
    from ._operators import AbstractTimeOperator, ScaledOperator, TimeOperator

    if isinstance(other, AbstractTimeOperator):
        return ScaledOperator(coefficient, other)
    return TimeOperator((coefficient,), [other])


def _operator_fallback(coefficient, name, other):
    raise TypeError(
        f"Cannot combine a `{type(coefficient).__name__}` with a "
        f"`{type(other).__name__}` by `{name}`: a time function adds to numbers and "
        "other time functions; multiply it by a matrix to make an operator."
    )


def _as_coefficient_or_none(x) -> "AbstractCoefficient | None":
    """A number (or 0-d array) becomes a `Constant`; anything else is not a scalar."""
    if isinstance(x, AbstractCoefficient):
        return x
    if isinstance(x, (bool,)):
        return None
    if isinstance(x, (int, float, complex)):
        return Constant(x)
    if hasattr(x, "shape") and hasattr(x, "dtype") and x.shape == ():
        return Constant(x)
    return None


def _zeros_above(value: Array, order: OrderLike) -> Array:
    return jnp.concatenate([value[None], jnp.zeros((order,), value.dtype)])


class Constant(AbstractCoefficient):
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

    def scaled_taylor(self, t, order, scale):
        order = check_order(order, "hierax.Constant.taylor")
        dtype = jnp.result_type(self.value, _time(t))
        return _zeros_above(jnp.asarray(self.value, dtype), order)


class Polynomial(AbstractCoefficient):
    """A polynomial $f(t) = \\sum_{i=0}^{D} a_i t^i$ (coefficients in ascending
    order, as in `numpy.polynomial`)."""

    coefficients: Inexact[Array, " degree_plus_1"]

    def __init__(self, coefficients: ArrayLike):
        """**Arguments:**

        - `coefficients`: $a_0, \\ldots, a_D$, a 1-d real or complex array.
        """
        api = "hierax.Polynomial"
        array = as_numeric_array(coefficients, "coefficients", api)
        if array.ndim != 1 or array.shape[0] == 0:
            raise ValueError(
                f"`{api}`: `coefficients` must be a non-empty 1-d array (a_0, ..., "
                f"a_D), got shape {tuple(array.shape)}."
            )
        self.coefficients = array

    @property
    def is_constant(self) -> bool:
        return self.coefficients.shape[0] == 1

    def scaled_taylor(self, t, order, scale):
        order = check_order(order, "hierax.Polynomial.taylor")
        t = _time(t)
        a = self.coefficients
        degree = a.shape[0] - 1
        dtype = jnp.result_type(a, t)
        rdtype = real_dtype(dtype)
        # Shift to t: c_j = sum_{i >= j} binom(i, j) t^(i-j) a_i.
        i = jnp.arange(degree + 1)
        diff = i[None, :] - i[:, None]  # (j, i) -> i - j
        ok = diff >= 0
        safe = jnp.where(ok, diff, 0)
        lg = lambda x: lax.lgamma(x.astype(rdtype) + 1)
        binom = jnp.where(
            ok, jnp.round(jnp.exp(lg(i[None, :]) - lg(i[:, None]) - lg(safe))), 0
        )
        t_powers = jnp.concatenate(
            [jnp.ones((1,), dtype), jnp.cumprod(jnp.full((degree,), t, dtype))]
        )
        shift = jnp.where(ok, binom * t_powers[safe], 0)
        c = times_powers(shift @ a.astype(dtype), scale)
        if order <= degree:
            return c[: order + 1]
        return jnp.concatenate([c, jnp.zeros((order - degree,), c.dtype)])


def _sinusoid_parameters(api, frequency, phase, amplitude):
    return (
        _parameter(frequency, "frequency", api, real=True),
        _parameter(phase, "phase", api, real=True),
        _parameter(amplitude, "amplitude", api),
    )


def _sinusoid(amplitude, frequency, phase, t, order, shift, scale):
    dtype = jnp.result_type(amplitude, frequency, phase, t)
    argument = frequency * t + phase
    j = jnp.arange(order + 1, dtype=real_dtype(dtype))
    # d^j/dt^j cos(w t + p) = w^j cos(w t + p + j pi/2).
    phases = argument + (j + shift) * (jnp.pi / 2)
    rate = frequency if scale is None else frequency * scale
    return amplitude * power_series(rate, order) * jnp.cos(phases)


class Cos(AbstractCoefficient):
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
        self.frequency, self.phase, self.amplitude = _sinusoid_parameters(
            "hierax.Cos", frequency, phase, amplitude
        )

    @property
    def is_constant(self) -> bool:
        return False

    def scaled_taylor(self, t, order, scale):
        order = check_order(order, "hierax.Cos.taylor")
        return _sinusoid(
            self.amplitude, self.frequency, self.phase, _time(t), order, 0, scale
        )


class Sin(AbstractCoefficient):
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
        self.frequency, self.phase, self.amplitude = _sinusoid_parameters(
            "hierax.Sin", frequency, phase, amplitude
        )

    @property
    def is_constant(self) -> bool:
        return False

    def scaled_taylor(self, t, order, scale):
        order = check_order(order, "hierax.Sin.taylor")
        # sin(x) = cos(x - pi/2).
        return _sinusoid(
            self.amplitude, self.frequency, self.phase, _time(t), order, -1, scale
        )


class Exp(AbstractCoefficient):
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

    def scaled_taylor(self, t, order, scale):
        order = check_order(order, "hierax.Exp.taylor")
        t = _time(t)
        rate = self.rate if scale is None else self.rate * scale
        return self.amplitude * jnp.exp(self.rate * t) * power_series(rate, order)


class Gaussian(AbstractCoefficient):
    """$f(t) = A \\exp\\!\\big(-(t - \\mu)^2 / (2 s^2)\\big)$.

    The series uses the probabilists' Hermite recurrence
    $\\mathrm{He}_{j+1}(x) = x\\,\\mathrm{He}_j(x) - j\\,\\mathrm{He}_{j-1}(x)$ with
    $x = (t - \\mu)/s$, with the factor $(-1)^j / (s^j j!)$ folded into each step so
    that nothing overflows.
    """

    mean: Inexact[Array, ""]
    width: Inexact[Array, ""]
    amplitude: Inexact[Array, ""]

    def __init__(
        self, mean: ArrayLike = 0.0, width: ArrayLike = 1.0, amplitude: ArrayLike = 1.0
    ):
        """**Arguments:**

        - `mean`: the centre $\\mu$ (real).
        - `width`: the standard deviation $s$ (real, non-zero).
        - `amplitude`: $A$, real or complex.
        """
        api = "hierax.Gaussian"
        self.mean = _parameter(mean, "mean", api, real=True)
        self.width = _parameter(width, "width", api, real=True)
        self.amplitude = _parameter(amplitude, "amplitude", api)

    @property
    def is_constant(self) -> bool:
        return False

    def scaled_taylor(self, t, order, scale):
        order = check_order(order, "hierax.Gaussian.taylor")
        t = _time(t)
        dtype = jnp.result_type(self.mean, self.width, t)
        x = (t - self.mean) / self.width
        inv_s = (1 if scale is None else scale) / self.width

        # g_j = (-1)^j He_j(x) / (s^j j!) obeys
        # g_{j+1} = -(x g_j / s + g_{j-1} / s^2) / (j + 1).
        def step(carry, j):
            g_prev, g = carry
            g_next = -(x * g * inv_s + g_prev * inv_s**2) / (j + 1)
            return (g, g_next), g_next

        one = jnp.ones((), dtype)
        js = jnp.arange(order, dtype=real_dtype(dtype))
        _, rest = lax.scan(step, (jnp.zeros((), dtype), one), js)
        g = jnp.concatenate([one[None], rest])
        return self.amplitude * jnp.exp(-(x**2) / 2) * g


class CoefficientSum(AbstractCoefficient):
    """The sum $f(t) = \\sum_i f_i(t)$ of time functions (what `f + g` builds)."""

    terms: tuple[AbstractCoefficient, ...]

    def __init__(self, terms):
        """**Arguments:**

        - `terms`: a sequence of [`hierax.AbstractCoefficient`][]s.
        """
        flat = []
        for term in terms:
            if isinstance(term, CoefficientSum):
                flat.extend(term.terms)
            elif isinstance(term, AbstractCoefficient):
                flat.append(term)
            else:
                raise TypeError(
                    "`hierax.CoefficientSum`: every term must be a time function, "
                    f"got {type(term).__name__}."
                )
        self.terms = tuple(flat)

    @property
    def is_constant(self) -> bool:
        return all(term.is_constant for term in self.terms)

    def scaled_taylor(self, t, order, scale):
        order = check_order(order, "hierax.CoefficientSum.taylor")
        series = [term.scaled_taylor(t, order, scale) for term in self.terms]
        dtype = jnp.result_type(*series)
        return sum((s.astype(dtype) for s in series), jnp.zeros((order + 1,), dtype))


class CoefficientProduct(AbstractCoefficient):
    """The product $f(t) = g(t)\\,h(t)$ of two time functions (what `g * h` builds);
    its series is the Cauchy product of theirs."""

    left: AbstractCoefficient
    right: AbstractCoefficient

    def __init__(self, left: AbstractCoefficient, right: AbstractCoefficient):
        """**Arguments:**

        - `left`, `right`: the two factors.
        """
        self.left = left
        self.right = right

    @property
    def is_constant(self) -> bool:
        return self.left.is_constant and self.right.is_constant

    def scaled_taylor(self, t, order, scale):
        order = check_order(order, "hierax.CoefficientProduct.taylor")
        a = self.left.scaled_taylor(t, order, scale)
        b = self.right.scaled_taylor(t, order, scale)
        if isinstance(self.left, Constant):
            return a[0] * b
        if isinstance(self.right, Constant):
            return a * b[0]
        dtype = jnp.result_type(a, b)
        return scalar_cauchy_product(a.astype(dtype), b.astype(dtype))


class FunctionCoefficient(AbstractCoefficient):
    """Any JAX-traceable scalar function of time, $t \\mapsto f(t)$: a hand-written
    envelope, or an Equinox module such as a small neural network, whose parameters
    are then trained with the rest of a model. Its series is exact, computed by
    Taylor-mode propagation through the function.
    """

    fn: Callable[[Array], Array]

    def __init__(self, fn: Callable[[Array], Array]):
        """**Arguments:**

        - `fn`: a callable taking a scalar time array and returning a scalar (a 0-d
            array, or a 1-element array).
        """
        api = "hierax.FunctionCoefficient"
        out = trace_callable(fn, "fn", api)
        if not isinstance(out, jax.ShapeDtypeStruct) or out.shape not in ((), (1,)):
            raise ValueError(
                f"`{api}`: `fn` must return a scalar, got "
                f"{getattr(out, 'shape', type(out).__name__)}."
            )
        if not jnp.issubdtype(out.dtype, jnp.inexact):
            raise TypeError(
                f"`{api}`: `fn` must return a float or complex, got {out.dtype}."
            )
        self.fn = fn

    @property
    def is_constant(self) -> bool:
        return False

    def scaled_taylor(self, t, order, scale):
        order = check_order(order, "hierax.FunctionCoefficient.taylor")
        series = function_series(self.fn, _time(t), order, scale=scale)
        return series.reshape(order + 1)
