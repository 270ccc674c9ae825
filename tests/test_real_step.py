"""The Schrodinger step of real matrices from `REAL_STATE_SIZE` levels, in real
arithmetic on the state's real and imaginary halves side by side (`series_loop`'s
`turned` loop), against scipy (expm, DOP853) and central differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import hierax
from hierax._kernels import propagator

from .helpers import propagate


N = propagator.REAL_STATE_SIZE
RNG = np.random.default_rng(21)
H0, H1 = ((m + m.T) / (4 * np.sqrt(N)) for m in RNG.normal(size=(2, N, N)))
KET = (np.eye(N)[0] + 0.5j * np.eye(N)[3]) / np.sqrt(1.25)
SPAN = 1.5


def _hamiltonian(amplitude, constant):
    return hierax.TimeOperator(
        [hierax.Cos(1.3, 0.2, amplitude), hierax.Constant(constant)], [H1, H0]
    )


def _reference(amplitude, constant, start):
    def h(t):
        return amplitude * np.cos(1.3 * t + 0.2) * H1 + constant * H0

    return propagate(h, 0.0, SPAN, np.asarray(start))


def test_the_real_step_takes_the_turned_loop(monkeypatch):
    turned = []
    loop = propagator.series_loop

    def spy(*args, **kwargs):
        turned.append(args[6] if len(args) > 6 else kwargs.get("turned", False))
        return loop(*args, **kwargs)

    monkeypatch.setattr(propagator, "series_loop", spy)
    times = jnp.array([0.0, SPAN])
    final = hierax.sesolve(
        _hamiltonian(0.7, 1.1), KET, times, rtol=1e-11, atol=1e-13
    ).final_state
    assert turned and all(turned)
    assert np.max(np.abs(final - _reference(0.7, 1.1, KET))) <= 1e-9


@pytest.mark.parametrize("columns", [1, 3])
def test_kets_and_a_propagator_against_scipy(columns):
    """Several kets as columns, and a constant Hamiltonian's propagator against
    expm (every column of the identity)."""
    times = jnp.array([0.0, SPAN])
    kets = np.stack([np.roll(KET, 5 * c) for c in range(columns)], axis=1)
    final = hierax.sesolve(
        _hamiltonian(-0.4, 0.9), kets, times, rtol=1e-11, atol=1e-13
    ).final_state
    assert final.shape == kets.shape
    assert np.max(np.abs(final - _reference(-0.4, 0.9, kets))) <= 1e-9
    u = hierax.sesolve(
        H0 + 0.3 * H1, np.eye(N, dtype=complex), times, rtol=1e-11, atol=1e-13
    ).final_state
    exact = scipy.linalg.expm(-1j * SPAN * (H0 + 0.3 * H1))
    assert np.max(np.abs(u - exact)) <= 1e-9


def test_complex64_against_the_x64_reference():
    times = jnp.array([0.0, SPAN], jnp.float32)
    h = hierax.TimeOperator(
        [hierax.Cos(1.3, 0.2, 0.7), hierax.Constant(1.1)],
        [H1.astype(np.float32), H0.astype(np.float32)],
    )
    final = hierax.sesolve(
        h, KET.astype(np.complex64), times, rtol=1e-6, atol=1e-8
    ).final_state
    assert final.dtype == jnp.complex64
    assert np.max(np.abs(final - _reference(0.7, 1.1, KET))) <= 2e-5


def test_gradients_against_central_differences():
    """With respect to the drive's amplitude, the constant's coefficient and the
    start (the adjoint recursion reads the same loop)."""

    def loss(amplitude, constant, start):
        final = hierax.sesolve(
            _hamiltonian(amplitude, constant),
            start,
            jnp.array([0.0, SPAN]),
            rtol=1e-12,
            atol=1e-14,
        ).final_state
        return jnp.abs(final[5]) ** 2 + jnp.real(final[0] * final[7])

    start = jnp.asarray(KET)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(0.7, 1.1, start)
    e = 1e-5
    shift = np.zeros(N, complex)
    shift[3] = e
    central = (
        (loss(0.7 + e, 1.1, start) - loss(0.7 - e, 1.1, start)) / (2 * e),
        (loss(0.7, 1.1 + e, start) - loss(0.7, 1.1 - e, start)) / (2 * e),
        (loss(0.7, 1.1, start + shift) - loss(0.7, 1.1, start - shift)) / (2 * e),
    )
    assert abs(grads[0] - central[0]) <= 1e-8
    assert abs(grads[1] - central[1]) <= 1e-8
    # JAX's cotangent of a complex input is the conjugate of the gradient.
    assert abs(np.real(grads[2][3]) - central[2]) <= 1e-8


def test_a_multiple_of_the_identity_a_time_shift_and_exact_zeros():
    """H + c 1 gives the state times e^{-i c T}; a constant H gives the same state
    over [1e4, 1e4 + T] as over [0, T]; a drive at amplitude exactly 0 is H0
    alone (expm), and its gradient there matches central differences."""
    times = jnp.array([0.0, SPAN])
    base = hierax.sesolve(
        _hamiltonian(0.7, 1.1), KET, times, rtol=1e-11, atol=1e-13
    ).final_state
    shifted = hierax.TimeOperator(
        [hierax.Cos(1.3, 0.2, 0.7), hierax.Constant(1.1)], [H1, H0 + 3.0 * np.eye(N)]
    )
    moved = hierax.sesolve(shifted, KET, times, rtol=1e-11, atol=1e-13).final_state
    assert np.max(np.abs(moved - np.exp(-3.3j * SPAN) * base)) <= 1e-9

    constant = H0 + 0.3 * H1
    late = hierax.sesolve(
        constant, KET, jnp.array([1e4, 1e4 + SPAN]), rtol=1e-11, atol=1e-13
    ).final_state
    exact = scipy.linalg.expm(-1j * SPAN * constant) @ KET
    assert np.max(np.abs(late - exact)) <= 1e-8

    def final(amplitude):
        return hierax.sesolve(
            _hamiltonian(amplitude, 1.1), KET, times, rtol=1e-12, atol=1e-14
        ).final_state

    exact = scipy.linalg.expm(-1j * SPAN * 1.1 * H0) @ KET
    assert np.max(np.abs(final(0.0) - exact)) <= 1e-9

    def loss(amplitude):
        return jnp.abs(final(amplitude)[5]) ** 2

    e = 1e-5
    central = (loss(e) - loss(-e)) / (2 * e)
    assert abs(jax.grad(loss)(0.0) - central) <= 1e-8
