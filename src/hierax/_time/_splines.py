"""Sampled pulses as time functions: piecewise polynomials through samples.

On each segment between two knots a sampled pulse is a polynomial of degree at most
three, so its Taylor series is exact and ends after four coefficients. The knot times
and the samples are array leaves (differentiable; changing them never recompiles);
only their number is static. At a knot the segment to its right is used, so every
series is one-sided from the right there.
"""

from collections.abc import Sequence
from typing import Literal

import equinox as eqx
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Inexact, Real, ScalarLike

from .._core import Time, as_numeric_array, is_traced
from .._data import real_dtype
from ._time_functions import AbstractTimeFunction, scaled_field


_BC_TYPES = ("not-a-knot", "natural", "clamped")

# Samples and knots: an array, or a list of numbers.
_Samples = ArrayLike | Sequence[ScalarLike]


def _knots(x: _Samples, name: str, api: str, minimum: int) -> Array:
    """Real, finite, 1-d, at least `minimum` entries, strictly increasing (checked
    here when the values are known, and by `eqx.error_if` when they are traced)."""
    array = as_numeric_array(x, name, api, finite=True)
    if jnp.iscomplexobj(array):
        raise TypeError(f"`{api}`: `{name}` must be real, got dtype {array.dtype}.")
    if array.ndim != 1:
        raise ValueError(
            f"`{api}`: `{name}` must be a 1-d array, got shape {tuple(array.shape)}."
        )
    if array.shape[0] < minimum:
        raise ValueError(
            f"`{api}`: `{name}` must hold at least {minimum} entries, got "
            f"{array.shape[0]}."
        )
    if is_traced(array):
        return eqx.error_if(
            array,
            ~jnp.all(array[1:] > array[:-1]),
            f"`{api}`: `{name}` must be strictly increasing.",
        )
    values = np.asarray(array)
    bad = np.flatnonzero(~(values[1:] > values[:-1]))
    if bad.size:
        i = int(bad[0]) + 1
        raise ValueError(
            f"`{api}`: `{name}` must be strictly increasing, got {name}[{i}] = "
            f"{values[i]} after {name}[{i - 1}] = {values[i - 1]}."
        )
    return array


def _samples(y: _Samples, name: str, api: str, count: int, expected: str) -> Array:
    """Real or complex, finite where known, 1-d, `count` entries."""
    array = as_numeric_array(y, name, api, finite=True)
    if array.ndim != 1:
        raise ValueError(
            f"`{api}`: `{name}` must be a 1-d array, got shape {tuple(array.shape)}; "
            "build one time function per pulse."
        )
    if array.shape[0] != count:
        raise ValueError(
            f"`{api}`: `{name}` must hold {count} entries ({expected}), got "
            f"{array.shape[0]}."
        )
    return array


def _locate(knots: Array, t: Time) -> tuple[Array, Array, Array]:
    """The segment `i` (clipped to 0..n-2) with `knots[i] <= t < knots[i+1]`, and
    whether `t` lies before the first knot or at or after the last. A complex time
    (holomorphic use) is located by its real part."""
    rdtype = jnp.result_type(knots, jnp.real(t))
    x = jnp.real(t).astype(rdtype)
    index = jnp.searchsorted(knots.astype(rdtype), x, side="right") - 1
    segment = jnp.clip(index, 0, knots.shape[0] - 2)
    return segment, x < knots[0], x >= knots[-1]


def _local_series(
    coefficients: list[Array], u: Array, order: int, time_scale: Array | None, dtype
) -> Array:
    """The normalised series of $\\sigma \\mapsto p(u + s\\sigma)$ for
    $p(v) = \\sum_k c_k v^k$ (degree < 4), by Horner's rule on series: no power of
    $u$ or $s$ is formed, each coefficient picks up $s$ one factor at a time."""
    s = jnp.ones((), dtype) if time_scale is None else time_scale.astype(dtype)
    u = u.astype(dtype)
    width = len(coefficients)
    q = [coefficients[-1].astype(dtype)] + [jnp.zeros((), dtype)] * (width - 1)
    for c in coefficients[-2::-1]:
        q = [u * q[0] + c.astype(dtype)] + [
            u * q[j] + s * q[j - 1] for j in range(1, width)
        ]
    series = jnp.stack(q)
    if order < width:
        return series[: order + 1]
    return jnp.concatenate([series, jnp.zeros((order + 1 - width,), dtype)])


def _real_columns(y: Array) -> Array:
    """A real or complex vector as real columns (real part, imaginary part), so that
    the spline's real linear system is solved in real arithmetic."""
    if jnp.iscomplexobj(y):
        return jnp.stack([y.real, y.imag], axis=-1)
    return y[:, None]


def _from_real_columns(x: Array, complex_values: bool) -> Array:
    return lax.complex(x[:, 0], x[:, 1]) if complex_values else x[:, 0]


def _cubic_slopes(x: Array, y: Array, bc_type: str) -> Array:
    """The first derivatives $s_i$ of the cubic spline at its knots.

    With the cubic Hermite form on each segment, continuity of the second derivative
    at the interior knots gives one tridiagonal equation per knot,
    $h_i s_{i-1} + 2(h_{i-1} + h_i) s_i + h_{i-1} s_{i+1}
    = 3(h_i m_{i-1} + h_{i-1} m_i)$ ($h_i$ the widths, $m_i$ the secants), and the
    end conditions close the system. Not-a-knot (a continuous third derivative at
    the second and the last-but-one knot) is written, after eliminating $s_2$ by
    the first interior equation, as a first row on $s_0, s_1$ only, so the system
    stays tridiagonal. The number of knots is static: the special cases (two knots
    give a line, three not-a-knot knots a parabola, as in scipy) are chosen here.
    """
    n = x.shape[0]
    h = x[1:] - x[:-1]
    m = (y[1:] - y[:-1]) / h[:, None]
    if n == 2 and bc_type != "clamped":
        return jnp.stack([m[0], m[0]])
    if n == 3 and bc_type == "not-a-knot":
        # The parabola through the three points: p' = m_0 + a (2u - h_0).
        a = (m[1] - m[0]) / (h[0] + h[1])
        return jnp.stack(
            [m[0] - a * h[0], m[0] + a * h[0], m[0] + a * (h[0] + 2 * h[1])]
        )

    dtype = h.dtype
    zero, one = jnp.zeros((1,), dtype), jnp.ones((1,), dtype)
    # Interior rows i = 1..n-2.
    lower = h[1:]
    diagonal = 2 * (h[:-1] + h[1:])
    upper = h[:-1]
    rhs = 3 * (h[1:, None] * m[:-1] + h[:-1, None] * m[1:])
    if bc_type == "clamped":
        first = (one, zero, jnp.zeros((1, rhs.shape[1]), rhs.dtype))
        last = (zero, one, jnp.zeros((1, rhs.shape[1]), rhs.dtype))
    elif bc_type == "natural":
        first = (2 * one, one, 3 * m[:1])
        last = (one, 2 * one, 3 * m[-1:])
    else:  # not-a-knot, n >= 4
        d0 = h[0] + h[1]
        d1 = h[-1] + h[-2]
        b0 = ((3 * h[0] + 2 * h[1]) * h[1] * m[0] + h[0] ** 2 * m[1]) / d0
        b1 = ((3 * h[-1] + 2 * h[-2]) * h[-2] * m[-1] + h[-1] ** 2 * m[-2]) / d1
        first = (h[1:2], d0[None], b0[None])
        last = (d1[None], h[-2:-1], b1[None])
    lower_band = jnp.concatenate([zero, lower, last[0]])
    diagonal_band = jnp.concatenate([first[0], diagonal, last[1]])
    upper_band = jnp.concatenate([first[1], upper, zero])
    rhs = jnp.concatenate([first[2], rhs, last[2]])
    return lax.linalg.tridiagonal_solve(lower_band, diagonal_band, upper_band, rhs)


class CubicSpline(AbstractTimeFunction):
    """A cubic spline through samples $(t_i, y_i)$, $i = 0, \\ldots, N-1$: on each
    segment $[t_i, t_{i+1})$ a cubic polynomial, with the values, first and second
    derivatives continuous at the knots. It matches `scipy.interpolate.CubicSpline`
    with the same `bc_type` inside $[t_0, t_{N-1})$, values and derivatives; the
    derivatives beyond the third are zero.

    Outside the knot range the function holds its end value, $f(t) = y_0$ for
    $t < t_0$ and $f(t) = y_{N-1}$ for $t \\geq t_{N-1}$, with zero derivatives (as
    QuTiP's array coefficients do). At a knot the segment to its right is used, so
    the series there is one-sided: the third derivative may jump at an interior
    knot, and the first and second at the two ends, where the held value begins.

    The spline's linear system (tridiagonal, one row per knot) is solved in JAX at
    each evaluation, so the series is differentiable with respect to `values` and
    `times`; the number of samples is static.
    """

    times: Real[Array, " samples"]
    values: Inexact[Array, " samples"]
    bc_type: Literal["not-a-knot", "natural", "clamped"] = eqx.field(static=True)

    def __init__(
        self,
        times: _Samples,
        values: _Samples,
        bc_type: str = "not-a-knot",
    ):
        """**Arguments:**

        - `times`: the knots $t_0 < \\cdots < t_{N-1}$, a real 1-d array with
            $N \\geq 2$ (as scipy: two knots give a straight line, except
            `"clamped"`; three `"not-a-knot"` knots give the parabola through them).
        - `values`: the samples $y_i$, a real or complex 1-d array of length $N$.
        - `bc_type`: the end conditions, one of
            - `"not-a-knot"` (the default): the third derivative is continuous at
                $t_1$ and $t_{N-2}$;
            - `"natural"`: zero second derivative at both ends;
            - `"clamped"`: zero first derivative at both ends.

            scipy's `"periodic"` and explicit derivative tuples are not supported.
        """
        api = "hierax.CubicSpline"
        if not isinstance(bc_type, str) or bc_type not in _BC_TYPES:
            raise ValueError(
                f"`{api}`: `bc_type` must be one of "
                f"{', '.join(repr(b) for b in _BC_TYPES)}, got {bc_type!r}."
            )
        self.times = _knots(times, "times", api, 2)
        count = self.times.shape[0]
        self.values = _samples(values, "values", api, count, "one per entry of `times`")
        self.bc_type = bc_type

    @property
    def knots(self) -> Array:
        """The knot times $t_0, \\ldots, t_{N-1}$, shape `(N,)`: the points where
        the third derivative may jump (pass them to a step-size controller as jump
        times)."""
        return self.times

    @property
    def is_constant(self) -> bool:
        return False

    @property
    def series_degree(self) -> int:
        return 3

    def _scaled(self, factor):
        return scaled_field(self, "values", factor)

    def series(self, t, order, time_scale):
        dtype = jnp.result_type(self.times, self.values, t)
        x = self.times.astype(real_dtype(dtype))
        y = self.values.astype(dtype)
        columns = _cubic_slopes(x, _real_columns(y), self.bc_type)
        slopes = _from_real_columns(columns, jnp.iscomplexobj(y)).astype(dtype)
        i, before, after = _locate(x, t)
        h = x[i + 1] - x[i]
        m = (y[i + 1] - y[i]) / h
        cubic = (slopes[i] + slopes[i + 1] - 2 * m) / h**2
        quadratic = (3 * m - 2 * slopes[i] - slopes[i + 1]) / h
        held = jnp.where(before, y[0], y[-1])
        outside = before | after
        zero = jnp.zeros((), dtype)
        coefficients = [
            jnp.where(outside, held, y[i]),
            jnp.where(outside, zero, slopes[i]),
            jnp.where(outside, zero, quadratic),
            jnp.where(outside, zero, cubic),
        ]
        u = jnp.where(outside, jnp.zeros_like(t), t - x[i])
        return _local_series(coefficients, u, order, time_scale, dtype)


class PiecewiseLinear(AbstractTimeFunction):
    """Linear interpolation between samples $(t_i, y_i)$, $i = 0, \\ldots, N-1$:
    $f(t) = y_i + (t - t_i)(y_{i+1} - y_i)/(t_{i+1} - t_i)$ on $[t_i, t_{i+1})$ (as
    `numpy.interp`). Outside the knot range it holds its end value with zero
    derivatives. At a knot the segment to its right is used, so the first
    derivative there is the right-hand slope; derivatives beyond the first are zero.
    """

    times: Real[Array, " samples"]
    values: Inexact[Array, " samples"]

    def __init__(self, times: _Samples, values: _Samples):
        """**Arguments:**

        - `times`: the knots $t_0 < \\cdots < t_{N-1}$, a real 1-d array, $N \\geq 2$.
        - `values`: the samples $y_i$, a real or complex 1-d array of length $N$.
        """
        api = "hierax.PiecewiseLinear"
        self.times = _knots(times, "times", api, 2)
        count = self.times.shape[0]
        self.values = _samples(values, "values", api, count, "one per entry of `times`")

    @property
    def knots(self) -> Array:
        """The knot times $t_0, \\ldots, t_{N-1}$, shape `(N,)`: the points where
        the slope jumps (jump times for a step-size controller)."""
        return self.times

    @property
    def is_constant(self) -> bool:
        return False

    @property
    def series_degree(self) -> int:
        return 1

    def _scaled(self, factor):
        return scaled_field(self, "values", factor)

    def series(self, t, order, time_scale):
        dtype = jnp.result_type(self.times, self.values, t)
        x = self.times.astype(real_dtype(dtype))
        y = self.values.astype(dtype)
        i, before, after = _locate(x, t)
        slope = (y[i + 1] - y[i]) / (x[i + 1] - x[i])
        outside = before | after
        coefficients = [
            jnp.where(outside, jnp.where(before, y[0], y[-1]), y[i]),
            jnp.where(outside, jnp.zeros((), dtype), slope),
        ]
        u = jnp.where(outside, jnp.zeros_like(t), t - x[i])
        return _local_series(coefficients, u, order, time_scale, dtype)


class PiecewiseConstant(AbstractTimeFunction):
    """A piecewise-constant pulse, $f(t) = y_i$ on $[e_i, e_{i+1})$ for edges
    $e_0 < \\cdots < e_N$ and values $y_0, \\ldots, y_{N-1}$, and zero outside
    $[e_0, e_N)$ (the semantics of dynamiqs' `pwc`). At an edge the segment to its
    right is used. All derivatives are zero; the jumps live at the edges only, so
    the gradient with respect to `edges` of any series is zero (a solver sees the
    edges through its step-size controller's jump times).
    """

    edges: Real[Array, " edges"]
    values: Inexact[Array, " segments"]

    def __init__(self, edges: _Samples, values: _Samples):
        """**Arguments:**

        - `edges`: $e_0 < \\cdots < e_N$, a real 1-d array with $N \\geq 1$.
        - `values`: $y_0, \\ldots, y_{N-1}$, a real or complex 1-d array, one
            entry fewer than `edges`.
        """
        api = "hierax.PiecewiseConstant"
        self.edges = _knots(edges, "edges", api, 2)
        count = self.edges.shape[0] - 1
        self.values = _samples(values, "values", api, count, "len(edges) - 1")

    @property
    def knots(self) -> Array:
        """The edges $e_0, \\ldots, e_N$, shape `(N + 1,)`: where the function
        jumps (jump times for a step-size controller)."""
        return self.edges

    @property
    def is_constant(self) -> bool:
        return False

    @property
    def series_degree(self) -> int:
        return 0

    def _scaled(self, factor):
        return scaled_field(self, "values", factor)

    def series(self, t, order, time_scale):
        dtype = jnp.result_type(self.edges, self.values, t)
        x = self.edges.astype(real_dtype(dtype))
        i, before, after = _locate(x, t)
        value = jnp.where(before | after, jnp.zeros((), dtype), self.values[i])
        return jnp.zeros((order + 1,), dtype).at[0].set(value.astype(dtype))
