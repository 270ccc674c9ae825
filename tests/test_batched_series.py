"""`sesolve` under `jax.vmap`, where the batch steps in lockstep and the series
kernel takes each order's window of the drive's series as a slice: a sweep of
detunings of a qubit under a Gaussian pulse against scipy's DOP853 per element,
batched against one element at a time, its gradient against finite differences,
and one trace for every set of detunings."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

import hierax


SX = np.array([[0, 1], [1, 0]], complex)
SZ = np.diag([1.0, -1.0]).astype(complex)
MEAN, WIDTH, SPAN = 3.0, 0.8, 6.0
AMPLITUDE = np.pi / (WIDTH * np.sqrt(2 * np.pi))  # a pi pulse
START = np.array([1.0, 0.0], complex)
DETUNINGS = np.array([-1.5, -0.4, 0.0, 0.7, 1.8])


def _pulse(t):
    return AMPLITUDE * np.exp(-((t - MEAN) ** 2) / (2 * WIDTH**2))


def _hamiltonian(delta):
    return hierax.TimeOperator(
        [hierax.Constant(delta / 2), hierax.Gaussian(MEAN, WIDTH, AMPLITUDE / 2)],
        [SZ, SX],
    )


def _final(delta, order=None):
    solution = hierax.sesolve(
        _hamiltonian(delta),
        START,
        jnp.array([0.0, SPAN]),
        rtol=1e-11,
        atol=1e-13,
        order=order,
    )
    return solution.final_state


def _reference(delta):
    def rhs(t, y):
        psi = y[:2] + 1j * y[2:]
        h = delta / 2 * SZ + _pulse(t) / 2 * SX
        dpsi = -1j * (h @ psi)
        return np.concatenate([np.real(dpsi), np.imag(dpsi)])

    y0 = np.concatenate([np.real(START), np.imag(START)])
    solution = scipy.integrate.solve_ivp(
        rhs, (0.0, SPAN), y0, "DOP853", rtol=1e-13, atol=1e-15
    )
    y = solution.y[:, -1]
    return y[:2] + 1j * y[2:]


@pytest.fixture(scope="module")
def batched():
    return np.asarray(jax.jit(jax.vmap(_final))(jnp.asarray(DETUNINGS)))


def test_batched_sweep_against_scipy(batched):
    for delta, state in zip(DETUNINGS, batched):
        assert np.linalg.norm(state - _reference(delta)) < 1e-9


def test_batched_equals_one_at_a_time(batched):
    """The batch steps together (one step size for all, `_lockstep`): each element
    agrees with its solve alone to the tolerance, not to the last digit."""
    one = jax.jit(_final)
    for delta, state in zip(DETUNINGS, batched):
        assert np.max(np.abs(state - np.asarray(one(jnp.asarray(delta))))) < 1e-10


def test_batched_low_order_against_scipy():
    """An order other than the default (the window's length follows it)."""
    states = jax.jit(jax.vmap(lambda d: _final(d, order=9)))(jnp.asarray(DETUNINGS))
    for delta, state in zip(DETUNINGS, np.asarray(states)):
        assert np.linalg.norm(state - _reference(delta)) < 1e-8


def test_gradient_of_batched_solve_against_finite_differences():
    """Reverse mode through the batched solve (the series' adjoint recursion reads
    the windows of the drive's series) against central differences of the
    solve."""

    def population(delta):
        return jnp.abs(_final(delta)[1]) ** 2

    deltas = jnp.asarray(DETUNINGS[:3])
    gradients = np.asarray(jax.jit(jax.vmap(jax.grad(population)))(deltas))
    step = 1e-5
    batch = jax.jit(jax.vmap(population))
    differences = np.asarray(batch(deltas + step) - batch(deltas - step)) / (2 * step)
    np.testing.assert_allclose(gradients, differences, rtol=1e-6, atol=1e-9)


def test_no_retrace_when_detunings_change():
    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def sweep(deltas):
        return jax.vmap(_final)(deltas)

    first = np.asarray(sweep(jnp.asarray(DETUNINGS)))
    shifted = DETUNINGS[::-1] * 0.5
    second = np.asarray(sweep(jnp.asarray(shifted)))
    assert np.linalg.norm(first[0] - _reference(DETUNINGS[0])) < 1e-9
    assert np.linalg.norm(second[0] - _reference(shifted[0])) < 1e-9


def test_batched_callable_against_scipy():
    """A Hamiltonian given as a function: its dense series' window is a slice too."""

    def final(delta):
        def h(t):
            pulse = AMPLITUDE / 2 * jnp.exp(-((t - MEAN) ** 2) / (2 * WIDTH**2))
            return delta / 2 * jnp.asarray(SZ) + pulse * jnp.asarray(SX)

        solution = hierax.sesolve(
            hierax.CallableOperator(h),
            START,
            jnp.array([0.0, SPAN]),
            rtol=1e-11,
            atol=1e-13,
        )
        return solution.final_state

    deltas = DETUNINGS[:3]
    states = np.asarray(jax.jit(jax.vmap(final))(jnp.asarray(deltas)))
    for delta, state in zip(deltas, states):
        assert np.linalg.norm(state - _reference(delta)) < 1e-9
