"""`sesolve` under `jax.vmap`: a batch that differs only in constant coefficients,
drive amplitudes and states steps in lockstep (one step size, the elements as the
columns of one state); any other batch element by element. Both against an
independent reference (scipy's DOP853), against the solve of each element alone,
and differentiated."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hierax
from hierax._solvers import _lockstep

from .helpers import compile_count, propagate, recorded_returns


SX = np.array([[0, 1], [1, 0]], complex)
SZ = np.diag([1.0, -1.0]).astype(complex)
TIMES = jnp.array([0.0, 4.0])
PULSE = (2.0, 0.8, 0.9)  # mean, width, amplitude of the Gaussian drive
DETUNINGS = jnp.linspace(-1.5, 9.0, 7)
START = jnp.array([1.0, 0.0], complex)


def _hamiltonian(detuning, amplitude=PULSE[2]):
    return hierax.TimeOperator(
        [hierax.Constant(detuning / 2), hierax.Gaussian(*PULSE[:2], amplitude / 2)],
        [SZ, SX],
    )


def _matrix(detuning, amplitude=PULSE[2]):
    mean, width, _ = PULSE

    def h(t):
        pulse = amplitude / 2 * np.exp(-((t - mean) ** 2) / (2 * width**2))
        return detuning / 2 * SZ + pulse * SX

    return h


def _reference(detuning, state=START, amplitude=PULSE[2]):
    return propagate(_matrix(float(detuning), amplitude), 0.0, 4.0, np.asarray(state))


def _solve(detuning, state=START, rtol=1e-10, **options):
    solution = hierax.sesolve(
        _hamiltonian(detuning), state, TIMES, rtol=rtol, atol=rtol / 100, **options
    )
    return solution.final_state, solution.stats["num_steps"]


def _error(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def test_a_sweep_of_detunings_steps_in_lockstep(monkeypatch):
    """One step count for the whole batch, at least the largest any element takes
    alone, and every element within the tolerance of scipy's solve."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    finals, steps = jax.jit(jax.vmap(_solve))(DETUNINGS)
    assert stepped and all(s is not None for s in stepped)
    alone = [int(_solve(d)[1]) for d in DETUNINGS]
    assert len(set(alone)) > 1  # the elements alone take different steps
    assert set(np.asarray(steps).tolist()) == {int(steps[0])} and steps[0] >= max(alone)
    for d, final in zip(DETUNINGS, finals):
        assert _error(final, _reference(d)) <= 1e-9


def test_a_sweep_of_states_and_of_both(monkeypatch):
    """States mapped with one Hamiltonian (its own columns) and states with
    detunings, expectation values included, equal the elements solved alone."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    rng = np.random.default_rng(0)
    kets = rng.normal(size=(5, 2)) + 1j * rng.normal(size=(5, 2))
    kets = jnp.asarray(kets / np.linalg.norm(kets, axis=1, keepdims=True))
    times = jnp.linspace(0.0, 4.0, 3)

    def solve(detuning, state):
        return hierax.sesolve(
            _hamiltonian(detuning), state, times, rtol=1e-10, atol=1e-12, exp_ops=[SZ]
        )

    for mapped in (
        jax.vmap(solve, in_axes=(None, 0))(0.4, kets),
        jax.vmap(solve)(DETUNINGS[:5], kets),
    ):
        assert mapped.states.shape == (5, 3, 2) and mapped.expects is not None
        assert mapped.expects.shape == (5, 1, 3) and mapped.times.shape == (5, 3)
        assert mapped.final_state.shape == (5, 2)
    assert len(stepped) == 2 and all(s is not None for s in stepped)
    for k in range(5):
        alone = solve(DETUNINGS[k], kets[k])
        assert _error(mapped.states[k], alone.states) <= 1e-9
        assert _error(mapped.expects[k], alone.expects) <= 1e-9
        assert _error(mapped.final_state[k], _reference(DETUNINGS[k], kets[k])) <= 1e-9


def test_other_batches_go_element_by_element(monkeypatch):
    """A batched pulse width (a time-dependent term's shape), a complex batched
    amplitude, batched times or a batched tolerance: each element steps alone, as
    it would unmapped with traced values (under `jax.jit`: concrete ones skip the
    resolution check, and agree to the tolerance only)."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    mean, _, amplitude = PULSE

    def by_width(width):
        h = hierax.TimeOperator(
            [hierax.Constant(0.15), hierax.Gaussian(mean, width, amplitude / 2)],
            [SZ, SX],
        )
        return hierax.sesolve(h, START, TIMES, rtol=1e-10, atol=1e-12).final_state

    def by_complex_amplitude(a):
        h = hierax.TimeOperator(
            [hierax.Constant(0.15), hierax.Gaussian(mean, PULSE[1], a / 2)], [SZ, SX]
        )
        return hierax.sesolve(h, START, TIMES, rtol=1e-10, atol=1e-12).final_state

    def by_end(end):
        times = jnp.stack([0.0, end])
        return hierax.sesolve(_hamiltonian(0.3), START, times, rtol=1e-10).final_state

    def by_rtol(rtol):
        return _solve(0.3, rtol=rtol)[0]

    widths = jnp.array([0.5, 0.8, 1.3])
    mapped = jax.vmap(by_width)(widths)
    for w, final in zip(widths, mapped):
        h = lambda t, w=float(w): (
            0.15 * SZ
            + amplitude
            / 2
            * np.exp(  # noqa: E731
                -((t - mean) ** 2) / (2 * w**2)
            )
            * SX
        )
        assert _error(final, propagate(h, 0.0, 4.0, np.asarray(START))) <= 1e-9
        assert _error(final, jax.jit(by_width)(w)) <= 1e-14
        assert _error(final, by_width(w)) <= 1e-9
    # (The phase of a complex amplitude rotates the drive: not a real scale.)
    phases = jnp.exp(1j * jnp.array([0.0, 0.7]))
    rotated = jax.vmap(by_complex_amplitude)(amplitude * phases)
    for p, final in zip(phases, rotated):
        assert _error(final, jax.jit(by_complex_amplitude)(amplitude * p)) <= 1e-14
    ends = jax.vmap(by_end)(jnp.array([2.0, 4.0]))
    assert _error(ends[1], _reference(0.3)) <= 1e-9
    rtols = jax.vmap(by_rtol)(jnp.array([1e-6, 1e-10]))
    assert _error(rtols[1], _reference(0.3)) <= 1e-9
    assert len(stepped) == 4 and all(s is None for s in stepped)


def test_a_sweep_of_drive_amplitudes_steps_in_lockstep(monkeypatch):
    """Real amplitudes of a time-dependent term (a Rabi sweep, amplitude 0
    included), with the detuning swept too: one step count for the batch, every
    element within the tolerance of scipy's solve and of its solve alone."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    amplitudes = jnp.array([0.0, 0.4, 2.5, 6.0, -1.2])
    detunings = jnp.linspace(-1.0, 3.0, 5)

    def solve(detuning, amplitude):
        h = _hamiltonian(detuning, amplitude)
        s = hierax.sesolve(h, START, TIMES, rtol=1e-10, atol=1e-12)
        return s.final_state, s.stats["num_steps"]

    finals, steps = jax.jit(jax.vmap(solve))(detunings, amplitudes)
    assert stepped and all(s is not None for s in stepped)
    alone = [solve(d, a) for d, a in zip(detunings, amplitudes)]
    assert len({int(s) for _, s in alone}) > 1
    assert set(np.asarray(steps).tolist()) == {int(steps[0])}
    assert steps[0] >= max(int(s) for _, s in alone)
    for d, a, final, (one, _) in zip(detunings, amplitudes, finals, alone):
        assert _error(final, _reference(d, amplitude=float(a))) <= 1e-9
        assert _error(final, one) <= 1e-9
    # Only the amplitude mapped, the detuning shared.
    shared = jax.vmap(lambda a: solve(0.3, a)[0])(amplitudes)
    for a, final in zip(amplitudes, shared):
        assert _error(final, _reference(0.3, amplitude=float(a))) <= 1e-9


def test_amplitudes_of_complex_drives_and_of_a_large_state(monkeypatch):
    """Swept amplitudes of a `Cos` drive on a complex matrix (sigma_y) beside a
    `Gaussian` on a real one, on a qubit (real embedding) and on a 256-level
    random system (real and complex parts apart): each element against its solve
    alone, and the qubit's against scipy's."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    sy = np.array([[0, -1j], [1j, 0]])

    def qubit(a, b):
        h = hierax.TimeOperator(
            [
                hierax.Constant(0.4),
                hierax.Cos(1.1, 0.3, a),
                hierax.Gaussian(2.0, 0.8, b),
            ],
            [SZ, sy, SX],
        )
        return hierax.sesolve(h, START, TIMES, rtol=1e-10, atol=1e-12).final_state

    pairs = (jnp.array([0.0, 0.5, 1.5]), jnp.array([1.0, -0.3, 2.0]))
    finals = jax.vmap(qubit)(*pairs)
    for a, b, final in zip(*pairs, finals):
        a, b = float(a), float(b)

        def h(t, a=a, b=b):
            pulse = b * np.exp(-((t - 2.0) ** 2) / (2 * 0.8**2))
            return 0.4 * SZ + a * np.cos(1.1 * t + 0.3) * sy + pulse * SX

        assert _error(final, propagate(h, 0.0, 4.0, np.asarray(START))) <= 1e-9
        assert _error(final, qubit(a, b)) <= 1e-9
    rng = np.random.default_rng(3)
    n = 256
    h0 = rng.normal(size=(n, n))
    h0 = (h0 + h0.T) / (2 * np.sqrt(n))
    v = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
    v = (v + v.conj().T) / (2 * np.sqrt(n))
    ket = jnp.asarray(np.eye(n)[0], complex)
    times = jnp.array([0.0, 0.6])

    def large(a):
        h = hierax.TimeOperator(
            [hierax.Constant(1.0), hierax.Cos(2.0, 0.0, a)], [h0, v]
        )
        return hierax.sesolve(h, ket, times, rtol=1e-10, atol=1e-12).final_state

    amplitudes = jnp.array([0.0, 0.7, 2.0])
    mapped = jax.vmap(large)(amplitudes)
    for a, final in zip(amplitudes, mapped):
        assert _error(final, large(a)) <= 1e-9
    assert len(stepped) == 2 and all(s is not None for s in stepped)


def test_gradients_with_respect_to_swept_amplitudes():
    """The gradient of a mapped solve with respect to the amplitudes equals each
    element's own gradient and a central difference; a new set of amplitudes
    compiles nothing."""

    def population(amplitude):
        final = hierax.sesolve(
            _hamiltonian(0.4, amplitude), START, TIMES, rtol=1e-10, atol=1e-12
        ).final_state
        return jnp.abs(final[1]) ** 2

    amplitudes = jnp.array([0.0, 0.9, 2.3])
    sweep = jax.jit(jax.grad(lambda a: jnp.sum(jax.vmap(population)(a))))
    grads = sweep(amplitudes)
    alone = np.array([float(jax.grad(population)(a)) for a in amplitudes])
    step = 1e-5
    central = np.array(
        [(population(a + step) - population(a - step)) / (2 * step) for a in amplitudes]
    )
    assert np.allclose(alone, central, rtol=1e-6, atol=1e-10)
    assert _error(grads, alone) <= 1e-10
    values = jax.jit(jax.vmap(population))
    values(amplitudes)
    shifted = amplitudes + 0.25
    before = compile_count()
    values(shifted)
    sweep(shifted)
    assert compile_count() == before


def test_gradients_of_a_batch_are_the_elements_gradients():
    """Reverse mode of the mapped solve and the map of reverse mode equal the
    elements' own gradients and a central difference; forward mode
    (`diffrax.ForwardMode`) under `jax.vmap` too."""

    def population(detuning, adjoint=None):
        final, _ = _solve(detuning, adjoint=adjoint)
        return jnp.abs(final[1]) ** 2

    detunings = DETUNINGS[:4]
    alone = np.array([float(jax.grad(population)(d)) for d in detunings])
    step = 1e-5
    central = np.array(
        [(population(d + step) - population(d - step)) / (2 * step) for d in detunings]
    )
    assert np.allclose(alone, central, rtol=1e-6, atol=1e-10)
    of_sum = jax.grad(lambda d: jnp.sum(jax.vmap(population)(d)))(detunings)
    mapped = jax.vmap(jax.grad(population))(detunings)
    forward = jax.vmap(jax.jacfwd(lambda d: population(d, diffrax.ForwardMode())))(
        detunings
    )
    for g in (of_sum, mapped, forward):
        assert _error(g, alone) <= 1e-10


def test_a_new_tolerance_or_detuning_never_recompiles():
    @jax.jit
    def sweep(detunings, rtol):
        return jax.vmap(lambda d: _solve(d, rtol=rtol)[0])(detunings)

    shifted = DETUNINGS + 0.01  # (an eager operation compiles: before counting)
    first = sweep(DETUNINGS, 1e-8)
    before = compile_count()
    again = sweep(shifted, 1e-9)
    assert compile_count() == before
    assert _error(first[2], _reference(DETUNINGS[2])) <= 1e-7
    assert _error(again[2], _reference(shifted[2])) <= 1e-8


def test_batched_energy_shifts_and_complex64():
    """An offset c I per element is its exact phase; a complex64 batch keeps its
    dtype and its accuracy."""

    def shifted(detuning, offset):
        h = hierax.TimeOperator(
            [
                hierax.Constant(detuning / 2),
                hierax.Constant(offset),
                hierax.Gaussian(*PULSE),
            ],
            [SZ, np.eye(2), SX / 2],
        )
        return hierax.sesolve(h, START, TIMES, rtol=1e-10, atol=1e-12).final_state

    offsets = jnp.array([0.0, 3.0, 250.0])
    finals = jax.vmap(shifted)(DETUNINGS[:3], offsets)
    for d, c, final in zip(DETUNINGS[:3], offsets, finals):
        assert _error(final, np.exp(-4j * float(c)) * _reference(d)) <= 1e-9

    low = jax.vmap(
        lambda d: (
            hierax.sesolve(
                _hamiltonian(d), START.astype(jnp.complex64), TIMES.astype(jnp.float32)
            ).final_state
        )
    )(DETUNINGS.astype(jnp.float32))
    assert low.dtype == jnp.complex64
    for d, final in zip(DETUNINGS, low):
        assert _error(final, _reference(d)) <= 1e-4


@pytest.mark.parametrize("order", [5, 16])
def test_orders_and_a_larger_system(order):
    """Any order, and a 4-level system whose constant term is a batched sum."""
    rng = np.random.default_rng(3)
    a = rng.normal(size=(4, 4)) + 1j * rng.normal(size=(4, 4))
    h0, v = (a + a.conj().T) / 4, np.diag([1.0, 0.5, -0.5, -1.0]).astype(complex)
    state = jnp.asarray(np.eye(4)[0], complex)

    def solve(g):
        h = hierax.TimeOperator(
            [hierax.Constant(g), hierax.Cos(1.7, 0.0, 0.4)], [h0, v]
        )
        return hierax.sesolve(h, state, TIMES, rtol=1e-10, order=order).final_state

    couplings = jnp.array([0.3, 1.0, 2.0])
    finals = jax.vmap(solve)(couplings)
    for g, final in zip(couplings, finals):
        h = lambda t, g=float(g): g * h0 + 0.4 * np.cos(1.7 * t) * v  # noqa: E731
        assert _error(final, propagate(h, 0.0, 4.0, np.asarray(state))) <= 1e-9


def _chain(sites):
    """The XY chain's hopping and its staggered field, as NumPy matrices."""
    x, y = SX, np.array([[0, -1j], [1j, 0]])
    z = SZ

    def at(op, k, width=1):
        return np.kron(np.kron(np.eye(2**k), op), np.eye(2 ** (sites - k - width)))

    hopping = sum(at(np.kron(x, x) + np.kron(y, y), k, 2) for k in range(sites - 1))
    field = sum((-1) ** k * at(z, k) for k in range(sites))
    drive = sum(at(x, k) for k in range(sites))
    return hopping, field, drive


def test_a_chain_held_by_its_diagonals_and_nested_maps(monkeypatch):
    """A 6-site chain (n = 64, terms held by their diagonals) swept over its field
    strength and kets, nested `jax.vmap`s and a batch of one, against each element
    solved alone (and that against scipy)."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    hopping, field, drive = _chain(6)
    neel = jnp.asarray(np.eye(64)[int("010101", 2)], complex)
    rng = np.random.default_rng(4)
    kets = rng.normal(size=(2, 64)) + 1j * rng.normal(size=(2, 64))
    kets = jnp.asarray(kets / np.linalg.norm(kets, axis=1, keepdims=True))
    times = jnp.array([0.0, 1.5])

    def solve(strength, state):
        h = hierax.TimeOperator(
            [hierax.Constant(1.0), hierax.Constant(strength), hierax.Cos(2.0, 0, 0.3)],
            [hopping, field, drive],
        )
        return hierax.sesolve(h, state, times, rtol=1e-10, atol=1e-12).final_state

    strengths = jnp.array([0.2, 1.3, 2.5])
    nested = jax.jit(jax.vmap(jax.vmap(solve, in_axes=(None, 0)), in_axes=(0, None)))(
        strengths, kets
    )
    one = jax.vmap(solve)(strengths[:1], neel[None])
    assert nested.shape == (3, 2, 64) and one.shape == (1, 64)
    assert stepped and all(s is not None for s in stepped)
    for i, g in enumerate(strengths):
        for k in range(2):
            assert _error(nested[i, k], solve(g, kets[k])) <= 1e-9
    alone = solve(strengths[0], neel)
    assert _error(one[0], alone) <= 1e-9

    def h(t):
        return hopping + 0.2 * field + 0.3 * np.cos(2.0 * t) * drive

    assert _error(alone, propagate(h, 0.0, 1.5, np.asarray(neel))) <= 1e-9


def test_one_hamiltonian_with_a_sampled_pulse_maps_its_kets(monkeypatch):
    """One Hamiltonian for the whole batch steps its kets as columns, whatever its
    structure (here a piecewise-constant pulse, whose knots bound the steps)."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    knots = jnp.linspace(0.0, 4.0, 9)
    pulse = hierax.PiecewiseConstant(knots, jnp.linspace(0.2, 1.0, 8))
    h = hierax.TimeOperator([hierax.Constant(0.4), pulse], [SZ, SX])
    kets = jnp.asarray([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8j]], complex)

    def solve(ket):
        return hierax.sesolve(h, ket, TIMES, rtol=1e-10, atol=1e-12).final_state

    mapped = jax.vmap(solve)(kets)
    assert len(stepped) == 1 and stepped[0] is not None
    for ket, final in zip(kets, mapped):
        assert _error(final, solve(ket)) <= 1e-10


def test_swept_constants_on_real_matrices_of_a_large_state(monkeypatch):
    """From 256 levels the terms with real matrices step in real arithmetic, apart
    from the others. A sweep of a constant term's coefficient there (and of a
    drive's amplitude beside it) steps in lockstep, each column with its own
    value: every element against scipy's solve and against its solve alone. (The
    real terms' series once lost which rows are constant, and every column then
    stepped with element 0's detuning: errors of order 1.)"""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    rng = np.random.default_rng(11)
    n = 256
    h0, h1 = (rng.normal(size=(n, n)) for _ in range(2))
    h0, h1 = ((m + m.T) / (4 * np.sqrt(n)) for m in (h0, h1))
    d = np.diag(np.arange(n) % 3).astype(float)
    ket = jnp.asarray(np.eye(n)[0], complex)

    def solve(detuning, amplitude):
        h = hierax.TimeOperator(
            [
                hierax.Constant(detuning),
                hierax.Cos(1.3, 0.0, amplitude),
                hierax.Constant(1.0),
            ],
            [d, h1, h0],
        )
        return hierax.sesolve(h, ket, TIMES / 2, rtol=1e-10, atol=1e-12).final_state

    detunings, amplitudes = jnp.array([0.0, 0.5, 2.0]), jnp.array([1.0, 1.0, -0.5])
    finals = jax.jit(jax.vmap(solve))(detunings, amplitudes)
    assert stepped and all(s is not None for s in stepped)
    for x, a, final in zip(detunings, amplitudes, finals):
        x, a = float(x), float(a)

        def h(t, x=x, a=a):
            return x * d + a * np.cos(1.3 * t) * h1 + h0

        assert _error(final, propagate(h, 0.0, 2.0, np.asarray(ket))) <= 1e-9
        assert _error(final, solve(x, a)) <= 1e-9


@pytest.mark.parametrize("case", ["amplitudes", "kets", "kets and detunings, saved"])
def test_the_lockstep_batches_the_outputs_a_mapped_solve_would(monkeypatch, case):
    """The lockstep rule reads which outputs are batched off the solution's
    structure (`_lockstep_batched`); JAX's own batching of the element-by-element
    solve (`_batched_outputs`, what the rule falls back to) must agree, or the
    derivatives of a mapped solve would not match its values."""
    states = jnp.stack([START, jnp.array([0.6, 0.8j])])
    most = [1000]  # (a new value for the second call: a new program, traced)

    def solve(detuning, amplitude, state, times=TIMES):
        h = _hamiltonian(detuning, amplitude)
        return hierax.sesolve(
            h, state, times, exp_ops=[SZ], rtol=1e-8, max_steps=most[0]
        )

    calls = {
        "amplitudes": lambda: jax.vmap(lambda a: solve(0.3, a, START))(
            jnp.array([0.0, 1.5])
        ),
        "kets": lambda: jax.vmap(lambda s: solve(0.3, 0.9, s))(states),
        "kets and detunings, saved": lambda: jax.vmap(
            lambda d, s: solve(d, 0.9, s, jnp.linspace(0.0, 4.0, 5))
        )(DETUNINGS[:2], states),
    }
    read = recorded_returns(monkeypatch, _lockstep, "_lockstep_batched")
    stepped = calls[case]()
    monkeypatch.setattr(_lockstep, "_in_lockstep", lambda *args: None)
    most[0] += 1
    mapped_flags = recorded_returns(monkeypatch, _lockstep, "_batched_outputs")
    mapped = calls[case]()
    assert len(read) == len(mapped_flags) == 1
    assert jax.tree.structure(read[0]) == jax.tree.structure(mapped_flags[0])
    assert jax.tree.leaves(read[0]) == jax.tree.leaves(mapped_flags[0])
    assert _error(stepped.final_state, mapped.final_state) <= 1e-7


def test_a_sweep_of_propagators_steps_in_lockstep(monkeypatch):
    """Matrix states under `jax.vmap` (propagators, `floquet`'s sweeps): the
    identity under a sweep of detunings and drive amplitudes, a batch of
    non-square states under one Hamiltonian, and both, step in lockstep (each
    element's columns adjacent columns of one state). Every column within the
    tolerance of scipy's solve; gradients equal the elements' alone."""
    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    eye = jnp.eye(2, dtype=complex)
    amplitudes = jnp.linspace(0.3, 1.2, 7)
    rng = np.random.default_rng(3)
    states = jnp.asarray(rng.normal(size=(5, 2, 3)) + 1j * rng.normal(size=(5, 2, 3)))

    def solve(detuning, amplitude, state):
        h = _hamiltonian(detuning, amplitude)
        return hierax.sesolve(h, state, TIMES, rtol=1e-10, atol=1e-12).final_state

    swept = jax.jit(jax.vmap(solve, in_axes=(0, 0, None)))(DETUNINGS, amplitudes, eye)
    shared = jax.jit(jax.vmap(solve, in_axes=(None, None, 0)))(0.4, 0.9, states)
    both = jax.jit(jax.vmap(solve))(DETUNINGS[:5], amplitudes[:5], states)
    assert len(stepped) == 3 and all(s is not None for s in stepped)
    assert swept.shape == (7, 2, 2) and shared.shape == both.shape == (5, 2, 3)
    for k in range(7):
        d, a = float(DETUNINGS[k]), float(amplitudes[k])
        assert _error(swept[k], _reference(d, eye, a)) <= 1e-9
    for k in range(5):
        assert _error(shared[k], _reference(0.4, states[k], 0.9)) <= 1e-8
        d, a = float(DETUNINGS[k]), float(amplitudes[k])
        assert _error(both[k], _reference(d, states[k], a)) <= 1e-8

    def entry(amplitude):
        return jnp.real(solve(0.4, amplitude, eye)[0, 1])

    slopes = jax.jit(jax.vmap(jax.grad(entry)))(amplitudes[:3])
    single = jax.jit(jax.grad(entry))
    for k in range(3):
        assert abs(float(slopes[k]) - float(single(amplitudes[k]))) <= 1e-9
