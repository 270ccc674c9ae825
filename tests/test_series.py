"""The series arithmetic against plain NumPy loops."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from hierax._series import (
    factorial_scale,
    power_series,
    scalar_cauchy_product,
    triangular_cauchy_product,
)


@pytest.mark.parametrize("order,n", [(0, 3), (1, 3), (6, 3), (7, 3), (7, 100)])
@pytest.mark.parametrize("transposed", [False, True])
def test_triangular_cauchy_product(order, n, transposed):
    # n = 100 takes the one-product-at-a-time path; the others the batched one.
    rng = np.random.default_rng(order + n)
    left = rng.normal(size=(order + 1, n, n)) + 1j * rng.normal(size=(order + 1, n, n))
    right = rng.normal(size=(order + 1, n, n)) + 1j * rng.normal(size=(order + 1, n, n))
    expected = np.stack(
        [sum(left[m] @ right[k - m] for m in range(k + 1)) for k in range(order + 1)]
    )
    given = np.swapaxes(left, 1, 2) if transposed else left
    got = triangular_cauchy_product(
        jnp.asarray(given), jnp.asarray(right), left_transposed=transposed
    )
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12 * n)
    scaled = triangular_cauchy_product(
        jnp.asarray(given), jnp.asarray(right), transposed, factorial=True
    )
    factorials = np.array([math.factorial(k) for k in range(order + 1)], float)
    np.testing.assert_allclose(
        scaled, expected * factorials[:, None, None], rtol=1e-12, atol=1e-10 * n
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


def test_factorial_scale_round_trip_and_overflow():
    x = jnp.linspace(1.0, 2.0, 171)  # 170! is the last finite factorial
    np.testing.assert_allclose(factorial_scale(factorial_scale(x), -1), x, rtol=1e-12)
    big = np.asarray(factorial_scale(jnp.ones(400)))
    assert big[170] == pytest.approx(float(math.factorial(170)), rel=1e-15)
    assert np.isinf(big[171]) and not np.any(np.isnan(big))
    tiny = np.asarray(factorial_scale(jnp.full(400, 1e-300)))  # 1e-300 * 200! is finite
    expected = math.exp(math.lgamma(201) - 300 * math.log(10))
    assert tiny[200] == pytest.approx(expected, rel=1e-11)
