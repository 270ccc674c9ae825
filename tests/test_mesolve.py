"""hierax.mesolve, LindbladTerm and TaylorSolver on density matrices against
independent solvers: `jax.scipy.linalg.expm` of the vectorised Liouvillian for
constant generators, scipy's DOP853 at rtol 1e-13 for time-dependent ones, finite
differences for gradients, Python loops for vmap, and `sesolve` without jump
operators."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import hierax
from hierax import LindbladTerm, TaylorSolver, mesolve, sesolve
from hierax._kernels.density import StructuredParts, VectorisedParts
from hierax._kernels.propagator import Diagonals
from hierax._solvers import _density
from hierax._solvers._density import (
    density_step_terms,
    generic_density_terms,
    known_density_parts,
)

from .helpers import compile_count


def _layout(parts):
    if isinstance(parts, StructuredParts):
        return "structured"
    assert isinstance(parts, VectorisedParts)
    return "diagonals" if isinstance(parts.stacked, Diagonals) else "dense"


SX = np.array([[0, 1], [1, 0]], complex)
SZ = np.array([[1, 0], [0, -1]], complex)
SM = np.array([[0, 1], [0, 0]], complex)
RTOL = 1e-10
ATOL = 1e-12
# A pure state with coherences: every entry of rho moves.
PSI = np.array([0.6, 0.8j])
RHO = np.outer(PSI, PSI.conj())


def _error(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def _liouvillian(hamiltonian, jumps):
    """The generator on vec(rho), column stacking: vec(A rho B) = (B^T kron A)
    vec(rho)."""
    n = hamiltonian.shape[0]
    eye = np.eye(n)
    out = -1j * (np.kron(eye, hamiltonian) - np.kron(hamiltonian.T, eye))
    for jump in jumps:
        number = jump.conj().T @ jump
        out = out + np.kron(jump.conj(), jump)
        out = out - 0.5 * (np.kron(eye, number) + np.kron(number.T, eye))
    return out


def _vec(rho):
    return np.asarray(rho).T.reshape(-1)


def _unvec(v, n):
    return np.asarray(v).reshape(n, n).T


def _expm_reference(hamiltonian, jumps, rho, times):
    generator = jnp.asarray(_liouvillian(hamiltonian, jumps))
    n = rho.shape[0]
    return np.stack(
        [
            _unvec(jsl.expm(generator * (t - times[0])) @ _vec(rho), n)
            for t in np.asarray(times)
        ]
    )


def _dop853(hamiltonian, jumps, rho, times):
    """scipy DOP853 at rtol 1e-13 on the Lindblad equation, at `times`. The right-
    hand side is one compiled call: the operators' matrices at t, then
    -i[H, rho] + sum_j L_j rho L_j^dag - {L_j^dag L_j, rho} / 2 (a product form,
    independent of the Kronecker form of `_liouvillian` and of hierax's kernels)."""
    n = rho.shape[0]

    @jax.jit
    def derivative(t, rho):
        h = hamiltonian(t)
        out = -1j * (h @ rho - rho @ h)
        for jump in jumps:
            matrix = jump(t)
            adjoint = matrix.conj().T
            number = adjoint @ matrix
            out = out + matrix @ rho @ adjoint - 0.5 * (number @ rho + rho @ number)
        return out

    def rhs(t, v):
        return _vec(derivative(t, _unvec(v, n)))

    times = np.asarray(times)
    out = solve_ivp(
        rhs,
        (times[0], times[-1]),
        _vec(rho).astype(complex),
        method="DOP853",
        rtol=1e-13,
        atol=1e-14,
        t_eval=times,
    )
    return np.stack([_unvec(v, n) for v in out.y.T])


def _qubit_t1_t2(gamma1=0.2, gamma2=0.1):
    hamiltonian = 0.5 * SZ + 0.3 * SX
    jumps = [np.sqrt(gamma1) * SM, np.sqrt(gamma2 / 2) * SZ]
    return hamiltonian, jumps


def _qutrit():
    a = np.diag(np.sqrt([1.0, 2.0]), 1).astype(complex)
    hamiltonian = np.diag([0.0, 1.0, 1.7]) + 0.4 * (a + a.T)
    return hamiltonian, [np.sqrt(0.15) * a]


def _driven():
    """A driven qubit with a time-dependent decay rate and dephasing."""
    hamiltonian = hierax.Cos(1.3) * SX + 0.5 * SZ
    jumps = [
        hierax.Polynomial(jnp.array([0.3, 0.05])) * SM,
        hierax.as_operator(np.sqrt(0.05) * SZ),
    ]
    return hamiltonian, jumps


@pytest.mark.parametrize("system", [_qubit_t1_t2, _qutrit], ids=["qubit", "qutrit"])
def test_constant_generator_against_expm(system):
    hamiltonian, jumps = system()
    n = hamiltonian.shape[0]
    rho = RHO if n == 2 else np.diag([0.0, 0.0, 1.0]).astype(complex)
    times = np.linspace(0.0, 8.0, 5)
    ours = mesolve(hamiltonian, jumps, rho, times, rtol=RTOL, atol=ATOL)
    reference = _expm_reference(hamiltonian, jumps, rho, times)
    assert ours.states.shape == (5, n, n)
    assert _error(ours.states, reference) <= 10 * RTOL


def test_time_dependent_against_dop853_and_physicality():
    hamiltonian, jumps = _driven()
    times = np.linspace(0.0, 6.0, 31)
    ours = mesolve(hamiltonian, jumps, RHO, times, rtol=RTOL, atol=ATOL)
    reference = _dop853(hamiltonian, jumps, RHO, times)
    assert _error(ours.states, reference) <= 10 * RTOL
    states = np.asarray(ours.states)
    traces = np.trace(states, axis1=1, axis2=2)
    assert np.max(np.abs(traces - 1)) <= 1e-10
    assert _error(states, np.conj(np.swapaxes(states, 1, 2))) <= 1e-12
    hermitian = 0.5 * (states + np.conj(np.swapaxes(states, 1, 2)))
    assert np.min(np.linalg.eigvalsh(hermitian)) >= -1e-10


# The three layouts of the Lindblad step, each with `_every_kind(n, sparse)`: dense
# superoperators on vec(rho) for small n, the structured kernel's products for
# larger n, and the superoperators' few nonzero diagonals when every matrix is
# sparse (banded).
LAYOUTS = pytest.mark.parametrize(
    "n, sparse, layout",
    [(4, False, "dense"), (10, False, "structured"), (10, True, "diagonals")],
    ids=["vectorised", "structured", "diagonals"],
)


def _every_kind(n, sparse=False):
    """Every kind of term the density kernels treat apart: diagonal (constant, with
    an offset, time-dependent, complex), real, imaginary and general complex
    matrices (banded, with `sparse`), constant and time-dependent, real and complex
    time functions, in H and in the jump operators; and a state with every entry
    nonzero."""
    rng = np.random.default_rng(1)
    m = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
    if sparse:
        m = np.triu(np.tril(m, 1), -1)
    general = (m + m.conj().T) / 4
    a = np.diag(np.sqrt(np.arange(1.0, n)), 1).astype(complex)
    sy = np.kron(np.array([[0, -1j], [1j, 0]]), np.eye(n // 2))
    diagonal = np.diag(rng.normal(size=n) + 5.0).astype(complex)
    hamiltonian = (
        hierax.Cos(1.3) * general
        + diagonal
        + hierax.Sin(0.7) * sy
        + hierax.as_operator(a + a.T)
    )
    jumps = [
        np.sqrt(0.1) * a,
        hierax.Polynomial(jnp.array([0.3, 0.05])) * np.diag(np.linspace(-1, 1, n)),
        hierax.Cos(0.4) * (0.2 * (a.T + 1j * a)),
        0.2 * np.diag(np.exp(1j * np.arange(n))),
        0.15 * np.diag(np.linspace(0.0, 1.0, n)),  # a second constant diagonal one
        0.1 * general,
        # a complex time function: complex series in every kernel
        hierax.Exp(0.5j) * (0.2 * a) + hierax.Cos(0.3) * (0.1 * a.T),
    ]
    psi = rng.normal(size=n) + 1j * rng.normal(size=n)
    rho = np.outer(psi, psi.conj()) / np.vdot(psi, psi)
    return hamiltonian, jumps, rho, a


@LAYOUTS
def test_structured_operators_against_dop853(n, sparse, layout):
    """`_every_kind` of term, small n on vec(rho), larger n term by term or by the
    superoperators' diagonals, against DOP853; and a callable jump operator, which
    takes the generic kernel."""
    hamiltonian, jumps, rho, a = _every_kind(n, sparse)
    term = LindbladTerm(hamiltonian, jumps)
    parts = known_density_parts(term.hamiltonian, term.jump_operators, jnp.complex128)
    assert _layout(parts) == layout
    diagonals = [
        op
        for op in term.hamiltonian.operators  # pyright: ignore[reportAttributeAccessIssue]
        if isinstance(op, hierax.TimeOperator) and op.is_sparse
    ]
    assert len(diagonals) == 1
    times = np.array([0.0, 0.5, 1.0])
    operators = [hierax.as_operator(jump) for jump in jumps]
    reference = _dop853(hamiltonian, operators, rho, times)
    ours = mesolve(hamiltonian, jumps, rho, times, rtol=RTOL, atol=ATOL)
    assert _error(ours.states, reference) <= 10 * RTOL
    if n > 4:
        return
    callable_jump = hierax.as_operator(lambda t: 0.3 * jnp.cos(t) * jnp.asarray(a))
    generic = mesolve(
        hamiltonian, [*jumps[:2], callable_jump], rho, times, rtol=RTOL, atol=ATOL
    )
    reference = _dop853(hamiltonian, [*operators[:2], callable_jump], rho, times)
    assert _error(generic.states, reference) <= 10 * RTOL


@LAYOUTS
def test_step_parts_known_before_compiling_equal_traced_and_generic(n, sparse, layout):
    """One step's series (a backward step: odd orders of every series negated)
    three ways: the structured kernel with its constant parts assembled in NumPy
    before compiling (what `mesolve` does), the same kernel assembling them itself
    from traced operators, and the generic kernel, which keeps no structure."""
    hamiltonian, jumps, rho, _ = _every_kind(n, sparse)
    term = LindbladTerm(hamiltonian, jumps)
    parts = known_density_parts(term.hamiltonian, term.jump_operators, jnp.complex128)
    assert parts is not None and _layout(parts) == layout
    t, step, order = jnp.asarray(0.3), jnp.asarray(-0.2), 12

    @jax.jit
    def series(term, parts):
        operators = (term.hamiltonian, term.jump_operators)
        return density_step_terms(*operators, t, step, jnp.asarray(rho), order, parts)

    known = series(term, parts)
    traced = series(term, None)
    generic = jax.jit(
        lambda term: generic_density_terms(
            term.hamiltonian, term.jump_operators, t, step, jnp.asarray(rho), order
        )
    )(term)
    size = float(np.max(np.abs(generic)))
    for level in range(order + 1):
        assert _error(known[level], generic[level]) <= 1e-14 * size, level
        assert _error(traced[level], generic[level]) <= 1e-14 * size, level

    def unknown(term):  # traced operators are not known before compiling
        operators = (term.hamiltonian, term.jump_operators)
        assert known_density_parts(*operators, jnp.complex128) is None
        return jnp.zeros(())

    jax.jit(unknown)(term)


@LAYOUTS
def test_complex64_state_sets_the_precision(n, sparse, layout):
    """A complex64 density matrix with float32 times under float64 operators: the
    step's parts, assembled in float64 before compiling, are cast to the state's
    precision, and the solve stays in complex64."""
    hamiltonian, jumps, rho, _ = _every_kind(n, sparse)
    term = LindbladTerm(hamiltonian, jumps)
    parts = known_density_parts(term.hamiltonian, term.jump_operators, jnp.complex64)
    assert _layout(parts) == layout
    assert all(
        leaf.dtype in (jnp.float32, jnp.complex64, jnp.int32)
        for leaf in jax.tree.leaves(parts)
    )
    times = np.array([0.0, 0.5, 1.0])
    low = mesolve(
        hamiltonian,
        jumps,
        rho.astype(np.complex64),
        times.astype(np.float32),
        rtol=1e-5,
        atol=1e-7,
    )
    assert low.states.dtype == jnp.complex64
    high = mesolve(hamiltonian, jumps, rho, times, rtol=RTOL, atol=ATOL)
    assert _error(low.states, high.states) <= 1e-5  # measured 6e-8


def test_complex64_state_under_float64_times_is_solved_in_complex128():
    """diffrax widens a complex64 state under float64 times to complex128: the
    step's parts and its order follow (they stayed complex64 and float32's order,
    and a driven oscillator came out 5e-9 off at rtol 1e-12, in complex128)."""
    a = np.diag(np.sqrt([1.0, 2.0]), 1)
    hamiltonian = a.T @ a + 0.3 * (a + a.T)
    jumps = [0.4 * a]
    rho = np.diag([0.0, 0.0, 1.0])
    times = np.linspace(0.0, 2.0, 4)
    reference = _expm_reference(hamiltonian, jumps, rho, times)
    for low in (rho.astype(np.float32), jnp.asarray(rho, jnp.complex64)):
        ours = mesolve(hamiltonian, jumps, low, times, rtol=1e-12, atol=1e-14)
        assert ours.states.dtype == jnp.complex128
        assert _error(ours.states, reference) <= 1e-11  # 5e-9 before


def test_expectation_values_dense_output_and_progress(capsys):
    hamiltonian, jumps = _qubit_t1_t2()
    times = np.linspace(0.0, 8.0, 5)
    ours = mesolve(
        hamiltonian,
        jumps,
        RHO,
        times,
        rtol=RTOL,
        atol=ATOL,
        exp_ops=[SZ, SX],
        dense=True,
        progress=True,
    )
    assert ours.expects is not None
    assert ours.expects.shape == (2, 5)
    traces = np.einsum("enm,tmn->et", np.stack([SZ, SX]), np.asarray(ours.states))
    assert _error(ours.expects, traces) <= 1e-14
    # Dense output between the saved times, against expm of the Liouvillian.
    between = np.array([0.3, 2.9, 5.55, 7.9])
    reference = _expm_reference(
        hamiltonian, jumps, RHO, np.concatenate([[0.0], between])
    )
    assert _error(ours.evaluate(between), reference[1:]) <= 10 * RTOL
    assert "100.00%" in capsys.readouterr().out


def _oscillator(n=10):
    """The lowering and number operators of n levels, a span, and the density
    matrix of (|0> + |1>) / sqrt(2)."""
    a = np.diag(np.sqrt(np.arange(1.0, n)), 1)
    psi = np.zeros(n)
    psi[:2] = 1 / np.sqrt(2)
    rho = jnp.asarray(np.outer(psi, psi), complex)
    return a, a.T @ a, jnp.array([0.0, 1.5]), rho


def test_numpy_operators_inside_jit_keep_the_step_parts():
    """Operators built inside a user's `jax.jit` from NumPy matrices, with a traced
    drive amplitude: their matrices stay concrete, so the step's parts are
    assembled before compiling (here the superoperators' diagonals) as for an
    eager call; the solve equals the eager one, and a new amplitude compiles
    nothing."""
    a, number, times, rho = _oscillator()
    layouts = []

    def final(amplitude, rho):
        hamiltonian = 0.3 * number + amplitude * hierax.Cos(1.1) * (a + a.T)
        jumps = [np.sqrt(0.2) * a, np.sqrt(0.1) * number]
        term = LindbladTerm(hamiltonian, jumps)
        operators = (term.hamiltonian, term.jump_operators)
        layouts.append(_layout(known_density_parts(*operators, jnp.complex128)))
        return mesolve(hamiltonian, jumps, rho, times, rtol=RTOL, atol=ATOL).states[-1]

    jitted = jax.jit(final)
    assert _error(jitted(0.4, rho), final(0.4, rho)) <= 1e-12
    before = compile_count()
    again = jitted(0.7, rho)
    assert compile_count() == before
    assert _error(again, final(0.7, rho)) <= 1e-12
    # Traced once inside the jit, once per eager call: the same layout each time.
    assert layouts == ["diagonals"] * 3


def test_traced_operators_assemble_their_parts_once_per_solve(monkeypatch):
    """Jump operators made inside a user's `jax.jit` from a traced rate cannot be
    read before compiling: the solve assembles their parts once, at its start
    inside the program (not in every step), and equals the eager solve with
    known operators, value and gradient (against a central difference)."""
    a, number, times, rho = _oscillator()
    hamiltonian = 0.3 * number + 0.4 * hierax.Cos(1.1) * (a + a.T)
    assemblies = []
    assemble = _density.traced_density_parts

    def counted(operators, hamiltonian_series, jump_series, dtype):
        # The length of the series it reads: 1 (values) at the program's start,
        # K + 1 in a step.
        assemblies.append(max(len(s) for s in hamiltonian_series if s is not None))
        return assemble(operators, hamiltonian_series, jump_series, dtype)

    monkeypatch.setattr(_density, "traced_density_parts", counted)

    def population(rate):
        jumps = [jnp.sqrt(rate) * jnp.asarray(a), np.sqrt(0.1) * number]
        final = mesolve(hamiltonian, jumps, rho, times, rtol=RTOL, atol=ATOL)
        return jnp.real(final.final_state[1, 1])

    traced = jax.jit(jax.value_and_grad(population))
    value, slope = traced(0.2)
    assert assemblies == [1]  # once, at the program's start; none in the step
    eager = float(population(0.2))  # known operators: assembled in NumPy
    assert abs(float(value) - eager) <= 1e-12
    step = 1e-5
    difference = (population(0.2 + step) - population(0.2 - step)) / (2 * step)
    assert float(slope) == pytest.approx(float(difference), rel=1e-6)


def test_traced_rates_of_known_matrices_keep_the_step_parts(monkeypatch):
    """A traced rate or coupling times a known matrix as an operator
    (`jnp.sqrt(rate) * hierax.as_operator(a)`: the matrix stays known, the value
    is the term's traced constant) keeps the parts assembled before compiling:
    the traced constants step as time-dependent terms, nothing is assembled in
    the program, and the solve equals the one with known numbers, value and
    gradient (against a central difference), with no compile for a new rate."""
    a, number, times, rho = _oscillator()
    layouts, assemblies = [], []
    assemble = _density.traced_density_parts

    def counted(*args):
        assemblies.append(None)
        return assemble(*args)

    monkeypatch.setattr(_density, "traced_density_parts", counted)

    def population(rate, coupling=0.4):
        hamiltonian = 0.3 * number + coupling * hierax.as_operator(a + a.T)
        jumps = [jnp.sqrt(rate) * hierax.as_operator(a), np.sqrt(0.1) * number]
        term = LindbladTerm(hamiltonian, jumps)
        operators = (term.hamiltonian, term.jump_operators)
        layouts.append(_layout(known_density_parts(*operators, jnp.complex128)))
        final = mesolve(hamiltonian, jumps, rho, times, rtol=RTOL, atol=ATOL)
        return jnp.real(final.final_state[1, 1])

    traced = jax.jit(jax.value_and_grad(population, argnums=(0, 1)))
    value, slopes = traced(0.2, 0.4)
    assert layouts == ["diagonals"] and not assemblies
    eager = float(population(0.2))  # known numbers: constant terms
    assert abs(float(value) - eager) <= 1e-12
    step = 1e-5
    differences = (
        (population(0.2 + step) - population(0.2 - step)) / (2 * step),
        (population(0.2, 0.4 + step) - population(0.2, 0.4 - step)) / (2 * step),
    )
    for slope, difference in zip(slopes, differences):
        assert float(slope) == pytest.approx(float(difference), rel=1e-6)
    before = compile_count()
    again, _ = traced(0.3, 0.5)
    assert compile_count() == before
    assert abs(float(again) - float(population(0.3, 0.5))) <= 1e-12


def test_numpy_operators_are_kept_by_their_values(monkeypatch):
    """NumPy Hamiltonians and jump operators passed again with the same entries
    reuse the term built for them (its Lindblad parts are not assembled again);
    new entries, including an in-place change of the same array, give a new term
    and the new dynamics (against the Liouvillian's expm)."""
    import hierax._solvers._mesolve as module

    built = []
    real = module.known_density_parts
    monkeypatch.setattr(
        module,
        "known_density_parts",
        lambda *a: built.append(1) or real(*a),
    )
    hamiltonian = 0.7 * SZ + 0.3 * SX
    jump = np.sqrt(0.2) * SM
    times = jnp.array([0.0, 1.3])

    def solve():
        return mesolve(hamiltonian, [jump], RHO, times, rtol=RTOL, atol=ATOL)

    def expected():
        vec = jsl.expm(1.3 * _liouvillian(hamiltonian, [jump])) @ RHO.T.reshape(-1)
        return vec.reshape(2, 2).T

    first = solve().states[-1]
    assert _error(first, expected()) <= 1e-9
    assert _error(solve().states[-1], first) == 0
    # Equal entries in new arrays: the same term again.
    hamiltonian, jump = hamiltonian.copy(), jump.copy()
    assert _error(solve().states[-1], first) == 0
    assert len(built) == 1
    jump *= 2  # in place: new entries
    changed = solve().states[-1]
    assert len(built) == 2
    assert _error(changed, expected()) <= 1e-9
    assert _error(changed, first) > 1e-3


def test_no_jump_operators_equals_sesolve():
    hamiltonian, _ = _driven()
    times = np.linspace(0.0, 5.0, 6)
    ours = mesolve(hamiltonian, [], RHO, times, rtol=RTOL, atol=ATOL)
    propagators = sesolve(
        hamiltonian, np.eye(2, dtype=complex), times, rtol=RTOL, atol=ATOL
    ).states
    expected = propagators @ RHO @ np.conj(np.swapaxes(propagators, 1, 2))
    assert _error(ours.states, expected) <= 1e-9


def _population(gamma, amplitude=0.4, times=None):
    """The excited population at the end of a driven, decaying qubit: a function
    of a decay rate and of a pulse amplitude."""
    hamiltonian, _ = _qubit_t1_t2()
    hamiltonian = hamiltonian + hierax.Cos(1.3, amplitude=amplitude) * SX
    if times is None:
        times = jnp.array([0.0, 3.0])
    jumps = [jnp.sqrt(gamma) * SM, np.sqrt(0.05) * SZ]
    final = mesolve(hamiltonian, jumps, RHO, times, rtol=RTOL, atol=ATOL).final_state
    return jnp.real(final[0, 0])


def test_gradient_with_respect_to_a_decay_rate_and_a_pulse_amplitude():
    gamma, amplitude, step = 0.2, 0.4, 1e-4
    gradient = jax.grad(_population, argnums=(0, 1))(gamma, amplitude)
    differences = (
        (_population(gamma + step) - _population(gamma - step)) / (2 * step),
        (_population(gamma, amplitude + step) - _population(gamma, amplitude - step))
        / (2 * step),
    )
    for got, want in zip(gradient, differences):
        assert float(got) == pytest.approx(float(want), rel=1e-5)


def test_vmap_over_rates_equals_loop_and_no_retrace():
    gammas = jnp.array([0.1, 0.2, 0.4])
    batched = jax.vmap(_population)(gammas)
    looped = jnp.stack([_population(g) for g in gammas])
    assert _error(batched, looped) <= 1e-12

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def solve(gamma, times):
        return _population(gamma, times=times)

    solve(jnp.asarray(0.2), jnp.array([0.0, 1.0, 3.0]))
    solve(jnp.asarray(0.5), jnp.array([0.5, 2.0, 4.0]))


# diffrax warns on every complex state it is given; for the Taylor solver it does not
# apply (exact complex steps, a real norm: see `hierax._solvers._integrate`).
@pytest.mark.filterwarnings("ignore:Complex dtype support")
def test_taylor_solver_in_diffeqsolve_equals_mesolve():
    hamiltonian, jumps = _driven()
    times = jnp.linspace(0.0, 6.0, 4)
    ours = mesolve(hamiltonian, jumps, RHO, times, rtol=RTOL, atol=ATOL)
    solution = diffrax.diffeqsolve(
        LindbladTerm(hamiltonian, jumps),
        TaylorSolver(ours.order),
        t0=times[0],
        t1=times[-1],
        dt0=0.1,
        y0=jnp.asarray(RHO),
        saveat=diffrax.SaveAt(ts=times),
        stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
    )
    assert solution.ys is not None
    assert _error(solution.ys, ours.states) <= 10 * RTOL
    # t1 < t0: diffrax runs a reversed time variable, and the series must follow
    # (odd orders of every operator's series negated); back to the initial state.
    back = diffrax.diffeqsolve(
        LindbladTerm(hamiltonian, jumps),
        TaylorSolver(ours.order),
        t0=times[-1],
        t1=times[0],
        dt0=-0.1,
        y0=ours.states[-1],
        stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
    )
    assert back.ys is not None
    assert _error(back.ys[-1], RHO) <= 100 * RTOL


@pytest.mark.filterwarnings("ignore:Complex dtype support")
def test_a_users_args_leave_the_steps_parts_alone():
    """The Lindblad step's parts that `mesolve` assembles before compiling are a
    field of the term, never diffrax's `args`: a user's own `args` (any pytree)
    leave the step's program as it is with `args=None` (that of the parts, not of
    the term without them), and a diffrax solve with them gives the same states
    bitwise and the same steps, equal to DOP853's."""
    from hierax._solvers._mesolve import _term as mesolve_term

    hamiltonian, jumps = _driven()
    bare, with_known_parts = mesolve_term(hamiltonian, jumps)
    term = with_known_parts(jnp.complex128)
    assert term.parts is not None and bare.parts is None
    users = {"rate": jnp.arange(3.0), "label": None, "pair": (1, jnp.ones((2, 2)))}
    rho = jnp.asarray(RHO)

    def program(term, args):
        step = lambda y: term.taylor_terms(
            jnp.asarray(0.3), jnp.asarray(-0.4), y, 12, args
        )
        return str(jax.make_jaxpr(step)(rho))

    assert program(term, users) == program(term, None) != program(bare, None)

    @jax.jit
    def solve(args):
        solution = diffrax.diffeqsolve(
            term,
            TaylorSolver(20),
            t0=0.0,
            t1=2.0,
            dt0=0.05,
            y0=rho,
            args=args,
            stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
        )
        return solution.ys, solution.stats["num_steps"]

    plain, plain_steps = solve(None)
    ours, steps = solve(users)
    assert np.array_equal(ours, plain) and int(steps) == int(plain_steps)
    reference = _dop853(hamiltonian, jumps, RHO, np.array([0.0, 2.0]))
    assert _error(ours[-1], reference[-1]) <= 10 * RTOL


def test_lindblad_term_vector_field():
    hamiltonian, jumps = _qubit_t1_t2()
    term = LindbladTerm(hamiltonian, jumps)
    expected = _unvec(_liouvillian(hamiltonian, jumps) @ _vec(RHO), 2)
    assert _error(term.vf(0.0, jnp.asarray(RHO), None), expected) <= 1e-15


@pytest.mark.parametrize(
    "hamiltonian, jumps, rho, match",
    [
        (SZ, [SM], np.ones(2), "rho"),
        (SZ, [SM], np.eye(3), "rho"),
        (SZ, None, RHO, "`jump_operators` must be a list"),
        (SZ, [np.eye(3)], RHO, r"jump_operators\[0\]"),
        (SZ, np.eye(3), RHO, r"jump_operators\[0\]"),
        (SZ, [SM], None, "`rho` must be a numeric array, got None"),
        (None, [SM], RHO, "`hamiltonian`"),
        (SZ, [SM], [[np.nan, 0], [0, 1]], "`rho` must be finite"),
    ],
    ids=[
        "rho-not-square",
        "rho-wrong-size",
        "jumps-none",
        "jump-wrong-size",
        "bare-jump-wrong-size",
        "rho-none",
        "hamiltonian-none",
        "rho-nan",
    ],
)
def test_bad_input_names_the_argument(hamiltonian, jumps, rho, match):
    with pytest.raises((ValueError, TypeError), match=match):
        mesolve(hamiltonian, jumps, rho, np.array([0.0, 1.0]))


def test_one_jump_operator_alone_is_a_list_of_one_whatever_ran_before():
    """A bare `(n, n)` jump matrix is one jump operator, an `(J, n, n)` array J of
    them, a matrix written as nested lists one: each against expm of the
    Liouvillian, right after the closed system was solved with the same
    Hamiltonian object (its cached term was once returned for the bare matrix:
    P_e(5) = 1 instead of e^{-5 gamma}). A list of times with a bare matrix is not
    QuTiP's order; a list of operators in the place of the times still is."""
    hamiltonian = jnp.asarray(0.5 * SZ + 0.3 * SX)
    jump, dephasing = np.sqrt(0.2) * SM, np.sqrt(0.05) * SZ
    times = np.linspace(0.0, 5.0, 3)
    closed = mesolve(hamiltonian, [], RHO, times, rtol=RTOL, atol=ATOL).states
    assert (
        _error(closed, _expm_reference(np.asarray(hamiltonian), [], RHO, times)) < 1e-8
    )
    one = _expm_reference(np.asarray(hamiltonian), [jump], RHO, times)
    two = _expm_reference(np.asarray(hamiltonian), [jump, dephasing], RHO, times)
    for jumps, reference in (
        (jump, one),
        (jnp.asarray(jump), one),
        (jump.tolist(), one),
        (np.stack([jump, dephasing]), two),
        (jnp.stack([jump, dephasing]), two),
        ([jump, dephasing], two),
    ):
        states = mesolve(hamiltonian, jumps, RHO, times, rtol=RTOL, atol=ATOL).states
        assert _error(states, reference) <= 1e-8
    listed = mesolve(hamiltonian, jump, RHO, list(times), rtol=RTOL, atol=ATOL)
    assert _error(listed.states, one) <= 1e-8
    with pytest.raises(TypeError, match="QuTiP's order"):
        mesolve(hamiltonian, RHO, times, [jump])


def test_traced_rates_of_known_jump_operators_under_vmap_and_grad():
    """Rates as traced scales of known jump operators (`sqrt(g) * as_operator(L)`,
    the form a sweep or a fit writes): constant in time, so their rows of the
    vec(rho) step take no window of the Cauchy product, under `jax.vmap` and
    `jax.grad` alike. Each element against scipy's DOP853, the gradient against
    central differences."""
    drive = hierax.Gaussian(1.5, 0.6, 0.8)
    times = jnp.array([0.0, 3.0])

    def final(gamma, phase_rate):
        h = hierax.TimeOperator([hierax.Constant(0.5), drive], [SZ, SX])
        jumps = [
            jnp.sqrt(gamma) * hierax.as_operator(SM),
            jnp.sqrt(phase_rate) * hierax.as_operator(SZ),
        ]
        return mesolve(h, jumps, RHO, times, rtol=RTOL, atol=ATOL).final_state

    gammas, rates = jnp.array([0.0, 0.3, 1.2]), jnp.array([0.05, 0.0, 0.4])
    finals = jax.jit(jax.vmap(final))(gammas, rates)
    for g, r, got in zip(gammas, rates, finals):
        g, r = float(g), float(r)

        def h_of(t):
            pulse = 0.8 * jnp.exp(-((t - 1.5) ** 2) / (2 * 0.6**2))
            return 0.5 * SZ + pulse * SX

        jumps = [lambda t, g=g: np.sqrt(g) * SM, lambda t, r=r: np.sqrt(r) * SZ]
        assert _error(got, _dop853(h_of, jumps, RHO, [0.0, 3.0])[-1]) <= 1e-9

    def population(gamma, phase_rate):
        return jnp.real(final(gamma, phase_rate)[1, 1])

    gradient = jax.grad(population, argnums=(0, 1))(0.3, 0.1)
    step = 1e-4
    differences = (
        (population(0.3 + step, 0.1) - population(0.3 - step, 0.1)) / (2 * step),
        (population(0.3, 0.1 + step) - population(0.3, 0.1 - step)) / (2 * step),
    )
    for got, want in zip(gradient, differences):
        assert float(got) == pytest.approx(float(want), rel=1e-6, abs=1e-10)
