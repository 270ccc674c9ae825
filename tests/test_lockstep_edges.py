"""Edges of `sesolve` under `jax.vmap` in lockstep (see `test_lockstep.py` for the
plain cases): huge times, pulses far in their tails, gradients where they are
exactly zero, a batch whose elements alone need very different steps, and zero
kets. Each against a reference independent of hierax (a closed form,
`scipy.linalg.expm`, or scipy's DOP853 at rtol 1e-13), and where said against
each element solved alone."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

import hierax
from hierax._solvers import _lockstep

from .helpers import propagate, recorded_returns


SX = np.array([[0, 1], [1, 0]], complex)
SZ = np.diag([1.0, -1.0]).astype(complex)
START = np.array([0.6, 0.8j])  # a superposition: the relative phase counts
COUPLING = 0.7
DETUNINGS = jnp.array([-3.0, -0.4, 0.0, 1.1, 6.0])


def _error(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def _static(detuning, coupling=COUPLING, pulse=(0.0, 1.0, 0.9)):
    """`detuning / 2 sz + coupling sx`, plus a Gaussian drive on sx (by default
    centred at 0: at the times used with it, it is zero to every digit)."""
    return hierax.TimeOperator(
        [
            hierax.Constant(detuning / 2),
            hierax.Constant(coupling),
            hierax.Gaussian(*pulse),
        ],
        [SZ, SX, SX],
    )


def _expm(detuning, tau, state=START, coupling=COUPLING):
    """The state after `tau` under the constant `detuning / 2 sz + coupling sx`."""
    h = detuning / 2 * SZ + coupling * SX
    return scipy.linalg.expm(-1j * tau * h) @ np.asarray(state)


def _free(detuning, tau, state=START):
    """The closed form of the free evolution under `detuning / 2 sz`."""
    phases = np.exp(-0.5j * detuning * tau * np.array([1.0, -1.0]))
    return phases * np.asarray(state)


def _sweep(hamiltonian, state, times, **options):
    """`sesolve` of `hamiltonian(d)` mapped over detunings `d`."""

    def one(d):
        return hierax.sesolve(hamiltonian(d), state, times, **options)

    return jax.vmap(one)


# --------------------------------------------------------------------------------
# 1. Huge times
# --------------------------------------------------------------------------------


def test_huge_times_x64(monkeypatch):
    """A detuning sweep under a constant coupling (and a Gaussian drive centred at
    t = 0, zero at these times), from 1e4 over 5 and from 1e6 over 0.5, saved at
    six times: every saved state of every element equals
    `expm(-i (t - start) H) psi0` (scipy), stepped in lockstep. Time translation
    is exact for a constant H; at t ~ 1e6 a float64 time carries ten digits after
    the point, which the steps must not lose."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    for start, span in [(1e4, 5.0), (1e6, 0.5)]:
        times = start + jnp.linspace(0.0, span, 6)
        solution = _sweep(_static, jnp.asarray(START), times, rtol=1e-10, atol=1e-12)(
            DETUNINGS
        )
        assert solution.states.shape == (5, 6, 2)
        for d, states in zip(DETUNINGS, solution.states):
            for t, state in zip(np.asarray(times), states):
                assert _error(state, _expm(float(d), t - start)) <= 1e-9
    assert stepped and all(s is not None for s in stepped)


def test_huge_times_complex64(monkeypatch):
    """The same sweeps in complex64 (float32 times, exactly representable: 1e4 +
    k and 1e6 + k/4). Float32 resolves times near 1e4 to 2^-10 and near 1e6 to
    2^-4, but for a constant H only the differences of the step ends matter,
    which are exact: each element within 1e-5 of `expm` (a few float32 roundings
    of the state per step, over ten steps at most), in lockstep."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    for start, span in [(1e4, 5.0), (1e6, 0.5)]:
        times = (start + jnp.linspace(0.0, span, 3)).astype(jnp.float32)
        assert len(set(np.asarray(times).tolist())) == 3
        low = _sweep(_static, jnp.asarray(START, jnp.complex64), times)(
            DETUNINGS.astype(jnp.float32)
        )
        assert low.states.dtype == jnp.complex64
        for d, states in zip(DETUNINGS, low.states):
            for t, state in zip(np.asarray(times, float), states):
                assert _error(state, _expm(float(d), t - start)) <= 1e-5
    assert stepped and all(s is not None for s in stepped)


def test_a_pulse_in_a_span_that_starts_at_huge_times():
    """A Gaussian drive centred in the span [1e4, 1e4 + 5]: against scipy's DOP853
    from 1e4 (float64, rtol 1e-13), each element of a lockstep sweep. In
    complex64 the times near 1e4 are resolved to 2^-10, so the drive is sampled
    up to 5e-4 off: an error of order 5e-4 times the drive's largest slope (0.34)
    over the span, held to 5e-4."""
    start, mean, width, amplitude = 1e4, 1e4 + 2.5, 0.8, 0.45

    def hamiltonian(d):
        return hierax.TimeOperator(
            [hierax.Constant(d / 2), hierax.Gaussian(mean, width, amplitude)], [SZ, SX]
        )

    def reference(d):
        def h(t):
            pulse = amplitude * np.exp(-((t - mean) ** 2) / (2 * width**2))
            return d / 2 * SZ + pulse * SX

        return propagate(h, start, 5.0, START)

    times = jnp.array([start, start + 5.0])
    finals = _sweep(hamiltonian, jnp.asarray(START), times, rtol=1e-10, atol=1e-12)(
        DETUNINGS
    ).final_state
    low = _sweep(
        hamiltonian, jnp.asarray(START, jnp.complex64), times.astype(jnp.float32)
    )(DETUNINGS.astype(jnp.float32)).final_state
    for d, final, final32 in zip(DETUNINGS, finals, low):
        exact = reference(float(d))
        assert _error(final, exact) <= 1e-9
        assert _error(final32, exact) <= 5e-4


# --------------------------------------------------------------------------------
# 2. Pulses far in their tails, and pulses of zero amplitude
# --------------------------------------------------------------------------------


def _driven(mean, width=1.0, amplitude=0.9):
    def hamiltonian(d):
        return hierax.TimeOperator(
            [hierax.Constant(d / 2), hierax.Gaussian(mean, width, amplitude)], [SZ, SX]
        )

    return hamiltonian


def test_far_tails_are_free_evolution(monkeypatch):
    """Over [0, 4], a Gaussian centred at 37.5 (width 1) is between 5e-306 and
    2e-244, and one centred at -1000 underflows to 0: each element of a lockstep
    sweep of detunings is finite and equals the free evolution's closed form, in
    x64 (1e-9, rtol 1e-10) and complex64 (where both pulses underflow: 1e-5,
    float32 roundings over a few steps)."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    near = hierax.Gaussian(37.5, 1.0, 0.9)
    assert 0 < float(near(0.0)) < 1e-300 and float(near(4.0)) < 1e-240
    assert float(hierax.Gaussian(-1000.0, 1.0, 0.9)(0.0)) == 0.0
    times = jnp.array([0.0, 2.0, 4.0])
    for mean in (37.5, -1000.0):
        states = _sweep(
            _driven(mean), jnp.asarray(START), times, rtol=1e-10, atol=1e-12
        )(DETUNINGS).states
        low = _sweep(
            _driven(jnp.float32(mean)),
            jnp.asarray(START, jnp.complex64),
            times.astype(jnp.float32),
        )(DETUNINGS.astype(jnp.float32)).states
        assert np.all(np.isfinite(np.asarray(states)))
        assert np.all(np.isfinite(np.asarray(low)))
        for d, per_time, per_time32 in zip(DETUNINGS, states, low):
            for t, state, state32 in zip(np.asarray(times), per_time, per_time32):
                assert _error(state, _free(float(d), t)) <= 1e-9
                assert _error(state32, _free(float(d), t)) <= 1e-5
    assert stepped and all(s is not None for s in stepped)


def test_a_zero_coupling_row_in_lockstep(monkeypatch):
    """A constant coupling that is exactly 0 for some elements (a row of the
    batch's constant coefficients), swept with the detunings: stepped in
    lockstep, the uncoupled elements equal the free evolution's closed form and
    the others `expm` (scipy)."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    couplings = jnp.array([0.0, 0.5, 0.0, 1.3, 0.0, 2.0])
    detunings = jnp.array([0.0, 0.0, 2.5, -1.0, -7.0, 4.0])

    def one(d, g):
        h = hierax.TimeOperator([hierax.Constant(d / 2), hierax.Constant(g)], [SZ, SX])
        return hierax.sesolve(h, jnp.asarray(START), jnp.array([0.0, 3.0]), rtol=1e-10)

    finals = jax.vmap(one)(detunings, couplings).final_state
    assert len(stepped) == 1 and stepped[0] is not None
    for d, g, final in zip(detunings, couplings, finals):
        exact = _expm(float(d), 3.0, coupling=float(g))
        if g == 0:
            assert _error(exact, _free(float(d), 3.0)) <= 1e-14
        assert _error(final, exact) <= 1e-9


def test_a_sweep_of_pulse_amplitudes_with_zeros(monkeypatch):
    """A Gaussian drive's amplitude swept, some exactly 0: stepped in lockstep
    (the window of the drive at amplitude 1, scaled per column), the batch takes
    one count, at least the largest alone, and each element equals its solve
    alone to the tolerance; the zero-amplitude elements equal the free
    evolution's closed form and the others scipy's DOP853."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    amplitudes = jnp.array([0.0, 0.9, 0.0, 2.0])
    mean, width, detuning = 2.0, 0.8, 0.6
    times = jnp.array([0.0, 4.0])

    def one(a):
        h = hierax.TimeOperator(
            [hierax.Constant(detuning / 2), hierax.Gaussian(mean, width, a)], [SZ, SX]
        )
        return hierax.sesolve(h, jnp.asarray(START), times, rtol=1e-10, atol=1e-12)

    mapped = jax.vmap(one)(amplitudes)
    assert len(stepped) == 1
    alone = [one(a) for a in amplitudes]
    steps = np.asarray(mapped.stats["num_steps"]).tolist()
    counts = [int(s.stats["num_steps"]) for s in alone]
    assert counts[0] == counts[2] < counts[3]  # the elements alone differ
    assert stepped[0] is not None
    assert len(set(steps)) == 1 and steps[0] >= max(counts)
    for a, final, single in zip(amplitudes, mapped.final_state, alone):
        a = float(a)

        def h(t, a=a):
            pulse = a * np.exp(-((t - mean) ** 2) / (2 * width**2))
            return detuning / 2 * SZ + pulse * SX

        exact = _free(detuning, 4.0) if a == 0 else propagate(h, 0.0, 4.0, START)
        assert _error(final, exact) <= 1e-9
        assert _error(final, single.final_state) <= 1e-9


# --------------------------------------------------------------------------------
# 3. Gradients where they are exactly zero
# --------------------------------------------------------------------------------


def _population(detuning, coupling, duration):
    """The closed form of |<1|psi(t)>|^2 from |0> under `d / 2 sz + g sx`:
    `4 g^2 / W^2 sin^2(W t / 2)`, `W = sqrt(d^2 + 4 g^2)` (in JAX, for its
    derivatives; W > 0)."""
    w = jnp.sqrt(detuning**2 + 4 * coupling**2)
    return 4 * coupling**2 / w**2 * jnp.sin(w * duration / 2) ** 2


def test_gradients_at_exact_zeros(monkeypatch):
    """`jax.grad` of the summed excited population of a lockstep sweep from |0>,
    with respect to the detunings and the couplings. The population is even in
    the detuning and in the coupling, so its derivatives are exactly 0 at
    detuning 0 and at coupling 0, and at coupling 0 the state never leaves |0>
    (the derivative in the detuning is 0 for every detuning). Against the closed
    form's derivative (where W > 0), central differences of the mapped solve in
    x64, and 0 to 1e-9 where it is 0, including the element with H = 0; never
    nan or inf. Forward mode (`diffrax.ForwardMode`) under `jax.vmap` gives the
    same."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    duration = 2.5
    detunings = jnp.array([0.0, -2.0, 0.0, 0.7, 3.0, 0.0, 1.5])
    couplings = jnp.array([0.6, 0.6, 0.0, 0.0, 0.0, 1.1, 0.4])

    def one(d, g, adjoint=None):
        h = hierax.TimeOperator([hierax.Constant(d / 2), hierax.Constant(g)], [SZ, SX])
        state = jnp.array([1.0, 0.0], complex)
        times = jnp.array([0.0, duration])
        final = hierax.sesolve(
            h, state, times, rtol=1e-12, atol=1e-14, adjoint=adjoint
        ).final_state
        return jnp.real(final[1] * jnp.conj(final[1]))

    def total(d, g):
        return jnp.sum(jax.vmap(one)(d, g))

    by_d, by_g = jax.jit(jax.grad(total, argnums=(0, 1)))(detunings, couplings)
    by_d, by_g = np.asarray(by_d), np.asarray(by_g)
    assert np.all(np.isfinite(by_d)) and np.all(np.isfinite(by_g))
    zero_d = np.asarray((detunings == 0) | (couplings == 0))
    zero_g = np.asarray(couplings == 0)
    assert np.all(np.abs(by_d[zero_d]) <= 1e-9)
    assert np.all(np.abs(by_g[zero_g]) <= 1e-9)
    # Forward mode under `jax.vmap`: the same numbers.
    forward = jax.vmap(
        jax.jacfwd(lambda d, g: one(d, g, diffrax.ForwardMode()), argnums=(0, 1))
    )(detunings, couplings)
    assert _error(forward[0], by_d) <= 1e-12 and _error(forward[1], by_g) <= 1e-12

    # The closed form where W > 0 (all but the element with H = 0, whose
    # derivatives are the zeros checked above).
    alive = np.asarray((detunings != 0) | (couplings != 0))
    assert np.sum(~alive) == 1
    closed_d, closed_g = jax.vmap(jax.grad(_population, argnums=(0, 1)), (0, 0, None))(
        detunings[alive], couplings[alive], duration
    )
    assert _error(by_d[alive], closed_d) <= 1e-9
    assert _error(by_g[alive], closed_g) <= 1e-9
    assert np.sum(np.abs(np.asarray(closed_d)) > 0.1) >= 2  # not all zeros
    assert np.sum(np.abs(np.asarray(closed_g)) > 0.1) >= 3

    # Central differences of the mapped solve (stepped in lockstep, where the
    # gradient went element by element), every element's at once.
    step = 1e-5
    mapped = jax.jit(jax.vmap(one))  # each element's population
    for shift, grad in ((jnp.array([step, 0.0]), by_d), (jnp.array([0.0, step]), by_g)):
        up = mapped(detunings + shift[0], couplings + shift[1])
        down = mapped(detunings - shift[0], couplings - shift[1])
        central = (np.asarray(up) - np.asarray(down)) / (2 * step)
        assert _error(grad, central) <= 1e-7
    assert stepped and all(s is not None for s in stepped)


# --------------------------------------------------------------------------------
# 4. Elements that alone need very different steps
# --------------------------------------------------------------------------------


def test_detunings_over_five_decades_share_the_smallest_steps(monkeypatch):
    """Detunings from 1e-3 to 50 under a Gaussian drive: alone, the elements take
    from 8 steps to 22; in lockstep the batch takes one count, at least the
    largest any element takes alone, and every element is within 1e-9 of scipy's
    DOP853 (the fast elements' errors would show if the batch took the slow ones'
    steps) and of its solve alone."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    mean, width, amplitude = 2.0, 0.8, 0.9
    detunings = jnp.array([1e-3, 1e-2, 0.3, 4.0, 50.0, -50.0])
    times = jnp.array([0.0, 4.0])

    def one(d):
        h = hierax.TimeOperator(
            [hierax.Constant(d / 2), hierax.Gaussian(mean, width, amplitude / 2)],
            [SZ, SX],
        )
        solution = hierax.sesolve(h, jnp.asarray(START), times, rtol=1e-10, atol=1e-12)
        return solution.final_state, solution.stats["num_steps"]

    finals, steps = jax.vmap(one)(detunings)
    assert len(stepped) == 1 and stepped[0] is not None
    alone = [one(d) for d in detunings]
    counts = [int(s) for _, s in alone]
    assert max(counts) >= 2.5 * min(counts)  # very different needs
    assert len(set(np.asarray(steps).tolist())) == 1 and int(steps[0]) >= max(counts)
    for d, final, (final_alone, _) in zip(detunings, finals, alone):

        def h(t, d=float(d)):
            pulse = amplitude / 2 * np.exp(-((t - mean) ** 2) / (2 * width**2))
            return d / 2 * SZ + pulse * SX

        assert _error(final, propagate(h, 0.0, 4.0, START)) <= 1e-9
        assert _error(final, final_alone) <= 1e-9


# --------------------------------------------------------------------------------
# 5. Zero kets
# --------------------------------------------------------------------------------


def test_zero_kets_stay_zero(monkeypatch):
    """A zero ket is a valid input of a linear equation whose solution is zero:
    alone, `sesolve` returns zeros (no error). In a lockstep batch (detunings and
    kets mapped, with an observable; and one Hamiltonian with its kets mapped),
    the zero element's states and expectation values are exactly zero and
    finite, and the other elements equal `expm` (scipy) as if it were absent."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    times = jnp.array([0.0, 1.5, 3.0])
    zero = jnp.zeros(2, complex)

    def one(d, ket):
        h = hierax.TimeOperator(
            [hierax.Constant(d / 2), hierax.Constant(COUPLING)], [SZ, SX]
        )
        return hierax.sesolve(h, ket, times, rtol=1e-10, atol=1e-12, exp_ops=[SZ])

    alone = one(0.4, zero)
    assert np.all(np.asarray(alone.states) == 0)
    kets = jnp.asarray([START, [0.0, 0.0], [0.0, 1.0], [0.0, 0.0]], complex)
    detunings = jnp.array([0.4, 0.4, -2.0, 9.0])
    both = jax.vmap(one)(detunings, kets)
    shared = jax.vmap(one, in_axes=(None, 0))(0.4, kets)
    assert len(stepped) == 2 and all(s is not None for s in stepped)
    for mapped, swept in ((both, detunings), (shared, jnp.full(4, 0.4))):
        assert mapped.expects is not None
        assert np.all(np.isfinite(np.asarray(mapped.states)))
        assert np.all(np.asarray(mapped.states[1::2]) == 0)
        assert np.all(np.asarray(mapped.expects[1::2]) == 0)
        for k in (0, 2):
            for t, state in zip(np.asarray(times), mapped.states[k]):
                exact = _expm(float(swept[k]), t, state=np.asarray(kets[k]))
                assert _error(state, exact) <= 1e-9
