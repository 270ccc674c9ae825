"""Differential sweeps of the public API: fine sweeps of one continuous parameter
(under `jax.vmap`, and a Python loop at a few points) against independent
references (scipy's DOP853 at rtol 1e-12, products of `scipy.linalg.expm`,
`numpy.linalg.eig`, Taylor series summed in NumPy). Sweeps meet coincidences
(crossings, degeneracies, sums of quasienergies) that single random draws miss.
Fixed seeds and grids; tolerances are stated against the requested rtol."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.linalg

import hierax


SZ = np.diag([1.0, -1.0])
SX = np.array([[0.0, 1.0], [1.0, 0.0]])
SM = np.array([[0.0, 1.0], [0.0, 0.0]])


def _transmon(levels, anharmonicity=-0.3):
    a = np.diag(np.sqrt(np.arange(1, levels)), 1)
    n = a.T @ a
    return n + 0.5 * anharmonicity * n @ (n - np.eye(levels)), a + a.T


def _spin(twice_j):
    """J_z and J_x of spin j = twice_j / 2: equally spaced quasienergies under
    a J_x drive, so many pairs share their sums and cross together."""
    m = twice_j / 2 - np.arange(twice_j + 1)
    up = np.diag(np.sqrt(twice_j / 2 * (twice_j / 2 + 1) - m[1:] * (m[1:] + 1)), 1)
    return np.diag(m), (up + up.T) / 2


def _propagator(h, n, t0, t1):
    """U(t1, t0) of a NumPy H(t) with DOP853 (rtol 1e-12)."""

    def f(t, y):
        return (-1j * h(t) @ y.reshape(n, n)).ravel()

    y0 = np.eye(n, dtype=complex).ravel()
    s = scipy.integrate.solve_ivp(
        f, (t0, t1), y0, method="DOP853", rtol=1e-12, atol=1e-14
    )
    return s.y[:, -1].reshape(n, n)


def _circle_gap(energies, reference, omega):
    """The largest distance, modulo omega, from a quasienergy to the nearest of the
    other set (both ways)."""
    d = np.asarray(energies)[:, None] - np.asarray(reference)[None, :]
    d = np.abs(d - omega * np.round(d / omega))
    return max(d.min(1).max(), d.min(0).max())


def _check_basis(energies, modes, u, period):
    """Quasienergies against the eigenphases of U (numpy.linalg.eig), and the modes'
    residuals |U v - e^{-i eps T} v|; returns both."""
    omega = 2 * np.pi / period
    assert np.all(energies > -omega / 2) and np.all(energies <= omega / 2)
    expected = -np.angle(np.linalg.eigvals(u)) / period
    residual = u @ modes - modes * np.exp(-1j * energies * period)[None, :]
    return _circle_gap(energies, expected, omega), np.abs(residual).max()


@pytest.mark.parametrize("levels", [2, 6])
def test_floquet_amplitude_sweep_against_eig_and_dop853(levels):
    """256 drive amplitudes (0 to 1.5) of a driven transmon, H0 + A cos(w t) V, in
    one `jax.vmap`: at every point the quasienergies equal numpy's eigenphases of
    the returned propagator to 1e-13 and the modes are eigenvectors (residual
    1e-10); at 4 points the propagator equals DOP853's (rtol 1e-12) to 1e-10, and
    a Python loop (known values: the half-period mirror solve) equals the batch
    (full-period solve, traced period) to 1e-10. Seen: 4e-16, 1e-12, 5e-12."""
    h0, v = (0.5 * SZ, SX) if levels == 2 else _transmon(levels)
    omega = 1.3
    period = 2 * np.pi / omega

    def basis(amplitude):
        h = jnp.asarray(h0) + hierax.Cos(omega, amplitude=amplitude) * jnp.asarray(v)
        b = hierax.floquet(h, 2 * jnp.pi / omega)
        return b.quasienergies, b.modes, b.propagator

    amplitudes = np.linspace(0.0, 1.5, 256)
    energies, modes, u = map(np.asarray, jax.jit(jax.vmap(basis))(amplitudes))
    for k in range(len(amplitudes)):
        gap, residual = _check_basis(energies[k], modes[k], u[k], period)
        assert gap < 1e-13 and residual < 1e-10, (amplitudes[k], gap, residual)
    for k in (0, 85, 170, 255):
        a = amplitudes[k]

        def h_np(t, a=a):
            return h0 + a * np.cos(omega * t) * v

        reference = _propagator(h_np, levels, 0, period)
        np.testing.assert_allclose(u[k], reference, atol=1e-10)
        single = hierax.floquet(h0 + hierax.Cos(omega, amplitude=a) * v, period)
        np.testing.assert_allclose(
            np.asarray(single.quasienergies), energies[k], atol=1e-10
        )


@pytest.mark.parametrize("twice_j", [2, 5])
def test_floquet_spin_sweep_of_a_piecewise_constant_drive_against_expm(twice_j):
    """A spin j (3 and 6 levels: equally spaced quasienergies, so pairs cross and
    share their sums all along the sweep) under a three-segment
    piecewise-constant J_x drive, 400 amplitudes in one `jax.vmap`: the propagator
    equals the product of `scipy.linalg.expm`s to 1e-11, the quasienergies its
    eigenphases to 1e-12, the modes are eigenvectors (residual 1e-9; seen 1e-11:
    near-coincident pairs of the Hermitian mixes leave residuals ~ eps / gap)."""
    jz, jx = _spin(twice_j)
    h0, n, period = 0.7 * jz, twice_j + 1, 2 * np.pi / 1.3
    edges = np.array([0.0, 0.3, 0.55, 1.0]) * period
    profile = np.array([1.0, -0.4, 0.7])

    def basis(amplitude):
        pulse = hierax.PiecewiseConstant(edges, amplitude * jnp.asarray(profile))
        b = hierax.floquet(jnp.asarray(h0) + pulse * jnp.asarray(jx), period)
        return b.quasienergies, b.modes, b.propagator

    amplitudes = np.linspace(0.0, 3.0, 400)
    energies, modes, u = map(np.asarray, jax.jit(jax.vmap(basis))(amplitudes))
    for k, a in enumerate(amplitudes):
        reference = np.eye(n, dtype=complex)
        for s in range(3):
            step = (h0 + a * profile[s] * jx) * (edges[s + 1] - edges[s])
            reference = scipy.linalg.expm(-1j * step) @ reference
        np.testing.assert_allclose(u[k], reference, atol=1e-11)
        gap, residual = _check_basis(energies[k], modes[k], reference, period)
        assert gap < 1e-12 and residual < 1e-9, (a, gap, residual)


def test_floquet_phase_and_start_sweep_against_dop853():
    """Drive phases and start times swept in a Python loop (known values: the
    mirror-symmetric solve about a shifted centre, or the whole period where
    two harmonics have no common centre), 4-level transmon: quasienergies
    against the eigenphases of DOP853's propagator over [t0, t0 + T] to 1e-10,
    `modes_at(t)` periodic and equal to U(t, t0) modes e^{i eps (t - t0)}
    (DOP853) to 1e-9. Seen: 1e-13, 3e-12."""
    h0, v = _transmon(4)
    v2 = h0 @ v + v @ h0
    omega = 1.1
    period = 2 * np.pi / omega
    for phase, t0, other in [(-2.9, 0.0, 0.3), (-1.0, 0.37, 0.0), (0.4, -2.1, 1.9)]:
        h = (
            h0
            + hierax.Cos(omega, phase, 0.4) * v
            + hierax.Cos(2 * omega, other, 0.3) * v2
        )

        def h_np(t, phase=phase, other=other):
            drive = 0.4 * np.cos(omega * t + phase) * v
            return h0 + drive + 0.3 * np.cos(2 * omega * t + other) * v2

        basis = hierax.floquet(h, period, t0=t0)
        u = _propagator(h_np, 4, t0, t0 + period)
        energies, modes = np.asarray(basis.quasienergies), np.asarray(basis.modes)
        gap, residual = _check_basis(energies, modes, u, period)
        assert gap < 1e-10 and residual < 1e-9, (phase, t0, gap, residual)
        t = t0 + 0.61 * period
        at = np.asarray(basis.modes_at(t))
        expected = _propagator(h_np, 4, t0, t) @ modes
        expected = expected * np.exp(1j * energies * (t - t0))[None, :]
        np.testing.assert_allclose(at, expected, atol=1e-9)
        np.testing.assert_allclose(
            np.asarray(basis.modes_at(t + 3 * period)), at, atol=1e-9
        )


def _ket_reference(h, psi0, times):
    s = scipy.integrate.solve_ivp(
        lambda t, y: -1j * (h(t) @ y),
        (times[0], times[-1]),
        np.asarray(psi0, complex),
        method="DOP853",
        t_eval=times,
        rtol=1e-12,
        atol=1e-14,
    )
    return s.y.T


@pytest.mark.parametrize("double", [True, False])
def test_sesolve_lockstep_sweeps_against_dop853(double):
    """`sesolve` under `jax.vmap` (stepped in lockstep) over a qubit's detuning
    under a Gaussian pulse, over the pulse's amplitude (through 0 and negative),
    and over a 5-level transmon's initial ket, with `exp_ops` and six save
    times: every element's states and expectation values against DOP853
    (rtol 1e-12) per element. x64 at rtol 1e-10 to 1e-9 (seen 1e-11);
    complex64 at rtol 1e-5 to 2e-4 (seen 5e-6). A jitted single solve at three
    points equals its batch element to the same tolerance."""
    real, cplx = (np.float64, np.complex128) if double else (np.float32, np.complex64)
    rtol, atol, tol = (1e-10, 1e-12, 1e-9) if double else (1e-5, 1e-7, 2e-4)
    times = np.array([0.0, 0.7, 3.3, 6.0, 11.9, 12.0])
    h0, v = _transmon(5)
    up, ground = np.eye(2)[0], np.eye(5)[0]

    def gauss(t):
        return np.exp(-((t - 6.0) ** 2) / (2 * 1.5**2))

    cases = [
        (  # detuning
            lambda d: hierax.TimeOperator(
                [hierax.Constant(d / 2), hierax.Gaussian(6.0, 1.5, 0.5)],
                [jnp.asarray(SZ, real), jnp.asarray(SX, real)],
            ),
            lambda d, t: d / 2 * SZ + 0.5 * gauss(t) * SX,
            lambda d: jnp.asarray(up, cplx),
            np.linspace(-3.0, 3.0, 33),
            [SZ, SX],
        ),
        (  # amplitude, with 0 in the sweep
            lambda a: (
                jnp.asarray(0.3 * SZ, real)
                + hierax.Gaussian(6.0, 1.5, a) * jnp.asarray(SX, real)
            ),
            lambda a, t: 0.3 * SZ + a * gauss(t) * SX,
            lambda a: jnp.asarray(up, cplx),
            np.linspace(-2.0, 2.0, 33),
            [SZ, SX],
        ),
        (  # initial kets
            lambda th: (
                jnp.asarray(h0, real) + hierax.Cos(1.0, 0.0, 0.2) * jnp.asarray(v, real)
            ),
            lambda th, t: h0 + 0.2 * np.cos(t) * v,
            lambda th: (
                jnp.cos(th) * jnp.asarray(ground, cplx)
                + jnp.sin(th) * jnp.exp(1j * th) * jnp.asarray(np.eye(5)[2], cplx)
            ).astype(cplx),
            np.linspace(0.0, np.pi, 33),
            [np.diag(np.arange(5.0)), v],
        ),
    ]
    for build, h_np, ket, params, observables in cases:
        ops = jnp.asarray(np.stack(observables), cplx)

        def solve(p, build=build, ket=ket, ops=ops):
            s = hierax.sesolve(
                build(p),
                ket(p),
                jnp.asarray(times, real),
                rtol=rtol,
                atol=atol,
                exp_ops=ops,
            )
            return s.states, s.expects

        params = params.astype(real)
        states, expects = map(np.asarray, jax.jit(jax.vmap(solve))(params))
        assert states.dtype == cplx
        for k, p in enumerate(params):
            p = float(p)
            reference = _ket_reference(
                lambda t, p=p, h_np=h_np: h_np(p, t), np.asarray(ket(p)), times
            )
            np.testing.assert_allclose(states[k], reference, atol=tol)
            values = np.einsum(
                "ti,eij,tj->et", reference.conj(), np.stack(observables), reference
            ).real
            np.testing.assert_allclose(expects[k], values, atol=tol)
        single = jax.jit(solve)
        for k in (0, 16, 32):
            np.testing.assert_allclose(
                np.asarray(single(params[k])[0]), states[k], atol=tol
            )


def test_mesolve_sweeps_of_decay_and_drive_against_dop853():
    """`mesolve` under `jax.vmap` over a decay rate (0 to 2) and over a drive
    amplitude of a 4-level transmon with a coherence in rho(0), against DOP853
    (rtol 1e-12) of the Lindblad equation written with matrix products, at 5
    save times: 1e-8 at rtol 1e-10 (seen 1e-12)."""
    h0, v = _transmon(4)
    a = np.diag(np.sqrt(np.arange(1, 4)), 1)
    rho0 = np.zeros((4, 4))
    rho0[1:3, 1:3] = 0.5
    times = np.array([0.0, 0.5, 2.0, 5.0, 8.0])

    def reference(gamma, amplitude):
        jump = np.sqrt(gamma) * a
        decay = jump.T @ jump

        def f(t, y):
            r = y.reshape(4, 4)
            h = h0 + amplitude * np.cos(t) * v
            d = -1j * (h @ r - r @ h) + jump @ r @ jump.T
            return (d - 0.5 * (decay @ r + r @ decay)).ravel()

        s = scipy.integrate.solve_ivp(
            f,
            (0.0, 8.0),
            rho0.astype(complex).ravel(),
            method="DOP853",
            t_eval=times,
            rtol=1e-12,
            atol=1e-14,
        )
        return s.y.T.reshape(-1, 4, 4)

    for swept in ("gamma", "amplitude"):

        def solve(p, swept=swept):
            gamma, amplitude = (p, 0.3) if swept == "gamma" else (0.2, p)
            h = jnp.asarray(h0) + hierax.Cos(1.0, 0.0, amplitude) * jnp.asarray(v)
            return hierax.mesolve(
                h,
                [jnp.sqrt(gamma) * jnp.asarray(a)],
                jnp.asarray(rho0, complex),
                jnp.asarray(times),
                rtol=1e-10,
                atol=1e-12,
            ).states

        params = np.linspace(0.0, 2.0 if swept == "gamma" else 0.8, 17)
        states = np.asarray(jax.jit(jax.vmap(solve))(params))
        for k, p in enumerate(params):
            gamma, amplitude = (p, 0.3) if swept == "gamma" else (0.2, p)
            np.testing.assert_allclose(
                states[k], reference(gamma, amplitude), atol=1e-8
            )


def test_hierarchy_levels_swept_over_time_against_taylor_series():
    """`HeisenbergHierarchy` and `PropagatorDerivatives` (K = 10) of
    H(t) = H0 + A cos(w t) H1 (4-level transmon), 200 times t in [-5, 40] in one
    `jax.vmap`, against the same recursions summed in NumPy from the exact Taylor
    coefficients of cos (h_m = A w^m cos(w t + m pi / 2) / m!): relative
    Frobenius error 1e-11 per level (seen 2e-13); and a constant H scaled by 1e3
    against nested commutators."""
    order = 10
    h0, h1 = _transmon(4)
    x0 = np.diag(np.arange(4.0)) + 0.3 * (np.eye(4, k=1) + np.eye(4, k=-1))
    rng = np.random.default_rng(1)
    g = rng.normal(size=(4, 4))
    u0 = scipy.linalg.expm(-1j * (g + g.T))

    def series(t, w, amplitude):
        hs = [
            amplitude * w**m * np.cos(w * t + m * np.pi / 2) / math.factorial(m) * h1
            for m in range(order + 1)
        ]
        hs[0] = hs[0] + h0
        return hs

    def heisenberg(t, w, amplitude):
        hs = series(t, w, amplitude)
        x = [x0.astype(complex)] + [np.zeros((4, 4), complex)] * order
        levels = [x[0]]
        for k in range(1, order + 1):
            x = [
                sum(1j * (hs[m] @ x[j - m] - x[j - m] @ hs[m]) for m in range(j + 1))
                + (j + 1) * x[j + 1]
                for j in range(order + 1 - k)
            ] + [np.zeros((4, 4), complex)]
            levels.append(x[0])
        return np.stack(levels)

    def propagator(t, w, amplitude):
        hs = series(t, w, amplitude)
        u: list[np.ndarray] = [u0]
        for j in range(order):
            total = np.zeros((4, 4), complex)
            for m in range(j + 1):
                total = total + hs[m] @ u[j - m]
            u.append(-1j / (j + 1) * total)
        return np.stack([math.factorial(k) * u[k] for k in range(order + 1)])

    def relative(a, b):
        norms = np.linalg.norm(b, axis=(1, 2))
        return (np.linalg.norm(a - b, axis=(1, 2)) / norms).max()

    times = np.linspace(-5.0, 40.0, 200)
    for w, amplitude in ((1.3, 0.5), (3.0, 2.0)):
        h = jnp.asarray(h0) + hierax.Cos(w, 0.0, amplitude) * jnp.asarray(h1)
        heis = hierax.HeisenbergHierarchy(h, jnp.asarray(x0), order)
        props = hierax.PropagatorDerivatives(h, order)
        levels = np.asarray(jax.jit(jax.vmap(heis))(times))
        derivatives = np.asarray(
            jax.jit(jax.vmap(props, in_axes=(0, None)))(times, jnp.asarray(u0))
        )
        for i, t in enumerate(times):
            assert relative(levels[i], heisenberg(t, w, amplitude)) < 1e-11, t
            assert relative(derivatives[i], propagator(t, w, amplitude)) < 1e-11, t
    constant = 1e3 * (h0 + 0.4 * h1)
    levels = np.asarray(
        hierax.HeisenbergHierarchy(jnp.asarray(constant), jnp.asarray(x0), order)(0.0)
    )
    x = x0.astype(complex)
    for k in range(order + 1):
        assert np.linalg.norm(levels[k] - x) < 1e-12 * np.linalg.norm(x), k
        x = 1j * (constant @ x - x @ constant)
