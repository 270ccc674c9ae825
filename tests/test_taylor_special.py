"""`hierax.taylor` on special functions (log-gamma, digamma, polygamma, the scaled
Bessel functions `i0e` and `i1e`, the regularised incomplete gamma and beta
functions) against Taylor coefficients from mpmath at 200 digits (from its
polygamma, its Bessel functions of integer order, and `mp.taylor` of the elementary
densities), nested `jax.jvp` on general input series, and closed forms at the
edges."""

import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jss
import mpmath as mp
import numpy as np
import pytest
from jax.test_util import check_grads

import hierax
from hierax._taylor import expand, supported_primitives

from .test_taylor_jet_suite import assert_close, nested_jvp_coefficients
from .test_taylor_rules import _traced_size


def _psi(shift):
    """$\\psi^{(k + shift)}(t) / k!$ (`shift` = -1: log-gamma, its value at k = 0)."""

    def reference(t, order):
        value = [mp.log(abs(mp.gamma(t)))] if shift < 0 else []
        first = len(value)
        return value + [
            mp.psi(k + shift, t) / mp.factorial(k) for k in range(first, order + 1)
        ]

    return reference


def _bessel(nu):
    """Coefficients of $e^{-|x|} I_\\nu(x)$ at $t \\ne 0$, from
    $I_\\nu^{(k)} = 2^{-k} \\sum_j \\binom{k}{j} I_{\\nu - k + 2j}$ times those of
    $e^{-\\operatorname{sign}(t) x}$."""

    def reference(t, order):
        # I_{-n} = I_n, and I_n(-a) = (-1)^n I_n(a).
        i = [
            (-1) ** n * mp.besseli(n, -t) if t < 0 else mp.besseli(n, t)
            for n in range(order + nu + 1)
        ]
        d = [
            sum(mp.binomial(k, j) * i[abs(nu - k + 2 * j)] for j in range(k + 1))
            / (2**k * mp.factorial(k))
            for k in range(order + 1)
        ]
        e = [(-mp.sign(t)) ** k / mp.factorial(k) for k in range(order + 1)]
        scale = mp.exp(-abs(t))
        return [
            scale * sum(d[m] * e[k - m] for m in range(k + 1)) for k in range(order + 1)
        ]

    return reference


def _from_derivative(value, derivative):
    """$c_0$ = `value(t)`, $c_k$ = coefficient $k - 1$ of the elementary `derivative`
    over $k$."""

    def reference(t, order):
        slope = mp.taylor(derivative, t, order - 1)
        return [value(t)] + [slope[k - 1] / k for k in range(1, order + 1)]

    return reference


def _reference(reference, t, order):
    with mp.workdps(200):  # i0e at 1e4: coefficient 12 is 1e-48 of coefficient 0
        return np.array([float(c) for c in reference(mp.mpf(float(t)), order)])


def _gamma_density(x):
    return x**1.5 * mp.exp(-x) / mp.gamma(2.5)


def _beta_density(x):
    return x**1.5 * (1 - x) ** 0.5 / mp.beta(2.5, 1.5)


# name: (JAX function, mpmath coefficients, points; half-integers, tiny, large and
# negative arguments among them)
SPECIAL = {
    "gammaln": (jss.gammaln, _psi(-1), [-10.3, -3.9, -0.5, 1e-3, 0.3, 1.0, 50.0, 1e4]),
    "digamma": (jss.digamma, _psi(0), [-10.3, -0.5, 1e-3, 0.3, 0.5, 2.5, 50.0, 1e4]),
    "polygamma_1": (lambda x: jss.polygamma(1, x), _psi(1), [1e-3, 0.3, 2.5, 50.0]),
    "polygamma_3": (lambda x: jss.polygamma(3, x), _psi(3), [0.3, 2.5, 50.0]),
    "i0e": (jss.i0e, _bessel(0), [-100.0, -2.0, 1e-3, 0.5, 13.25, 100.0, 1e4]),
    "i1e": (jss.i1e, _bessel(1), [-100.0, -2.0, 1e-3, 0.5, 13.25, 100.0, 1e4]),
    "gammainc": (
        lambda x: jss.gammainc(2.5, x),
        _from_derivative(
            lambda x: mp.gammainc(2.5, 0, x, regularized=True), _gamma_density
        ),
        [0.5, 2.0, 7.0],
    ),
    "gammaincc": (
        lambda x: jss.gammaincc(2.5, x),
        _from_derivative(
            lambda x: mp.gammainc(2.5, x, mp.inf, regularized=True),
            lambda x: -_gamma_density(x),
        ),
        [0.5, 2.0, 7.0],
    ),
    "betainc": (
        lambda x: jss.betainc(2.5, 1.5, x),
        _from_derivative(
            lambda x: mp.betainc(2.5, 1.5, 0, x, regularized=True), _beta_density
        ),
        [0.2, 0.7],
    ),
}


@pytest.mark.parametrize("name", sorted(SPECIAL))
def test_order_12_against_mpmath(name):
    # Coefficient by coefficient (no scale shared between them): the coefficients
    # of i0e at 100 fall like 100^-k, those of gammaln at 1e-3 grow like 1000^k.
    fn, exact, points = SPECIAL[name]
    for t in points:
        series = np.asarray(hierax.taylor(fn, t, 12))
        np.testing.assert_allclose(
            series, _reference(exact, t, 12), rtol=1e-13, atol=0, err_msg=f"t = {t}"
        )


def test_order_30_against_mpmath():
    for fn, exact, t in [
        (jss.gammaln, _psi(-1), 2.5),
        (jss.i0e, _bessel(0), 7.0),
        (jss.i1e, _bessel(1), -30.0),
    ]:
        series = np.asarray(hierax.taylor(fn, t, 30))
        np.testing.assert_allclose(series, _reference(exact, t, 30), rtol=1e-13)


@pytest.mark.parametrize("name", sorted(SPECIAL))
def test_float32(name):
    fn, exact, points = SPECIAL[name]
    t = np.float32(points[len(points) // 2])
    series = hierax.taylor(fn, t, 8)
    assert series.dtype == jnp.float32
    reference = _reference(exact, t, 8)
    error = np.max(np.abs(np.asarray(series, np.float64) - reference))
    assert error <= 2e-5 * np.max(np.abs(reference)), error


def _on_curve(fn, lims):
    """`fn` along a random polynomial curve in the rule's argument (the last)."""

    def build(rng):
        lo, hi = lims
        primal = lo + (hi - lo) * rng.random((2, 3))
        return jnp.asarray(
            np.concatenate([primal[None], rng.standard_normal((3, 2, 3))])
        )

    return fn, build


GENERAL_SERIES = {
    "gammaln": _on_curve(jss.gammaln, (-3.0, 4.0)),
    "digamma": _on_curve(jss.digamma, (-3.0, 4.0)),
    "polygamma": _on_curve(lambda x: jss.polygamma(2, x), (0.2, 4.0)),
    "i0e": _on_curve(jss.i0e, (-20.0, 20.0)),
    "i1e": _on_curve(jss.i1e, (-20.0, 20.0)),
    "gammainc": _on_curve(
        lambda x: jss.gammainc(jnp.array([[1.0, 2.5, 4.0]]), x), (0.1, 5.0)
    ),
    "gammaincc": _on_curve(lambda x: jss.gammaincc(3.5, x), (0.1, 5.0)),
    "betainc": _on_curve(lambda x: jss.betainc(2.5, 1.5, x), (0.05, 0.95)),
}


@pytest.mark.parametrize("name", sorted(GENERAL_SERIES))
def test_general_input_series_against_nested_jvp(name):
    fn, build = GENERAL_SERIES[name]
    x = build(np.random.default_rng(len(name)))
    ours, nested = jax.jit(
        lambda x: (expand(fn, x), nested_jvp_coefficients(fn, [x], 3))
    )(x)
    assert_close(ours, nested, rtol=1e-12)


def test_bessel_at_zero():
    """At x = 0, where |x| has its kink, JAX's derivative takes sign(0) = 0: the
    coefficients are I_0's and I_1's, without NaN (i1e'(x) has 1/x in it)."""
    i0 = [1 / (4**m * math.factorial(m) ** 2) for m in range(4)]
    i1 = [1 / (2 * 4**m * math.factorial(m) * math.factorial(m + 1)) for m in range(4)]
    np.testing.assert_allclose(
        hierax.taylor(jss.i0e, 0.0, 7), np.ravel(np.c_[i0, np.zeros(4)]), rtol=1e-15
    )
    np.testing.assert_allclose(
        hierax.taylor(jss.i1e, 0.0, 7), np.ravel(np.c_[np.zeros(4), i1]), rtol=1e-15
    )
    # The first derivative is JAX's own.
    for fn in (jss.i0e, jss.i1e):
        assert hierax.taylor(fn, 0.0, 1)[1] == jax.grad(fn)(0.0)


def test_incomplete_gamma_and_beta_at_the_ends():
    """Where x^(a-1) has a zero base, JAX's derivative is NaN (a = 1: 0 * log 0) or
    its own derivative is; integer parameters give polynomials times exponentials
    there, exact here."""
    e = [(-1) ** k / math.factorial(k) for k in range(6)]
    np.testing.assert_allclose(  # P(1, x) = 1 - e^-x
        hierax.taylor(lambda x: jss.gammainc(1.0, x), 0.0, 5), [0] + [-c for c in e[1:]]
    )
    np.testing.assert_allclose(  # P(3, x) = x^3/6 - x^4/8 + x^5/20 - ...
        hierax.taylor(lambda x: jss.gammainc(3.0, x), 0.0, 5),
        [0, 0, 0, 1 / 6, -1 / 8, 1 / 20],
        rtol=1e-15,
    )
    # A non-integer a: x^a is not analytic at 0; the finite coefficients and the
    # infinite or NaN ones as nested jax.jvp.
    for a in (0.5, 2.5):
        fn = lambda x, a=a: jss.gammainc(a, x)
        series = np.asarray(hierax.taylor(fn, 0.0, 3))
        nested = np.asarray(nested_jvp_coefficients(fn, [jnp.array([0.0, 1.0])], 3))
        finite = np.isfinite(nested)
        np.testing.assert_array_equal(np.isfinite(series), finite)
        np.testing.assert_array_equal(series[finite], nested[finite])
    # I_x(2, 3)' = 12 x (1 - x)^2 at both ends
    np.testing.assert_allclose(
        hierax.taylor(lambda x: jss.betainc(2.0, 3.0, x), 0.0, 5), [0, 0, 6, -8, 3, 0]
    )
    np.testing.assert_allclose(
        hierax.taylor(lambda x: jss.betainc(2.0, 3.0, x), 1.0, 5),
        [1, 0, 0, 4, 3, 0],
        atol=1e-15,
    )


def test_poles_as_jax():
    """At a pole of gammaln and digamma the value is JAX's and the coefficients
    above are not finite (NaN or infinite), as nested `jax.jvp` gives."""
    for fn in (jss.gammaln, jss.digamma):
        for t in (0.0, -1.0, -2.0):
            series = np.asarray(hierax.taylor(fn, t, 3))
            nested = np.asarray(nested_jvp_coefficients(fn, [jnp.array([t, 1.0])], 3))
            np.testing.assert_array_equal(series[0], fn(t))
            np.testing.assert_array_equal(np.isfinite(series), np.isfinite(nested))


def test_gradients_through_the_rules():
    """Reverse-mode derivatives through every rule, in one program: the
    vector of each function's loss, checked against finite differences (a
    random cotangent weighs every entry)."""
    fns = (
        jss.gammaln,
        jss.digamma,
        lambda x: jss.polygamma(2, x),
        jss.i0e,
        jss.i1e,
        lambda x: jss.gammainc(2.5, x),
        lambda x: jss.betainc(2.5, 1.5, x / 2),
    )

    def losses(w):
        series = [hierax.taylor(lambda t, f=f: f(w * t + 0.4), 0.5, 6) for f in fns]
        return jnp.stack([jnp.sum(s**2) for s in series])

    check_grads(jax.jit(losses), (jnp.asarray(0.7),), order=1, modes=["rev"])


def test_refusals():
    # The order of polygamma must be known when tracing; shape parameters constant.
    with pytest.raises(NotImplementedError, match="'polygamma'.*known when tracing"):
        jax.jit(lambda n: hierax.taylor(lambda t: jss.polygamma(n, t), 0.5, 3))(1)
    with pytest.raises(NotImplementedError, match="'igamma'.*shape parameter"):
        hierax.taylor(lambda t: jss.gammainc(1 + t, 2.0), 0.5, 3)
    with pytest.raises(NotImplementedError, match="'regularized_incomplete_beta'"):
        hierax.taylor(lambda t: jss.betainc(2.0, 1 + t, 0.5), 0.5, 3)


def test_listed_and_program_size_flat_in_order():
    names = supported_primitives()
    for name in ("lgamma", "digamma", "polygamma", "bessel_i0e", "bessel_i1e"):
        assert name in names
    for fn in (jss.gammaln, jss.i1e):
        assert _traced_size(fn, 10) == _traced_size(fn, 100)
