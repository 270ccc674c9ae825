"""The bounds of a time function's series remainder over a whole step
(`_time._majorants`), against the remainder itself in high precision (mpmath), and
the solves they keep from passing over a Gaussian pulse, against scipy's DOP853."""

import math

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import hierax
from hierax._time._majorants import hides_its_peak, remainder_bound


def _bound(function, t, step, order) -> float:
    """`remainder_bound` as a float (it is known for every function here)."""
    bound = remainder_bound(function, jnp.asarray(t), jnp.asarray(step), order)
    assert bound is not None
    return float(bound)


def _remainder(f, t, h, order, points=9):
    """max over s in [t, t + h] of |f(s) - sum_{k <= K} f^(k)(t) (s - t)^k / k!|,
    in 50 digits."""
    mpmath.mp.dps = 50
    coefficients = mpmath.taylor(f, mpmath.mpf(t), order)
    worst = mpmath.mpf(0)
    for i in range(1, points + 1):
        s = mpmath.mpf(t) + mpmath.mpf(h) * i / points
        series = mpmath.polyval(coefficients[::-1], s - t)
        worst = max(worst, abs(f(s) - series))
    return float(worst)


def _gaussian(mean, width, amplitude):
    return lambda s: amplitude * mpmath.exp(-((s - mean) ** 2) / (2 * width**2))


CASES = {
    # (function, its mpmath form, t, step). The step over a pulse from far in its
    # tail is bounded loosely (the disc reaches far past the peak): there the bound
    # need only be large, and the step is refused.
    "gaussian at its centre": (
        hierax.Gaussian(0.0, 1.0, 2.0),
        _gaussian(0, 1, 2),
        -0.3,
        0.75,
    ),
    "gaussian in its tail, the peak ahead": (
        hierax.Gaussian(5.0, 0.2, 1.0),
        _gaussian(5, mpmath.mpf("0.2"), 1),
        0.0,
        5.0,
    ),
    "gaussian in its tail, the peak behind": (
        hierax.Gaussian(-3.0, 0.5, 1.0),
        _gaussian(-3, mpmath.mpf("0.5"), 1),
        1.0,
        0.4,
    ),
    "gaussian times a carrier": (
        hierax.Gaussian(2.0, 1.0, 1.0) * hierax.Cos(5.0, 0.3),
        lambda s: _gaussian(2, 1, 1)(s) * mpmath.cos(5 * s + mpmath.mpf("0.3")),
        1.0,
        0.3,
    ),
    "drag slope": (
        hierax.Polynomial(np.array([10.0, -1.0]) / 16.0) * hierax.Gaussian(10.0, 4.0),
        lambda s: (10 - s) / 16 * _gaussian(10, 4, 1)(s),
        6.0,
        3.0,
    ),
    "gaussian plus an exponential": (
        hierax.Gaussian(1.0, 0.5) + hierax.Exp(-0.7, 0.4),
        lambda s: _gaussian(1, mpmath.mpf("0.5"), 1)(s) + 0.4 * mpmath.exp(-0.7 * s),
        0.5,
        0.5,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("order", [12, 28])
def test_the_bound_holds_and_is_near_the_remainder(name, order):
    function, exact, t, h = CASES[name]
    true = _remainder(exact, t, h, order)
    bound = _bound(function, t, h, order)
    assert bound >= true
    # Sharp to a small factor where the remainder is above rounding, for steps the
    # series can take.
    if true > 1e-250 and "ahead" not in name:
        assert bound <= 1e3 * true, (bound, true)


def test_the_bound_is_finite_and_zero_without_a_step_or_amplitude():
    f = hierax.Gaussian(0.0, 1e-3, 1.0)
    huge = _bound(f, -10.0, 20.0, 28)
    assert np.isfinite(huge) and huge > 1e300
    assert _bound(f, 0.5, 0.0, 28) == 0
    assert _bound(hierax.Gaussian(0.0, 1.0, 0.0), 0.0, 1.0, 28) == 0


def test_which_functions_may_hide_a_peak():
    assert hides_its_peak(hierax.Gaussian())
    assert hides_its_peak(hierax.Gaussian() * hierax.Cos(3.0))
    assert hides_its_peak(2.0 * hierax.Gaussian() + hierax.Sin(1.0))
    for f in (
        hierax.Cos(3.0),
        hierax.Exp(-1.0),
        hierax.Polynomial(np.array([1.0, 2.0])),
    ):
        assert not hides_its_peak(f)
    term = hierax.SchrodingerTerm(hierax.Cos(1.0) * np.eye(2))
    t, step = jnp.asarray(0.0), jnp.asarray(1.0)
    assert term.generator_remainder(t, step, 28, None, None) is None


_SX = np.array([[0, 1], [1, 0]], complex)
_SZ = np.diag([1.0, -1.0]).astype(complex)
_SM = np.array([[0, 1], [0, 0]], complex)
_WIDTH = 0.2
# Area pi/2 on sx: a pi pulse.
_AMPLITUDE = np.pi / 2 / (_WIDTH * math.sqrt(2 * math.pi))


def _pulses(means):
    def value(t):
        return sum(
            _AMPLITUDE * math.exp(-((t - m) ** 2) / (2 * _WIDTH**2)) for m in means
        )

    drive = sum(hierax.Gaussian(m, _WIDTH, _AMPLITUDE) for m in means[1:])
    drive = hierax.Gaussian(means[0], _WIDTH, _AMPLITUDE) + drive
    return drive, value


def _dop853(derivative, y0, span):
    y0 = np.asarray(y0, complex).ravel()
    n = y0.size

    def real(t, y):
        d = derivative(t, y[:n] + 1j * y[n:])
        return np.concatenate([np.real(d), np.imag(d)])

    out = solve_ivp(
        real,
        (0, span),
        np.concatenate([np.real(y0), np.imag(y0)]),
        method="DOP853",
        rtol=1e-12,
        atol=1e-14,
    )
    return out.y[:n, -1] + 1j * out.y[n:, -1]


@pytest.mark.parametrize(
    "means", [(5.0,), (3.0, 7.0), (9.3,)], ids=["middle", "two", "near the end"]
)
@pytest.mark.parametrize("x64", [True, False], ids=["x64", "x32"])
def test_sesolve_does_not_pass_over_a_gaussian_pulse(means, x64):
    drive, value = _pulses(means)
    psi = np.array([1, 0], complex)
    expected = _dop853(lambda t, y: -1j * ((value(t) * _SX + 0.3 * _SZ) @ y), psi, 10.0)
    if x64:
        out = hierax.sesolve(drive * _SX + 0.3 * _SZ, psi, [0.0, 10.0], rtol=1e-8)
        tol = 1e-6
    else:
        h = drive * _SX.astype(np.complex64) + 0.3 * _SZ.astype(np.complex64)
        out = hierax.sesolve(h, psi.astype(np.complex64), [0.0, 10.0])
        tol = 1e-4
    np.testing.assert_allclose(np.asarray(out.final_state), expected, atol=tol)


def test_mesolve_does_not_pass_over_a_gaussian_pulse():
    drive, value = _pulses((6.0,))
    jump = 0.1 * _SM
    rho = np.diag([1.0, 0.0]).astype(complex)

    def derivative(t, y):
        r = y.reshape(2, 2)
        h = value(t) * _SX + 0.3 * _SZ
        d = -1j * (h @ r - r @ h) + jump @ r @ jump.conj().T
        d = d - 0.5 * (jump.conj().T @ jump @ r + r @ jump.conj().T @ jump)
        return d.ravel()

    expected = _dop853(derivative, rho, 10.0).reshape(2, 2)
    out = hierax.mesolve(drive * _SX + 0.3 * _SZ, [jump], rho, [0.0, 10.0], rtol=1e-8)
    np.testing.assert_allclose(np.asarray(out.final_state), expected, atol=1e-6)


def test_a_pulse_behind_a_jit_boundary_and_under_vmap():
    # The pulse's centre traced: nothing of it is known before compiling.
    psi = np.array([1, 0], complex)

    @jax.jit
    @jax.vmap
    def final(mean):
        h = hierax.Gaussian(mean, _WIDTH, _AMPLITUDE) * _SX + 0.3 * _SZ
        return hierax.sesolve(h, psi, jnp.array([0.0, 10.0]), rtol=1e-8).final_state

    means = np.array([2.0, 5.0, 8.0])
    got = np.asarray(final(jnp.asarray(means)))
    for m, row in zip(means, got):
        _, value = _pulses((m,))
        expected = _dop853(
            lambda t, y, value=value: -1j * ((value(t) * _SX + 0.3 * _SZ) @ y),
            psi,
            10.0,
        )
        np.testing.assert_allclose(row, expected, atol=1e-6)


@pytest.mark.parametrize("swept", ["amplitude", "state"])
def test_a_pulse_under_a_lockstep_sweep(swept):
    """`jax.vmap` of `sesolve` over a Gaussian's amplitude or over the initial state
    steps the batch in lockstep (`_lockstep.ColumnsTerm`): the same bound, per
    column."""
    h0 = 0.3 * _SZ

    def final(a, psi):
        h = hierax.Gaussian(6.0, _WIDTH, a) * _SX + h0
        return hierax.sesolve(h, psi, jnp.array([0.0, 10.0]), rtol=1e-8).final_state

    amplitudes = np.array([0.5, 1.0, 1.5]) * _AMPLITUDE
    states = np.array([[1, 0], [0, 1], [1, 1j]], complex) / np.array(
        [[1], [1], [2**0.5]]
    )
    if swept == "amplitude":
        got = jax.vmap(final, in_axes=(0, None))(jnp.asarray(amplitudes), states[0])
        pairs = [(a, states[0]) for a in amplitudes]
    else:
        got = jax.vmap(final, in_axes=(None, 0))(_AMPLITUDE, jnp.asarray(states))
        pairs = [(_AMPLITUDE, s) for s in states]
    for (a, psi), row in zip(pairs, np.asarray(got)):

        def derivative(t, y, a=a):
            value = a * math.exp(-((t - 6.0) ** 2) / (2 * _WIDTH**2))
            return -1j * ((value * _SX + h0) @ y)

        np.testing.assert_allclose(row, _dop853(derivative, psi, 10.0), atol=1e-6)
