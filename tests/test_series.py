"""The series layer against plain NumPy and exact arithmetic."""

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hierax._data._series import (
    power_series,
    scalar_cauchy_product,
    times_exp,
    two_product,
)


def test_scalar_series():
    a, b = np.arange(1.0, 6.0), np.array([2.0, -1.0, 0.5, 0.0, 3.0])
    expected = [sum(a[m] * b[k - m] for m in range(k + 1)) for k in range(5)]
    np.testing.assert_allclose(
        scalar_cauchy_product(jnp.asarray(a), jnp.asarray(b)), expected
    )
    np.testing.assert_allclose(
        power_series(jnp.asarray(2.5), 6),
        [2.5**j / math.factorial(j) for j in range(7)],
        rtol=1e-15,
    )


@pytest.mark.parametrize("x", [2.5, -1.75, 0.0, 0.3 - 1.2j])
def test_power_series_derivatives_in_both_modes_and_the_second(x):
    """The derivative of x^j / j! (its own rule: the series shifted by one) against
    exact rationals, real, negative, zero and complex x; forward and reverse mode
    agree, and the second derivative is x^(j-2) / (j-2)!."""
    order = 12
    x = jnp.asarray(x)
    exact = [
        0 if j == 0 else complex(x) ** (j - 1) / math.factorial(j - 1)
        for j in range(order + 1)
    ]
    forward = jax.jacfwd(power_series, holomorphic=x.dtype.kind == "c")(x, order)
    np.testing.assert_allclose(forward, exact, rtol=1e-14, atol=1e-300)
    if x.dtype.kind == "f":
        reverse = jax.jacrev(power_series)(x, order)
        np.testing.assert_array_equal(reverse, forward)
        second = jax.jacfwd(jax.jacrev(power_series))(x, order)
        exact = [
            0 if j < 2 else float(x) ** (j - 2) / math.factorial(j - 2)
            for j in range(order + 1)
        ]
        np.testing.assert_allclose(second, exact, rtol=1e-14, atol=1e-300)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_two_product_is_error_free(dtype):
    """p + e equals a * b exactly (checked with rationals)."""
    rng = np.random.default_rng(0)
    for a, b in rng.uniform(-1e6, 1e6, size=(20, 2)).astype(dtype):
        p, e = two_product(jnp.asarray(a), jnp.asarray(b))
        exact = Fraction(float(a)) * Fraction(float(b))
        assert Fraction(float(p)) + Fraction(float(e)) == exact


def test_times_exp_reaches_every_representable_result():
    """Factors far beyond the float range, applied to values at the other end:
    the finite true results come out right, overflow reads inf, and zeros stay
    zero (no 0 * inf = nan), with the factor as the derivative at zero."""
    values = jnp.asarray([1e-300, 1e300, 0.0, 1.0 + 1e-300j, 2.0])
    exponent = jnp.asarray([1300.0, -1300.0, 5000.0, 1000.0, 800.0])
    got = np.asarray(times_exp(values.astype(complex), exponent))
    want_log = np.log(1e-300) + 1300.0
    np.testing.assert_allclose(got[0].real, math.exp(want_log), rtol=1e-12)
    np.testing.assert_allclose(
        got[1].real, math.exp(np.log(1e300) - 1300.0), rtol=1e-12
    )
    assert got[2] == 0
    assert np.isinf(got[3].real) and not np.isnan(got[3]).any()
    assert np.isinf(got[4].real)
    grad = jax.grad(lambda x: times_exp(x[None], jnp.asarray([3.0]))[0])(0.0)
    np.testing.assert_allclose(grad, math.exp(3.0), rtol=1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp_is_within_an_ulp_everywhere(dtype):
    """`exp` (range reduction and a polynomial: what the time functions use, since
    XLA's float32 `exp` is off by 30 ulp on a TPU) against mpmath at 40 digits:
    within 1.05 ulp over the finite range, inf and 0 exactly where e^x overflows
    and underflows (also within one ulp of the largest finite value), nan for nan,
    and its derivative e^x."""
    import mpmath

    from hierax._data import exp

    mpmath.mp.dps = 40
    info = np.finfo(dtype)
    top = float(np.log(info.max))
    rng = np.random.default_rng(3)
    x = np.concatenate(
        [
            rng.uniform(-top, top, 3000),
            rng.uniform(-1, 1, 1000),
            [0.0, -0.0, top, top - 1e-3, np.log(info.tiny), 1e-30],
        ]
    ).astype(dtype)
    got = np.asarray(exp(jnp.asarray(x))).astype(np.float64)
    exact = np.array([float(mpmath.exp(mpmath.mpf(float(v)))) for v in x])
    normal = (exact >= info.tiny) & (exact <= info.max)
    assert np.all(got[exact > info.max] == np.inf)
    ulp = np.spacing(exact[normal].astype(dtype)).astype(np.float64)
    assert np.max(np.abs(got[normal] - exact[normal]) / ulp) <= 1.05
    edges = jnp.asarray([top + 1, -top - 200, np.inf, -np.inf, np.nan], dtype)
    out = np.asarray(exp(edges))
    assert out[0] == np.inf and out[1] == 0 and out[2] == np.inf and out[3] == 0
    assert np.isnan(out[4])
    g = jax.grad(exp)(jnp.asarray(0.7, dtype))
    assert abs(float(g) - np.exp(0.7)) <= 4 * float(np.spacing(dtype(np.exp(0.7))))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_times_exp_in_range_is_one_exp_and_one_product(dtype):
    """A factor in the finite range is applied at once: `times_exp(x, E)` is
    `x * exp(E)` to the bit (four equal steps rounded four times and carried
    four times `exp`'s error: 3 ulp against mpmath where `exp` is within 1)."""
    import mpmath

    from hierax._data import exp

    mpmath.mp.dps = 40
    top = 0.99 * float(np.log(np.finfo(dtype).max))
    # (Products in the normal range: a subnormal one has fewer digits.)
    exponent = np.random.default_rng(0).uniform(2 - top, top, 400).astype(dtype)
    x = np.random.default_rng(1).uniform(0.5, 2.0, 400).astype(dtype)
    got = np.asarray(times_exp(jnp.asarray(x), jnp.asarray(exponent)))
    np.testing.assert_array_equal(got, x * np.asarray(exp(jnp.asarray(exponent))))
    # The error in mpmath (the exact value rounded to `dtype` first would add up
    # to half an ulp): `exp` is within 1.05 ulp, and the product rounds once.
    ulps = [
        abs(mpmath.mpf(float(g)) - mpmath.mpf(float(a)) * mpmath.exp(float(e)))
        / float(np.spacing(g))
        for g, a, e in zip(got, x, exponent)
    ]
    assert max(ulps) <= 1.6, max(ulps)
