"""Sampled pulses: `CubicSpline` against scipy and SymPy, `PiecewiseLinear` and
`PiecewiseConstant` against closed forms, their series against nested `jacfwd`,
gradients against finite differences, the hierarchy against mpmath, and bad input.

Compiled functions are shared between tests (one trace per knot count, boundary
condition and dtype), so the file stays fast on a small machine.
"""

import functools
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.interpolate
import sympy as sp

import hierax

from .helpers import (
    SIGMA_X,
    SIGMA_Z,
    mp_relative_errors,
    sympy_levels,
    t_sym,
)


ORDER = 5  # two orders past the cubic's last non-zero coefficient
FACTORIALS = np.array([math.factorial(j) for j in range(ORDER + 1)], float)
BC_TYPES = ["not-a-knot", "natural", "clamped"]


@eqx.filter_jit
def _series_at(functions, ts, scale=None):
    """The series of a time function (or of each of a tuple of them) at each of `ts`
    (one compile per structure)."""

    def at(f):
        if scale is None:
            return jax.vmap(lambda t: f.taylor(t, ORDER))(ts)
        return jax.vmap(lambda t: f.series(t, ORDER, scale))(ts)

    if isinstance(functions, tuple):
        return tuple(at(f) for f in functions)
    return at(functions)


def _knots(rng, n):
    """Knots on a jittered grid: random but never closer than a third of a step."""
    grid = np.arange(n, dtype=float)
    return 0.4 + 0.7 * (grid + rng.uniform(-0.33, 0.33, n))


def _points(rng, x):
    """Random points inside, every knot exactly, and points outside on both sides."""
    inside = rng.uniform(x[0], x[-1], 12)
    outside = np.array([x[0] - 1.3, x[0] - 1e-9, x[-1] + 1e-9, x[-1] + 2.0])
    return np.concatenate([inside, x, outside])


def _check_against(series, expected, tol):
    """Each order's error relative to that order's largest reference value (or to
    1e-2 of the largest of all orders where an order is all but zero, as the third
    derivative of a parabola is)."""
    series, expected = np.asarray(series), np.asarray(expected)
    scale = np.maximum(
        np.max(np.abs(expected), axis=0), 1e-2 * np.max(np.abs(expected))
    )
    errors = np.max(np.abs(series - expected), axis=0) / scale
    assert np.all(errors <= tol), errors
    return float(np.max(errors))


# ----------------------------------------------------------------------------------
# CubicSpline against scipy
# ----------------------------------------------------------------------------------


def test_cubic_spline_against_scipy():
    """Values and derivatives 0..3 at random points, at every knot and outside the
    range, for 2, 3, 4 and 9 knots (scipy's special cases included), each boundary
    condition, real and complex samples. Inside the range (knots included: the
    right-hand segment, as scipy picks it) the derivatives are scipy's; from the
    last knot on and before the first the end value is held with zero derivatives;
    orders 4 and 5 are exactly 0."""
    rng = np.random.default_rng(1)
    worst = 0.0
    for n, complex_values in ((2, True), (3, False), (4, True), (9, False)):
        x = _knots(rng, n)
        ts = _points(rng, x)
        samples = [rng.normal(size=n) for _ in BC_TYPES]
        if complex_values:
            samples = [y + 1j * rng.normal(size=n) for y in samples]
        splines = tuple(
            hierax.CubicSpline(x, y, bc_type=bc) for y, bc in zip(samples, BC_TYPES)
        )
        # One compiled call per knot count for the three boundary conditions.
        all_series = _series_at(splines, jnp.asarray(ts))
        for series, y, bc in zip(all_series, samples, BC_TYPES):
            reference = scipy.interpolate.CubicSpline(x, y, bc_type=bc)
            expected = np.zeros((len(ts), ORDER + 1), y.dtype)
            for j in range(4):
                expected[:, j] = reference(ts, nu=j) / FACTORIALS[j]
            before, after = ts < x[0], ts >= x[-1]
            expected[before | after] = 0
            expected[before, 0] = y[0]
            expected[after, 0] = y[-1]
            assert series.dtype == (jnp.complex128 if complex_values else jnp.float64)
            worst = max(worst, _check_against(series, expected, 1e-12))
            assert np.all(np.asarray(series)[:, 4:] == 0)
    print(f"largest error against scipy: {worst:.1e}")


def test_cubic_spline_continuity_at_knots():
    """One-sided at a knot: values and first two derivatives agree with the left
    segment's limit, the third derivative jumps (that is what a knot is; not-a-knot
    ends would keep it continuous at the second and last-but-one knots)."""
    rng = np.random.default_rng(2)
    x = _knots(rng, 6)
    f = hierax.CubicSpline(x, np.sin(2 * x), bc_type="natural")
    at = np.asarray(_series_at(f, jnp.asarray(x[1:-1])))
    below = np.asarray(_series_at(f, jnp.asarray(x[1:-1] - 1e-7)))
    np.testing.assert_allclose(at[:, :3], below[:, :3], atol=1e-6)
    assert np.all(np.abs(at[:, 3] - below[:, 3]) > 1e-3)


# ----------------------------------------------------------------------------------
# CubicSpline against SymPy: the spline system set up from its definition
# ----------------------------------------------------------------------------------


def _sympy_spline(x, y, bc_type):
    """The cubic spline as a SymPy Piecewise, in exact rationals: one cubic with four
    unknown coefficients per segment, determined by interpolation, continuity of the
    first and second derivatives at interior knots and the two end conditions
    (independent of hierax's slope formulation and of scipy)."""
    n = len(x)
    coefficients = sp.symbols(f"c0:{4 * (n - 1)}")
    pieces: list[Any] = [
        sp.Add(*[coefficients[4 * i + k] * (t_sym - x[i]) ** k for k in range(4)])
        for i in range(n - 1)
    ]
    equations = []
    for i, p in enumerate(pieces):
        equations += [p.subs(t_sym, x[i]) - y[i], p.subs(t_sym, x[i + 1]) - y[i + 1]]
    for i in range(n - 2):
        for order in (1, 2):
            jump: Any = sp.diff(pieces[i + 1] - pieces[i], t_sym, order)
            equations.append(jump.subs(t_sym, x[i + 1]))
    first, last = pieces[0], pieces[-1]
    if bc_type == "natural":
        conditions = [(first, x[0], 2), (last, x[-1], 2)]
    elif bc_type == "clamped":
        conditions = [(first, x[0], 1), (last, x[-1], 1)]
    else:
        conditions = []
        equations += [
            sp.diff(pieces[0], t_sym, 3) - sp.diff(pieces[1], t_sym, 3),
            sp.diff(pieces[-2], t_sym, 3) - sp.diff(pieces[-1], t_sym, 3),
        ]
    for p, at, order in conditions:
        equations.append(sp.diff(p, t_sym, order).subs(t_sym, at))
    solution = sp.solve(equations, coefficients, dict=True)[0]
    return sp.Piecewise(
        (y[0], t_sym < x[0]),
        *[
            (p.subs(solution), (t_sym >= x[i]) & (t_sym < x[i + 1]))
            for i, p in enumerate(pieces)
        ],
        (y[-1], True),
    )


@pytest.mark.parametrize("bc_type", BC_TYPES)
def test_cubic_spline_against_sympy(bc_type):
    R = sp.Rational
    x = [R(0), R(1, 2), R(3, 2), R(2), R(3)]
    y = [R(1), R(-1, 3), R(2), R(5, 4), R(-1, 2)]
    spline = _sympy_spline(x, y, bc_type)
    ts = [R(1, 4), R(1, 2), R(7, 5), R(3, 2), R(11, 4), R(3), R(-1), R(4)]
    expected = np.array(
        [
            [
                float(sp.diff(spline, t_sym, j).subs(t_sym, t) / math.factorial(j))
                for j in range(ORDER + 1)
            ]
            for t in ts
        ]
    )
    f = hierax.CubicSpline(np.array(x, float), np.array(y, float), bc_type=bc_type)
    series = _series_at(f, jnp.asarray(np.array(ts, float)))
    _check_against(series, expected, 1e-13)


# ----------------------------------------------------------------------------------
# PiecewiseLinear and PiecewiseConstant against closed forms
# ----------------------------------------------------------------------------------


def test_piecewise_linear_closed_form():
    rng = np.random.default_rng(3)
    x = _knots(rng, 7)
    y = rng.normal(size=7) + 1j * rng.normal(size=7)
    ts = _points(rng, x)
    f = hierax.PiecewiseLinear(x, y)
    series = np.asarray(_series_at(f, jnp.asarray(ts)))
    # numpy.interp holds the end values outside; the slope of [x_i, x_{i+1}) applies
    # from x_i on, and none before x_0 or from x_{N-1} on.
    value = np.interp(ts, x, y.real) + 1j * np.interp(ts, x, y.imag)
    index = np.clip(np.searchsorted(x, ts, side="right") - 1, 0, len(x) - 2)
    slope = (y[index + 1] - y[index]) / (x[index + 1] - x[index])
    slope = np.where((ts < x[0]) | (ts >= x[-1]), 0, slope)
    expected = np.zeros_like(series)
    expected[:, 0], expected[:, 1] = value, slope
    _check_against(series, expected, 1e-14)
    assert np.all(series[:, 2:] == 0)


def test_piecewise_constant_closed_form():
    """dynamiqs' `pwc`: values[i] on [edges[i], edges[i+1]), zero outside."""
    rng = np.random.default_rng(4)
    edges = _knots(rng, 6)
    values = rng.normal(size=5) + 1j * rng.normal(size=5)
    ts = _points(rng, edges)
    expected = np.zeros((len(ts), ORDER + 1), complex)
    for k, t in enumerate(ts):
        for i in range(5):
            if edges[i] <= t < edges[i + 1]:
                expected[k, 0] = values[i]
    f = hierax.PiecewiseConstant(edges, values)
    series = np.asarray(_series_at(f, jnp.asarray(ts)))
    np.testing.assert_array_equal(series, expected)
    assert f(edges[-1]) == 0 and f(edges[0]) == values[0]


def test_knots_property():
    x = np.linspace(0.0, 1.0, 5)
    for f in (hierax.CubicSpline(x, x**2), hierax.PiecewiseLinear(x, x)):
        np.testing.assert_array_equal(f.knots, x)
    np.testing.assert_array_equal(hierax.PiecewiseConstant(x, x[1:]).knots, x)


# ----------------------------------------------------------------------------------
# The series: nested jacfwd, the time scale
# ----------------------------------------------------------------------------------


def _nested_jvp_series(f, ts, order):
    """Normalised Taylor coefficients of `t -> f(t)` by nested forward derivatives
    (independent of the series code: it differentiates the evaluation)."""
    derivatives = [f]
    for _ in range(order):
        below = derivatives[-1]
        derivatives.append(lambda t, g=below: jax.jvp(g, (t,), (jnp.ones_like(t),))[1])
    values = jax.vmap(lambda t: jnp.stack([d(t) for d in derivatives]))(ts)
    return values / FACTORIALS[None, : order + 1]


def test_series_against_nested_jvp_and_time_scale():
    """The series is the Taylor series of the function the object evaluates (nested
    `jvp` of `f(t)`, inside a segment), and `series(t, K, s)` gives the
    coefficients of sigma -> f(t + s sigma), `c_j s^j`."""
    rng = np.random.default_rng(5)
    x = _knots(rng, 8)
    y = rng.normal(size=8) + 0.5j * rng.normal(size=8)
    functions = (
        hierax.CubicSpline(x, y, bc_type="natural"),
        hierax.PiecewiseLinear(x, y),
        hierax.PiecewiseConstant(x, y[:-1]),
    )
    ts = jnp.array([x[2] + 0.2, x[5] + 0.05, x[0] - 0.5, x[-1] + 0.5])
    scale = jnp.asarray(0.375)
    all_series = _series_at(functions, ts)
    all_scaled = _series_at(functions, ts, scale)
    references = eqx.filter_jit(
        lambda fs, ts: tuple(_nested_jvp_series(f, ts, 4) for f in fs)
    )(functions, ts)
    for series, scaled, reference in zip(all_series, all_scaled, references):
        np.testing.assert_allclose(
            scaled, series * 0.375 ** np.arange(ORDER + 1)[None], rtol=1e-14, atol=0
        )
        np.testing.assert_allclose(series[:, :5], reference, rtol=1e-13, atol=1e-14)


# ----------------------------------------------------------------------------------
# Gradients against central finite differences
# ----------------------------------------------------------------------------------


_WEIGHTS = np.array([1.0, -0.7, 0.4, 1.3, 0.0, 0.0])
_GRADIENT_POINTS = np.array([0.95, 2.1, 3.3])

GRADIENT_CASES = {
    "not-a-knot": lambda x, y: hierax.CubicSpline(x, y),
    "natural": lambda x, y: hierax.CubicSpline(x, y, bc_type="natural"),
    "clamped": lambda x, y: hierax.CubicSpline(x, y, bc_type="clamped"),
    "linear": hierax.PiecewiseLinear,
    "constant": lambda x, y: hierax.PiecewiseConstant(x, y[:-1]),
}


def _weighted(series):
    """A real scalar from complex series, shape (points, ORDER + 1)."""
    weights = _WEIGHTS[None]
    return (series.real * weights + series.imag * weights[:, ::-1]).sum()


def _reference_series(name, x, y):
    """The series at `_GRADIENT_POINTS` from scipy and numpy (for the differences)."""
    ts = _GRADIENT_POINTS
    out = np.zeros((len(ts), ORDER + 1), complex)
    if name == "linear":
        index = np.searchsorted(x, ts, side="right") - 1
        out[:, 0] = np.interp(ts, x, y.real) + 1j * np.interp(ts, x, y.imag)
        out[:, 1] = (y[index + 1] - y[index]) / (x[index + 1] - x[index])
    elif name == "constant":
        out[:, 0] = y[np.searchsorted(x, ts, side="right") - 1]
    else:
        spline = scipy.interpolate.CubicSpline(x, y, bc_type=name)
        for j in range(4):
            out[:, j] = spline(ts, nu=j) / FACTORIALS[j]
    return out


def test_gradients_against_finite_differences():
    """`jax.grad` with respect to the knot times and the complex samples (one
    compiled call for every kind) against central differences of the same
    objective computed by scipy and numpy."""
    rng = np.random.default_rng(6)
    x = _knots(rng, 6)
    y = rng.normal(size=6) + 1j * rng.normal(size=6)

    @jax.jit
    def gradients(x, y):
        def objective(make, x, y):
            f = make(x, y)
            ts = jnp.asarray(_GRADIENT_POINTS)
            return _weighted(jax.vmap(lambda t: f.taylor(t, ORDER))(ts))

        return {
            name: jax.grad(functools.partial(objective, make), argnums=(0, 1))(x, y)
            for name, make in GRADIENT_CASES.items()
        }

    results = gradients(jnp.asarray(x), jnp.asarray(y))
    eps = 1e-6
    for name, (grad_x, grad_y) in results.items():

        def objective(x, y, name=name):
            return _weighted(_reference_series(name, x, y))

        fd_x, fd_y = np.zeros(6), np.zeros(6, complex)
        for i, e in enumerate(eps * np.eye(6)):
            fd_x[i] = (objective(x + e, y) - objective(x - e, y)) / (2 * eps)
            # For complex samples JAX's gradient of a real function is
            # d/d(re) - i d/d(im).
            d_re = objective(x, y + e) - objective(x, y - e)
            d_im = objective(x, y + 1j * e) - objective(x, y - 1j * e)
            fd_y[i] = (d_re - 1j * d_im) / (2 * eps)
        np.testing.assert_allclose(grad_x, fd_x, rtol=1e-6, atol=1e-8, err_msg=name)
        np.testing.assert_allclose(grad_y, fd_y, rtol=1e-6, atol=1e-8, err_msg=name)
        assert np.any(np.abs(np.asarray(grad_y)) > 1e-3), name
        if name == "constant":
            np.testing.assert_array_equal(grad_x, 0.0)
        else:
            assert np.any(np.abs(np.asarray(grad_x)) > 1e-3), name


# ----------------------------------------------------------------------------------
# float32, the hierarchy, retracing
# ----------------------------------------------------------------------------------


def test_float32():
    """float32 knots and samples stay float32 (complex64 for complex samples), to
    float32 accuracy against scipy."""
    rng = np.random.default_rng(7)
    x = _knots(rng, 9)
    y = np.cos(x)
    ts = rng.uniform(x[0], x[-1], 6)
    functions = (
        hierax.CubicSpline(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)),
        hierax.PiecewiseLinear(
            jnp.asarray(x, jnp.float32), jnp.asarray(y + 1j * y, jnp.complex64)
        ),
    )
    cubic, linear = _series_at(functions, jnp.asarray(ts, jnp.float32))
    assert cubic.dtype == jnp.float32 and linear.dtype == jnp.complex64
    reference = scipy.interpolate.CubicSpline(x, y)
    expected = np.stack(
        [reference(ts, nu=j) / FACTORIALS[j] for j in range(4)]
        + [np.zeros_like(ts)] * 2,
        axis=1,
    )
    _check_against(cubic, expected, 1e-5)
    np.testing.assert_allclose(linear[:, 0], (1 + 1j) * np.interp(ts, x, y), rtol=1e-5)


def test_heisenberg_hierarchy_with_a_spline():
    """H = CubicSpline * sx + sz in `HeisenbergHierarchy`, against the direct
    Taylor recursion in mpmath on scipy's spline written as a SymPy Piecewise, at a
    point inside a segment and exactly at a knot (where the segment on the right is
    used); k <= 4, so the third derivative's jump at the knot enters X_4 only."""
    rng = np.random.default_rng(8)
    x = np.linspace(0.0, 2.0, 9)
    y = np.sin(1.5 * x) + 0.1 * rng.normal(size=9)
    reference = scipy.interpolate.CubicSpline(x, y)
    pieces = []
    for i in range(len(x) - 1):
        c = [sp.Rational(float(v)) for v in reference.c[::-1, i]]
        left, right = sp.Rational(float(x[i])), sp.Rational(float(x[i + 1]))
        u = t_sym - left
        condition = (t_sym >= left) & (t_sym < right)
        pieces.append((sum(ck * u**k for k, ck in enumerate(c)), condition))
    spline = sp.Piecewise(*pieces, (sp.Rational(float(y[-1])), True))
    sx = sp.Matrix([[0, 1], [1, 0]])
    sz = sp.Matrix([[1, 0], [0, -1]])
    hamiltonian = hierax.CubicSpline(x, y) * SIGMA_X + SIGMA_Z
    levels = hierax.HeisenbergHierarchy(hamiltonian, SIGMA_Z, 4)
    for t0 in (sp.Rational(7, 10), sp.Rational(float(x[3]))):
        expected = sympy_levels(
            [(spline, sx), (sp.Integer(1), sz)], [(sp.Integer(1), sz)], t0, 4
        )
        errors = mp_relative_errors(levels(float(t0)), expected)
        print(f"t = {float(t0)}: relative errors per level {errors}")
        assert np.all(errors < 1e-12), errors
    # At the knot, levels 0..3 are continuous and X_4 jumps.
    knot = float(x[3])
    at, below = np.asarray(levels(knot)), np.asarray(levels(knot - 1e-8))
    jumps = np.linalg.norm(at - below, axis=(1, 2)) / np.linalg.norm(at, axis=(1, 2))
    assert np.all(jumps[:4] < 1e-6) and jumps[4] > 1e-2, jumps


def test_new_samples_do_not_retrace():
    """New samples and knot times reuse the hierarchy's compiled call (the pattern
    of `test_retrace.py`: a callable beside the spline counts how often it is
    traced), and the reused program computes with the new values."""
    runs: list = []

    def envelope(t):
        runs.append(None)
        return jnp.exp(-(t**2))

    counting = hierax.CallableTimeFunction(envelope)

    def levels(times, values, t):
        hamiltonian = hierax.CubicSpline(times, values) * SIGMA_X + counting * SIGMA_Z
        return hierax.HeisenbergHierarchy(hamiltonian, SIGMA_Z, 4)(t)

    x = np.linspace(0.0, 2.0, 9)
    first = levels(x, np.sin(x), 0.7)
    traced = len(runs)
    assert traced >= 1
    for k in range(1, 4):
        levels(x * (1 + 0.1 * k), np.sin(k * x), 0.3 * k)
    assert len(runs) == traced, "new samples or knot times retraced the call"
    assert not np.allclose(levels(x, np.cos(x), 0.7), first)


def test_time_function_alone_does_not_retrace():
    """Under the user's own `filter_jit`, new samples and edges are new array
    values of the same structure: one trace."""

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def series(f, t):
        return f.taylor(t, 3)

    x = jnp.linspace(0.0, 2.0, 12)
    for k in range(3):
        t = jnp.asarray(0.1 * k)
        series(hierax.PiecewiseConstant(x, jnp.sin(k * x[1:])), t)
        series(hierax.PiecewiseConstant(x + k, jnp.cos(x[1:])), t)


# ----------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------


X4 = np.array([0.0, 1.0, 2.0, 3.0])
Y4 = np.array([0.0, 1.0, 0.0, 1.0])
NAN, INF = np.nan, np.inf
Cubic, Linear, Constant = (
    hierax.CubicSpline,
    hierax.PiecewiseLinear,
    hierax.PiecewiseConstant,
)
INCREASING = r"`times` must be strictly increasing"

BAD_INPUT = [
    (lambda: Cubic([0.0, 1.0, 1.0, 2.0], Y4), INCREASING + r", got times\[2\] = 1"),
    (lambda: Cubic([0.0, 2.0, 1.0, 3.0], Y4), INCREASING),
    (lambda: Cubic([0.0], [1.0]), r"`times` must hold at least 2"),
    (lambda: Cubic(X4, [0.0, NAN, 1.0, 2.0]), r"`values` must be finite"),
    (lambda: Cubic([0.0, INF, 1.0, 2.0], Y4), r"`times` must be finite"),
    (lambda: Cubic(X4, Y4[:3]), r"`values` must hold 4 entries"),
    (lambda: Cubic(X4, Y4, bc_type="periodic"), r"`bc_type` must be one of"),
    # (Under the jaxtyping plugin of the tests, beartype names `bc_type` first.)
    (lambda: Cubic(X4, Y4, bc_type=None), r"bc_type"),  # type: ignore[arg-type]
    (lambda: Cubic(X4 + 0j, Y4), r"`times` must be real"),
    (lambda: Cubic(X4[None], Y4), r"`times` must be a 1-d array"),
    (lambda: Cubic(X4, np.ones((4, 2))), r"`values` must be a 1-d array"),
    (lambda: Cubic(X4, np.array(list("abcd"))), r"`values` must be a numeric array"),
    (lambda: Linear([1.0], [1.0]), r"PiecewiseLinear`: `times` must hold at least 2"),
    (lambda: Linear(X4[::-1], Y4), r"PiecewiseLinear`: " + INCREASING),
    (lambda: Linear(X4, [1.0, INF, 0.0, 0.0]), r"`values` must be finite"),
    (lambda: Constant(X4, Y4), r"`values` must hold 3 entries \(len\(edges\) - 1\)"),
    (lambda: Constant([0.0], []), r"`edges` must hold at least 2"),
    (lambda: Constant([0.0, 0.0], [1.0]), r"`edges` must be strictly increasing"),
    (lambda: Constant(X4, [1.0, NAN, 2.0]), r"`values` must be finite"),
]


@pytest.mark.parametrize("make,match", BAD_INPUT)
def test_bad_input(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_traced_knots_are_checked_in_the_compiled_call():
    @jax.jit
    def value(times):
        return hierax.CubicSpline(times, Y4)(1.5)

    assert np.isfinite(value(jnp.asarray(X4)))
    with pytest.raises(Exception, match="`times` must be strictly increasing"):
        value(jnp.asarray([0.0, 2.0, 1.0, 3.0])).block_until_ready()


# ----------------------------------------------------------------------------------
# Series that end: `series_degree`, and the solves that read it
# ----------------------------------------------------------------------------------


def _degree_cases(x, y):
    """Time functions by name, with the degree their series end at."""
    spline = hierax.CubicSpline(x, y)
    linear = hierax.PiecewiseLinear(x, y.real)
    quadratic = hierax.Polynomial(np.array([0.3, -1.2, 0.5]))
    return {
        "constant": (hierax.Constant(1.5), 0),
        "quadratic": (quadratic, 2),
        "piecewise constant": (hierax.PiecewiseConstant(x, y[:-1]), 0),
        "piecewise linear": (linear, 1),
        "cubic spline": (spline, 3),
        "spline plus line": (spline + linear, 3),
        "spline times quadratic": (spline * quadratic, 5),
        "cosine": (hierax.Cos(1.3), None),
        "spline times cosine": (spline * hierax.Cos(1.3), None),
    }


def test_series_end_at_their_degree():
    """Every series above a function's `series_degree` is exactly zero, inside
    a segment, at a knot and outside the samples, and the coefficient at the degree
    is not (the bound is the degree, not just a bound); a function whose series
    goes on says `None`, and `has_constant_series` is degree 0."""
    rng = np.random.default_rng(11)
    x = _knots(rng, 6)
    y = rng.normal(size=6) + 1j * rng.normal(size=6)
    cases = _degree_cases(x, y)
    ts = jnp.asarray(_points(rng, x))
    order = 8
    series = eqx.filter_jit(
        lambda fs, ts: {
            name: jax.vmap(lambda t, f=f: f.series(t, order, jnp.asarray(0.6)))(ts)
            for name, (f, _) in fs.items()
        }
    )(cases, ts)
    for name, (f, degree) in cases.items():
        assert f.series_degree == degree, name
        assert f.has_constant_series == (degree == 0), name
        coefficients = np.asarray(series[name])
        if degree is None:
            assert np.max(np.abs(coefficients[:, -1])) > 1e-6, name
            continue
        np.testing.assert_array_equal(coefficients[:, degree + 1 :], 0.0, name)
        assert np.max(np.abs(coefficients[:, degree])) > 1e-3, name


def test_operators_know_where_their_series_end():
    """An operator's `series_degree` from its structure: the largest of its terms',
    of a sum's parts', a scaled operator's plus its function's, and unknown for a
    callable or wherever one term goes on."""
    from hierax._operators import series_degree

    x = np.linspace(0.0, 2.0, 5)
    spline = hierax.CubicSpline(x, np.sin(x))
    linear = hierax.PiecewiseLinear(x, np.cos(x))
    terms = hierax.TimeOperator([1.0, spline, linear], [SIGMA_Z, SIGMA_X, SIGMA_Z])
    assert series_degree(terms) == 3
    assert series_degree(hierax.TimeOperator([1.0], [SIGMA_Z])) == 0
    ramp = hierax.Polynomial(np.array([0.0, 1.0]))
    assert series_degree(hierax.ScaledOperator(ramp, terms)) == 4
    assert series_degree(hierax.OperatorSum([terms, linear * SIGMA_X])) == 3
    assert series_degree(terms + hierax.Cos(1.0) * SIGMA_X) is None
    assert series_degree(hierax.as_operator(lambda t: jnp.cos(t) * SIGMA_X)) is None


def _qutrit_drives():
    a = np.diag([1.0, np.sqrt(2.0)], 1)
    drift = np.diag([0.0, 0.1, -1.8])
    return drift, (a + a.T) / 2, 1j * (a.T - a) / 2


def _steps_against_the_full_window(hamiltonian, values, y, step):
    """One step's series (of `step` from 0.7) of `hamiltonian(values)` from `y` and
    the reverse-mode derivative of a weighted sum of their squares with respect to
    `values`, with the operator's `series_degree` and with it hidden from the
    kernel (the full Cauchy product): equal to rounding."""
    from hierax._solvers import _term

    def terms(values, known):
        operator = _term.SchrodingerTerm(hamiltonian(values)).hamiltonian
        with pytest.MonkeyPatch.context() as patch:
            if not known:
                patch.setattr(_term, "series_degree", lambda operator: None)
            assert _term.series_degree(operator) == (3 if known else None)
            return _term.schrodinger_terms(
                operator, jnp.asarray(0.7), jnp.asarray(step), y, 20, adjoint=True
            )

    weights = jnp.arange(1.0, 22.0)[(...,) + (None,) * y.ndim]

    def loss(values, known):
        return jnp.sum(jnp.abs(terms(values, known) * weights) ** 2)

    ours = jax.jit(lambda v: (terms(v, True), jax.grad(loss)(v, True)))(values)
    full = jax.jit(lambda v: (terms(v, False), jax.grad(loss)(v, False)))(values)
    for mine, theirs in zip(ours, full):
        scale = float(np.max(np.abs(theirs)))
        assert (
            float(np.max(np.abs(np.asarray(mine) - np.asarray(theirs))))
            <= 1e-14 * scale
        )
    assert float(np.max(np.abs(np.asarray(full[0][-1])))) > 0


def _spline_reference(x, values, span):
    """|<1|psi(span)>|^2 for the qutrit under scipy's not-a-knot spline of `values`
    on the x quadrature and `numpy.interp` of 0.3 cos on the y quadrature, by
    DOP853 from knot to knot at rtol 1e-12."""
    from scipy.integrate import solve_ivp

    drift, drive_x, drive_y = _qutrit_drives()
    spline = scipy.interpolate.CubicSpline(x, values)
    linear = 0.3 * np.cos(x)

    def rhs(t, psi):
        h = drift + spline(t) * drive_x + np.interp(t, x, linear) * drive_y
        return -1j * h @ psi

    psi = np.array([1.0, 0.0, 0.0], complex)
    edges = np.concatenate([x[x < span], [span]])
    for t0, t1 in zip(edges[:-1], edges[1:]):
        psi = solve_ivp(rhs, (t0, t1), psi, "DOP853", rtol=1e-12, atol=1e-14).y[:, -1]
    return abs(psi[1]) ** 2


def test_sesolve_through_sampled_pulses_and_their_gradient():
    """A qutrit driven by a cubic spline and a piecewise-linear pulse (a tiny state:
    one product an order, reading the 4 latest terms only): the population and its
    gradient with respect to the spline's samples against scipy (DOP853 knot to
    knot; central differences for the gradient), and one step's series and its
    reverse-mode derivative equal to those of the full Cauchy product to
    rounding."""

    drift, drive_x, drive_y = _qutrit_drives()
    x = np.linspace(0.0, 3.0, 7)
    values = np.pi / 3 * np.sin(np.pi * x / 3) + np.array(
        [0, 0.1, -0.2, 0.1, 0, 0.2, 0]
    )
    span = 3.0

    def hamiltonian(values):
        functions = [
            1.0,
            hierax.CubicSpline(x, values),
            hierax.PiecewiseLinear(x, 0.3 * np.cos(x)),
        ]
        return hierax.TimeOperator(functions, [drift, drive_x, drive_y])

    @jax.jit
    def population(values):
        psi = hierax.sesolve(
            hamiltonian(values),
            jnp.array([1.0, 0, 0], complex),
            jnp.array([0.0, span]),
            rtol=1e-10,
            atol=1e-12,
        ).final_state
        return jnp.abs(psi[1]) ** 2

    value, gradient = jax.jit(jax.value_and_grad(population))(jnp.asarray(values))
    assert abs(float(value) - _spline_reference(x, values, span)) < 1e-9
    eps = 1e-5
    expected = [
        (
            _spline_reference(x, values + e, span)
            - _spline_reference(x, values - e, span)
        )
        / (2 * eps)
        for e in eps * np.eye(len(x))
    ]
    np.testing.assert_allclose(gradient, expected, rtol=1e-6, atol=1e-8)
    assert np.max(np.abs(expected)) > 1e-2

    # One step, against the full window (the degree hidden from the kernel).
    y = jnp.asarray(np.array([0.6, 0.3j, -0.2]) / np.linalg.norm([0.6, 0.3, 0.2]))
    _steps_against_the_full_window(hamiltonian, values, y, -0.45)


def test_the_window_loop_reads_only_the_terms_the_series_reach(monkeypatch):
    """Five levels under a cubic spline and a piecewise-linear pulse (the loop over
    terms, past the tiny states; the window shortened at any size here): one
    step's series of a ket and of a propagator, and their reverse-mode derivatives
    with respect to the samples, equal those of the full Cauchy product to
    rounding."""
    from hierax._kernels import propagator

    monkeypatch.setattr(propagator, "_DEGREE_WINDOW_SIZE", 0)
    levels = 5
    a = np.diag(np.sqrt(np.arange(1.0, levels)), 1)
    number = np.diag(np.arange(levels, dtype=float))
    drift = 0.1 * number - number @ (number - np.eye(levels))
    x = np.linspace(0.0, 3.0, 7)
    values = np.sin(x) + 0.3

    def hamiltonian(values):
        functions = [
            1.0,
            hierax.CubicSpline(x, values),
            hierax.PiecewiseLinear(x, 0.3 * np.cos(x)),
        ]
        return hierax.TimeOperator(functions, [drift, a + a.T, 1j * (a.T - a)])

    rng = np.random.default_rng(12)
    ket = rng.normal(size=levels) + 1j * rng.normal(size=levels)
    for y in (jnp.asarray(ket / np.linalg.norm(ket)), jnp.eye(levels, dtype=complex)):
        _steps_against_the_full_window(hamiltonian, values, y, 0.45)
