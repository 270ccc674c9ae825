import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp

import hierax

from .helpers import SIGMA_X


t = sp.Symbol("t", real=True)
ORDER = 14
T0 = sp.Rational(7, 10)


def _sympy_series(expr, order=ORDER, t0=T0):
    out = []
    d = expr
    for j in range(order + 1):
        out.append(complex(sp.N(d.subs(t, t0), 30)) / float(sp.factorial(j)))
        d = sp.diff(d, t)
    return np.array(out)


CASES = [
    ("constant", lambda: hierax.Constant(2.5 - 1j), 2.5 - sp.I),
    (
        "polynomial",
        lambda: hierax.Polynomial(jnp.array([1.0, -2.0, 0.5, 3.0])),
        1 - 2 * t + t**2 / 2 + 3 * t**3,
    ),
    (
        # More coefficients than Horner's rule is unrolled for: the loop.
        "polynomial-long",
        lambda: hierax.Polynomial(
            jnp.array([(-1.0) ** k / (k + 1) for k in range(20)])
        ),
        sum(sp.Integer(-1) ** k / (k + 1) * t**k for k in range(20)),
    ),
    (
        "cos",
        lambda: hierax.Cos(1.7, 0.3, 0.5),
        sp.Rational(1, 2) * sp.cos(sp.Rational(17, 10) * t + sp.Rational(3, 10)),
    ),
    (
        "sin",
        lambda: hierax.Sin(-2.0, 1.0, 1.5j),
        sp.Rational(3, 2) * sp.I * sp.sin(-2 * t + 1),
    ),
    (
        "exp-complex",
        lambda: hierax.Exp(-0.5 + 2j, 0.75),
        sp.Rational(3, 4) * sp.exp((-sp.Rational(1, 2) + 2 * sp.I) * t),
    ),
    (
        "gaussian",
        lambda: hierax.Gaussian(0.2, 0.4, 2.0),
        2 * sp.exp(-((t - sp.Rational(1, 5)) ** 2) / (2 * sp.Rational(2, 5) ** 2)),
    ),
    (
        "sum",
        lambda: hierax.Cos(1.7) + 3.0 * hierax.Exp(0.5) - 1.0,
        sp.cos(sp.Rational(17, 10) * t) + 3 * sp.exp(t / 2) - 1,
    ),
    (
        "product",
        lambda: hierax.Gaussian(0.0, 1.0) * hierax.Sin(3.0) * 2,
        2 * sp.exp(-(t**2) / 2) * sp.sin(3 * t),
    ),
    (
        "function",
        lambda: hierax.CallableTimeFunction(lambda s: jnp.tanh(s) * jnp.exp(-s)),
        sp.tanh(t) * sp.exp(-t),
    ),
]


@pytest.mark.parametrize("name,make,expr", CASES, ids=[c[0] for c in CASES])
def test_series_against_sympy(name, make, expr):
    f = make()
    order = 8 if name == "function" else ORDER
    series = np.asarray(f.taylor(float(T0), order))
    expected = _sympy_series(expr, order)
    assert series.shape == (order + 1,)
    scale = np.maximum(np.abs(expected), 1e-300)
    assert np.all(
        np.abs(series - expected)
        <= 1e-12 * np.maximum(scale, np.max(np.abs(expected)) * 1e-3)
    ), (
        series,
        expected,
    )
    np.testing.assert_allclose(f(float(T0)), expected[0], rtol=1e-13)


def test_gaussian_high_order_no_overflow():
    series = np.asarray(hierax.Gaussian(0.0, 0.05).taylor(0.01, 300))
    assert np.all(np.isfinite(series))
    cos = np.asarray(hierax.Cos(3.0).taylor(0.0, 400))
    assert np.all(np.isfinite(cos)) and cos[0] == 1.0


@pytest.mark.parametrize(
    "dtype, t, order, scale",
    [
        (np.float32, 8.0, 40, None),
        (np.float32, 5.0, 60, 8.0),
        (np.float32, 8.0, 60, 8.0),
        (np.float64, 8.0, 200, 8.0),
        (np.float64, 0.3, 120, 1.0),
    ],
)
def test_gaussian_high_orders_do_not_underflow(dtype, t, order, scale):
    """Coefficients well inside the dtype's range come out, against mpmath at 120
    digits: the recurrence's scaled terms fell like 1/j! far in the tail and
    underflowed (float32 from order 31 at x = 8, a coefficient of 9.5e8 at order 40
    with scale 8 read 0; float64 from 173). The reference: the Taylor coefficients
    of f(s) = e^{-s^2/2} at t from its equation f' = -s f, (k + 1) c_{k+1} =
    -(t c_k + c_{k-1}), checked against mpmath's numerical derivatives to order
    12 (`mpmath.taylor` to order 200 took 12 s)."""
    import mpmath

    mpmath.mp.dps = 120
    x = mpmath.mpf(t)
    c = [mpmath.exp(-(x**2) / 2)]
    c.append(-x * c[0])
    for k in range(1, order):
        c.append(-(x * c[k] + c[k - 1]) / (k + 1))
    gaussian = lambda s: mpmath.exp(-(s**2) / 2)  # noqa: E731
    for ci, di in zip(c, mpmath.taylor(gaussian, x, 12), strict=False):
        assert abs(ci - di) <= mpmath.mpf(10) ** -40 * abs(c[0]), (ci, di)
    s = 1 if scale is None else scale
    exact = np.array([float(ci * mpmath.mpf(s) ** i) for i, ci in enumerate(c)])
    f = hierax.Gaussian(dtype(0.0), dtype(1.0))
    time_scale = None if scale is None else jnp.asarray(scale, dtype)
    got = np.asarray(f.series(jnp.asarray(t, dtype), order, time_scale))
    assert got.dtype == dtype
    # Where the exact value is a normal number of the dtype (sqrt of the smallest
    # normal: the largest relative error of float32's rounding stays small).
    normal = np.abs(exact) > np.sqrt(np.finfo(dtype).tiny)
    assert normal.sum() > order // 2
    rtol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got[normal], exact[normal], rtol=rtol)


def test_parameters_are_differentiable():
    def value(freq):
        return hierax.Cos(freq, 0.1).taylor(0.3, 5)[3]

    grad = jax.grad(value)(1.2)
    eps = 1e-6
    fd = (value(1.2 + eps) - value(1.2 - eps)) / (2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=1e-7)


def test_float32_stays_float32():
    series = hierax.Cos(jnp.float32(2.0)).taylor(jnp.float32(0.5), 6)
    assert series.dtype == jnp.float32


@pytest.mark.parametrize("name,make,expr", CASES, ids=[c[0] for c in CASES])
def test_scaled_series(name, make, expr):
    """`series(t, order, s)` is the series of sigma -> f(t + s sigma): c_j s^j, with
    the scale folded into each closed form's recurrence."""
    f = make()
    series = np.asarray(f.taylor(float(T0), 8))
    scaled = np.asarray(f.series(jnp.asarray(float(T0)), 8, jnp.asarray(3.0)))
    np.testing.assert_allclose(
        scaled, series * 3.0 ** np.arange(9), rtol=1e-12, atol=1e-14
    )


def test_former_names_are_gone():
    """The version 0.1 names were removed after their one version as aliases."""
    for name in (
        "AbstractCoefficient",
        "FunctionCoefficient",
        "CoefficientSum",
        "CoefficientProduct",
        "FunctionOperator",
    ):
        assert not hasattr(hierax, name), name


def test_polynomial_gradient_at_zero_coefficients():
    """Horner's rule on series: a coefficient that is exactly zero still carries
    its derivative, with and without a time scale (d c_j / d a_2 = binom(2, j)
    t^(2-j) s^j)."""
    t, s = 0.7, 3.0

    def coefficient(a2, j, scale):
        f = hierax.Polynomial(jnp.stack([0.3, 1.0, a2]))
        return f.series(jnp.asarray(t), 4, scale)[j]

    for scale in (None, jnp.asarray(s)):
        factor = 1.0 if scale is None else s
        for j, want in ((0, t**2), (1, 2 * t * factor), (2, factor**2), (3, 0.0)):
            got = jax.grad(coefficient)(jnp.asarray(0.0), j, scale)
            np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("name,make,expr", CASES, ids=[c[0] for c in CASES])
def test_series_at_complex_time(name, make, expr):
    """At a complex time every series is that of the analytic continuation (the
    Gaussian's once dropped its phase: exp(-x^2/2) has one for complex x)."""
    t0 = sp.Rational(3, 10) + sp.Rational(1, 5) * sp.I
    order = 6
    series = np.asarray(make().taylor(0.3 + 0.2j, order))
    expected = _sympy_series(expr, order, t0)
    np.testing.assert_allclose(series, expected, rtol=1e-12, atol=1e-14)


FOLDED = [
    ("constant", lambda: hierax.Constant(2.5 - 1j)),
    ("polynomial", lambda: hierax.Polynomial(jnp.array([1.0, -2.0, 0.5]))),
    ("cos", lambda: hierax.Cos(1.7, 0.3, 0.5)),
    ("sin", lambda: hierax.Sin(-2.0, 1.0, 1.5j)),
    ("exp", lambda: hierax.Exp(-0.5 + 2j, 0.75)),
    ("gaussian", lambda: hierax.Gaussian(0.2, 0.4, 2.0)),
    (
        "piecewise-linear",
        lambda: hierax.PiecewiseLinear(
            jnp.array([0.0, 1.0, 2.0]), jnp.array([0.0, 1, 3])
        ),
    ),
    (
        "piecewise-constant",
        lambda: hierax.PiecewiseConstant(
            jnp.array([0.0, 1.0, 2.0]), jnp.array([2.0, 1])
        ),
    ),
    (
        "cubic-spline",
        lambda: hierax.CubicSpline(
            jnp.linspace(0.0, 2.0, 5), jnp.array([0.0, 1, 3, 2, 1])
        ),
    ),
    ("sum", lambda: hierax.Cos(1.7) + hierax.Gaussian(0.1, 0.5)),
    ("product", lambda: hierax.Gaussian(0.0, 1.0) * hierax.Sin(3.0)),
]


def _constant_factors(f: hierax.AbstractTimeFunction) -> list:
    return [
        leaf
        for leaf in jax.tree_util.tree_leaves(
            f, is_leaf=lambda x: isinstance(x, hierax.Constant) and x is not f
        )
        if isinstance(leaf, hierax.Constant)
    ]


@pytest.mark.parametrize("name,make", FOLDED, ids=[c[0] for c in FOLDED])
def test_constant_factors_fold_into_the_amplitude(name, make):
    """`c * f`, `f * c` and `-f` are functions of f's kind (the amplitude, values or
    coefficients times c), with the series c times f's: a solve then computes one
    series where a product is two and their product, and drives of one kind
    scaled by different numbers stay one vectorised series."""
    f = make()
    series = np.asarray(f.taylor(0.7, 10))
    for c, scaled in [
        (-1.5 + 0.25j, (-1.5 + 0.25j) * f),
        (3.0, f * 3.0),
        (2.0, f * hierax.Constant(2.0)),
        (-1.0, -f),
    ]:
        assert type(scaled) is type(f)
        if name != "constant":
            assert not _constant_factors(scaled), scaled
        np.testing.assert_allclose(
            np.asarray(scaled.taylor(0.7, 10)), c * series, rtol=1e-14, atol=1e-15
        )


def test_folded_factor_is_traced_differentiable_and_keeps_precision():
    """A traced factor (`a * Cos(w)` inside a user's jit) folds too: new values
    reuse the program, its derivative is f's series, and a Python number never
    widens float32 parameters."""
    traces = []

    @jax.jit
    def series(a):
        traces.append(None)
        return (a * hierax.Cos(1.3, 0.2)).taylor(0.4, 6)

    reference = np.asarray(hierax.Cos(1.3, 0.2).taylor(0.4, 6))
    np.testing.assert_allclose(series(2.0), 2.0 * reference, rtol=1e-14)
    np.testing.assert_allclose(series(-0.5), -0.5 * reference, rtol=1e-14)
    assert len(traces) == 1
    derivative = jax.jacfwd(series)(0.7)
    np.testing.assert_allclose(derivative, reference, rtol=1e-14)
    gradient = jax.grad(lambda a: series(a)[3])(0.7)
    np.testing.assert_allclose(gradient, reference[3], rtol=1e-14)

    single = 2.0 * hierax.Cos(np.float32(1.3), amplitude=np.float32(0.5))
    assert single.amplitude.dtype == jnp.float32
    assert single.taylor(np.float32(0.4), 4).dtype == jnp.float32
    weak = 2.0 * hierax.Gaussian(0.0, 1.0)
    assert weak.amplitude.weak_type  # still widened by nothing
    # A traced number times an operator scales each term's function in place:
    # the drives of `a * H` keep their kinds (one vectorised series in a solve).
    sx = np.array([[0.0, 1.0], [1.0, 0.0]])
    h = hierax.Cos(1.0) * sx + hierax.Gaussian(0.0, 1.0) * (1j * sx)

    @jax.jit
    def kinds(a):
        scaled = a * h
        assert isinstance(scaled, hierax.TimeOperator)
        traces.append([type(f) for f in scaled.functions])
        return scaled.taylor(0.3, 4)

    np.testing.assert_allclose(
        kinds(0.5), 0.5 * np.asarray(h.taylor(0.3, 4)), rtol=1e-14
    )
    assert traces[-1] == [hierax.Cos, hierax.Gaussian]
    # A function with no amplitude of its own stays a product.
    g = hierax.CallableTimeFunction(jnp.tanh)
    assert isinstance(2.0 * g, hierax.TimeFunctionProduct)
    np.testing.assert_allclose(
        (2.0 * g).taylor(0.4, 5), 2.0 * np.asarray(g.taylor(0.4, 5)), rtol=1e-14
    )


def test_a_product_with_a_wrapped_sparse_matrix_names_the_product():
    # `np.asarray` of a sparse matrix is a 0-d object array: not a number to make a
    # `hierax.Constant` of, but an operand the product names, with the fix.
    import scipy.sparse

    wrapped = np.asarray(scipy.sparse.csr_matrix(np.eye(2)))
    for product in (lambda: hierax.Cos() * wrapped, lambda: wrapped * hierax.Cos()):
        with pytest.raises(TypeError) as info:
            product()
        message = str(info.value)
        assert "hierax.Cos * ..." in message and "hierax.Constant" not in message
        assert "sparse matrix itself" in message


def test_an_overflowing_complex_exponential_is_inf_not_nan():
    """e^{(100 + i) t} at t = 1 overflows float32: its value and series read inf,
    as `jnp.exp` gives, not the nan of inf times a complex number."""
    f = hierax.Exp(np.complex64(100 + 1j))
    t = jnp.asarray(1.0, jnp.float32)
    for out in (np.asarray(f(t)), np.asarray(f.taylor(t, 3))):
        assert out.dtype == np.complex64
        assert not np.any(np.isnan(out)) and np.all(np.isinf(np.real(out)))
    # Within range, against the closed form.
    g = hierax.Exp(-0.5 + 2j, 0.3)
    k = np.arange(4)
    exact = 0.3 * np.exp((-0.5 + 2j) * 1.5) * (-0.5 + 2j) ** k / [1, 1, 2, 6]
    np.testing.assert_allclose(np.asarray(g.taylor(1.5, 3)), exact, rtol=1e-14)


def test_a_numpy_scalar_factor_keeps_the_functions_precision():
    """A NumPy scalar times a time function is a number as a Python one is: its
    value kept exactly, its dtype not imposed. `np.float32(0.1) * Cos(w)` is
    float64 under x64 (the float32 factor had made the series float32, wrong from
    the 8th digit), and a float64 NumPy factor leaves a float32 function float32."""
    w, t0 = 1.3, 0.5
    k = np.arange(4)
    # d^k/dt^k cos(w t) / k! in NumPy float64.
    cos_series = np.cos(w * t0 + k * np.pi / 2) * w**k / [1, 1, 2, 6]
    for a in (np.float32(0.1), np.array(0.1, np.float32), np.complex64(0.1 + 0.2j)):
        exact = a.item() * cos_series  # the factor's exact value, in float64
        for f in (a * hierax.Cos(w), hierax.Cos(w) * a):
            series = f.taylor(t0, 3)
            assert series.dtype == exact.dtype
            np.testing.assert_allclose(
                np.asarray(series), exact, rtol=1e-15, atol=1e-16
            )
        h = a * (hierax.Cos(w) * SIGMA_X)
        np.testing.assert_allclose(
            np.asarray(h.taylor(t0, 3))[:, 0, 1], exact, rtol=1e-15, atol=1e-16
        )
        total = a + hierax.Cos(w)
        np.testing.assert_allclose(
            np.asarray(total(t0)), a.item() + cos_series[0], rtol=1e-15
        )
    # Neither a NumPy float64 nor a Python float widens a float32 function.
    single = hierax.Cos(np.float32(w), amplitude=np.float32(0.5))
    for a in (np.float64(2.0), 2.0, np.int64(2), 2):
        scaled = a * single
        assert scaled.amplitude.dtype == jnp.float32, type(a)
        assert scaled.taylor(np.float32(t0), 3).dtype == jnp.float32
    # A JAX array factor promotes by JAX's rules (a chosen dtype).
    assert (jnp.float32(2.0) * hierax.Cos(w)).amplitude.dtype == jnp.float32


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "rate,amplitude",
    [
        (1.0, 1 + 1j),  # A e^{t}: in range
        (-0.5, 2.0 - 3j),
        (100.0, 1 + 1j),  # e^{100} overflows float32: inf + inf i, not nan
        (800.0, 1 - 2j),  # ... and float64
        (100.0, 1e-30),  # e^{100} overflows float32, A e^{100} does not
        (100.0, 1e-30 + 2e-30j),
        (-800.0, 1e300),  # e^{-800} underflows float64, A e^{-800} does not
        (-800.0, 1e300 - 1e300j),
        (-120.0, 1e30 + 1e30j),  # ... and e^{-120} float32
    ],
)
def test_a_real_rate_exponential_is_its_closed_form_or_inf_never_nan(
    dtype, rate, amplitude
):
    """A e^{lambda t} with a real rate: its value and series against the closed
    form A e^{lambda t} lambda^j / j! (mpmath), the growth applied last as a real
    factor as for a complex rate: inf (with the amplitude's signs) where the true
    value overflows, the finite value where only e^{lambda t} alone would
    overflow or underflow, and never nan (inf times a complex amplitude was
    inf - inf = nan)."""
    import mpmath

    mpmath.mp.dps = 40
    complex_dtype = np.result_type(dtype, np.complex64)
    amplitude_dtype = complex_dtype if isinstance(amplitude, complex) else dtype
    if abs(amplitude) > float(np.finfo(dtype).max):
        pytest.skip("the amplitude is beyond this dtype's range")
    a = np.asarray(amplitude, amplitude_dtype)
    f = hierax.Exp(dtype(rate), a)
    t = jnp.asarray(1.0, dtype)
    order = 3
    big = float(np.finfo(dtype).max)
    tiny = float(np.finfo(dtype).tiny)
    exact = [
        mpmath.mpc(a.item())
        * mpmath.exp(rate)
        * mpmath.mpf(rate) ** j
        / mpmath.factorial(j)
        for j in range(order + 1)
    ]
    for got, want in [
        (np.asarray(f(t)), exact[:1]),
        (np.asarray(f.taylor(t, order)), exact),
    ]:
        got = np.atleast_1d(got)
        assert got.dtype == np.result_type(a.dtype, dtype)
        assert not np.isnan(got).any(), got
        for g, w in zip(got, want):
            for part, g_part in [(w.real, g.real), (w.imag, np.imag(g))]:
                if abs(part) > big:
                    assert np.isinf(g_part) and np.sign(g_part) == mpmath.sign(part)
                elif abs(part) >= tiny:
                    np.testing.assert_allclose(
                        g_part, float(part), rtol=8 * np.finfo(dtype).eps
                    )
                else:
                    assert abs(g_part) < 2 * tiny


def test_exponential_derivatives_with_respect_to_its_parameters():
    """d/d lambda and d/dA of A e^{lambda t} lambda^j / j! (the growth applied as
    a real factor carries its derivative), against the closed forms."""
    t, order = 0.7, 4
    j = np.arange(order + 1)
    fact = np.array([math.factorial(i) for i in j], float)

    def series(rate, amplitude):
        return hierax.Exp(rate, amplitude).taylor(t, order)

    for rate in (-1.3, 0.4):
        d_rate = jax.jacfwd(series, argnums=0)(rate, 2.0)
        exact = (
            2.0
            * np.exp(rate * t)
            * (t * rate**j + j * rate ** np.maximum(j - 1, 0))
            / fact
        )
        np.testing.assert_allclose(d_rate, exact, rtol=1e-13)
        d_amplitude = jax.jacrev(series, argnums=1)(rate, 2.0)
        np.testing.assert_allclose(
            d_amplitude, np.exp(rate * t) * rate**j / fact, rtol=1e-14
        )
