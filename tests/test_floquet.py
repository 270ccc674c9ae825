"""Floquet quasienergies and modes against QuTiP's FloquetBasis, exact products of
matrix exponentials for piecewise-constant drives, finite differences, and a loop."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import qutip
import scipy.linalg

import hierax

from .helpers import Counting, compile_count


SX = np.array([[0.0, 1.0], [1.0, 0.0]])
SZ = np.diag([1.0, -1.0])


def _fold(energies, omega):
    """Quasienergies folded into (-omega/2, omega/2], in their order."""
    e = np.mod(np.asarray(energies) + omega / 2, omega) - omega / 2
    return np.where(e <= -omega / 2 + 1e-13, e + omega, e)


def _folded(energies, omega):
    """Quasienergies folded into (-omega/2, omega/2], sorted."""
    return np.sort(_fold(energies, omega))


def _transmon(levels=3, anharmonicity=-0.3):
    a = np.diag(np.sqrt(np.arange(1, levels)), 1)
    n = a.T @ a
    return 1.0 * n + 0.5 * anharmonicity * n @ (n - np.eye(levels)), a + a.T


@pytest.mark.parametrize("system", ["qubit", "transmon"])
def test_against_qutip_floquet_basis(system):
    """A driven qubit and a driven 3-level transmon (lab frame, counter-rotating
    terms kept): quasienergies against QuTiP's FloquetBasis to 1e-9, modes equal up
    to a phase."""
    if system == "qubit":
        h0, v, amplitude, omega = 0.5 * 1.0 * SZ, SX, 0.4, 2.3
    else:
        h0, v = _transmon()
        amplitude, omega = 0.08, 0.95
    period = 2 * np.pi / omega
    basis = hierax.floquet(h0 + hierax.Cos(omega, amplitude=amplitude) * v, period)
    reference = qutip.FloquetBasis(
        [qutip.Qobj(h0), [qutip.Qobj(v), lambda t: amplitude * np.cos(omega * t)]],
        period,
        options={"atol": 1e-14, "rtol": 1e-13, "nsteps": 10**6},
    )
    expected = _folded(reference.e_quasi, omega)
    np.testing.assert_allclose(np.asarray(basis.quasienergies), expected, atol=1e-9)
    modes = np.asarray(basis.modes)
    for j, energy in enumerate(np.asarray(basis.quasienergies)):
        k = int(np.argmin(np.abs(_fold(reference.e_quasi, omega) - energy)))
        theirs = np.asarray(reference.mode(0.0, data=False)[k].full()).ravel()
        overlap = abs(np.vdot(theirs, modes[:, j]))
        np.testing.assert_allclose(overlap, 1.0, atol=1e-9)


def test_piecewise_constant_drive_against_matrix_exponentials():
    """H0 + f(t) V with f = a on [0, T/2), b on [T/2, T): the one-period propagator
    is a product of two matrix exponentials (scipy), its eigenphases the
    quasienergies."""
    h0, v = _transmon(4)
    period, a, b = 3.7, 0.35, -0.2
    pulse = hierax.PiecewiseConstant([0.0, period / 2, period], [a, b])
    basis = hierax.floquet(h0 + pulse * v, period, rtol=1e-13, atol=1e-15)
    u = scipy.linalg.expm(-1j * (h0 + b * v) * period / 2) @ scipy.linalg.expm(
        -1j * (h0 + a * v) * period / 2
    )
    np.testing.assert_allclose(np.asarray(basis.propagator), u, atol=1e-10)
    expected = _folded(-np.angle(np.linalg.eigvals(u)) / period, 2 * np.pi / period)
    np.testing.assert_allclose(np.asarray(basis.quasienergies), expected, atol=1e-10)


def test_modes_at_later_times_are_floquet_modes():
    """phi_j(t) = e^{i eps_j t} U(t, 0) phi_j(0) is periodic, and the propagator
    maps the modes at 0 onto the modes at t with the phases e^{-i eps_j t}."""
    omega = 1.7
    h = (
        0.6 * SZ
        + hierax.Cos(omega, amplitude=0.5) * SX
        + hierax.Sin(omega) * (0.2 * SZ)
    )
    basis = hierax.floquet(h, 2 * np.pi / omega)
    period = float(basis.period)
    np.testing.assert_allclose(
        np.asarray(basis.modes_at(period)), np.asarray(basis.modes), atol=1e-10
    )
    np.testing.assert_allclose(
        np.asarray(basis.modes_at(0.3 + 2 * period)),
        np.asarray(basis.modes_at(0.3)),
        atol=1e-10,
    )
    t = 0.9
    u = hierax.sesolve(h, jnp.eye(2, dtype=complex), jnp.array([0.0, t]), rtol=1e-12)
    evolved = np.asarray(u.states[-1]) @ np.asarray(basis.modes)
    phases = np.exp(-1j * np.asarray(basis.quasienergies) * t)
    np.testing.assert_allclose(
        evolved, np.asarray(basis.modes_at(t)) * phases[None, :], atol=1e-10
    )


def test_vmap_over_periods_and_amplitudes_equals_a_loop_and_compiles_once():
    """A batch of drive frequencies (and so periods) and amplitudes in one
    `jax.vmap` equals a loop; new values compile nothing."""
    start = compile_count()

    def energies(omega, amplitude):
        h = 0.5 * SZ + hierax.Cos(omega, amplitude=amplitude) * SX
        return hierax.floquet(h, 2 * jnp.pi / omega).quasienergies

    omegas, amplitudes = jnp.array([1.9, 2.3, 3.1]), jnp.array([0.2, 0.4, 0.3])
    batched = jax.jit(jax.vmap(energies))
    together = batched(omegas, amplitudes)
    others = (jnp.array([2.0, 2.6, 2.8]), jnp.array([0.3, 0.1, 0.5]))
    before = compile_count()
    assert before > start  # the events are seen
    batched(*others)
    assert compile_count() == before
    for k in range(3):
        np.testing.assert_allclose(
            np.asarray(together[k]),
            np.asarray(energies(omegas[k], amplitudes[k])),
            atol=1e-11,
        )


def test_large_batches_are_solved_in_blocks_that_equal_single_solves(monkeypatch):
    """A sweep larger than a block (here blocks of 8: 19 drives are two blocks and
    a remainder, solved one after another) equals single solves, and its
    gradient under `jax.vmap` equals single gradients."""
    monkeypatch.setattr(hierax._periodic._floquet, "_block_bytes", lambda: 1)
    h0, drive = _transmon()

    def energies(amplitude):
        h = h0 + hierax.Cos(0.9, amplitude=amplitude) * drive
        return hierax.floquet(h, 2 * jnp.pi / 0.9, rtol=1e-10).quasienergies

    amplitudes = jnp.linspace(0.0, 0.1, 19)
    batched = jax.jit(jax.vmap(energies))(amplitudes)
    slopes = jax.jit(jax.vmap(jax.grad(lambda a: energies(a)[0])))(amplitudes)
    # One compiled gradient for the single solves (an eager `jax.grad` of a new
    # function traces the solve's derivative on every call).
    single_slope = jax.jit(jax.grad(lambda a: energies(a)[0]))
    for k in (0, 7, 8, 16, 18):  # first, last of a block, next block, remainder
        np.testing.assert_allclose(
            np.asarray(batched[k]), np.asarray(energies(amplitudes[k])), atol=1e-12
        )
        single = single_slope(amplitudes[k])
        np.testing.assert_allclose(float(slopes[k]), float(single), atol=1e-10)


def test_an_unhashable_structure_is_solved_without_compiling_per_call():
    """An operator whose static part cannot be hashed (`Counting` keeps a list)
    gets a one-period solver built for each call; it runs eagerly around the
    compiled solve, so a second call compiles nothing, and the quasienergies equal
    those of the same drive written with `hierax.Cos`."""

    def energies(drive):
        return hierax.floquet(0.5 * SZ + 0.3 * (drive * SX), 2 * np.pi / 2.0)

    traces: list = []  # one list: the two operators have equal structures
    tagged = energies(Counting(hierax.Cos(2.0), traces)).quasienergies
    before = compile_count()
    again = energies(Counting(hierax.Cos(2.0), traces)).quasienergies
    assert compile_count() == before
    plain = energies(hierax.Cos(2.0)).quasienergies
    np.testing.assert_allclose(np.asarray(again), np.asarray(tagged), atol=0)
    np.testing.assert_allclose(np.asarray(tagged), np.asarray(plain), atol=1e-12)


def test_a_new_amplitude_compiles_nothing_from_python():
    """Eager `floquet` calls with new drive values reuse the compiled solve."""

    def energies(amplitude):
        h = 0.5 * SZ + hierax.Cos(2.0, amplitude=amplitude) * SX
        return hierax.floquet(h, 2 * np.pi / 2.0).quasienergies

    energies(0.1)
    before = compile_count()
    energies(0.3)
    assert compile_count() == before


def test_an_eager_vmap_compiles_once():
    """`jax.vmap` over `floquet` called from Python (no jit) with new amplitudes
    reuses its blocked map, and equals single calls."""

    def energies(amplitude):
        h = 0.5 * SZ + hierax.Cos(2.0, 0.3, amplitude) * SX
        return hierax.floquet(h, 2 * np.pi / 2.0).quasienergies

    sweep = jax.vmap(energies)
    sweep(jnp.array([0.1, 0.2]))
    before = compile_count()
    again = sweep(jnp.array([0.3, 0.5]))
    assert compile_count() == before
    np.testing.assert_allclose(
        np.asarray(again[1]), np.asarray(energies(0.5)), atol=1e-12
    )


def test_new_phases_and_starts_do_not_recompile():
    """Each drive phase and start puts H's mirror centre elsewhere in the period;
    where it lies is a value of the compiled solve, so a new one compiles nothing,
    and the quasienergies do not depend on the start."""

    def basis(phase, t0):
        h = 0.5 * SZ + hierax.Cos(2.0, phase, 0.4) * SX
        return hierax.floquet(h, 2 * np.pi / 2.0, t0=t0)

    first = basis(0.3, 0.0).quasienergies
    before = compile_count()
    moved = basis(0.3, 0.41).quasienergies
    other = basis(-1.2, 0.0).quasienergies
    assert compile_count() == before
    np.testing.assert_allclose(np.asarray(moved), np.asarray(first), atol=1e-11)
    # A phase is a shift of time: the same quasienergies.
    np.testing.assert_allclose(np.asarray(other), np.asarray(first), atol=1e-11)


def test_quasienergy_gradient_against_finite_differences():
    """d eps / d amplitude of a driven qubit (away from degeneracies) against a
    central difference."""

    def lower(amplitude):
        h = 0.5 * 1.3 * SZ + hierax.Cos(2.1, amplitude=amplitude) * SX
        return hierax.floquet(h, 2 * jnp.pi / 2.1).quasienergies[0]

    step = 1e-5
    numeric = (lower(0.45 + step) - lower(0.45 - step)) / (2 * step)
    np.testing.assert_allclose(float(jax.grad(lower)(0.45)), float(numeric), rtol=1e-6)


def test_bad_input_is_named():
    h = 0.5 * SZ + hierax.Cos(2.0) * SX
    with pytest.raises(ValueError, match="`period` must be positive"):
        hierax.floquet(h, -1.0)
    with pytest.raises(ValueError, match="`period` must be a real scalar"):
        hierax.floquet(h, jnp.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="not Hermitian"):
        hierax.floquet(np.array([[0.0, 1.0], [0.0, 0.0]]) + hierax.Cos(2.0) * SX, np.pi)


def test_hermitian_h_with_non_hermitian_terms_against_qutip():
    """H = sz / 2 + 0.4 (e^{iwt} s+ + e^{-iwt} s-): Hermitian though its terms are
    not (checked whole at a few times before refusing), symmetric about T / 2 (half
    a period solved); quasienergies against QuTiP's FloquetBasis to 1e-9. Inside a
    jit with a traced amplitude H is checked inside the solve: the same values."""
    omega = 1.7
    sp = np.array([[0.0, 1.0], [0.0, 0.0]])

    def hamiltonian(amplitude):
        drive = hierax.Exp(1j * omega, amplitude) * sp
        return 0.5 * SZ + drive + hierax.Exp(-1j * omega, amplitude) * sp.T

    period = 2 * np.pi / omega
    basis = hierax.floquet(hamiltonian(0.4), period)
    reference = qutip.FloquetBasis(
        [
            qutip.Qobj(0.5 * SZ),
            [qutip.Qobj(sp), lambda t: 0.4 * np.exp(1j * omega * t)],
            [qutip.Qobj(sp.T), lambda t: 0.4 * np.exp(-1j * omega * t)],
        ],
        period,
        options={"atol": 1e-14, "rtol": 1e-13, "nsteps": 10**6},
    )
    np.testing.assert_allclose(
        np.asarray(basis.quasienergies), _folded(reference.e_quasi, omega), atol=1e-9
    )
    # With a traced amplitude H is checked at run time, inside the solve.
    traced = jax.jit(lambda a: hierax.floquet(hamiltonian(a), period).quasienergies)
    np.testing.assert_allclose(
        np.asarray(traced(0.4)), np.asarray(basis.quasienergies), atol=1e-12
    )


def test_bloch_siegert_shift_of_a_driven_qubit():
    """H = (Delta/2) sz + A cos(w t) sx off resonance: second-order perturbation
    theory in the extended space gives eps = Delta/2 + (A^2/4) (1/(Delta - w) +
    1/(Delta + w)) (the counter-rotating 1/(Delta + w) is the Bloch-Siegert
    part); the remainder falls as A^4."""
    delta, omega = 1.0, 2.3

    def remainder(amplitude):
        h = 0.5 * delta * SZ + hierax.Cos(omega, amplitude=amplitude) * SX
        energy = float(
            hierax.floquet(h, 2 * np.pi / omega, rtol=1e-13, atol=1e-15).quasienergies[
                1
            ]
        )
        series = delta / 2 + amplitude**2 / 4 * (
            1 / (delta - omega) + 1 / (delta + omega)
        )
        return abs(energy - series)

    large, small = remainder(0.08), remainder(0.04)
    assert small < 1e-6
    assert 12 < large / small < 20, (large, small)  # 2^4 = 16


@pytest.mark.parametrize(("phase", "t0"), [(0.0, 0.0), (0.3, 0.37)])
def test_float32_period_runs_in_single_precision(phase, t0):
    """A float32 period gives a complex64 propagator and quasienergies within
    float32's reach of the float64 ones, from the middle of the period and from a
    centre elsewhere (the propagator carried to t0 in float32)."""
    h = 0.5 * SZ + hierax.Cos(2.3, phase, 0.4) * SX
    double = hierax.floquet(h, 2 * np.pi / 2.3, t0=t0)
    single = hierax.floquet(
        h, jnp.float32(2 * np.pi / 2.3), t0=t0, rtol=1e-6, atol=1e-7
    )
    assert single.propagator.dtype == jnp.complex64
    assert single.quasienergies.dtype == jnp.float32
    np.testing.assert_allclose(
        np.asarray(single.quasienergies), np.asarray(double.quasienergies), atol=1e-5
    )
    np.testing.assert_allclose(
        np.asarray(single.propagator), np.asarray(double.propagator), atol=1e-5
    )


W = 2.0
PERIOD = 2 * np.pi / W
SP = np.array([[0.0, 1.0], [0.0, 0.0]])


def _full_period(hamiltonian, period, t0=0.0):
    """U(t0 + T, t0) by `sesolve` over the whole span (no symmetry used)."""
    eye = jnp.eye(2, dtype=complex)
    solution = hierax.sesolve(
        hamiltonian, eye, [t0, t0 + period], rtol=1e-13, atol=1e-15
    )
    return np.asarray(solution.states[-1])


@pytest.mark.parametrize(
    "drive",
    [
        hierax.Cos(W, 0.4, 0.7),  # the issue's: 1.5 periods of the cosine
        hierax.Sin(W, amplitude=0.5),
        hierax.Cos(W) * hierax.Cos(W / 5),
        hierax.Cos(W) + hierax.Cos(W / 2, amplitude=0.2),
        hierax.Exp(-0.3, 0.5),
        hierax.Gaussian(1.0, 0.5, 0.4),
        hierax.Polynomial(np.array([0.1, 0.2])),
        hierax.Gaussian(1.0, 0.5) * hierax.Cos(W),
    ],
)
def test_a_hamiltonian_that_is_not_periodic_with_the_period_is_refused(drive):
    """Closed-form time functions tell H's periods: a frequency that is not a whole
    number of cycles per period (over 1.5 periods of the drive, the mirror-symmetry
    shortcut gave a propagator 0.3 away from U(t0 + T, t0)), a decaying exponential,
    a Gaussian or a polynomial are refused, naming `period`."""
    with pytest.raises(ValueError, match="`hierax.floquet`: `hamiltonian` is not per"):
        hierax.floquet(0.5 * SZ + drive * SX, 1.5 * PERIOD)


@pytest.mark.parametrize(
    ("drive", "period"),
    [
        # cos^2(w t) = (1 + cos 2 w t) / 2 has period pi / w: a product's frequencies
        # are the sums of its factors'.
        (hierax.Cos(W, 0.3) * hierax.Cos(W, 0.3), PERIOD / 2),
        (hierax.Exp(2j * W, 0.3) * hierax.Exp(-1j * W), PERIOD),  # e^{i w t}
        # Sampled pulses and callables: one period of a periodic drive.
        (
            hierax.PiecewiseLinear([0.0, 1.0, 1.5 * PERIOD], [0.1, 0.6, 0.1]),
            1.5 * PERIOD,
        ),
        (
            hierax.CallableTimeFunction(lambda t: 0.7 * jnp.cos(W * t + 0.4)),
            1.5 * PERIOD,
        ),
    ],
)
def test_what_is_not_refused_is_the_propagator_over_one_period(drive, period):
    """Periodic products pass (and may use the half-period solve); what tells no
    period is solved over the whole span: in every case the propagator is
    U(t0 + T, t0) of the full solve (the callable cosine over 1.5 of its periods
    too, where the mirror shortcut went wrong for `hierax.Cos`)."""
    if isinstance(drive, hierax.TimeFunctionProduct) and isinstance(
        drive.left, hierax.Exp
    ):  # e^{i w t} s+ + h.c.
        conj = hierax.Exp(-2j * W, 0.3) * hierax.Exp(1j * W)
        drive_operator = drive * SP + conj * SP.T
    else:
        drive_operator = drive * (SX + 0.2 * SZ)
    hamiltonian = 0.5 * SZ + drive_operator
    # A sampled pulse is one period from its first knot (a later `t0` is refused).
    t0 = 0.0 if isinstance(drive, hierax.PiecewiseLinear) else 0.3
    basis = hierax.floquet(hamiltonian, period, t0=t0, rtol=1e-12, atol=1e-14)
    expected = _full_period(hamiltonian, period, t0)
    np.testing.assert_allclose(np.asarray(basis.propagator), expected, atol=1e-10)


def test_a_traced_period_or_frequency_is_checked_in_the_solve():
    """Inside a jit the frequencies and the period are values: a wrong period is
    refused at run time, a right one gives the eager quasienergies."""

    def energies(omega, period):
        h = 0.5 * SZ + hierax.Cos(omega, amplitude=0.3) * SX
        return hierax.floquet(h, period).quasienergies

    compiled = jax.jit(energies)
    with pytest.raises(Exception, match="`hamiltonian` is not periodic with `period`"):
        jax.block_until_ready(compiled(W, 1.5 * PERIOD))
    np.testing.assert_allclose(
        np.asarray(compiled(W, PERIOD)), np.asarray(energies(W, PERIOD)), atol=1e-12
    )


def _bcoo(m):
    from jax.experimental import sparse

    return sparse.BCOO.fromdense(jnp.asarray(m))


def _non_hermitian_forms():
    """Non-Hermitian Hamiltonians in every form `floquet` takes."""
    import scipy.sparse

    cos = hierax.Cos(W, amplitude=0.3)
    return {
        "dense term": 0.5 * SZ + cos * SP,
        "scipy.sparse": scipy.sparse.csr_matrix(SP + 0.5 * SZ),
        "sparse drive": scipy.sparse.csr_matrix(SZ) + cos * scipy.sparse.csr_matrix(SP),
        "bcoo": _bcoo(SP + 0.5 * SZ),
        "callable": lambda t: jnp.array([[0.5, jnp.cos(W * t)], [0.0, -0.5]]),
        "complex amplitude": 0.5 * SZ + hierax.Cos(W, amplitude=0.3j) * SX,
        "one rotating term": 0.5 * SZ + hierax.Exp(1j * W, 0.3) * SX,
        "scaled callable": cos
        * hierax.CallableOperator(
            lambda t: jnp.array([[0.0, 1.0], [0.0, 0.0]]) + 0 * t
        ),
        "qutip": qutip.Qobj(SP + 0.5 * SZ),
    }


@pytest.mark.parametrize("form", list(_non_hermitian_forms()))
def test_a_non_hermitian_hamiltonian_is_refused_in_every_form(form):
    """Dense, sparse (scipy, BCOO), callables, complex functions, scaled operators
    and QuTiP objects: H is checked whole (at times of the period) where its terms
    do not tell, and refused naming it."""
    hamiltonian = _non_hermitian_forms()[form]
    with pytest.raises(ValueError, match="`hierax.floquet`: `hamiltonian` is not Her"):
        hierax.floquet(hamiltonian, PERIOD)


def test_a_traced_non_hermitian_hamiltonian_is_refused_at_run_time():
    """A callable closing over a traced amplitude and a sparse term with a traced
    function are checked inside the solve."""
    import scipy.sparse

    def callable_h(a):
        return lambda t: jnp.array([[0.5, a * jnp.cos(W * t)], [0.0, -0.5]])

    def sparse_h(a):
        return scipy.sparse.csr_matrix(SZ) + hierax.Cos(W, amplitude=a) * (
            scipy.sparse.csr_matrix(SP)
        )

    for build in (callable_h, sparse_h):
        compiled = jax.jit(
            lambda a, build=build: hierax.floquet(build(a), PERIOD).quasienergies
        )
        with pytest.raises(Exception, match="`hamiltonian` is not Hermitian"):
            jax.block_until_ready(compiled(0.3))


def test_hermitian_sparse_and_callable_forms_equal_the_dense_one():
    """The same Hermitian H as scipy.sparse terms and as a callable: the dense
    form's quasienergies."""
    import scipy.sparse

    dense = hierax.floquet(0.5 * SZ + hierax.Cos(W, amplitude=0.3) * SX, PERIOD)
    sparse = hierax.floquet(
        scipy.sparse.csr_matrix(0.5 * SZ)
        + hierax.Cos(W, amplitude=0.3) * scipy.sparse.csr_matrix(SX),
        PERIOD,
    )
    callable_h = hierax.floquet(
        lambda t: 0.5 * jnp.asarray(SZ) + 0.3 * jnp.cos(W * t) * jnp.asarray(SX),
        PERIOD,
    )
    for other in (sparse, callable_h):
        np.testing.assert_allclose(
            np.asarray(other.quasienergies), np.asarray(dense.quasienergies), atol=1e-11
        )


H_QUBIT = 0.5 * SZ + hierax.Cos(W, amplitude=0.3) * SX


@pytest.mark.parametrize(
    ("keywords", "error", "match"),
    [
        ({"period": np.inf}, ValueError, "`period` must be finite"),
        ({"period": np.nan}, ValueError, "`period` must be"),
        ({"period": 0.0}, ValueError, "`period` must be positive"),
        ({"period": None}, TypeError, "period"),
        ({"period": 1j}, ValueError, "`period` must be a real scalar"),
        ({"t0": np.nan}, ValueError, "`t0` must be finite"),
        ({"t0": np.inf}, ValueError, "`t0` must be finite"),
        ({"t0": np.array([0.0, 1.0])}, ValueError, "`t0` must be a scalar"),
        ({"t0": jnp.array([0.0, 1.0])}, ValueError, "`t0` must be a real scalar"),
        ({"t0": "a"}, TypeError, "t0"),
        ({"t0": 1j}, TypeError, "`t0` must be a real number"),
        ({"rtol": -1.0}, ValueError, "`rtol` must be positive and finite"),
        ({"rtol": 0.0}, ValueError, "`rtol` must be positive and finite"),
        ({"rtol": np.nan}, ValueError, "`rtol` must be positive and finite"),
        ({"atol": np.inf}, ValueError, "`atol` must be positive and finite"),
        ({"atol": np.array([1e-8, 1e-9])}, ValueError, "`atol` must be a real scalar"),
        ({"rtol": "a"}, TypeError, "rtol"),
        ({"order": 0}, ValueError, r"`hierax.floquet\(order=...\)` must be a positive"),
        (
            {"order": -1},
            ValueError,
            r"`hierax.floquet\(order=...\)` must be a positive",
        ),
        ({"order": 1.5}, TypeError, "order"),
        ({"order": True}, TypeError, "order"),
    ],
)
def test_every_bad_argument_is_named(keywords, error, match):
    """Each argument of `floquet`, bad in value or in kind, gives an error naming
    `hierax.floquet` and the argument (the tolerances' too, which named
    `hierax.sesolve`). (Under the test suite's jaxtyping hook, arguments of the
    wrong type are refused by the annotations first: those match the name only.)"""
    arguments = {"period": PERIOD, **keywords}
    period = arguments.pop("period")
    with pytest.raises(error, match=match) as info:
        hierax.floquet(H_QUBIT, period, **arguments)
    if error is ValueError:
        assert "`hierax.floquet" in str(info.value)


def test_bad_times_of_modes_at_are_named():
    """`modes_at` refuses a batch of times, nan, inf, complex and non-numbers,
    naming `t`; a nan on the device is refused inside its compiled call."""
    basis = hierax.floquet(H_QUBIT, PERIOD)
    api = "`hierax.FloquetBasis.modes_at`"
    with pytest.raises(ValueError, match=f"{api}: `t` must be a scalar"):
        basis.modes_at(np.array([0.1, 0.2]))
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match=f"{api}: `t` must be finite"):
            basis.modes_at(bad)
    with pytest.raises(TypeError, match=f"{api}: `t` must be a real number"):
        basis.modes_at(1j)
    with pytest.raises(ValueError, match=f"{api}: `t` must be a real scalar"):
        basis.modes_at(jnp.array([0.1, 0.2]))
    with pytest.raises(Exception, match="`t` must be finite"):
        jax.block_until_ready(basis.modes_at(jnp.array(np.nan)))


def test_traced_bad_arguments_are_named_at_run_time():
    """A traced period, start or tolerance is checked inside the solve."""

    def energies(period, t0, rtol):
        return hierax.floquet(
            0.5 * SZ + hierax.Cos(2 * jnp.pi / period, amplitude=0.3) * SX,
            period,
            t0=t0,
            rtol=rtol,
        ).quasienergies

    compiled = jax.jit(energies)
    for arguments, name in (
        ((np.inf, 0.0, 1e-10), "`period` must be positive and finite"),
        ((PERIOD, np.nan, 1e-10), "`t0` must be finite"),
        ((PERIOD, 0.0, -1.0), "`rtol` must be positive and finite"),
    ):
        with pytest.raises(Exception, match=f"`hierax.floquet`: {name}"):
            jax.block_until_ready(compiled(*arguments))


def test_a_new_tolerance_compiles_nothing():
    """The tolerances are values of the compiled solve, as `sesolve`'s: a new
    `rtol` or `atol` compiles nothing, eagerly or inside a jit; a tighter one gives
    quasienergies at least as close to a tight reference."""
    reference = hierax.floquet(H_QUBIT, PERIOD, rtol=1e-13, atol=1e-15).quasienergies
    loose = hierax.floquet(H_QUBIT, PERIOD, rtol=1e-5, atol=1e-7)
    loose.modes_at(0.4)
    before = compile_count()
    tight = hierax.floquet(H_QUBIT, PERIOD, rtol=1e-11, atol=1e-13)
    tight.modes_at(0.4)
    assert compile_count() == before
    assert float(np.abs(np.asarray(tight.quasienergies - reference)).max()) <= max(
        1e-12, float(np.abs(np.asarray(loose.quasienergies - reference)).max())
    )
    traces = []

    @jax.jit
    def energies(rtol):
        traces.append(rtol)
        return hierax.floquet(H_QUBIT, PERIOD, rtol=rtol).quasienergies

    energies(1e-8)
    before = compile_count()
    energies(1e-10)
    assert compile_count() == before and len(traces) == 1


def test_a_second_call_on_the_device_moves_no_data():
    """With the Hamiltonian's arrays, the period and t0 on the device, a second
    `floquet` call and a `modes_at` call run without a transfer between host and
    device (the checks of values read nothing back), for a drive whose terms are
    Hermitian and one whose whole is checked at times of the period."""
    w = jnp.asarray(W)
    period, t0, t = 2 * jnp.pi / w, jnp.asarray(0.2), jnp.asarray(0.7)
    sz, sx, sp = (jnp.asarray(m) for m in (SZ, SX, SP))
    amplitude = jnp.asarray(0.3)
    hamiltonians = [
        0.5 * sz + hierax.Cos(w, amplitude=amplitude) * sx,
        0.5 * sz
        + hierax.Exp(1j * w, amplitude) * sp
        + hierax.Exp(-1j * w, amplitude) * sp.T,
    ]
    for h in hamiltonians:
        first = hierax.floquet(h, period, t0=t0)
        first.modes_at(t)
        with jax.transfer_guard("disallow"):
            again = hierax.floquet(h, period, t0=t0)
            modes = again.modes_at(t)
        np.testing.assert_allclose(
            np.asarray(modes), np.asarray(first.modes_at(t)), atol=0
        )


@pytest.mark.parametrize(
    "shift, dtype, tolerance",
    [
        (0.0, np.complex128, 1e-11),
        (1e-7, np.complex128, 1e-11),
        (-3e-5, np.complex128, 1e-11),
        (2e-3, np.complex128, 1e-11),
        (0.0, np.complex64, 2e-5),
        (3e-4, np.complex64, 2e-5),
    ],
)
def test_pairs_whose_quasienergies_sum_to_where_one_hermitian_mix_meets(
    shift, dtype, tolerance
):
    """H = Q diag(E) Q^dagger, constant (periodic with any T), so the quasienergies
    are E folded. Two of them are placed so that (e + e') T = -2 arctan c (+ a
    shift), where one Hermitian combination of U has a double eigenvalue and its
    `eigh` mixes their modes (with that one pass, the shifts 0 and 1e-7 failed in
    complex128, both in complex64): every quasienergy to the tolerance and every
    mode an eigenvector of U."""
    rng = np.random.default_rng(5)
    period = np.pi  # omega = 2: quasienergies in (-1, 1]
    c = 0.6180339887498949
    pair_sum = (-2 * np.arctan(c) + shift) / period
    energies = np.array([0.3, pair_sum - 0.3, 0.71, -0.83, 0.05, -0.44])
    q, _ = np.linalg.qr(rng.normal(size=(6, 6)) + 1j * rng.normal(size=(6, 6)))
    h = (q * energies) @ q.conj().T
    h = (h + h.conj().T) / 2
    tight = dtype == np.complex128
    basis = hierax.floquet(
        h.astype(dtype),
        np.real(np.asarray(period, dtype)),
        rtol=1e-13 if tight else 1e-6,
        atol=1e-15 if tight else 1e-8,
    )
    got = np.asarray(basis.quasienergies).astype(float)
    np.testing.assert_allclose(got, _folded(energies, 2.0), atol=tolerance)
    u = scipy.linalg.expm(-1j * h * period)
    modes = np.asarray(basis.modes).astype(complex)
    residual = u @ modes - modes * np.exp(-1j * got * period)
    assert np.max(np.abs(residual)) < 10 * tolerance


def test_too_low_an_order_is_named_with_floquets_settings():
    """A low `order` takes very many short steps (order 1 runs out of `max_steps`
    at the default tolerances): the error names `hierax.floquet`, the order, and
    floquet's way to raise the step limit (it has no `max_steps` keyword; the
    error named `hierax.sesolve` and asked for one). `modes_at` names itself, as
    a one-line ValueError (it was JAX's run-time error, with a traceback)."""
    for order, arguments in (
        (1, dict(order=1)),
        (2, dict(options=hierax.TaylorOptions(order=2, rtol=1e-6, max_steps=200))),
    ):
        with pytest.raises(ValueError) as info:
            hierax.floquet(H_QUBIT, PERIOD, **arguments)
        message = str(info.value)
        assert message.startswith("`hierax.floquet`: the solve over the period")
        assert f"at `order` = {order}." in message and "Raise `order`" in message
        assert "hierax.TaylorOptions(max_steps=...)" in message
        assert "sesolve" not in message and "\n" not in message
    # Between the steps of half a period and of a whole one (measured: 400-800
    # and 800-1600): the basis, over half a period by the drive's symmetry, is
    # built; a time nearly a period on runs out of them.
    options = hierax.TaylorOptions(order=4, rtol=1e-8, max_steps=800)
    basis = hierax.floquet(H_QUBIT, PERIOD, options=options)
    with pytest.raises(ValueError) as info:
        basis.modes_at(0.99 * PERIOD)
    message = str(info.value)
    assert message.startswith("`hierax.FloquetBasis.modes_at`: the solve from `t0`")
    assert "at `order` = 4 (given to `hierax.floquet`)" in message
    assert "\n" not in message


def test_a_period_past_the_samples_is_refused():
    """A sampled pulse is one period from its first knot: from another `t0`, the
    window [t0, t0 + T] left its samples, where it gives no drive, and the
    quasienergies were another drive's (+-0.436 from t0 = 0.7 for +-0.425). From
    its first knot it matches the product of the segments' exponentials; samples
    shorter than the period (pulse, then nothing) and longer ones that hold the
    window are taken."""
    import scipy.linalg

    sx = np.array([[0, 1], [1, 0]], complex)
    sz = np.diag([1.0, -1.0]).astype(complex)
    pulse = hierax.PiecewiseConstant([0, 0.5, 1.2, 2.0], [0.3, -0.8, 1.1])
    u = np.eye(2)
    for a, b, v in [(0, 0.5, 0.3), (0.5, 1.2, -0.8), (1.2, 2.0, 1.1)]:
        u = scipy.linalg.expm(-1j * (b - a) * (0.4 * sz + v * sx)) @ u
    want = np.sort(-np.angle(np.linalg.eigvals(u)) / 2.0)
    got = hierax.floquet(0.4 * sz + pulse * sx, 2.0).quasienergies
    np.testing.assert_allclose(np.sort(np.asarray(got)), want, atol=1e-9)
    for t0 in (0.7, -0.3, 2.0):
        with pytest.raises(ValueError, match=r"sampled pulses on \[0, 2\].*`t0=0`"):
            hierax.floquet(0.4 * sz + pulse * sx, 2.0, t0=t0)
    short = hierax.PiecewiseConstant([0.0, 0.5, 1.2], [0.3, -0.8])
    hierax.floquet(0.4 * sz + short * sx, 2.0)
    with pytest.raises(ValueError, match="`t0=0`"):
        hierax.floquet(0.4 * sz + short * sx, 2.0, t0=0.3)
    edges = np.linspace(0.0, 4.0, 9)
    long = hierax.PiecewiseConstant(edges, np.cos(np.pi * edges[:-1]))
    hierax.floquet(0.4 * sz + long * sx, 2.0, t0=1.0)


@pytest.mark.parametrize("seed", range(4))
def test_a_pair_at_the_second_passs_condition_is_not_mixed(seed):
    """Two quasienergies with (e + e') T = 2 arctan(1.618...) meet in the second
    pass's combination: a pair the first pass separated, coupled by rounding
    alone, was mixed there fully (quasienergies up to 0.3 off, in 40 of 40
    random cases). A static H of known spectrum, against its eigenvalues."""
    import scipy.stats

    rng = np.random.default_rng(seed)
    energies = rng.uniform(-np.pi, np.pi, 4)
    energies[1] = 2 * np.arctan(1.6180339887498949) - energies[0]
    energies = (energies + np.pi) % (2 * np.pi) - np.pi
    v = scipy.stats.unitary_group.rvs(4, random_state=rng)
    h = v @ np.diag(energies) @ v.conj().T
    got = hierax.floquet((h + h.conj().T) / 2, 1.0).quasienergies
    np.testing.assert_allclose(np.asarray(got), np.sort(energies), atol=1e-12)


def test_a_sweep_steps_in_lockstep_against_scipy(monkeypatch):
    """A `jax.vmap` sweep of drive amplitudes steps its propagators in lockstep
    (`_lockstep`, each element's U as adjacent columns of one state); the
    quasienergies equal those of scipy's one-period propagators."""
    from hierax._solvers import _lockstep

    from .helpers import propagate, recorded_returns

    stepped = recorded_returns(monkeypatch, _lockstep, "_in_lockstep")
    h0, drive = _transmon()
    omega = 0.9

    def energies(amplitude):
        h = h0 + hierax.Cos(omega, amplitude=amplitude) * drive
        return hierax.floquet(h, 2 * np.pi / omega, rtol=1e-11).quasienergies

    amplitudes = jnp.linspace(0.0, 0.3, 5)
    batched = jax.jit(jax.vmap(energies))(amplitudes)
    assert stepped and all(s is not None for s in stepped)
    for k, a in enumerate(np.asarray(amplitudes)):
        u = propagate(
            lambda t, a=a: h0 + a * np.cos(omega * t) * drive,
            0.0,
            2 * np.pi / omega,
            np.eye(3),
        )
        expected = _folded(-np.angle(np.linalg.eigvals(u)) * omega / (2 * np.pi), omega)
        np.testing.assert_allclose(np.asarray(batched[k]), expected, atol=1e-9)


def test_throw_false_returns_the_failure_with_no_callback():
    """With `throw=False` (the keyword or `TaylorOptions`) a sweep in a jit holds
    no host callback and gives the quasienergies of `throw=True`; a failed check
    (a traced bad period, a traced non-Hermitian H, a traced period that is no
    period of H, too few steps) comes back in `failure`, per element, with the
    results nan; `failure.throw()` raises what `throw=True` raises."""

    def basis(amplitude, period=PERIOD, **keywords):
        h = 0.5 * SZ + hierax.Cos(W, amplitude=amplitude) * SX
        if "options" not in keywords:
            keywords["rtol"] = 1e-10
        return hierax.floquet(h, period, **keywords)

    amplitudes = jnp.array([0.1, 0.3, 0.5])
    quiet = jax.jit(jax.vmap(lambda a: basis(a, throw=False)))
    assert "callback" not in quiet.lower(amplitudes).as_text()
    assert "callback" in jax.jit(jax.vmap(basis)).lower(amplitudes).as_text()
    out = quiet(amplitudes)
    assert out.failure is not None and np.all(np.asarray(out.failure.code) == -1)
    loud = jax.jit(jax.vmap(lambda a: basis(a).quasienergies))(amplitudes)
    np.testing.assert_allclose(np.asarray(out.quasienergies), np.asarray(loud))
    assert jax.jit(jax.vmap(basis))(amplitudes).failure is None

    def failed(result, match):
        assert not np.any(np.asarray(result.failure.succeeded))
        for x in (result.quasienergies, result.modes, result.propagator):
            assert np.all(np.isnan(np.asarray(x)))
        with pytest.raises(ValueError, match=match):
            result.failure.throw()

    periods = jnp.array([PERIOD, -1.0, PERIOD])
    mixed = jax.jit(jax.vmap(lambda p: basis(0.3, p, throw=False)))(periods)
    assert np.asarray(mixed.failure.succeeded).tolist() == [True, False, True]
    failed(jax.tree.map(lambda x: x[1], mixed), "`period` must be positive")
    wrong = jax.jit(lambda p: basis(0.3, p, throw=False))(1.5 * PERIOD)
    failed(wrong, "`hamiltonian` is not periodic with `period`")

    def callable_h(a):
        h = lambda t: jnp.array([[0.5, a * jnp.cos(W * t)], [0.0, -0.5]])  # noqa: E731
        return hierax.floquet(h, PERIOD, throw=False)

    # (`eqx.filter_jit`: the basis holds the callable.)
    failed(eqx.filter_jit(callable_h)(0.3), "`hamiltonian` is not Hermitian")
    short = hierax.TaylorOptions(max_steps=2, throw=False)
    few = basis(0.3, options=short)
    failed(few, "`max_steps` = 2")
    # (At sesolve's default order, 28 here: no "16 by default" advice.)
    with pytest.raises(ValueError, match="`order` = 28. Raise `order`: a step"):
        few.failure.throw()
    # `modes_at` has no place for a failure: it raises the basis' own, and a
    # failure of its own solve.
    with pytest.raises(ValueError, match="`max_steps` = 2"):
        few.modes_at(0.4)
    fine = basis(0.3, options=hierax.TaylorOptions(throw=False))
    alone = eqx.tree_at(lambda b: b.options, fine, short)
    with pytest.raises(ValueError, match="`max_steps` = 2"):
        alone.modes_at(0.99 * PERIOD)
    with pytest.raises(TypeError, match="`hierax.floquet`: `throw` must be a bool"):
        basis(0.3, throw=1)
    with pytest.raises(TypeError, match="give each setting once"):
        basis(0.3, throw=False, options=short)


def test_throw_false_unbatched_with_a_constant_term_holds_no_callback():
    """A constant term's trace is split off the solve's matrices; where they are
    traced (the one-period solve's arguments) its value was read by the public
    `Constant(...)(0.0)`, whose check of the time left a host callback in every
    unbatched `throw=False` program with a constant term."""

    def basis(amplitude):
        h = 0.5 * SZ + hierax.Cos(W, amplitude=amplitude) * SX
        return hierax.floquet(h, PERIOD, throw=False)

    assert "callback" not in jax.jit(basis).lower(0.3).as_text()
    out = jax.jit(basis)(0.3)
    assert int(out.failure.code) == -1
    loud = hierax.floquet(0.5 * SZ + hierax.Cos(W, amplitude=0.3) * SX, PERIOD)
    np.testing.assert_allclose(
        np.asarray(out.quasienergies), np.asarray(loud.quasienergies), atol=1e-14
    )


def test_a_sweep_of_a_callable_closing_over_the_swept_value():
    """`jax.vmap` over a callable H that closes over the swept amplitude (it once
    raised a bare AssertionError from the blocked map's batching rule, which
    takes explicit arguments only): the quasienergies of the closed-form drive,
    eagerly and in a jit, with `throw=False` too."""

    def by_callable(amplitude, throw=True):
        h = lambda t: 0.5 * SZ + amplitude * jnp.cos(W * t) * SX  # noqa: E731
        return hierax.floquet(h, PERIOD, rtol=1e-11, throw=throw).quasienergies

    def by_cos(amplitude):
        h = 0.5 * SZ + hierax.Cos(W, amplitude=amplitude) * SX
        return hierax.floquet(h, PERIOD, rtol=1e-11).quasienergies

    amplitudes = jnp.array([0.1, 0.3, 0.5])
    expected = np.asarray(jax.vmap(by_cos)(amplitudes))
    for found in (
        jax.vmap(by_callable)(amplitudes),
        jax.jit(jax.vmap(by_callable))(amplitudes),
        jax.jit(jax.vmap(lambda a: by_callable(a, throw=False)))(amplitudes),
    ):
        np.testing.assert_allclose(np.asarray(found), expected, atol=1e-9)


def test_throw_false_on_the_shifted_half_period_holds_no_callback():
    """A cosine with a phase is symmetric about a time inside the period: half of
    it is solved and carried to t0. With `throw=False` that is two solves of two
    times each (three save times keep diffrax's own checks, host callbacks), with
    the propagator and quasienergies of `throw=True`."""

    def basis(amplitude, throw):
        h = 0.5 * SZ + hierax.Cos(W, 0.7, amplitude) * SX
        return hierax.floquet(h, PERIOD, rtol=1e-12, throw=throw)

    quiet = jax.jit(lambda a: basis(a, False))
    assert "callback" not in quiet.lower(0.3).as_text()
    loud = basis(0.3, True)
    np.testing.assert_allclose(
        np.asarray(quiet(0.3).propagator), np.asarray(loud.propagator), atol=1e-10
    )
    np.testing.assert_allclose(
        np.asarray(quiet(0.3).quasienergies), np.asarray(loud.quasienergies), atol=1e-11
    )
    expected = _full_period(0.5 * SZ + hierax.Cos(W, 0.7, 0.3) * SX, PERIOD)
    np.testing.assert_allclose(np.asarray(quiet(0.3).propagator), expected, atol=1e-10)
