"""`hierax.Recursion` against the seed's known values, the naive nested-`jacfwd`
recursion, and an exact SymPy polynomial recursion."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp
from jax.test_util import check_grads

from hierax import Recursion

from .helpers import SEED_EXACT, SIGMA_X, SIGMA_Y, jacfwd_levels, relative_error


def commutator_herm(a, b):
    ab = a @ b
    return ab - ab.conj().T


def seed_step(t, x, dx):
    # As the physicist wrote it: X_k = i [H, X_{k-1}] + dX_{k-1}/dt, H = cos(t) sigma_y.
    return 1j * commutator_herm(jnp.cos(t) * SIGMA_Y, x) + dx


def test_seed_known_values():
    levels = Recursion(seed_step, SIGMA_X, order=9)(1.0)
    assert levels.shape == (10, 2, 2)
    for k, row in SEED_EXACT.items():
        np.testing.assert_allclose(levels[k, 0], row, rtol=1e-12)


def test_seed_against_naive_recursion():
    ours = Recursion(seed_step, SIGMA_X, order=9)(1.0)
    naive = jacfwd_levels(seed_step, lambda t: SIGMA_X.astype(complex), 1.0, 5)
    for k in range(6):
        assert relative_error(ours[k], naive[k]) <= 1e-12, k


def test_time_dependent_pytree_nonlinear_against_naive():
    # A pytree state, a callable initial value and a nonlinear step.
    def initial(t):
        return {"a": jnp.array([jnp.sin(t), jnp.cos(2 * t)]), "b": jnp.exp(-t)}

    def step(t, x, dx):
        return {
            "a": jnp.tanh(x["a"]) * x["b"] + dx["a"] * t,
            "b": jnp.sum(x["a"] ** 2) + dx["b"] / (1 + x["b"] ** 2),
        }

    ours = Recursion(step, initial, order=6)(0.4)
    naive = jacfwd_levels(step, initial, 0.4, 4)
    for k in range(5):
        for key in ("a", "b"):
            assert relative_error(ours[key][k], naive[key][k]) <= 1e-12, (k, key)


def test_nonlinear_recursion_against_sympy():
    # X_k = X_{k-1} @ X_{k-1} + dX_{k-1}/dt with a polynomial X_0: every level is a
    # matrix of integer polynomials (degree 512 at level 8), exact in SymPy.
    s = sp.Symbol("s")
    poly = lambda expression: sp.Poly(expression, s, domain="ZZ")
    x = [[poly(1 + s), poly(s**2)], [poly(-1 + 0 * s), poly(2 - s)]]
    half = sp.Rational(1, 2)
    exact = []
    for _ in range(9):
        exact.append([[float(p.as_expr().subs(s, half)) for p in row] for row in x])
        square = [
            [x[i][0] * x[0][j] + x[i][1] * x[1][j] for j in range(2)] for i in range(2)
        ]
        x = [[square[i][j] + x[i][j].diff(s) for j in range(2)] for i in range(2)]

    def initial(t):
        return jnp.array([[1 + t, t**2], [-1 + 0 * t, 2 - t]])

    ours = Recursion(lambda t, x, dx: x @ x + dx, initial, order=8)(0.5)
    for k in range(9):
        assert relative_error(ours[k], exact[k]) <= 1e-12, k


class _Drive(eqx.Module):
    amplitude: jax.Array

    def __call__(self, t, x, dx):
        h = self.amplitude * jnp.cos(t) * SIGMA_Y
        return 1j * commutator_herm(h, x) + dx


def test_gradient_with_respect_to_step_parameters():
    def loss(amplitude):
        levels = Recursion(_Drive(amplitude), SIGMA_X, order=5)(0.7)
        return jnp.sum(jnp.abs(levels) ** 2)

    check_grads(loss, (jnp.asarray(0.8),), order=1, modes=["rev"])


def test_vmap_over_time_equals_loop():
    recursion = Recursion(seed_step, SIGMA_X, order=6)
    ts = jnp.linspace(0.0, 2.0, 4)
    batched = jax.vmap(recursion)(ts)
    looped = jnp.stack([recursion(t) for t in ts])
    np.testing.assert_allclose(batched, looped, rtol=1e-13, atol=1e-13)


def test_no_retrace_when_time_changes():
    traces = []

    def step(t, x, dx):
        traces.append(None)
        return x * jnp.sin(t) + dx

    recursion = Recursion(step, jnp.ones(3), order=4)
    for t in (0.1, 0.2, jnp.asarray(0.3), np.float64(0.4)):
        recursion(t)
    # One trace for the shape check and one inside the loop, both at the first call.
    first = len(traces)
    recursion(0.5)
    assert len(traces) == first <= 2


def test_order_zero_and_constant_step():
    np.testing.assert_allclose(
        Recursion(seed_step, SIGMA_X, order=0)(1.0), SIGMA_X[None].astype(complex)
    )
    levels = Recursion(lambda t, x, dx: 2.0 * jnp.ones(2), jnp.zeros(2), order=3)(0.0)
    np.testing.assert_allclose(levels, [[0, 0], [2, 2], [2, 2], [2, 2]])


@pytest.mark.parametrize("order", [-1, 1.5, True, "3", 10**6])
def test_bad_order(order):
    with pytest.raises((TypeError, ValueError), match="order"):
        Recursion(seed_step, SIGMA_X, order=order)


def test_bad_step_and_initial():
    not_a_function: Any = "not a function"
    with pytest.raises(TypeError, match="step"):
        Recursion(not_a_function, SIGMA_X, order=2)
    with pytest.raises(ValueError, match="step"):
        Recursion(lambda t, x, dx: x[0], SIGMA_X, order=2)(0.0)
    with pytest.raises(ValueError, match="step"):
        Recursion(lambda t, x, dx: (x, dx), SIGMA_X, order=2)(0.0)
    with pytest.raises(TypeError, match="initial"):
        Recursion(seed_step, "sigma_x", order=2)


@pytest.mark.parametrize("t", [float("nan"), float("inf")])
def test_non_finite_time(t):
    with pytest.raises(ValueError, match="finite"):
        Recursion(seed_step, SIGMA_X, order=2)(t)


def test_non_scalar_time():
    with pytest.raises((TypeError, ValueError)):
        Recursion(seed_step, SIGMA_X, order=2)(jnp.ones(2))
