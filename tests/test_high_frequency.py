"""High-frequency expansions against an independent Dyson-series oracle (the
Floquet-Magnus terms), the closed forms of the first van Vleck terms, exact
quasienergies order by order, the exact propagator, finite differences and a loop."""

import math
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import hierax

from .helpers import compile_count


SX = np.array([[0.0, 1.0], [1.0, 0.0]])
SY = np.array([[0.0, -1j], [1j, 0.0]])
SZ = np.diag([1.0, -1.0])


def _random_drive(seed=1, n=3):
    """H0 + sum_{m=1,2} (V_m e^{imwt} + h.c.): the Fourier components and the
    hierax operator of the same H."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
    h0 = (a + a.conj().T) / 2
    vs = [rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n)) for _ in range(2)]
    components = {0: h0}
    for m, v in enumerate(vs, start=1):
        components[m], components[-m] = v, v.conj().T

    def operator(omega):
        h = h0
        for m, v in enumerate(vs, start=1):
            h = h + hierax.Cos(m * omega) * (v + v.conj().T)
            h = h + hierax.Sin(m * omega) * (1j * (v - v.conj().T))
        return h

    return components, operator


def _dyson_floquet_magnus(components, tau0, order):
    """The Floquet-Magnus terms F_k (without 1/omega^k) of
    H~(tau) = sum_m H_m e^{i m tau} started at tau0, from the Dyson series of the
    one-period propagator in eps = 1/omega (i dU/dtau = eps H~ U) and the power
    series of its logarithm: an algorithm independent of the van Vleck recursion.
    The Dyson terms are quasi-polynomials sum_{m,p} C[m,p] s^p e^{ims} in
    s = tau - tau0, integrated in closed form."""
    n = components[0].shape[0]
    shifted = {m: h * np.exp(1j * m * tau0) for m, h in components.items()}
    u = {(0, 0): np.eye(n, dtype=complex)}
    dyson = []
    for _ in range(order + 1):
        product = defaultdict(lambda: np.zeros((n, n), complex))
        for (m2, p), c in u.items():
            for m1, h in shifted.items():
                product[m1 + m2, p] += -1j * h @ c
        u = defaultdict(lambda: np.zeros((n, n), complex))
        for (m, p), c in product.items():
            if m == 0:
                u[0, p + 1] += c / (p + 1)
                continue
            # int_0^s x^p e^{imx} dx = e^{ims} sum_q p!/q! (-1)^{p-q} s^q / (im)^{p-q+1}
            #                          - p! (-1)^p / (im)^{p+1}
            for q in range(p + 1):
                weight = math.factorial(p) / math.factorial(q) * (-1) ** (p - q)
                u[m, q] += c * weight / (1j * m) ** (p - q + 1)
            u[0, 0] -= c * math.factorial(p) * (-1) ** p / (1j * m) ** (p + 1)
        dyson.append(sum(c * (2 * np.pi) ** p for (m, p), c in u.items()))
    # log(I + X) = sum_q (-1)^{q+1} X^q / q with X = sum_{j>=1} eps^j D_j.
    x = [np.zeros((n, n), complex), *dyson]
    log = [np.zeros((n, n), complex) for _ in x]
    power = x
    for q in range(1, len(x)):
        log = [a + (-1) ** (q + 1) * b / q for a, b in zip(log, power)]
        power = [sum(power[i] @ x[k - i] for i in range(k + 1)) for k in range(len(x))]
    # U = exp(-i H_F 2 pi eps): H_F = (i / (2 pi eps)) log U.
    return np.stack([1j / (2 * np.pi) * log[k + 1] for k in range(order + 1)])


def _commutator(a, b):
    return a @ b - b @ a


@pytest.fixture(scope="module")
def random_expansion():
    components, operator = _random_drive()
    omega = 3.0
    expansion = hierax.high_frequency_expansion(
        operator(omega), 2 * np.pi / omega, order=5, harmonics=2
    )
    return components, omega, expansion


def test_floquet_magnus_terms_against_the_dyson_series(random_expansion):
    """A random 3-level H with two harmonics: every Floquet-Magnus term to order 5,
    at two starts, against the Dyson-series oracle (relative 1e-12 per order)."""
    components, omega, expansion = random_expansion
    for t0 in (0.0, 0.37):
        ours = np.asarray(expansion.stroboscopic_terms(t0))
        theirs = _dyson_floquet_magnus(components, omega * t0, 5)
        theirs = theirs * omega ** -np.arange(6.0)[:, None, None]
        for k in range(6):
            error = np.abs(ours[k] - theirs[k]).max() / np.abs(theirs[k]).max()
            assert error < 1e-12, (t0, k, error)


def test_van_vleck_terms_against_their_closed_forms(random_expansion):
    """H_eff^(0) = H_0, H_eff^(1) = sum_{m>0} [H_m, H_-m] / (m w) and the second
    order of Eckardt and Anisimovas (NJP 17, 093039 (2015)):
    sum_{m!=0} [[H_m, H_0], H_-m] / (2 m^2 w^2)
      + sum_{m!=0} sum_{m'!=0,m} [[H_m, H_{m'-m}], H_-m'] / (3 m m' w^2)."""
    h, omega, expansion = random_expansion
    terms = np.asarray(expansion.terms)
    harmonics = [m for m in h if m != 0]
    first = sum(_commutator(h[m], h[-m]) / m for m in (1, 2)) / omega
    second = np.zeros_like(h[0])
    for m in harmonics:
        second += _commutator(_commutator(h[m], h[0]), h[-m]) / (2 * m * m)
        for k in harmonics:
            if k != m and k - m in h:
                second += _commutator(_commutator(h[m], h[k - m]), h[-k]) / (3 * m * k)
    second /= omega**2
    for ours, theirs in ((terms[0], h[0]), (terms[1], first), (terms[2], second)):
        np.testing.assert_allclose(ours, theirs, atol=1e-13 * np.abs(theirs).max())


def _qubit(omega, amplitude=1.3, offset=0.0):
    return (
        0.5 * SZ
        + offset * np.eye(2)
        + hierax.Cos(omega, amplitude=amplitude) * SX
        + hierax.Sin(omega, amplitude=0.4) * SY
    )


def test_quasienergy_error_falls_as_the_next_power_of_one_over_omega():
    """A strongly driven qubit at w = 20 and 40: the error of the quasienergies at
    order k (against hierax.floquet, itself checked against QuTiP) falls by at least
    about 2^(k+1) when w doubles."""
    errors = []
    for omega in (20.0, 40.0):
        period = 2 * np.pi / omega
        expansion = hierax.high_frequency_expansion(_qubit(omega), period, order=5)
        exact = hierax.floquet(_qubit(omega), period, rtol=1e-13, atol=1e-15)
        errors.append(np.asarray(expansion.convergence(exact)))
    for k in (0, 1, 3, 5):
        assert errors[0][k] / errors[1][k] > 0.7 * 2 ** (k + 1), (k, errors)
    assert errors[1][5] < 1e-9
    assert errors[1][0] > 1e-3  # order 0 alone is far off: the test can tell


def test_kick_operator_gives_the_propagator_between_any_times():
    """U(t, t0) = e^{-iK(t)} e^{-iH_eff (t - t0)} e^{iK(t0)} against sesolve between
    two times that are not a period apart, the error falling with the order; K is
    periodic with zero mean, and the stroboscopic H_F[t0] at order 5 gives the
    one-period propagator."""
    omega, t0, t = 30.0, 0.05, 0.6
    period = 2 * np.pi / omega
    h = _qubit(omega)
    expansion = hierax.high_frequency_expansion(h, period, order=5)
    exact = np.asarray(
        hierax.sesolve(
            h, np.eye(2, dtype=complex), [t0, t], rtol=1e-13, atol=1e-15
        ).states[-1]
    )
    errors = [
        np.abs(np.asarray(expansion.propagator(t, t0, order=k)) - exact).max()
        for k in range(6)
    ]
    assert errors[5] < 1e-8 and errors[0] > 1e3 * errors[5], errors
    times = t0 + period * np.arange(64) / 64
    kicks = np.stack([np.asarray(expansion.kick(s)) for s in times])
    assert np.abs(kicks.mean(0)).max() < 1e-14
    np.testing.assert_allclose(
        np.asarray(expansion.kick(t + period)),
        np.asarray(expansion.kick(t)),
        atol=1e-14,
    )
    one_period = np.asarray(hierax.floquet(h, period, t0=t0, rtol=1e-13).propagator)
    stroboscopic = np.asarray(expansion.stroboscopic(t0))
    np.testing.assert_allclose(
        scipy.linalg.expm(-1j * stroboscopic * period), one_period, atol=1e-8
    )


def test_a_constant_shift_moves_only_the_zeroth_term(random_expansion):
    """H -> H + c I: H_eff^(0) gains c I, every other term and the kick operator are
    unchanged."""
    omega = 25.0
    period = 2 * np.pi / omega
    plain = hierax.high_frequency_expansion(_qubit(omega), period, order=4)
    shifted = hierax.high_frequency_expansion(
        _qubit(omega, offset=0.7), period, order=4
    )
    terms, moved = np.asarray(plain.terms), np.asarray(shifted.terms)
    np.testing.assert_allclose(moved[0], terms[0] + 0.7 * np.eye(2), atol=1e-14)
    np.testing.assert_allclose(moved[1:], terms[1:], atol=1e-15)
    np.testing.assert_allclose(
        np.asarray(shifted.kick(0.1)), np.asarray(plain.kick(0.1)), atol=1e-15
    )


def test_vmap_over_frequencies_equals_a_loop_compiles_once_and_has_gradients():
    """A batch of drive frequencies (so periods) and amplitudes in one `jax.vmap`
    equals a loop, new values compile nothing, and d eps / d amplitude agrees with
    a central difference."""
    start = compile_count()

    def energies(omega, amplitude):
        h = 0.5 * SZ + hierax.Cos(omega, amplitude=amplitude) * SX
        expansion = hierax.high_frequency_expansion(h, 2 * jnp.pi / omega, order=3)
        return expansion.quasienergies()

    batched = jax.jit(jax.vmap(energies))
    omegas, amplitudes = jnp.array([9.0, 11.0, 14.0]), jnp.array([0.5, 1.0, 0.8])
    together = batched(omegas, amplitudes)
    before = compile_count()
    assert before > start  # the events are seen
    batched(jnp.array([10.0, 12.0, 13.0]), jnp.array([0.2, 0.6, 0.9]))
    assert compile_count() == before
    for k in range(3):
        np.testing.assert_allclose(
            np.asarray(together[k]),
            np.asarray(energies(omegas[k], amplitudes[k])),
            atol=1e-13,
        )
    step = 1e-5
    upper = jax.jit(lambda a: energies(11.0, a)[1])
    numeric = (upper(0.7 + step) - upper(0.7 - step)) / (2 * step)
    np.testing.assert_allclose(float(jax.grad(upper)(0.7)), float(numeric), rtol=1e-7)


def test_float32_follows_the_period():
    """A float32 period runs the expansion in complex64, to float32's precision."""
    omega = 20.0
    h = _qubit(omega)
    double = hierax.high_frequency_expansion(h, 2 * np.pi / omega, order=3)
    single = hierax.high_frequency_expansion(h, jnp.float32(2 * np.pi / omega), order=3)
    assert single.terms.dtype == jnp.complex64
    np.testing.assert_allclose(
        np.asarray(single.terms), np.asarray(double.terms), atol=2e-6
    )


def test_bad_input_is_named():
    omega = 10.0
    period = 2 * np.pi / omega
    api = hierax.high_frequency_expansion
    with pytest.raises(ValueError, match="not periodic with `period`"):
        api(0.5 * SZ + hierax.Cos(1.3 * omega) * SX, period, order=2)
    # Nearly constant over the period: within 7e-11 of a Fourier series on the
    # samples (accepted), not periodic by its frequency (as `floquet` reads it).
    with pytest.raises(ValueError, match="frequency 0.0001"):
        api(0.5 * SZ + hierax.Cos(1e-4) * SX, period, order=2)
    with pytest.raises(ValueError, match="harmonics above `harmonics` = 1"):
        api(0.5 * SZ + hierax.Cos(2 * omega) * SX, period, order=2)
    with pytest.raises(ValueError, match="not Hermitian"):
        api(
            np.array([[0.0, 1.0], [0.0, 0.0]]) + hierax.Cos(omega) * SX, period, order=2
        )
    with pytest.raises(ValueError, match="`period` must be positive"):
        api(_qubit(omega), -period, order=2)
    with pytest.raises(ValueError, match=r"order=\.\.\.\)` must be a non-negative"):
        api(_qubit(omega), period, order=-1)
    with pytest.raises(ValueError, match="harmonics=...\\)` must be positive"):
        api(_qubit(omega), period, order=2, harmonics=0)
    expansion = api(_qubit(omega), period, order=2)
    with pytest.raises(ValueError, match="at most the expansion's order 2"):
        expansion.effective(order=3)
    # (The test suite's jaxtyping hook refuses it by its annotation first.)
    with pytest.raises(TypeError, match="exact"):
        expansion.convergence(np.zeros(2))  # pyright: ignore[reportArgumentType]
    # Inside a jit the check runs in the program.
    with pytest.raises(Exception, match="not periodic with `period`"):
        jax.jit(lambda w: api(0.5 * SZ + hierax.Cos(w) * SX, period, order=1).terms)(
            1.3 * omega
        )


@pytest.mark.parametrize(
    ("period", "error", "match"),
    [
        (np.inf, ValueError, "`period` must be finite"),
        (-np.inf, ValueError, "`period` must be positive"),
        (np.nan, ValueError, "`period` must be positive"),
        (0.0, ValueError, "`period` must be positive"),
        (1j, ValueError, "`period` must be a real scalar"),
        (None, TypeError, "period"),
    ],
)
def test_a_bad_period_is_named(period, error, match):
    """An infinite period gave nan terms; every bad period is refused, naming it."""
    with pytest.raises(error, match=match):
        hierax.high_frequency_expansion(_qubit(10.0), period, order=1)


def test_a_bad_traced_period_or_hamiltonian_is_refused_at_run_time():
    """Inside a jit an infinite period, and a nan amplitude (whose nan gaps passed
    the comparisons), are refused by the compiled call."""
    period = 2 * np.pi / 10.0

    def terms(period, amplitude):
        h = 0.5 * SZ + hierax.Cos(2 * jnp.pi / period, amplitude=amplitude) * SX
        return hierax.high_frequency_expansion(h, period, order=1).terms

    compiled = jax.jit(terms)
    with pytest.raises(Exception, match="`period` must be positive and finite"):
        jax.block_until_ready(compiled(np.inf, 1.0))
    with pytest.raises(Exception, match="`hierax.high_frequency_expansion`"):
        jax.block_until_ready(compiled(period, np.nan))


def test_bad_times_of_the_methods_are_named():
    """The methods' times: a batch, nan, complex, refused naming `t` or `t0` (a
    start was named `t`); a nan on the device inside the compiled call."""
    expansion = hierax.high_frequency_expansion(_qubit(10.0), 2 * np.pi / 10.0, order=1)
    name = "`hierax.HighFrequencyExpansion"
    with pytest.raises(ValueError, match=f"{name}.kick`: `t` must be finite"):
        expansion.kick(np.nan)
    with pytest.raises(ValueError, match=f"{name}.stroboscopic`: `t0` must be finite"):
        expansion.stroboscopic(np.inf)
    with pytest.raises(ValueError, match=f"{name}.stroboscopic_terms`: `t0` must be a"):
        expansion.stroboscopic_terms(np.array([0.0, 1.0]))
    with pytest.raises(TypeError, match=f"{name}.propagator`: `t0` must be a real"):
        expansion.propagator(0.1, 1j)
    with pytest.raises(Exception, match=f"{name}.propagator`: `t0` must be finite"):
        jax.block_until_ready(expansion.propagator(0.1, jnp.array(np.nan)))
    with pytest.raises(Exception, match=f"{name}.kick`: `t` must be finite"):
        jax.block_until_ready(expansion.kick(jnp.array(np.inf)))
    three_levels = hierax.floquet(np.diag([0.0, 1.0, 2.0]), 2 * np.pi / 10.0)
    with pytest.raises(ValueError, match=f"{name}.convergence`: `exact` has 3"):
        expansion.convergence(three_levels)
    # Another period folds the quasienergies into another zone: the distances
    # read as errors of order omega (silently, before).
    twice = hierax.floquet(_qubit(10.0), 4 * np.pi / 10.0)
    with pytest.raises(ValueError, match=f"{name}.convergence`: `exact` has period"):
        expansion.convergence(twice)
