"""hierax.sesolve, TaylorSolver and SchrodingerTerm against independent solvers:
scipy's DOP853 at rtol 1e-13, `jax.scipy.linalg.expm` for constant Hamiltonians,
finite differences for gradients, Python loops for vmap."""

import functools
import math
import re
from typing import Any, cast

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import hierax
from hierax._data._sparse import SparseMatrix, SparseTerms, UniformSparseMatrix
from hierax._kernels import propagator
from hierax._operators._rewrites import merge_equal_terms
from hierax._solvers import (
    SchrodingerTerm,
    Solution,
    TaylorSolver,
    _term as term_module,
    sesolve,
)
from hierax._solvers._sesolve import _term as _sesolve_term
from hierax._solvers._term import schrodinger_terms, with_parts

from .helpers import compile_count, no_reads_to_the_host, recorded_returns


SX = np.array([[0, 1], [1, 0]], complex)
SY = np.array([[0, -1j], [1j, 0]])
SZ = np.array([[1, 0], [0, -1]], complex)


def _kron_at(op, site, sites):
    out = np.eye(1)
    for k in range(sites):
        out = np.kron(out, op if k == site else np.eye(2))
    return out


def _ising(sites):
    """Nearest-neighbour ZZ couplings and the transverse field, as two matrices."""
    zz = sum(
        _kron_at(SZ, k, sites) @ _kron_at(SZ, k + 1, sites) for k in range(sites - 1)
    )
    x = sum(_kron_at(SX, k, sites) for k in range(sites))
    return zz, x


def _qubit(amplitude=1.0, offset=0.0):
    """A driven qubit; every test that can shares this structure (and its compiled
    solve): the amplitude and the offset are values, not structure."""
    drift = 0.5 * SZ + offset * np.eye(2)
    return hierax.TimeOperator(
        [hierax.Constant(1.0), amplitude * hierax.Cos(1.3)], [drift, SX]
    )


def _three_level():
    # A ladder with anharmonicity, driven by a Gaussian-envelope carrier.
    a = np.diag(np.sqrt([1.0, 2.0]), 1)
    drift = np.diag([0.0, 1.0, 1.7])
    drive = hierax.Gaussian(2.0, 1.0) * hierax.Cos(1.0)
    return hierax.TimeOperator([hierax.Constant(1.0), drive], [drift, 0.8 * (a + a.T)])


def _ising_driven(sites=5):
    zz, x = _ising(sites)
    field = hierax.Constant(1.0) + 0.5 * hierax.Sin(2.0)
    return hierax.TimeOperator([hierax.Constant(1.0), field], [zz, x])


def _reference(hamiltonian, state, times):
    """scipy DOP853 at rtol 1e-13 on the flattened state, at `times`."""
    return _dop853(hamiltonian, state, times)[0]


def _dop853(hamiltonian, state, times, dense=False):
    """The states at `times`, and the dense solution when asked."""
    state = np.asarray(state, complex)
    shape = state.shape
    matrix = jax.jit(hamiltonian.__call__)

    def rhs(t, y):
        return (-1j * np.asarray(matrix(t)) @ y.reshape(shape)).reshape(-1)

    times = np.asarray(times)
    out = solve_ivp(
        rhs,
        (times[0], times[-1]),
        state.reshape(-1),
        method="DOP853",
        rtol=1e-13,
        atol=1e-14,
        t_eval=times,
        dense_output=dense,
    )
    return out.y.T.reshape((len(times),) + shape), out.sol


def _error(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


RTOL = 1e-10  # the tolerance most tests share (and so share one compiled solve)


@pytest.mark.parametrize(
    "system, state, span, rtol",
    [
        (_qubit, np.array([1.0, 0.0]), 12.0, 1e-6),
        (_qubit, np.array([1.0, 0.0]), 12.0, RTOL),
        (_three_level, np.array([1.0, 0.0, 0.0]), 6.0, RTOL),
        (_ising_driven, np.eye(32)[0], 3.0, RTOL),
    ],
    ids=["qubit-1e-6", "qubit", "three-level", "ising-5"],
)
def test_against_dop853(system, state, span, rtol):
    hamiltonian = system()
    times = np.linspace(0.0, span, 5)
    solution = sesolve(hamiltonian, state, times, rtol=rtol, atol=rtol * 1e-2)
    reference = _reference(hamiltonian, state, times)
    assert solution.states.shape == (5,) + state.shape
    assert _error(solution.states, reference) <= 10 * rtol
    assert int(solution.stats["num_accepted_steps"]) > 0


def test_complex_coefficients_against_dop853():
    """A rotating drive written with complex time functions, e^{iwt} a + e^{-iwt}
    a^dagger, on two kets at once: small states step in real arithmetic, where a
    complex coefficient's imaginary part is a term of its own."""
    a = np.diag(np.sqrt([1.0, 2.0]), 1).astype(complex)
    drift = np.diag([0.0, 1.0, 1.7]).astype(complex)
    hamiltonian = (
        hierax.Exp(0.9j) * (0.6 * a)
        + hierax.Exp(-0.9j) * (0.6 * a.conj().T)
        + drift
        + (0.2 + 0.1j) * hierax.Cos(1.1) * np.diag([1.0, 1j, -1j])
    )
    state = np.eye(3, dtype=complex)[:, :2]
    times = np.linspace(0.0, 5.0, 3)
    solution = sesolve(hamiltonian, state, times, rtol=RTOL, atol=RTOL * 1e-2)
    reference = _reference(hamiltonian, state, times)
    assert _error(solution.states, reference) <= 10 * RTOL


def test_constant_hamiltonian_against_expm():
    zz, x = _ising(4)
    matrix = zz + 0.7 * x
    propagator = np.eye(16, dtype=complex)
    times = np.array([0.0, 0.4, 2.5])
    solution = sesolve(matrix, propagator, times, rtol=RTOL, atol=RTOL * 1e-2)
    for t, out in zip(times, solution.states):
        exact = jsl.expm(-1j * t * jnp.asarray(matrix))
        assert _error(out, exact) <= 10 * RTOL


def test_real_and_imaginary_parts_in_real_arithmetic():
    """Known complex matrices of a large system step as real ones (real part with
    f, imaginary part with i f, zero parts dropped), beside a callable term that
    stays complex: against DOP853."""
    sites = 8
    rng = np.random.default_rng(3)
    n = 2**sites
    m = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
    general = (m + m.conj().T) / (4 * np.sqrt(n))
    sy = _kron_at(SY, 0, sites)
    zx = _kron_at(SZ, 1, sites) @ _kron_at(SX, 2, sites)
    hamiltonian = hierax.TimeOperator(
        [hierax.Cos(1.3), hierax.Sin(0.7), hierax.Constant(1.0)], [general, sy, zx]
    ) + hierax.as_operator(
        lambda t: jnp.cos(t) * jnp.asarray(_kron_at(SX, 3, sites) @ sy)
    )
    term = SchrodingerTerm(hamiltonian)
    assert isinstance(term.hamiltonian, hierax.OperatorSum)
    real, sparse = term.hamiltonian.operators[:2]
    assert isinstance(real, hierax.TimeOperator)
    assert isinstance(sparse, hierax.TimeOperator)
    matrices = jnp.asarray(real.matrices)
    # general: both parts, dense; sy: imaginary only, sz x sx: real only, each
    # with one nonzero per row, so applied by its nonzeros (in real arithmetic).
    assert matrices.shape[0] == 2 and not jnp.iscomplexobj(matrices)
    assert isinstance(sparse.matrices, tuple) and len(sparse.matrices) == 2
    assert all(
        isinstance(m, hierax.SparseMatrix)
        and m.values.shape[1] == 1
        and not jnp.iscomplexobj(m.values)
        for m in sparse.matrices
    )
    state = rng.normal(size=n) + 1j * rng.normal(size=n)
    state = state / np.linalg.norm(state)
    times = np.array([0.0, 0.5, 1.0])
    solution = sesolve(hamiltonian, state, times, rtol=RTOL)
    assert _error(solution.states, _reference(hamiltonian, state, times)) <= (10 * RTOL)


def test_terms_with_equal_matrices_step_as_one():
    """A two-tone drive through one coupling written term by term (h0 + f1 v +
    f2 v) steps as one term (f1 + f2) v: the term's structure says so, the
    solution matches DOP853 and the gradient with respect to a tone's amplitude
    matches finite differences. Traced matrices (a gradient with respect to them)
    and operators with no repeat are left as they are."""
    a = np.diag(np.sqrt(np.arange(1.0, 4.0)), 1)
    h0, v = np.diag([0.0, 1.0, 1.7, 2.2]), a + a.T

    def hamiltonian(amplitude):
        return (
            h0
            + hierax.Cos(0.9, 0.0, amplitude) * v
            + hierax.Cos(1.8, 0.7, 0.3) * v
            + hierax.Sin(0.4, amplitude=0.2) * h0
        )

    term = SchrodingerTerm(hamiltonian(0.5))
    merged = term.hamiltonian
    assert isinstance(merged, hierax.TimeOperator) and len(merged.functions) == 2
    state = np.eye(4)[0].astype(complex)
    times = np.array([0.0, 2.0, 4.0])
    solution = sesolve(hamiltonian(0.5), state, times, rtol=RTOL)
    reference = _reference(hamiltonian(0.5), state, times)
    assert _error(solution.states, reference) <= 10 * RTOL

    def population(amplitude):
        final = sesolve(hamiltonian(amplitude), state, [0.0, 4.0], rtol=1e-12)
        return jnp.abs(final.states[-1, 1]) ** 2

    step = 1e-5
    difference = (population(0.5 + step) - population(0.5 - step)) / (2 * step)
    np.testing.assert_allclose(jax.grad(population)(0.5), difference, rtol=1e-6)

    def traced(matrix):
        return SchrodingerTerm(hierax.Cos(0.9) * matrix + hierax.Sin(0.9) * matrix)

    kept = jax.eval_shape(traced, jnp.asarray(v)).hamiltonian
    assert len(kept.functions) == 2
    plain = hierax.as_operator(h0 + hierax.Cos(0.9) * v)
    assert merge_equal_terms(plain) is plain


def _xy_chain(sites: int) -> tuple[np.ndarray, np.ndarray]:
    """A chain's nearest-neighbour XX + YY hopping and its field sum Y_k."""
    hopping = sum(
        _kron_at(SX, k, sites) @ _kron_at(SX, k + 1, sites)
        + _kron_at(SY, k, sites) @ _kron_at(SY, k + 1, sites)
        for k in range(sites - 1)
    )
    field = sum(_kron_at(SY, k, sites) for k in range(sites))
    return np.asarray(hopping), np.asarray(field)


def test_few_diagonals_step_the_same_series_as_dense_terms():
    """A driven 5-site chain (n = 32, nearest-neighbour XX + YY, a complex time
    function on sum Y_k): its terms' real embeddings have few nonzero diagonals, so
    `sesolve` assembles them before compiling and steps with them. One step's
    series (a backward step, complex coefficients) equals the dense layout's, the
    solve equals DOP853, and for a propagator state (columns) too."""
    hopping, field = _xy_chain(5)
    n = hopping.shape[0]
    hamiltonian = hierax.TimeOperator(
        [hierax.Constant(1.0), hierax.Exp(0.4j) + hierax.Cos(1.1)], [hopping, field]
    )
    term, with_known_parts = _sesolve_term(hamiltonian)
    known = with_known_parts(jnp.complex128).parts
    assert isinstance(known, propagator.EmbeddedParts) and known.lowered.count < n
    rng = np.random.default_rng(4)
    state = rng.normal(size=n) + 1j * rng.normal(size=n)
    state = jnp.asarray(state / np.linalg.norm(state))

    @jax.jit
    def series(parts):
        stepped = with_parts(term, parts)
        return stepped.taylor_terms(
            jnp.asarray(0.3), jnp.asarray(-0.4), state, 14, None
        )

    (ours, _), (dense, _) = series(known), series(None)
    size = float(np.max(np.abs(dense)))
    assert _error(ours, dense) <= 1e-14 * size
    times = np.array([0.0, 0.5, 1.0])
    solution = sesolve(hamiltonian, state, times, rtol=RTOL)
    assert _error(solution.states, _reference(hamiltonian, state, times)) <= 10 * RTOL
    columns = jnp.stack([state, jnp.roll(state, 1)], axis=1)
    both = sesolve(hamiltonian, columns, times, rtol=RTOL).states
    assert _error(both[..., 0], solution.states) <= 10 * RTOL
    # H + 5 I: the same states times the phase e^{-5it}.
    shifted = hierax.TimeOperator(
        [hierax.Constant(1.0), hierax.Exp(0.4j) + hierax.Cos(1.1)],
        [hopping + 5.0 * np.eye(n), field],
    )
    phases = np.exp(-5j * times)[:, None]
    moved = sesolve(shifted, state, times, rtol=RTOL).states
    assert _error(moved, phases * np.asarray(solution.states)) <= 10 * RTOL
    # complex64: the parts in float32, the solve in single precision.
    low = sesolve(
        hamiltonian, state.astype(jnp.complex64), times.astype(np.float32), rtol=1e-5
    )
    assert low.states.dtype == jnp.complex64
    assert _error(low.states, solution.states) <= 1e-4


def test_diagonal_terms_are_differentiated_by_the_adjoint_or_densely(monkeypatch):
    """Terms held by their diagonals run fast and differentiate slowly by JAX
    (reverse mode turns each diagonal's slice into a pad of the state): the driven
    5-site chain solved in a jit steps with `Diagonals`, its gradient (the default
    adjoint: the adjoint recursion) too, while forward mode takes the dense
    embedding (`by_differentiation`); both equal a central difference."""
    hopping, field = _xy_chain(5)
    n = hopping.shape[0]
    state = jnp.zeros(n, complex).at[5].set(1.0)
    times = jnp.array([0.0, 0.6])
    layouts = []
    loop = propagator.series_loop

    def recorded(parts, *args):
        layouts.extend(type(part[1]).__name__ for part in parts)
        return loop(parts, *args)

    monkeypatch.setattr(propagator, "series_loop", recorded)

    def population(amplitude, adjoint=None):
        drive = amplitude * (hierax.Exp(0.4j) + hierax.Cos(1.1))
        hamiltonian = hierax.Constant(1.0) * hopping + drive * field
        # (An order of its own: a program no other test has traced, so that the
        # spy sees this test's traces.)
        final = sesolve(hamiltonian, state, times, rtol=RTOL, order=23, adjoint=adjoint)
        return jnp.abs(final.final_state[9]) ** 2

    # The gradient first: its trace is the solve's (a plain solve afterwards
    # reuses it).
    gradient = jax.jit(jax.grad(population))(0.7)
    assert layouts and set(layouts) == {"Diagonals"}
    solve = jax.jit(population)
    step = 1e-5
    central = (solve(0.7 + step) - solve(0.7 - step)) / (2 * step)
    assert abs(float(gradient - central)) <= 1e-7 * abs(float(central)) + 1e-12
    layouts.clear()
    forward = jax.jacfwd(lambda a: population(a, diffrax.ForwardMode()))(0.7)
    # The diagonals run the values, the dense embedding (traced) the derivative.
    assert layouts[0] == "Diagonals" and "Diagonals" not in layouts[1:]
    assert abs(float(forward - gradient)) <= 1e-10 * abs(float(gradient))
    assert 0 < float(solve(0.7)) < 1


def test_traced_scale_of_a_shifted_hamiltonian_and_its_zero():
    """`a * (H + 5 I)` with a traced `a` is a `TimeOperator` whose constant terms
    carry the traced value: the step still takes their trace out as an exact phase,
    so the state is the unshifted solve's times e^{-5 i a t}; at a = 0 the state
    stays put, and the gradient there is finite and equals a central difference."""
    h = hierax.Cos(1.3) * SX + 0.4 * SZ
    shifted = h + 5.0 * np.eye(2)
    psi = jnp.array([0.6, 0.8j])
    times = jnp.array([0.0, 0.7])

    def final(a, operator):
        return sesolve(a * operator, psi, times, rtol=RTOL).final_state

    solve = jax.jit(final)
    for a in (1.5, 0.0):
        expected = np.exp(-5j * a * 0.7) * np.asarray(solve(a, h))
        assert _error(solve(a, shifted), expected) <= 10 * RTOL
    assert _error(solve(0.0, shifted), psi) == 0.0
    shift = jax.jit(lambda a: hierax.SchrodingerTerm(a * shifted).energy_shift)
    assert complex(shift(1.5)) == pytest.approx(7.5, abs=1e-14)

    def population(a):
        return jnp.abs(final(a, shifted)[0]) ** 2

    gradient = jax.jit(jax.grad(population))(0.0)
    step = 1e-5
    central = (population(step) - population(-step)) / (2 * step)
    assert np.isfinite(float(gradient))
    assert abs(float(gradient - central)) <= 1e-8


def _driven_qutrit() -> tuple[list, np.ndarray]:
    """A qutrit's time functions and matrices: a constant, a Gaussian drive and a
    complex exponential times a cosine on the other quadrature."""
    a = np.diag([1.0, np.sqrt(2.0)], 1)
    functions = [
        hierax.Constant(1.0),
        hierax.Gaussian(mean=1.0, width=0.4, amplitude=0.8),
        hierax.Exp(0.4j) * hierax.Cos(1.1),
    ]
    return functions, np.stack([np.diag([0.0, 1.0, 1.7]), a + a.T, 1j * (a - a.T)])


def test_tiny_states_sum_the_generator_first_with_the_same_series(monkeypatch):
    """A driven qutrit with two drives (one with complex values): below
    `SMALL_EMBEDDED_SIZE` a step sums the generator's series first and takes one
    product an order. One step's series (a backward step; a ket and a propagator)
    equals the term-by-term loop's to rounding, and the solve equals DOP853, in
    float64 and float32."""
    functions, matrices = _driven_qutrit()
    hamiltonian = hierax.TimeOperator(functions, matrices)
    term, with_known_parts = _sesolve_term(hamiltonian)
    # The dense embeddings, formed once in the solve's program (not before).
    assert with_known_parts(jnp.complex128).parts is None
    known = term.with_program_parts(jnp.asarray(0.0), jnp.complex128).parts
    assert isinstance(known, propagator.DenseEmbedding)
    rng = np.random.default_rng(5)
    ket = rng.normal(size=3) + 1j * rng.normal(size=3)
    states = [jnp.asarray(ket / np.linalg.norm(ket)), jnp.eye(3, dtype=complex)]

    def series(y, parts=None):
        return schrodinger_terms(
            term.hamiltonian, jnp.asarray(0.7), jnp.asarray(-0.45), y, 20, parts
        )

    tiny = [jax.jit(series)(y) for y in states]
    assembled = jax.jit(series)(states[1], known)
    assert _error(assembled, tiny[1]) <= 1e-15 * float(np.max(np.abs(tiny[1])))
    monkeypatch.setattr(propagator, "SMALL_EMBEDDED_SIZE", 0)
    looped = [jax.jit(series)(y) for y in states]
    for ours, theirs in zip(tiny, looped):
        assert ours.shape == theirs.shape
        assert _error(ours, theirs) <= 1e-15 * float(np.max(np.abs(theirs)))
        assert float(np.max(np.abs(theirs[-1]))) > 0  # a series that reaches order 20
    monkeypatch.undo()
    times = np.array([0.0, 1.0, 2.5])
    reference = _reference(hamiltonian, states[0], times)
    solution = sesolve(hamiltonian, states[0], times, rtol=RTOL)
    assert _error(solution.states, reference) <= 10 * RTOL
    low = sesolve(
        hamiltonian,
        states[0].astype(jnp.complex64),
        times.astype(np.float32),
        rtol=1e-5,
    )
    assert low.states.dtype == jnp.complex64
    assert _error(low.states, reference) <= 1e-4
    # H + 5 I: the same states times the phase e^{-5it}.
    shifted = matrices.copy()
    shifted[0] += 5.0 * np.eye(3)
    moved = sesolve(
        hierax.TimeOperator(functions, shifted), states[0], times, rtol=RTOL
    )
    phases = np.exp(-5j * times)[:, None]
    assert _error(moved.states, phases * np.asarray(solution.states)) <= 10 * RTOL

    # The gradient at an exact zero (the Gaussian's amplitude) against a central
    # difference.
    def population(amplitude):
        pulse = hierax.Gaussian(mean=1.0, width=0.4, amplitude=amplitude)
        drives = hierax.TimeOperator([functions[0], pulse, functions[2]], matrices)
        final = sesolve(drives, states[0], times, rtol=RTOL).final_state
        return jnp.abs(final[1]) ** 2

    slope = float(jax.jit(jax.grad(population))(0.0))
    step = 1e-5
    difference = float(population(step) - population(-step)) / (2 * step)
    assert np.isfinite(slope) and abs(difference) > 1e-3
    assert slope == pytest.approx(difference, rel=1e-6)
    # Matrices made inside a user's jit (traced, unreadable before compiling):
    # their embeddings are formed once, at the solve's start in the program.
    formed = recorded_returns(monkeypatch, term_module, "program_embedded_parts")

    @jax.jit
    def inside(scale):
        traced = hierax.TimeOperator(functions, scale * jnp.asarray(matrices))
        return sesolve(traced, states[0], times, rtol=RTOL).states

    assert _error(inside(1.0), reference) <= 10 * RTOL
    assert len(formed) == 1 and isinstance(formed[0], propagator.DenseEmbedding)


def test_piecewise_constant_pulse_against_expm_per_segment():
    # The pulse's edges are jump times of the step-size controller: no step
    # straddles one, so each segment is solved with its own constant Hamiltonian.
    edges = np.array([0.0, 0.7, 1.9, 3.0])
    values = np.array([0.3, -1.2, 0.8])
    hamiltonian = hierax.PiecewiseConstant(edges, values) * SX + 0.5 * SZ
    state = np.array([1.0, 0.0], complex)
    times = np.array([0.0, 1.0, 2.5, 3.0])
    ours = sesolve(hamiltonian, state, times, rtol=RTOL, atol=RTOL * 1e-2)

    def exact(t):
        psi = state
        for a, b, v in zip(edges[:-1], edges[1:], values):
            if t > a:
                step = np.asarray(jsl.expm(-1j * (v * SX + 0.5 * SZ) * (min(t, b) - a)))
                psi = step @ psi
        return psi

    reference = np.stack([exact(t) for t in times])
    assert np.max(np.abs(np.asarray(ours.states) - reference)) <= 10 * RTOL


def test_dense_output_between_saved_times():
    hamiltonian = _three_level()
    state = np.array([0.0, 1.0, 0.0])
    times = np.array([0.0, 2.0, 6.0])
    rtol = RTOL
    solution = sesolve(
        hamiltonian,
        state,
        times,
        rtol=rtol,
        atol=rtol * 1e-2,
        dense=True,
        max_steps=500,
    )
    _, dense = _dop853(hamiltonian, state, times, dense=True)
    between = np.linspace(0.01, 5.97, 23)
    out = solution.evaluate(between)
    assert out.shape == (23, 3)
    assert dense is not None
    assert _error(out, dense(between).T) <= 10 * rtol
    assert _error(solution.evaluate(times[1]), solution.states[1]) <= 10 * rtol


def test_span_away_from_zero_and_its_ends():
    """A span far from t = 0 (the solver steps in the span's unit time and maps
    back): states, and dense output at both ends exactly and in between, against
    DOP853."""
    hamiltonian = _qubit()
    state = np.array([1.0, 0.0])
    times = 100.0 + np.array([0.0, 1.5, 3.0])
    solution = sesolve(
        hamiltonian, state, times, rtol=RTOL, atol=RTOL * 1e-2, dense=True
    )
    reference, dense = _dop853(hamiltonian, state, times, dense=True)
    assert dense is not None
    assert np.array_equal(np.asarray(solution.times), times)
    assert _error(solution.states, reference) <= 10 * RTOL
    ends = solution.evaluate(times[[0, -1]])
    assert _error(ends, reference[[0, -1]]) <= 10 * RTOL
    between = np.linspace(100.01, 102.99, 7)
    assert _error(solution.evaluate(between), dense(between).T) <= 10 * RTOL


def test_unitarity_over_ten_thousand_steps():
    # Fixed steps, each with the series converged to working precision: what is
    # left is rounding, which must not drift.
    hamiltonian = _qubit()
    solution = sesolve(
        hamiltonian,
        np.eye(2, dtype=complex),
        np.array([0.0, 5000.0]),
        dt=0.5,
        order=30,
        max_steps=10_000,
    )
    assert int(solution.stats["num_steps"]) == 10_000
    u = np.asarray(solution.states[-1])
    assert np.max(np.abs(u.conj().T @ u - np.eye(2))) <= 1e-12


def test_first_step_bound_from_norms_known_before_compiling():
    # The first step comes from a bound on |H(t0)|_inf; with the matrices known,
    # their norms are taken in NumPy and the bound is sum_a |f_a(t0)| |H_a|_inf: an
    # upper bound (a sum, sparse terms included), equal to the in-program one for
    # one term; traced matrices fall back to the in-program bound.
    from hierax._operators._rewrites import operator_bound, term_norms

    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(2, 4, 4)) + 1j * rng.normal(size=(2, 4, 4))
    diagonal = hierax.SparseMatrix.from_matrix(np.diag([1.0, -2.0, 3.0, 0.5]))
    operator = hierax.OperatorSum(
        [hierax.Cos(2.0, phase=0.3) * a + 0.5 * b, hierax.Sin(1.0) * diagonal]
    )
    t = jnp.asarray(0.7)
    norms = term_norms(operator)
    assert norms is not None and norms.dense.shape == (2,)
    assert norms.sparse.shape == (1,)
    dense = np.asarray(operator(t))
    exact = np.max(np.sum(np.abs(dense), axis=1))
    f = [np.cos(2.0 * 0.7 + 0.3), 0.5, np.sin(0.7)]
    norm = lambda m: np.max(np.sum(np.abs(m), axis=1))
    expected = abs(f[0]) * norm(a) + f[1] * norm(b) + abs(f[2]) * 3.0
    bound = float(operator_bound(operator, t, norms))
    assert bound >= exact
    np.testing.assert_allclose(bound, expected, rtol=1e-6)
    single = hierax.Cos(2.0) * a
    np.testing.assert_allclose(
        float(operator_bound(single, t, term_norms(single))),
        float(operator_bound(single, t)),
        rtol=1e-6,
    )
    traced = jax.jit(lambda m: jnp.asarray(term_norms(hierax.Cos(2.0) * m) is None))
    assert bool(traced(jnp.asarray(a)))


def test_energy_offset_is_an_exact_phase():
    # H + c 1 evolves as e^{-ict} times the evolution under H, at the same cost.
    state = np.array([1.0, 0.0])
    times = np.linspace(0.0, 4.0, 5)
    plain = sesolve(_qubit(), state, times, rtol=RTOL, atol=RTOL * 1e-2)
    shifted = sesolve(_qubit(offset=300.0), state, times, rtol=RTOL, atol=RTOL * 1e-2)
    phase = np.exp(-300j * times)[:, None]
    assert _error(shifted.states, phase * plain.states) <= 10 * RTOL
    assert int(shifted.stats["num_steps"]) == int(plain.stats["num_steps"])
    assert SchrodingerTerm(_qubit(offset=300.0)).energy_shift == pytest.approx(300.0)
    with pytest.raises(ValueError, match="dense=True"):
        plain.evaluate(0.5)


def _population(amplitude, duration, adjoint=None):
    times = jnp.stack([jnp.zeros_like(duration), duration])
    solution = sesolve(
        _qubit(amplitude),
        jnp.array([1.0, 0.0j]),
        times,
        rtol=1e-12,
        atol=1e-14,
        adjoint=adjoint,
    )
    return jnp.abs(solution.states[-1, 1]) ** 2


def test_gradients_against_finite_differences():
    amplitude, duration, step = 0.8, 3.0, 1e-4
    reverse = jax.grad(_population, argnums=(0, 1))(amplitude, duration)
    forward = jax.jacfwd(_population, argnums=(0, 1))(
        amplitude, duration, diffrax.ForwardMode()
    )
    differences = (
        (
            _population(amplitude + step, duration)
            - _population(amplitude - step, duration)
        )
        / (2 * step),
        (
            _population(amplitude, duration + step)
            - _population(amplitude, duration - step)
        )
        / (2 * step),
    )
    for r, f, d in zip(reverse, forward, differences):
        assert float(r) == pytest.approx(float(d), rel=1e-6, abs=1e-9)
        assert float(f) == pytest.approx(float(r), rel=1e-10, abs=1e-12)


def test_gradient_with_respect_to_matrix_entries():
    """A parameter inside the matrices (traced matrices, real and imaginary parts):
    small states step in real arithmetic with the matrices embedded, and the
    gradient goes through that embedding; against central differences."""
    sx, sz = jnp.asarray(SX), jnp.asarray(SZ)

    def population(g):
        hamiltonian = hierax.TimeOperator(
            [hierax.Constant(1.0), hierax.Cos(1.3)],
            [0.5 * sz, g * sx + 0.3j * g * (sx @ sz)],
        )
        solution = sesolve(
            hamiltonian, jnp.array([1.0, 0.0]), jnp.array([0.0, 2.0]), rtol=1e-11
        )
        return jnp.abs(solution.states[-1, 1]) ** 2

    g, step = 0.7, 1e-5
    gradient = float(jax.grad(population)(g))
    difference = float(population(g + step) - population(g - step)) / (2 * step)
    assert gradient == pytest.approx(difference, rel=1e-7, abs=1e-10)


def test_vmap_over_parameters_and_states_equals_loop():
    """A batch of drive amplitudes and states (stepped in lockstep: each element
    agrees with its solve alone to the tolerance, here 1e-9 at the default rtol
    1e-8, not to the last digit). And `final_state` is `states[-1]`, taken
    inside the compiled solve: reading it runs no JAX operation (indexing
    `states` from Python would), and under `jax.vmap` it has the batch axis."""
    amplitudes = jnp.array([0.2, 0.7, 1.1])
    states = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], complex)
    times = jnp.linspace(0.0, 2.0, 4)

    def solve(amplitude, state):
        return sesolve(_qubit(amplitude), state, times, exp_ops=[SZ])

    batched = jax.vmap(solve)(amplitudes, states)
    looped = [solve(a, s) for a, s in zip(amplitudes, states)]
    assert batched.expects is not None and batched.expects.shape == (3, 1, 4)
    assert (
        _error(batched.expects, np.stack([np.asarray(s.expects) for s in looped]))
        <= 1e-9
    )
    before = compile_count()
    finals = np.asarray(batched.final_state)
    assert finals.shape == (3, 2)
    assert np.array_equal(finals, np.asarray(batched.states)[:, -1])
    assert np.array_equal(
        np.asarray(looped[1].final_state), np.asarray(looped[1].states)[-1]
    )
    assert compile_count() == before
    assert _error(finals, np.stack([s.final_state for s in looped])) <= 1e-9


class _CountingHamiltonian(eqx.Module):
    amplitude: jax.Array
    calls: list = eqx.field(static=True)

    def __call__(self, t):
        self.calls.append(None)
        return jnp.asarray(SZ) + self.amplitude * jnp.cos(t) * jnp.asarray(SX)


def test_no_retrace_when_times_or_parameters_change():
    calls = []
    state = np.array([1.0, 0.0])
    SchrodingerTerm(_CountingHamiltonian(jnp.asarray(0.5), calls))
    validation = len(calls)  # the eager check of a callable Hamiltonian
    sesolve(
        _CountingHamiltonian(jnp.asarray(0.5), calls), state, np.array([0.0, 0.2, 1.0])
    )
    first = len(calls)
    assert first > validation
    for amplitude, end in [(0.9, 2.0), (1.4, 3.5)]:
        before = len(calls)
        sesolve(
            _CountingHamiltonian(jnp.asarray(amplitude), calls),
            state,
            np.array([0.0, 0.5, end]),
        )
        assert len(calls) - before == validation

    # Under a user's jit: one trace for every value of times and parameters, and
    # times that do not increase are caught at run time.
    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def solve(amplitude, times):
        return sesolve(_qubit(amplitude), jnp.array([1.0, 0.0j]), times).states

    solve(jnp.asarray(0.3), jnp.array([0.0, 1.0, 2.0]))
    solve(jnp.asarray(0.8), jnp.array([0.5, 1.0, 4.0]))
    with pytest.raises(Exception, match="strictly increasing"):
        solve(jnp.asarray(0.8), jnp.array([0.0, 2.0, 1.0]))


def test_new_tolerances_never_recompile():
    """Tolerances are values of the compiled solve: a new `rtol` or `atol` traces
    nothing, from Python (the solve's trace count stays put) and inside a user's
    `jax.jit` with the tolerances as arguments, in both solvers; the solution
    follows the tolerance (tighter is closer to the reference), and a bad traced
    tolerance is reported at run time."""
    calls = []
    state, times = np.array([1.0, 0.0]), np.array([0.0, 0.5, 2.0])
    hamiltonian = _CountingHamiltonian(jnp.asarray(0.5), calls)
    reference = _reference(hamiltonian, state, times)
    start = len(calls)
    SchrodingerTerm(hamiltonian)
    validation = len(calls) - start  # the eager check of a callable Hamiltonian
    before = len(calls)
    sesolve(hamiltonian, state, times, rtol=1e-6, atol=1e-8)
    assert len(calls) - before > validation  # the solve's own trace
    errors = []
    for rtol, atol in [(1e-4, 1e-6), (1e-9, 1e-11), (1e-12, 1e-14)]:
        before = len(calls)
        solution = sesolve(hamiltonian, state, times, rtol=rtol, atol=atol)
        errors.append(_error(solution.states, reference))
        # At most the eager check again (the term of an immutable Hamiltonian is
        # kept), never the solve's trace.
        assert len(calls) - before in (0, validation)
    assert errors[2] < errors[0] and errors[2] <= 1e-10

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def solve(rtol, atol):
        return sesolve(_qubit(0.5), state, times, rtol=rtol, atol=atol).states

    reference = _reference(_qubit(0.5), state, times)
    loose = solve(jnp.asarray(1e-4), jnp.asarray(1e-6))
    tight = solve(jnp.asarray(1e-12), jnp.asarray(1e-14))
    assert _error(tight, reference) < _error(loose, reference)
    assert _error(tight, reference) <= 1e-10
    with pytest.raises(Exception, match="`rtol` must be positive"):
        solve(jnp.asarray(-1e-4), jnp.asarray(1e-6))

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def open_solve(rtol):
        rho = jnp.diag(jnp.array([1.0, 0.0]))
        jump = 0.3 * jnp.array([[0.0, 1.0], [0.0, 0.0]])
        return hierax.mesolve(_qubit(0.5), [jump], rho, times, rtol=rtol).states

    open_solve(jnp.asarray(1e-5))
    open_solve(jnp.asarray(1e-10))


# diffrax warns on every complex state it is given; for the Taylor solver it does not
# apply (exact complex steps, a real norm: see `hierax._solvers._integrate`).
@pytest.mark.filterwarnings("ignore:Complex dtype support")
def test_taylor_solver_in_diffeqsolve_equals_sesolve():
    hamiltonian = _qubit()
    state = jnp.array([1.0, 0.0], complex)
    times = jnp.linspace(0.0, 12.0, 5)
    ours = sesolve(hamiltonian, state, times, rtol=RTOL, atol=RTOL * 1e-2)

    def solve(y0, ts):
        return diffrax.diffeqsolve(
            SchrodingerTerm(hamiltonian),
            TaylorSolver(ours.order),
            t0=ts[0],
            t1=ts[-1],
            dt0=(ts[-1] - ts[0]) / 100,
            y0=y0,
            saveat=diffrax.SaveAt(ts=ts),
            stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=RTOL * 1e-2),
        ).ys

    forward = solve(state, times)
    assert forward is not None
    reference = _reference(hamiltonian, state, times)
    assert _error(forward, ours.states) <= 10 * RTOL
    assert _error(forward, reference) <= 10 * RTOL
    # t1 < t0: diffrax runs a reversed time variable, and the series must follow.
    back = solve(forward[-1], times[::-1])
    assert _error(back, reference[::-1]) <= 10 * RTOL
    with pytest.raises(TypeError, match="adjoint_steps"):
        TaylorSolver(ours.order, adjoint_steps=cast(Any, "yes"))


@pytest.mark.filterwarnings("ignore:Complex dtype support")
def test_a_users_args_leave_the_steps_parts_alone():
    """The parts `sesolve` assembles before compiling (here the driven 5-site
    chain's real embeddings, held by their diagonals) are a field of the term,
    never diffrax's `args`: a user's own `args` (any pytree) leave the step's
    program as it is with `args=None` (that of the parts, not of the term without
    them), and a diffrax solve with them gives the same states bitwise and the
    same steps, equal to DOP853's. New times and new values of the user's `args`
    do not retrace."""
    hopping, field = _xy_chain(5)
    hamiltonian = hierax.TimeOperator(
        [hierax.Constant(1.0), hierax.Exp(0.4j) + hierax.Cos(1.1)], [hopping, field]
    )
    bare, with_known_parts = _sesolve_term(hamiltonian)
    term = with_known_parts(jnp.complex128)
    assert isinstance(term.parts, propagator.EmbeddedParts)
    assert bare.parts is None and term is with_known_parts(jnp.complex128)
    n = hopping.shape[0]
    rng = np.random.default_rng(6)
    state = rng.normal(size=n) + 1j * rng.normal(size=n)
    state = jnp.asarray(state / np.linalg.norm(state))
    users = {"drive": jnp.arange(3.0), "name": None, "pair": (1, jnp.ones((2, 2)))}

    def program(term, args):
        step = lambda y: term.taylor_terms(
            jnp.asarray(0.3), jnp.asarray(-0.4), y, 14, args
        )
        return str(jax.make_jaxpr(step)(state))

    assert program(term, users) == program(term, None) != program(bare, None)

    @jax.jit
    @eqx.debug.assert_max_traces(max_traces=2)  # `args=None`, and the user's
    def solve(t1, args):
        solution = diffrax.diffeqsolve(
            term,
            TaylorSolver(20),
            t0=0.0,
            t1=t1,
            dt0=0.05,
            y0=state,
            args=args,
            stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=RTOL * 1e-2),
        )
        return solution.ys, solution.stats["num_steps"]

    plain, plain_steps = solve(jnp.asarray(1.0), None)
    ours, steps = solve(jnp.asarray(1.0), users)
    assert np.array_equal(ours, plain) and int(steps) == int(plain_steps)
    times = np.array([0.0, 1.0])
    assert _error(ours[-1], _reference(hamiltonian, state, times)[-1]) <= 10 * RTOL
    moved = jax.tree.map(lambda x: x + 1 if isinstance(x, jax.Array) else x, users)
    later, _ = solve(jnp.asarray(0.7), moved)
    shorter = _reference(hamiltonian, state, np.array([0.0, 0.7]))[-1]
    assert _error(later[-1], shorter) <= 10 * RTOL


def test_several_kets_and_expectation_values():
    hamiltonian = _qubit()
    kets = np.array([[1.0, 0.6, 0.0], [0.0, 0.8j, 1.0]])  # three kets as columns
    times = np.linspace(0.0, 3.0, 5)
    solution = sesolve(hamiltonian, kets, times, exp_ops=[SZ, SX], rtol=RTOL)
    assert isinstance(solution, Solution)
    assert solution.states.shape == (5, 2, 3)
    assert solution.expects is not None and solution.expects.shape == (2, 5, 3)
    psi = _reference(hamiltonian, kets, times)
    for e, op in enumerate([SZ, SX]):
        exact = np.einsum("tni,nm,tmi->ti", psi.conj(), op, psi)
        assert _error(solution.expects[e], exact) <= 10 * RTOL


def test_complex64_state_under_float64_times_is_solved_in_complex128():
    """diffrax widens a complex64 state under float64 times to complex128: the
    step's parts and its order follow (they stayed complex64 and float32's order,
    and a driven qubit came out 8e-9 off at rtol 1e-12, in complex128)."""
    hamiltonian = 0.5 * SZ + 0.8 * SX
    times = np.linspace(0.0, 2.0, 4)
    state = np.array([1.0, 0.0])
    reference = np.stack([jsl.expm(-1j * hamiltonian * t) @ state for t in times])
    for low in (state.astype(np.complex64), jnp.asarray(state, jnp.float32)):
        ours = hierax.sesolve(hamiltonian, low, times, rtol=1e-12, atol=1e-14)
        assert ours.states.dtype == jnp.complex128
        assert _error(ours.states, reference) <= 1e-11


def test_float32():
    hamiltonian = hierax.TimeOperator(
        [hierax.Constant(np.float32(1.0)), hierax.Cos(np.float32(1.3))],
        [0.5 * SZ.astype(np.complex64), SX.astype(np.complex64)],
    )
    state = np.array([1.0, 0.0], np.complex64)
    times = np.linspace(0.0, 4.0, 5, dtype=np.float32)
    solution = sesolve(hamiltonian, state, times, rtol=1e-5, atol=1e-6)
    assert solution.states.dtype == jnp.complex64
    reference = _reference(hamiltonian, state, times)
    assert _error(solution.states, reference) <= 1e-4
    # A complex64 state under a float64 Hamiltonian: the state sets the precision.
    mixed = sesolve(_qubit(), state, times, rtol=1e-5, atol=1e-6)
    assert mixed.states.dtype == jnp.complex64
    assert _error(mixed.states, _reference(_qubit(), state, times)) <= 1e-4


def test_progress_meter(capfd):
    sesolve(_qubit(), np.array([1.0, 0.0]), np.array([0.0, 1.0]), progress=True)
    assert "100.00%" in capfd.readouterr().out


def test_progress_meter_over_no_elements(capfd):
    """`jax.vmap` over zero elements with `progress=True` gives empty results
    (diffrax's meter takes a maximum over the batch, which has none: a batch of
    none is solved without it), for a ket, dense output and `mesolve`; a batch
    of two still prints."""
    times = np.array([0.0, 0.5, 1.0])
    calls = {
        "ket": lambda a: (
            sesolve(_qubit(a), np.array([1.0, 0.0]), times, progress=True).states
        ),
        "dense": lambda a: sesolve(
            _qubit(a), np.array([1.0, 0.0]), times, progress=True, dense=True
        ).evaluate(0.3),
        "mesolve": lambda a: (
            hierax.mesolve(
                _qubit(a), [0.1 * SZ], np.diag([1.0, 0.0]), times, progress=True
            ).states
        ),
    }
    for name, call in calls.items():
        shape = jax.eval_shape(jax.vmap(call), jnp.ones(2)).shape
        assert jax.vmap(call)(jnp.ones(0)).shape == (0,) + shape[1:], name
    capfd.readouterr()
    jax.vmap(calls["mesolve"])(jnp.array([0.5, 1.0]))
    assert "100.00%" in capfd.readouterr().out


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(state=np.ones(3)), "`state`"),
        (dict(times=np.array([0.0, 2.0, 1.0])), "`times` must be strictly increasing"),
        (dict(times=np.array([1.0])), "`times`"),
        (dict(rtol=0.0), "`rtol`"),
        (dict(atol=-1e-9), "`atol`"),
        (dict(dt=0.0), "`dt`"),
        (dict(exp_ops=[SZ, np.eye(3)]), r"`exp_ops\[1\]`"),
        (dict(state=np.eye(2), exp_ops=[SZ]), "`exp_ops`"),
        (dict(order=0), "`order`"),
        (dict(max_steps=0), "`max_steps`"),
        (dict(adjoint=diffrax.BacksolveAdjoint()), "`adjoint`"),
    ],
)
def test_bad_input_names_the_argument(kwargs, match):
    arguments: dict[str, Any] = dict(
        state=np.array([1.0, 0.0]), times=np.array([0.0, 1.0])
    )
    arguments.update(kwargs)
    state, times = arguments.pop("state"), arguments.pop("times")
    with pytest.raises(ValueError, match=match):
        sesolve(_qubit(), state, times, **arguments)


def test_bad_traced_tolerances_name_the_argument_at_run_time():
    """Tolerances traced by a user's jit are checked inside the program (one check
    for both): each bad one is named, and good ones pass."""
    state, times = jnp.array([1.0, 0.0j]), jnp.array([0.0, 1.0])
    solve = jax.jit(
        lambda r, a: sesolve(_qubit(), state, times, rtol=r, atol=a).final_state
    )
    assert np.all(np.isfinite(solve(1e-6, 1e-8)))
    for rtol, atol, name in (
        (-1.0, 1e-8, "rtol"),
        (1e-6, np.nan, "atol"),
        (1e-6, np.inf, "atol"),
        (0.0, -1.0, "rtol"),
    ):
        with pytest.raises(Exception, match=f"`{name}` must be positive and finite"):
            jax.block_until_ready(solve(rtol, atol))


def test_dense_output_too_large_for_memory_is_refused_before_compiling():
    """Dense output keeps every step's series for `max_steps` steps: a request that
    cannot fit says so (naming `max_steps`) instead of failing inside XLA."""
    state, times = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    with pytest.raises(MemoryError, match="`max_steps`"):
        sesolve(_qubit(), state, times, dense=True, max_steps=10**14)


@pytest.mark.parametrize(
    "name, spelling",
    [
        ("e_ops", "`exp_ops=`"),
        ("tlist", "`times`"),
        ("c_ops", "second positional argument"),
        ("psi0", "`state`"),
    ],
)
def test_qutip_and_dynamiqs_names_get_the_hierax_spelling(name, spelling):
    """A QuTiP or dynamiqs keyword is refused in one line that names the hierax
    spelling (one name per meaning: no aliases), in both solvers; an unknown one
    lists the options."""
    state, times = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    with pytest.raises(TypeError, match=re.escape(spelling)) as info:
        sesolve(_qubit(), state, times, **cast(Any, {name: None}))
    assert f"`{name}=`" in str(info.value) and "hierax.sesolve" in str(info.value)
    rho = np.diag([1.0, 0.0])
    with pytest.raises(TypeError, match=re.escape(spelling)):
        hierax.mesolve(_qubit(), [], rho, times, **cast(Any, {name: None}))
    with pytest.raises(TypeError, match="unexpected keyword argument `tolerance=`"):
        sesolve(_qubit(), state, times, tolerance=1e-6)


def test_qutip_positional_order_in_mesolve_is_explained():
    rho = np.diag([1.0, 0.0])
    jumps = [0.1 * np.array([[0.0, 1.0], [0.0, 0.0]])]
    with pytest.raises(TypeError, match=r"QuTiP's order .*hierax.mesolve\(H, jump"):
        hierax.mesolve(_qubit(), rho, [0.0, 1.0], jumps)


def test_times_as_a_list_or_numpy_array_like_the_state():
    """`times` accepts what the state accepts: a list and a NumPy array give the
    solve of the same JAX array; a list of non-numbers is refused naming `times`."""
    state = [1.0, 0.0]
    from_list = sesolve(_qubit(), state, [0.0, 0.5, 1.0], rtol=1e-10, atol=1e-12)
    from_array = sesolve(
        _qubit(), np.array(state), jnp.array([0.0, 0.5, 1.0]), rtol=1e-10, atol=1e-12
    )
    np.testing.assert_array_equal(from_list.states, from_array.states)
    reference = _reference(_qubit(), np.array(state), np.array([0.0, 0.5, 1.0]))
    assert _error(from_list.states, reference) <= 1e-8
    with pytest.raises(ValueError, match="`times`"):
        sesolve(_qubit(), state, ["a", "b"])


def _vjps(function, inputs, cotangent):
    """The output and every input's cotangent of `function(*inputs)`, compiled."""

    def run(inputs, cotangent):
        out, back = jax.vjp(function, *inputs)
        return (out, *back(cotangent))

    return jax.jit(run)(inputs, cotangent)


@pytest.mark.parametrize(
    "layout", ["real matrices", "complex", "diagonals", "interleaved diagonals", "tiny"]
)
def test_the_steps_adjoint_recursion_equals_the_transposed_loop(layout):
    """Reverse mode through a step's recursion by its adjoint (`adjoint=True`:
    one backward loop and a few contractions) gives what JAX's transpose of the
    loop gives, to rounding, for every input: the coefficients (time-dependent and
    constant rows), the matrices (dense real or complex, or their diagonals'
    values, also listed with the blocks interleaved), the state (one column or
    several); and the tiny-state loop, whose generator is summed first."""
    rng = np.random.default_rng(3)
    order = 7

    def normal(*shape, complex_=True):
        x = rng.normal(size=shape)
        return jnp.asarray(x + 1j * rng.normal(size=shape) if complex_ else x)

    n, count, columns = (3, 3, 2) if layout == "tiny" else (5, 3, 2)
    flags = (True, False, True) if layout != "complex" else ()
    diagonal = None
    if layout == "tiny":
        # Coefficients (real) and the real embeddings of the terms, (A, 2n, 2n).
        inputs = (normal(count, order + 1, complex_=False),)
        inputs += (normal(count, 2 * n, 2 * n, complex_=False),)
    elif layout.endswith("diagonals"):
        blocks = [
            np.diag(rng.normal(size=n)) + np.diag(rng.normal(size=n - 2), 2)
            for _ in range(count)
        ]
        blocks[1] += np.diag(rng.normal(size=n - 1), -1)
        diagonal = propagator.side_by_side(
            [propagator.Diagonals.from_matrix(b) for b in blocks]
        )
        if layout == "interleaved diagonals":  # not grouped by block
            order_of = np.argsort([d for _, d in diagonal.offsets], kind="stable")
            diagonal = propagator.Diagonals(
                diagonal.values[order_of],
                tuple(diagonal.offsets[k] for k in order_of),
                diagonal.blocks,
            )
        inputs = (normal(count, order + 1), jnp.asarray(diagonal.values))
    else:
        columns = 1 if layout == "real matrices" else 2
        matrices = normal(n, count * n, complex_=layout == "complex")
        inputs = (normal(count, order + 1), matrices)
    inputs += (normal(n, columns),)

    def function(coefficients, matrices, state, adjoint):
        if layout == "tiny":
            return propagator._small_embedded_series(
                coefficients, matrices, state, order, adjoint
            )
        if diagonal is not None:
            matrices = propagator.Diagonals(matrices, diagonal.offsets, diagonal.blocks)
        parts = [(coefficients, matrices, flags)]
        return propagator.series_loop(parts, None, None, state, order, adjoint)

    shape = (order + 1, n, columns)
    cotangent = normal(*shape)
    transposed = _vjps(lambda a, b, c: function(a, b, c, False), inputs, cotangent)
    adjoint = _vjps(lambda a, b, c: function(a, b, c, True), inputs, cotangent)
    for expected, got in zip(transposed, adjoint):
        assert got.dtype == expected.dtype
        error = float(jnp.max(jnp.abs(got - expected)) / jnp.max(jnp.abs(expected)))
        assert error <= 1e-13


def test_the_adjoint_recursion_with_sparse_terms_equals_the_transposed_loop():
    """The same with sparse terms beside a dense part (`SparseTerms`): a general
    real and a complex sparse matrix, a diagonal one and one of equal entries
    (`UniformSparseMatrix`, whose one value takes the whole cotangent), constant
    and time-dependent; one state and three columns."""
    rng = np.random.default_rng(4)
    order, n = 7, 6

    def sparse(kind):
        if kind == "diagonal":
            values = jnp.asarray(rng.normal(size=(n, 1)))
            return SparseMatrix(values, jnp.arange(n)[:, None], diagonal=True)
        mask = rng.random((n, n)) < 0.35
        dense = rng.normal(size=(n, n)) * mask
        if kind == "complex":
            dense = dense + 1j * rng.normal(size=(n, n)) * mask
        matrix = hierax.SparseMatrix.from_matrix(
            mask * 1.0 if kind == "ones" else dense
        )
        if kind == "ones":
            return UniformSparseMatrix(matrix.values, matrix.columns, diagonal=False)
        return matrix

    matrices = tuple(sparse(k) for k in ("real", "complex", "diagonal", "ones"))
    flags = (True, False, False, True)

    def function(coefficients, values, stacked, state, adjoint):
        rebuilt = tuple(
            eqx.tree_at(lambda m: m.values, m, x) for m, x in zip(matrices, values)
        )
        terms = SparseTerms(coefficients, rebuilt, flags)
        parts = [(0.5 * coefficients[:2], stacked, (False, True))]
        return propagator.series_loop(parts, None, terms, state, order, adjoint)

    def normal(*shape):
        return jnp.asarray(rng.normal(size=shape) + 1j * rng.normal(size=shape))

    for columns in ((), (3,)):
        inputs = (normal(4, order + 1), tuple(m.values for m in matrices))
        inputs += (jnp.asarray(rng.normal(size=(n, 2 * n))), normal(n, *columns))
        cotangent = normal(order + 1, n, *columns)
        transposed = _vjps(
            lambda a, b, c, d: function(a, b, c, d, False), inputs, cotangent
        )
        adjoint = _vjps(
            lambda a, b, c, d: function(a, b, c, d, True), inputs, cotangent
        )
        for expected, got in zip(jax.tree.leaves(transposed), jax.tree.leaves(adjoint)):
            assert got.dtype == expected.dtype
            scale = float(jnp.max(jnp.abs(expected)))
            assert float(jnp.max(jnp.abs(got - expected))) <= 1e-13 * scale


def test_gradients_by_the_steps_adjoints_whatever_is_differentiated(monkeypatch):
    """`sesolve`'s default (reverse-mode) gradient goes through the steps'
    adjoint recursions, forward mode (`diffrax.ForwardMode`) does not; one solve
    of a tiny state, of a small one and of sparse terms, differentiated with
    respect to a drive's amplitude, gives a gradient equal to a central
    difference. The small one's is also forward mode's, and its solve is then
    differentiated with respect to a matrix's scale (the program traced once,
    differentiated again with other inputs perturbed)."""
    adjoints = []
    series, small = propagator._by_adjoint, propagator._small_by_adjoint
    monkeypatch.setattr(
        propagator, "_by_adjoint", lambda *a: adjoints.append(1) or series(*a)
    )
    monkeypatch.setattr(
        propagator, "_small_by_adjoint", lambda *a: adjoints.append(1) or small(*a)
    )
    for n in (3, 5, 8):
        ladder = np.diag(np.sqrt(np.arange(1.0, n)), 1)
        drift = np.diag(np.arange(n) * 0.9 - 0.1 * np.arange(n) ** 2)
        if n == 8:  # three spins, sparse terms (`SparseTerms`)
            sites = [hierax.site_operator(SX / 2, k, 3) for k in range(3)]
            ladder = sites[0] + sites[1] + sites[2]
            drift = hierax.site_operator(SZ, 0, 3) @ hierax.site_operator(SZ, 1, 3)
        state = np.eye(n)[0].astype(complex)

        def population(
            amplitude, scale, adjoint=None, ladder=ladder, drift=drift, state=state
        ):
            hamiltonian = (
                hierax.Constant(1.0) * drift
                + hierax.Cos(1.1, amplitude=amplitude) * (scale * (ladder + ladder.T))
                + hierax.Sin(0.6, amplitude=0.3)
                * (scale * (1j * ladder - 1j * ladder.T))
            )
            # (An order of its own: a program no other test has traced.)
            final = sesolve(
                hamiltonian, state, [0.0, 1.5], rtol=1e-12, order=21, adjoint=adjoint
            )
            return jnp.abs(final.final_state[1]) ** 2

        point, step = (0.8, 1.2), 1e-5
        # Both sides of each central difference in one compiled solve.
        both = jax.jit(jax.vmap(population))
        for argnum in (0, 1) if n == 5 else (0,):
            adjoints.clear()
            gradient = jax.jit(jax.grad(population, argnum))(*point)
            # Dense matrices are the compiled solve's arguments either way: the
            # second gradient differentiates the first one's trace again.
            assert adjoints if argnum == 0 else not adjoints
            shift = np.eye(2)[argnum] * step
            sides = both(*(np.asarray(point)[:, None] + np.stack([shift, -shift]).T))
            central = (sides[0] - sides[1]) / (2 * step)
            assert abs(float(gradient - central)) <= 1e-6 * abs(float(central))
            if argnum == 0 and n == 5:  # (a forward-mode program: compiles)
                adjoints.clear()
                forward = jax.jit(
                    jax.jacfwd(
                        lambda *x: population(*x, adjoint=diffrax.ForwardMode()),
                        argnum,
                    )
                )(*point)
                assert not adjoints
                assert abs(float(gradient - forward)) <= 1e-10 * abs(float(forward))


def test_forward_mode_through_the_default_adjoint_says_what_to_pass():
    """`jax.jacfwd` through a solve with the default (reverse-mode) adjoint fails
    with a message naming `adjoint=diffrax.ForwardMode()`, with which it works and
    agrees with reverse mode."""
    state, times = np.array([1.0, 0.0]), np.array([0.0, 1.0])

    def final(amplitude, adjoint=None):
        solution = sesolve(
            _qubit(amplitude), state, times, exp_ops=[SZ], adjoint=adjoint
        )
        return cast(jax.Array, solution.expects)[0, -1].real

    with pytest.raises(TypeError, match=r"adjoint=diffrax\.ForwardMode\(\)"):
        jax.jacfwd(final)(1.0)
    forward = jax.jacfwd(lambda a: final(a, diffrax.ForwardMode()))(1.0)
    reverse = jax.grad(final)(1.0)
    np.testing.assert_allclose(forward, reverse, rtol=1e-7)


def test_direct_adjoint_differentiates_both_ways():
    """`diffrax.DirectAdjoint()`, documented as supported, differentiates in
    forward and in reverse mode (as in diffrax): `jax.jacfwd` through it once
    failed with the message about the default adjoint (a `custom_vjp` around every
    solve). Both agree with `ForwardMode`, and mesolve's too."""
    state, times = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    direct = diffrax.DirectAdjoint()

    def final(amplitude, adjoint):
        solution = sesolve(
            _qubit(amplitude), state, times, exp_ops=[SZ], adjoint=adjoint
        )
        return cast(jax.Array, solution.expects)[0, -1].real

    def open_final(amplitude, adjoint):
        solution = hierax.mesolve(
            _qubit(amplitude), [0.3 * SZ], np.diag([1.0, 0.0]), times,
            exp_ops=[SX], adjoint=adjoint,
        )  # fmt: skip
        return cast(jax.Array, solution.expects)[0, -1].real

    for f in (final, open_final):
        want = jax.jacfwd(functools.partial(f, adjoint=diffrax.ForwardMode()))(1.0)
        forward = jax.jacfwd(functools.partial(f, adjoint=direct))(1.0)
        reverse = jax.grad(functools.partial(f, adjoint=direct))(1.0)
        np.testing.assert_allclose(forward, want, rtol=1e-7)
        np.testing.assert_allclose(reverse, want, rtol=1e-7)


def test_a_rebuilt_operator_finds_its_term_and_a_changed_one_does_not(monkeypatch):
    """An operator rebuilt on every call from the same matrices and parameters (a
    user's loop) reuses the term built for the first (its parts are not assembled
    again); a new parameter value or matrix gives a new term and the new dynamics
    (against expm of the constant part with the drive switched off)."""
    import hierax._solvers._sesolve as module

    built = []
    real = module.known_embedded_parts
    monkeypatch.setattr(
        module, "known_embedded_parts", lambda *a: built.append(1) or real(*a)
    )
    sz, sx = np.diag([1.0, -1.0]), np.array([[0.0, 1.0], [1.0, 0.0]])
    state, times = np.array([1.0, 0.0]), np.array([0.0, 0.8])

    def solve(amplitude, matrix=sx):
        hamiltonian = 0.4 * sz + hierax.Cos(1.3, amplitude=amplitude) * matrix
        return sesolve(hamiltonian, state, times, rtol=1e-10, atol=1e-12).states[-1]

    first = solve(0.7)
    assert _error(solve(0.7), first) == 0
    assert len(built) == 1
    assert _error(solve(0.9), first) > 1e-3
    assert len(built) == 2
    off = solve(0.0, 2 * sx)
    assert len(built) == 3
    assert _error(off, jsl.expm(-0.8j * 0.4 * sz) @ state) <= 1e-9


@pytest.mark.parametrize(
    "name", ["H", "psi0", "rho0", "tlist", "tsave", "c_ops", "jump_ops", "e_ops"]
)
def test_foreign_keywords_get_their_hint_before_missing_arguments(name):
    """A QuTiP or dynamiqs call spelled with its own keywords (`sesolve(H,
    psi0=psi, tlist=t)`) leaves hierax's positional arguments missing: the hint
    for the keyword comes first, not Python's "missing a required argument", in
    both solvers; a hierax keyword alongside changes nothing."""
    for solver, given in ((sesolve, (_qubit(),)), (hierax.mesolve, (_qubit(), []))):
        with pytest.raises(TypeError, match=f"got `{name}=`.*in hierax it is"):
            solver(*given, **cast(Any, {name: None, "exp_ops": [SZ]}))
    with pytest.raises(TypeError, match="got `H=`"):
        sesolve(H=_qubit(), psi0=np.array([1.0, 0.0]), tlist=np.array([0.0, 1.0]))


@pytest.mark.parametrize("which", ["hamiltonian", "state", "times"])
def test_none_names_the_argument(which):
    arguments: dict[str, Any] = dict(
        hamiltonian=_qubit(), state=np.array([1.0, 0.0]), times=np.array([0.0, 1.0])
    )
    arguments[which] = None
    with pytest.raises((TypeError, ValueError), match=f"hierax.sesolve`: `{which}`"):
        sesolve(*arguments.values())
    arguments["state"] = np.diag([1.0, 0.0]) if which != "state" else None
    name = "rho" if which == "state" else which
    with pytest.raises((TypeError, ValueError), match=f"hierax.mesolve`: `{name}`"):
        hierax.mesolve(arguments["hamiltonian"], [], *list(arguments.values())[1:])


def test_non_finite_times_and_states_are_refused():
    """nan and inf in `times` or in the state are refused, naming the argument:
    from NumPy before compiling (a nan time once gave states of inf, an infinite
    one ran to `max_steps`), from JAX arrays inside the compiled solve, and inside
    a user's `jax.jit`; good values pass through the checked program unchanged."""
    state, times = np.array([1.0, 0.0]), np.array([0.0, 0.5, 1.0])
    for bad in ([0.0, np.nan, 1.0], [0.0, np.inf], [np.nan, 1.0]):
        with pytest.raises(ValueError, match="`times` must be finite"):
            sesolve(_qubit(), state, np.array(bad))
        with pytest.raises(ValueError, match="`times` must be finite"):
            hierax.mesolve(_qubit(), [], np.diag([1.0, 0.0]), bad)
    with pytest.raises(ValueError, match="`times` must be strictly increasing"):
        sesolve(_qubit(), state, [0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"`state` must be finite, got nan at index"):
        sesolve(_qubit(), np.array([np.nan, 0.0]), times)

    solve = jax.jit(lambda y, t: sesolve(_qubit(), y, t).states)
    good = solve(jnp.asarray(state, complex), jnp.asarray(times))
    assert _error(good, _reference(_qubit(), state, times)) <= 1e-7
    for y, t, match in (
        (state, [0.0, np.nan, 1.0], "`times` must be finite"),
        (state, [0.0, np.inf], "`times` must be finite"),
        (state, [0.0, 2.0, 1.0], "`times` must be strictly increasing"),
        ([np.inf, 0.0], times, "`state` must be finite"),
    ):
        y, t = jnp.asarray(y, complex), jnp.asarray(t)
        for call in (solve, lambda y, t: sesolve(_qubit(), y, t).states):
            with pytest.raises(Exception, match=match):
                jax.block_until_ready(call(y, t))
    rho = jnp.asarray([[np.nan, 0.0], [0.0, 1.0]])
    with pytest.raises(Exception, match="`rho` must be finite"):
        jax.block_until_ready(hierax.mesolve(_qubit(), [], rho, times).states)
    # Observables too: nan expectation values once came back without a word.
    bad = np.array([[1.0, np.inf], [0.0, 1.0]])
    with pytest.raises(ValueError, match=r"`exp_ops\[1\]` must be finite"):
        sesolve(_qubit(), state, times, exp_ops=[SZ, bad])
    with pytest.raises(Exception, match="`exp_ops` must be finite"):
        observed = hierax.mesolve(
            _qubit(), [], np.eye(2) / 2, times, exp_ops=[jnp.asarray(bad)]
        )
        jax.block_until_ready(observed.expects)


def test_hierax_operators_as_observables():
    """A constant hierax operator or a `SparseMatrix` is an observable like its
    matrix; a time-dependent operator, or any other object, is refused saying
    so. NumPy read each as a 0-d object array: "`exp_ops[0]` has shape ()"."""
    state, times = np.array([0.6, 0.8j]), np.array([0.0, 1.0])
    want = sesolve(_qubit(), state, times, exp_ops=[2.0 * SZ + SX]).expects
    constant = hierax.Constant(2.0) * SZ + SX
    sparse = SparseMatrix(
        np.array([[2.0, 1.0], [1.0, -2.0]]), np.array([[0, 1], [0, 1]])
    )
    for observable in (constant, sparse):
        got = sesolve(_qubit(), state, times, exp_ops=[observable]).expects
        np.testing.assert_allclose(got, want, atol=1e-12)
    rho = np.outer(state, state.conj())
    got = hierax.mesolve(_qubit(), [], rho, times, exp_ops=[constant]).expects
    np.testing.assert_allclose(got, want, atol=1e-12)
    with pytest.raises(TypeError, match=r"`exp_ops\[0\]` must be a constant matrix"):
        sesolve(_qubit(), state, times, exp_ops=[hierax.Cos(1.0) * SZ])
    with pytest.raises(TypeError, match=r"`exp_ops\[1\]` must be a numeric"):
        sesolve(_qubit(), state, times, exp_ops=[SZ, object()])


def test_a_state_without_columns_is_refused():
    """A state of shape (n, 0) holds nothing to solve: refused with a message, where
    it once failed inside the kernels (ZeroDivisionError: integer modulo by zero)."""
    for state in (np.ones((2, 0)), jnp.ones((2, 0))):
        with pytest.raises(ValueError, match="`state` must hold at least one column"):
            sesolve(_qubit(), state, np.array([0.0, 1.0]))


def test_evaluate_outside_the_span_is_refused():
    """The dense output holds between the first and the last time only: outside
    (or at nan) it is refused, before compiling for numbers and NumPy times, at
    run time for JAX arrays and inside a user's jit, where it once returned nan.
    Within the span, the ends included, it is the solution."""
    state, times = np.array([1.0, 0.0]), np.array([0.0, 1.0, 2.0])
    solution = sesolve(_qubit(), state, times, dense=True, max_steps=64)
    inside = np.array([0.0, 0.7, 2.0])
    reference = _reference(_qubit(), state, inside)
    assert _error(solution.evaluate(inside), reference) <= 1e-7
    for t in (2.5, -0.1, np.nan, np.array([0.5, 3.0])):
        with pytest.raises(ValueError, match="`t` must lie in the solved span"):
            solution.evaluate(t)
    evaluate = jax.jit(lambda s, t: s.evaluate(t))
    assert _error(evaluate(solution, 0.7), reference[1]) <= 1e-7
    for t in (jnp.asarray(2.5), jnp.asarray([1.0, jnp.nan])):
        for call in (solution.evaluate, lambda t: evaluate(solution, t)):
            with pytest.raises(Exception, match="`t` must lie in the solved span"):
                jax.block_until_ready(call(t))


def test_evaluate_at_integer_times():
    """Integer times (a Python or NumPy int, an int array, a list of ints) are
    times like any other: they once reached diffrax's interpolation as integers
    and failed inside it ("cond branches must have equal output types")."""
    state, times = np.array([1.0, 0.0]), np.array([0.0, 1.0, 2.0])
    solution = sesolve(_qubit(), state, times, dense=True, max_steps=64)
    for t in (1, np.int64(1), jnp.asarray(1)):
        assert _error(solution.evaluate(t), solution.states[1]) <= 1e-7
    for t in ([0, 2], np.array([0, 2]), jnp.asarray([0, 2])):
        assert _error(solution.evaluate(t), solution.states[::2]) <= 1e-7


def test_evaluate_refuses_times_that_are_not_real_numbers():
    """Strings (which NumPy reads as numbers), bools, None, objects, bytes and
    complex times, as host values and as JAX arrays (inside a jit too), are
    refused naming `t`: they once reached the compiled call and failed there with
    JAX's own error, or (None) were read as nan."""
    state, times = np.array([1.0, 0.0]), np.array([0.0, 1.0, 2.0])
    solution = sesolve(_qubit(), state, times, dense=True, max_steps=64)
    api = "`hierax.Solution.evaluate`"
    evaluate = jax.jit(lambda s, t: s.evaluate(t))
    for t in ("1.0", None, [0.1, "a"], object(), True, b"1", np.array([0.5], object)):
        with pytest.raises(TypeError, match=f"{api}: `t` must be a real time"):
            solution.evaluate(t)
    for t in (jnp.asarray(True), jnp.asarray([True, False])):
        for call in (solution.evaluate, lambda t: evaluate(solution, t)):
            with pytest.raises(TypeError, match=f"{api}: `t` must be a real time"):
                call(t)
    for t in (1j, np.array([0.5 + 0j]), jnp.asarray(0.5 + 1j)):
        with pytest.raises(ValueError, match=f"{api}: `t` must be real"):
            solution.evaluate(t)


def test_fixed_step_far_too_long_is_an_error():
    """A fixed `dt` whose steps' series do not converge once returned |psi| of
    1e6 ... 1e35: the step's own error estimate, far above the tolerances, now
    stops the solve at run time (from Python and inside a user's jit), asking for
    a smaller `dt`; a `dt` that converges gives the solution."""
    state, times = np.array([1.0, 0.0]), np.array([0.0, 10.0])
    match = "fixed step `dt` is far too long"
    with pytest.raises(Exception, match=match):
        jax.block_until_ready(sesolve(_qubit(), state, times, dt=10.0).states)
    run = jax.jit(lambda y: sesolve(_qubit(), y, times, dt=10.0).final_state)
    with pytest.raises(Exception, match=match):
        jax.block_until_ready(run(jnp.asarray(state, complex)))
    rho, jumps = np.diag([0.0, 1.0]), [0.5 * np.array([[0.0, 1.0], [0.0, 0.0]])]
    with pytest.raises(Exception, match=match):
        jax.block_until_ready(
            hierax.mesolve(_qubit(), jumps, rho, times, dt=10.0).states
        )
    fine = sesolve(_qubit(), state, times, dt=0.5)
    assert _error(fine.states, _reference(_qubit(), state, times)) <= 1e-8


def test_repeated_solves_of_device_arrays_never_read_them_back():
    """With every input already a JAX array on the device (the state real, the
    times integers, a tolerance an array: each cast or checked inside the
    program), a second `sesolve` and a second `mesolve` read nothing back to the
    host: the values' checks run in the compiled program (issue 49)."""
    hamiltonian = _qubit()
    state, times = jnp.array([0.6, 0.8]), jnp.array([0, 1, 2])
    rtol, observables = jnp.asarray(1e-9), [jnp.asarray(SZ)]
    rho, jumps = jnp.array([[0.2, 0.1], [0.1, 0.8]]), [jnp.asarray(0.3 * SX)]

    def solves():
        closed = sesolve(hamiltonian, state, times, rtol=rtol, exp_ops=observables)
        fixed = sesolve(hamiltonian, state, times, dt=0.25)
        open_ = hierax.mesolve(hamiltonian, jumps, rho, times, atol=rtol)
        return closed.expects, fixed.states, open_.states

    first = solves()
    with no_reads_to_the_host():
        again = jax.block_until_ready(solves())
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    reference = _reference(hamiltonian, np.asarray(state), np.arange(3.0))
    assert _error(again[1], reference) <= 1e-8


def test_an_operator_holding_a_writable_numpy_array_is_never_stale():
    """An operator module whose matrices are a writable NumPy array (put there by
    `eqx.tree_at`) may change in place between calls: the solvers rebuild what
    they derive from it (its term, energy shift, Lindblad parts) instead of
    keeping it by the module's identity, which once solved the old matrix."""
    matrices = np.array([[[1.0, 0.5], [0.5, -1.0]]])
    operator = hierax.TimeOperator([hierax.Constant(1.0)], [matrices[0]])
    operator = eqx.tree_at(lambda o: o.matrices, operator, matrices)
    state, times, rho = np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.eye(2) / 2
    sesolve(operator, state, times)
    hierax.mesolve(operator, [], rho, times)
    matrices[0] = [[2.0, 0.0], [0.0, -2.0]]
    after = sesolve(operator, state, times, rtol=1e-12, atol=1e-14).final_state
    np.testing.assert_allclose(after, [np.exp(-2j), 0.0], atol=1e-10)
    rho = np.full((2, 2), 0.5)
    coherence = hierax.mesolve(operator, [], rho, times, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(
        coherence.final_state[0, 1], 0.5 * np.exp(-4j), atol=1e-10
    )


# Solver options as one object (`hierax.TaylorOptions`).

_STATIC_H = 0.5 * SZ + 0.8 * SX  # constant: the closed form is expm(-i H t)


def _closed_form(times: np.ndarray, state: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh(_STATIC_H)
    return np.stack([v @ (np.exp(-1j * w * t) * (v.conj().T @ state)) for t in times])


@pytest.mark.parametrize(
    "keywords",
    [{}, {"rtol": 1e-6, "atol": 1e-9, "order": 12}, {"dt": 0.25}, {"max_steps": 500}],
)
def test_options_give_the_keywords_results_bitwise(keywords):
    """`options=hierax.TaylorOptions(**kw)` is the flat keywords' solve: the same
    states to the bit, in both solvers (and the default options the default
    call)."""
    state, times = np.array([1.0, 0.0]), np.linspace(0.0, 3.0, 4)
    options = hierax.TaylorOptions(**keywords)
    flat = sesolve(_qubit(), state, times, **keywords)
    boxed = sesolve(_qubit(), state, times, options=options)
    assert np.array_equal(np.asarray(flat.states), np.asarray(boxed.states))
    rho = np.diag([0.0, 1.0])
    jumps = [0.3 * np.array([[0.0, 1.0], [0.0, 0.0]])]
    flat = hierax.mesolve(_qubit(), jumps, rho, times, **keywords)
    boxed = hierax.mesolve(_qubit(), jumps, rho, times, options=options)
    assert np.array_equal(np.asarray(flat.states), np.asarray(boxed.states))


def test_floquet_options_give_the_keywords_results_bitwise():
    h = 0.5 * SZ + hierax.Cos(1.3) * SX
    period = 2 * np.pi / 1.3
    default = hierax.floquet(h, period)
    boxed = hierax.floquet(
        h, period, options=hierax.TaylorOptions(rtol=1e-12, atol=1e-14, order=16)
    )
    assert np.array_equal(np.asarray(default.propagator), np.asarray(boxed.propagator))
    flat = hierax.floquet(h, period, rtol=1e-9, order=20)
    boxed = hierax.floquet(
        h, period, options=hierax.TaylorOptions(rtol=1e-9, atol=1e-14, order=20)
    )
    assert np.array_equal(np.asarray(flat.propagator), np.asarray(boxed.propagator))
    # The options reach `modes_at` too, and the rest of them (a fixed step) the
    # one-period solve: against the adaptive one.
    fixed = hierax.floquet(h, period, options=hierax.TaylorOptions(dt=0.1, order=20))
    assert fixed.options.dt is not None
    assert _error(fixed.propagator, default.propagator) <= 1e-10
    assert _error(fixed.modes_at(1.0), fixed.modes_at(1.0 + period)) <= 1e-9


def test_new_tolerances_in_options_compile_nothing():
    """The tolerances and the step are values of the compiled solve."""
    state, times = np.array([1.0, 0.0]), np.linspace(0.0, 3.0, 4)
    sesolve(_qubit(), state, times, options=hierax.TaylorOptions(rtol=1e-7))
    sesolve(_qubit(), state, times, options=hierax.TaylorOptions(dt=0.3))
    before = compile_count()
    for rtol, atol in ((1e-6, 1e-9), (3e-7, 2e-10), (1e-5, 1e-8)):
        options = hierax.TaylorOptions(rtol=rtol, atol=atol)
        solution = sesolve(_qubit(), state, times, options=options)
        assert np.isfinite(np.asarray(solution.final_state)).all()
    sesolve(_qubit(), state, times, options=hierax.TaylorOptions(dt=0.2))
    assert compile_count() == before


def test_options_inside_jit_and_vmapped_over_rtol():
    """Options built from traced values: a user's `jax.jit` over the tolerance
    and the step, and a `jax.vmap` over `rtol`, against the closed form."""
    state, times = np.array([1.0, 0.0]), np.linspace(0.0, 2.0, 3)
    exact = _closed_form(times, state)

    @jax.jit
    def final(rtol, dt):
        adaptive = hierax.TaylorOptions(rtol=rtol, atol=rtol * 1e-2)
        fixed = hierax.TaylorOptions(dt=dt)
        return (
            sesolve(_STATIC_H, state, times, options=adaptive).states,
            sesolve(_STATIC_H, state, times, options=fixed).states,
        )

    adaptive, fixed = final(jnp.array(1e-10), jnp.array(0.1))
    assert _error(adaptive, exact) <= 1e-9
    assert _error(fixed, exact) <= 1e-9

    def solve(rtol):
        options = hierax.TaylorOptions(rtol=rtol, atol=1e-12)
        return sesolve(_STATIC_H, state, times, options=options).final_state

    rtols = jnp.array([1e-6, 1e-9, 1e-12])
    batched = jax.vmap(solve)(rtols)
    for k, rtol in enumerate((1e-6, 1e-9, 1e-12)):
        assert _error(batched[k], exact[-1]) <= 100 * rtol
    # A bad traced value stops the compiled solve with the field named.
    with pytest.raises(Exception, match="`dt` must be positive"):
        final(jnp.array(1e-10), jnp.array(-0.1))


def test_step_control_gains_reach_the_controller():
    """Other gains (a plain integral controller) give other steps, still to the
    tolerance; the default gains are the documented ones."""
    state, times = np.array([1.0, 0.0]), np.linspace(0.0, 10.0, 2)
    default = hierax.TaylorOptions()
    assert (default.safety, default.pcoeff, default.icoeff, default.dcoeff) == (
        0.9,
        0.3,
        0.6,
        0.1,
    )
    integral = hierax.TaylorOptions(pcoeff=0.0, icoeff=1.0, dcoeff=0.0, safety=0.5)
    ours = sesolve(_qubit(), state, times, options=default)
    other = sesolve(_qubit(), state, times, options=integral)
    assert int(ours.stats["num_steps"]) != int(other.stats["num_steps"])
    assert _error(ours.final_state, other.final_state) <= 1e-8


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("rtol", -1.0, ValueError),
        ("atol", float("nan"), ValueError),
        ("rtol", "tight", TypeError),
        ("rtol", jnp.ones(2), ValueError),
        ("dt", 0.0, ValueError),
        ("order", 0, ValueError),
        ("order", 2.5, TypeError),
        ("max_steps", 0, ValueError),
        ("max_steps", 1.5, ValueError),
        ("adjoint", diffrax.BacksolveAdjoint(), ValueError),
        ("safety", 1.5, ValueError),
        ("pcoeff", -0.1, ValueError),
        ("dcoeff", jnp.array(0.1), TypeError),
        ("icoeff", float("inf"), ValueError),
    ],
)
def test_bad_options_name_the_class_and_the_field(field, value, error):
    with pytest.raises(error, match=rf"hierax\.TaylorOptions.*`{field}`"):
        hierax.TaylorOptions(**{field: value})


def test_no_gains_at_all_are_refused():
    with pytest.raises(ValueError, match=r"TaylorOptions.*`pcoeff \+ icoeff`"):
        hierax.TaylorOptions(pcoeff=0.0, icoeff=0.0)


def test_options_and_a_keyword_together_are_refused():
    state, times = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    options = hierax.TaylorOptions()
    for name, value in (
        ("rtol", 1e-6),
        ("dt", 0.1),
        ("adjoint", diffrax.ForwardMode()),
    ):
        with pytest.raises(TypeError, match=rf"hierax.sesolve.*`options=`.*`{name}=`"):
            sesolve(_qubit(), state, times, options=options, **{name: value})
    with pytest.raises(TypeError, match=r"hierax.mesolve.*`options=`.*`max_steps=`"):
        hierax.mesolve(_qubit(), [], np.eye(2), times, options=options, max_steps=10)
    with pytest.raises(TypeError, match=r"hierax.floquet.*`options=`.*`order=`"):
        hierax.floquet(0.5 * SZ, 1.0, options=options, order=12)


@pytest.mark.parametrize("options", [{"atol": 1e-8}, 1e-8, "tight"])
def test_options_of_another_kind_are_refused(options):
    state, times = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    with pytest.raises(TypeError, match=r"hierax.sesolve.*`hierax.TaylorOptions`"):
        sesolve(_qubit(), state, times, options=options)
    with pytest.raises(TypeError, match=r"hierax.floquet.*`hierax.TaylorOptions`"):
        hierax.floquet(0.5 * SZ, 1.0, options=options)


def test_options_from_plain_keywords_are_kept_by_their_whole_input():
    """The options a call builds from Python-number keywords are kept (building
    and flattening a new module cost ~60 us of a ~140 us small solve), keyed by
    every keyword's value and type, x64 and the default device: never another
    call's options."""
    from hierax._solvers._integrate import resolve_options

    api = "hierax.sesolve"
    first = resolve_options(None, api, rtol=1e-6, atol=None, order=None, dt=None)
    again = resolve_options(None, api, rtol=1e-6, atol=None, order=None, dt=None)
    assert again is first
    other = resolve_options(None, api, rtol=2e-6, atol=None, order=None, dt=None)
    assert other is not first and float(other.rtol) == 2e-6
    as_int = resolve_options(None, api, rtol=None, atol=None, order=None, dt=1)
    as_float = resolve_options(None, api, rtol=None, atol=None, order=None, dt=1.0)
    assert as_int is not as_float
    with jax.default_device(jax.devices("cpu")[0]):
        placed = resolve_options(None, api, rtol=1e-6, atol=None, order=None, dt=None)
    assert placed is not first
    # Arrays are never keys: a new array gives new options.
    array = jnp.asarray(1e-6)
    assert resolve_options(None, api, rtol=array) is not resolve_options(
        None, api, rtol=array
    )


def test_truncation_estimate_is_the_tail_at_the_steps_taken():
    """The step's error estimate against the tails it stands for, in closed form: a
    series decaying at 0.27 per order (the steps order 28 takes at rtol 1e-4, where
    `TAIL` is set) within 2%; e^x's terms at x = 28 * 0.22 (order 28 at rtol 1e-6)
    within a factor 3 either way; cos(x), whose odd terms vanish, likewise; and
    zeros for zeros."""
    from hierax._solvers._solver import truncation_estimate

    order = 28
    j = np.arange(order + 1)

    def estimate(terms):
        return float(np.max(np.asarray(truncation_estimate(jnp.asarray(terms)))))

    # A tail of 0.1 is that of a decay at 0.27 per order (order 28 at rtol 1e-4).
    geometric = 0.27**j
    np.testing.assert_allclose(
        estimate(geometric), 0.27 ** (order + 1) / 0.73, rtol=0.02
    )
    x = order * 0.22
    factorial = np.array([x**k / math.factorial(k) for k in j])
    tail = sum(x**k / math.factorial(k) for k in range(order + 1, order + 40))
    assert tail / 3 <= estimate(factorial) <= 3 * tail
    even = np.where(j % 2 == 0, factorial, 0.0)
    even_tail = sum(x**k / math.factorial(k) for k in range(order + 2, order + 40, 2))
    assert even_tail / 3 <= estimate(even) <= 3 * even_tail
    assert estimate(np.zeros((order + 1, 2))) == 0.0


def test_final_errors_track_the_tolerance():
    """A driven qutrit (a Gaussian and a complex exponential times a cosine) over
    three periods of its drive: the final error against DOP853 lies between 1/100
    and 10 times `rtol` at each of 1e-6, 1e-8 and 1e-10 (the estimate is the
    series' tail; the last two terms alone put it 200-1000x below), and the loosest
    tolerance takes the fewest steps."""
    functions, matrices = _driven_qutrit()
    hamiltonian = hierax.TimeOperator(functions, matrices)
    rng = np.random.default_rng(5)
    ket = rng.normal(size=3) + 1j * rng.normal(size=3)
    ket = jnp.asarray(ket / np.linalg.norm(ket))
    times = np.array([0.0, 1.0, 2.5])
    reference = _reference(hamiltonian, ket, times)
    steps = []
    for rtol in (1e-6, 1e-8, 1e-10):
        solution = sesolve(hamiltonian, ket, times, rtol=rtol)
        error = _error(solution.states, reference)
        assert rtol / 100 <= error <= 10 * rtol, (rtol, error)
        steps.append(int(solution.stats["num_steps"]))
    assert steps[0] <= min(steps[1:]), steps


# A one-step solve's derivative with respect to its end points (the first step covers
# the span): diffrax takes min(t0 + dt0, t1), and at a tie JAX splits the derivative
# between the two; it came out half the true one, whatever the adjoint.
_W = math.hypot(0.5, 0.3)


def _excited(final):
    return jnp.abs(final[1]) ** 2


@pytest.mark.parametrize(
    "kind", ["two times", "fixed step of the span", "knots", "forward", "mesolve"]
)
def test_one_step_solves_differentiate_with_respect_to_their_ends(kind):
    sx = np.array([[0, 1], [1, 0]], complex)
    sz = np.diag([1.0, -1.0]).astype(complex)
    h = 0.5 * sz + 0.3 * sx
    psi = np.array([1, 0], complex)
    adjoint = diffrax.ForwardMode() if kind == "forward" else None

    def excited(t0, t1):
        times = jnp.stack([t0, t1])
        if kind == "mesolve":
            # No loss: rho_11 is the closed system's population.
            rho = np.outer(psi, psi.conj())
            out = hierax.mesolve(h, [0 * sx], rho, times)
            return jnp.real(out.final_state[1, 1]), out.stats["num_steps"]
        hamiltonian: Any = h
        kw: dict[str, Any] = {} if adjoint is None else {"adjoint": adjoint}
        if kind == "fixed step of the span":
            kw["dt"] = t1 - t0
        if kind == "knots":
            # One segment over the span: knots keep physical time.
            hamiltonian = hierax.PiecewiseConstant([-1.0, 3.0], [1.0]) * sx * 0.3
            hamiltonian = hamiltonian + 0.5 * sz
        out = hierax.sesolve(hamiltonian, psi, times, **kw)
        return _excited(out.final_state), out.stats["num_steps"]

    t0, t1 = jnp.asarray(0.2), jnp.asarray(1.5)
    assert int(excited(t0, t1)[1]) == 1
    # The closed form: (0.3/W)^2 sin^2(W (t1 - t0)).
    exact = (0.3 / _W) ** 2 * _W * math.sin(2 * _W * float(t1 - t0))
    if kind == "forward":
        d1 = jax.jacfwd(lambda t: excited(t0, t)[0])(t1)
        d0 = jax.jacfwd(lambda t: excited(t, t1)[0])(t0)
    else:
        d1 = jax.grad(lambda t: excited(t0, t)[0])(t1)
        d0 = jax.grad(lambda t: excited(t, t1)[0])(t0)
    np.testing.assert_allclose(float(d1), exact, rtol=1e-9)
    np.testing.assert_allclose(float(d0), -exact, rtol=1e-9)
