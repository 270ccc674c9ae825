"""The open-system hierarchies: `hierax.LindbladHierarchy` and
`hierax.DensityMatrixDerivatives`.

Every level is compared against something independent of the code under test: the
direct Taylor recursion of the Lindblad generator in mpmath at 30 digits on series
that SymPy differentiates (below), the closed-system hierarchies, the duality
between the two pictures, and central finite differences for gradients.
"""

import functools
import math

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import hierax

from .helpers import (
    SIGMA_X,
    SIGMA_Y,
    SIGMA_Z,
    Counting,
    mp_relative_errors,
    mp_series,
    relative_errors,
    t_sym,
)


R = sp.Rational
SM = jnp.array([[0.0, 0.0], [1.0, 0.0]])  # |0> -> |1>
SX, SY, SZ = (
    sp.Matrix([[0, 1], [1, 0]]),
    sp.Matrix([[0, -sp.I], [sp.I, 0]]),
    sp.Matrix([[1, 0], [0, -1]]),
)
SM_SYM = sp.Matrix([[0, 0], [1, 0]])


# ----------------------------------------------------------------------------------
# The oracle: the Lindblad recursions in mpmath, on SymPy's series.
# ----------------------------------------------------------------------------------


def _cauchy(a, b, j):
    """Coefficient j of the product of two matrix series."""
    out = a[0] * b[j]
    for m in range(1, j + 1):
        out = out + a[m] * b[j - m]
    return out


def _mp_parts(h_terms, jump_terms, t0, order, dps):
    h = mp_series(h_terms, sp.Rational(t0), order, dps)
    jumps = [mp_series(terms, sp.Rational(t0), order, dps) for terms in jump_terms]
    adjoints = [[m.H for m in series] for series in jumps]
    n = h[0].rows
    number = [mp.matrix(n, n) for _ in range(order + 1)]
    for lj, dj in zip(jumps, adjoints, strict=True):
        for m in range(order + 1):
            number[m] = number[m] + _cauchy(dj, lj, m)
    return h, jumps, adjoints, number


def mp_lindblad_levels(h_terms, jump_terms, x_terms, t0, order, dps=30):
    """X_0(t0), ..., X_order(t0) for `X_k = L^+[X_{k-1}] + dX_{k-1}/dt`, as mpmath
    matrices: the direct recursion on truncated series (coefficients j <= K - k of
    level k are exact). `*_terms`: lists of (SymPy expression in `t_sym`, Matrix)."""
    mp.mp.dps = dps
    h, jumps, adjoints, number = _mp_parts(h_terms, jump_terms, t0, order, dps)
    x = mp_series(x_terms, sp.Rational(t0), order, dps)
    levels = [x[0]]
    for k in range(1, order + 1):
        width = order - k
        products = [[_cauchy(x, lj, j) for j in range(width + 1)] for lj in jumps]
        new = []
        for j in range(width + 1):
            acc = (j + 1) * x[j + 1]
            for m in range(j + 1):
                y = x[j - m]
                acc = acc + 1j * (h[m] * y - y * h[m])
                acc = acc - (number[m] * y + y * number[m]) / 2
            for dj, q in zip(adjoints, products, strict=True):
                acc = acc + _cauchy(dj, q, j)
            new.append(acc)
        x = new
        levels.append(x[0])
    return levels


def mp_density_derivatives(h_terms, jump_terms, rho, t0, order, dps=30):
    """rho(t0), rho'(t0), ..., as mpmath matrices: the Taylor coefficients
    `r_{j+1} = sum_m L_m[r_{j-m}] / (j+1)` of the Lindblad equation, times j!."""
    mp.mp.dps = dps
    h, jumps, adjoints, number = _mp_parts(h_terms, jump_terms, t0, order, dps)
    r = [mp.matrix(np.asarray(rho).tolist())]
    q = [[] for _ in jumps]  # (r * L^dagger), one coefficient per step
    for j in range(order):
        acc = mp.matrix(r[0].rows, r[0].cols)
        for m in range(j + 1):
            y = r[j - m]
            acc = acc - 1j * (h[m] * y - y * h[m])
            acc = acc - (number[m] * y + y * number[m]) / 2
        for lj, dj, qj in zip(jumps, adjoints, q, strict=True):
            qj.append(_cauchy(r, dj, j))
            acc = acc + _cauchy(lj, qj, j)
        r.append(acc / (j + 1))
    return [c * math.factorial(j) for j, c in enumerate(r)]


# ----------------------------------------------------------------------------------
# Test systems
# ----------------------------------------------------------------------------------


def _np(m: sp.Matrix) -> np.ndarray:
    return np.array(m.evalf(20).tolist(), dtype=complex)


RHO_QUBIT = np.array([[0.625, 0.25 - 0.125j], [0.25 + 0.125j, 0.375]])
RHO_QUTRIT = np.array(
    [
        [0.5, 0.125 + 0.0625j, 0.0625],
        [0.125 - 0.0625j, 0.25, -0.0625j],
        [0.0625, 0.0625j, 0.25],
    ]
)


def qubit_system(hermitian_observable: bool = True):
    """Time-dependent H, observable and jump operators; a complex rate in one."""
    h_terms = [(sp.cos(R(13, 10) * t_sym + R(1, 4)), SY), (R(2, 5), SZ)]
    rate = R(-3, 10) + R(1, 2) * sp.I
    jump_terms = [
        [(R(1, 5) + R(1, 20) * t_sym, SZ)],
        [(sp.sqrt(R(1, 5)) * sp.exp(rate * t_sym), SM_SYM)],
    ]
    hamiltonian = hierax.Cos(1.3, 0.25) * SIGMA_Y + 0.4 * SIGMA_Z
    jumps = [
        hierax.Polynomial(jnp.array([0.2, 0.05])) * SIGMA_Z,
        hierax.Exp(-0.3 + 0.5j, math.sqrt(0.2)) * SM,
    ]
    if hermitian_observable:
        x_terms = [(sp.sin(R(7, 10) * t_sym), SX), (sp.Integer(1), SZ)]
        observable = hierax.Sin(0.7) * SIGMA_X + SIGMA_Z
    else:
        x_terms = [(sp.sin(R(7, 10) * t_sym), SM_SYM)]
        observable = hierax.Sin(0.7) * SM
    return dict(
        t0=R(3, 5),
        h_terms=h_terms,
        jump_terms=jump_terms,
        x_terms=x_terms,
        hamiltonian=hamiltonian,
        jumps=jumps,
        observable=observable,
        rho=RHO_QUBIT,
    )


def qutrit_system():
    """Time-dependent H; a constant jump operator and a callable one with a complex
    time function (a dense series: no term structure)."""
    h1 = sp.Matrix(
        [[1, R(1, 2), 0], [R(1, 2), -1, R(1, 3) * sp.I], [0, -R(1, 3) * sp.I, R(1, 4)]]
    )
    h2 = sp.Matrix([[0, 1, R(1, 5)], [1, R(1, 2), 0], [R(1, 5), 0, -R(1, 2)]])
    lower = sp.Matrix([[0, 1, 0], [0, 0, sp.sqrt(2)], [0, 0, 0]])
    dephase = sp.diag(1, 0, -1)
    a, b = sp.Matrix([[1, 0, 0], [0, 0, 0], [0, 0, -1]]), h2
    poly = R(3, 10) + R(1, 2) * t_sym - R(1, 5) * t_sym**2
    h_terms = [(poly, h1), (sp.cos(R(13, 10) * t_sym + R(1, 4)), h2)]
    jump_terms = [
        [(sp.sqrt(R(1, 10)), lower)],
        [(R(3, 10) * sp.cos(t_sym / 2) + sp.I / 10, dephase)],
    ]
    x_terms = [(sp.sin(R(7, 10) * t_sym), a), (sp.Integer(1), b)]
    lower_np, dephase_np = jnp.asarray(_np(lower)), jnp.asarray(_np(dephase))
    hamiltonian = hierax.Polynomial(jnp.array([0.3, 0.5, -0.2])) * jnp.asarray(
        _np(h1)
    ) + hierax.Cos(1.3, 0.25) * jnp.asarray(_np(h2))
    jumps = [
        math.sqrt(0.1) * lower_np,
        lambda t: (0.3 * jnp.cos(t / 2) + 0.1j) * dephase_np,
    ]
    observable = hierax.Sin(0.7) * jnp.asarray(_np(a)) + jnp.asarray(_np(b))
    return dict(
        t0=R(3, 10),
        h_terms=h_terms,
        jump_terms=jump_terms,
        x_terms=x_terms,
        hamiltonian=hamiltonian,
        jumps=jumps,
        observable=observable,
        rho=RHO_QUTRIT,
    )


SYSTEMS = {
    "qubit": qubit_system,
    "qubit-nonhermitian-observable": lambda: qubit_system(False),
    "qutrit-callable-jump": qutrit_system,
}
ORDER = 10


@functools.cache
def _system(name: str) -> dict:
    """A test system with its oracle values at t0, computed once per session."""
    s = SYSTEMS[name]()
    s["name"] = name
    s["levels"] = mp_lindblad_levels(
        s["h_terms"], s["jump_terms"], s["x_terms"], s["t0"], ORDER
    )
    s["derivatives"] = mp_density_derivatives(
        s["h_terms"], s["jump_terms"], s["rho"], s["t0"], ORDER
    )
    return s


@pytest.fixture(scope="module", params=list(SYSTEMS))
def system(request):
    return _system(request.param)


def _hierarchies(s, order=ORDER, offset=0.0, dtype=None):
    hamiltonian = s["hamiltonian"]
    if offset:
        n = s["rho"].shape[0]
        hamiltonian = hamiltonian + offset * jnp.eye(n)
    levels = hierax.LindbladHierarchy(hamiltonian, s["jumps"], s["observable"], order)
    density = hierax.DensityMatrixDerivatives(hamiltonian, s["jumps"], order)
    return levels, density


def test_against_mpmath_x64(system):
    t0 = float(system["t0"])
    levels, density = _hierarchies(system)
    got = levels(t0)
    errors = mp_relative_errors(got, system["levels"])
    assert np.all(errors <= 1e-11), errors
    # The estimate is of the observed size: it does not model earlier levels'
    # rounding growing into a level that is small against the one before (level 9
    # of the qubit is observed at 1.3 times its estimate), nor the inputs' rounding.
    estimate = np.asarray(levels.error_estimate(t0))
    assert np.all(2 * estimate >= errors) and np.all(estimate <= 1e-11), estimate

    rho = density(t0, system["rho"])
    errors = mp_relative_errors(rho, system["derivatives"])
    assert np.all(errors <= 1e-11), errors
    estimate = np.asarray(density.error_estimate(t0, system["rho"]))
    assert np.all(estimate >= errors) and np.all(estimate <= 1e-11), estimate

    if system["name"] == "qubit":
        factorials = np.array([math.factorial(k) for k in range(ORDER + 1)])
        factorials = factorials[:, None, None]
        np.testing.assert_allclose(levels.normalised(t0) * factorials, got, rtol=1e-13)
        np.testing.assert_allclose(
            density.normalised(t0, system["rho"]) * factorials, rho, rtol=1e-13
        )


def test_offset_changes_nothing():
    """H + 100 I: only the Hamiltonian is shifted, and only its commutator sees H.
    One system is enough, the shift is the same code for all; on the qutrit its H,
    jump operators and observable all have other parts."""
    system = _system("qutrit-callable-jump")
    t0 = float(system["t0"])
    levels, density = _hierarchies(system, offset=100.0)
    errors = mp_relative_errors(levels(t0), system["levels"])
    assert np.all(errors <= 1e-11), errors
    errors = mp_relative_errors(density(t0, system["rho"]), system["derivatives"])
    assert np.all(errors <= 1e-11), errors


def test_complex64_qubit():
    """complex64 inputs give complex64 levels, exact to a few hundred float32
    roundings (measured: about 3e-6 at worst) and honest about it."""
    s = qubit_system()
    levels_ref = mp_lindblad_levels(
        s["h_terms"], s["jump_terms"], s["x_terms"], s["t0"], 8
    )
    rho_ref = mp_density_derivatives(
        s["h_terms"], s["jump_terms"], s["rho"], s["t0"], 8
    )
    c64 = jnp.complex64
    hamiltonian = hierax.Cos(1.3, 0.25) * jnp.asarray(SIGMA_Y, c64) + jnp.float32(
        0.4
    ) * jnp.asarray(SIGMA_Z, c64)
    jumps = [
        hierax.Polynomial(jnp.array([0.2, 0.05], jnp.float32))
        * jnp.asarray(SIGMA_Z, c64),
        hierax.Exp(jnp.complex64(-0.3 + 0.5j), jnp.float32(math.sqrt(0.2)))
        * jnp.asarray(SM, c64),
    ]
    observable = hierax.Sin(0.7) * jnp.asarray(SIGMA_X, c64) + jnp.asarray(SIGMA_Z, c64)
    t0 = jnp.float32(0.6)
    levels = hierax.LindbladHierarchy(hamiltonian, jumps, observable, 8)
    got = levels(t0)
    assert got.dtype == c64
    errors = mp_relative_errors(np.asarray(got, complex), levels_ref)
    assert np.all(errors <= 3e-5), errors
    estimate = np.asarray(levels.error_estimate(t0))
    assert estimate.dtype == np.float32
    assert np.all(estimate >= errors) and np.all(estimate <= 1e-3), estimate

    density = hierax.DensityMatrixDerivatives(hamiltonian, jumps, 8)
    rho = density(t0, jnp.asarray(s["rho"], c64))
    assert rho.dtype == c64
    errors = mp_relative_errors(np.asarray(rho, complex), rho_ref)
    assert np.all(errors <= 3e-5), errors


# ----------------------------------------------------------------------------------
# Structure: the closed system, trace, Hermiticity, duality
# ----------------------------------------------------------------------------------


def test_no_jump_operators_is_the_closed_system():
    s = qubit_system()
    t0, order = 0.6, 12
    closed = hierax.HeisenbergHierarchy(s["hamiltonian"], s["observable"], order)(t0)
    opened = hierax.LindbladHierarchy(s["hamiltonian"], [], s["observable"], order)
    # The same kernel; the compiler may fuse (and so round) it differently in the
    # two programs: equal to rounding.
    assert np.all(relative_errors(opened(t0), closed) <= 1e-14)

    # rho^(k) = sum_i C(k, i) V^(i) rho V^(k-i)^dagger, V(t) the propagator from t0.
    v = np.asarray(
        hierax.PropagatorDerivatives(s["hamiltonian"], order)(t0, jnp.eye(2))
    )
    rho = s["rho"]
    expected = np.stack(
        [
            sum(math.comb(k, i) * v[i] @ rho @ v[k - i].conj().T for i in range(k + 1))
            for k in range(order + 1)
        ]
    )
    got = hierax.DensityMatrixDerivatives(s["hamiltonian"], (), order)(t0, rho)
    assert np.all(relative_errors(got, expected) <= 1e-12)


def test_trace_and_hermiticity(system):
    t0 = float(system["t0"])
    _, density = _hierarchies(system)
    rho = np.asarray(density(t0, system["rho"]))
    scale = np.linalg.norm(rho.reshape(len(rho), -1), axis=1)
    traces = np.abs(np.trace(rho, axis1=1, axis2=2))
    assert abs(traces[0] - 1) <= 1e-15
    assert np.all(traces[1:] <= 1e-13 * scale[1:]), traces / scale
    skew = np.linalg.norm(
        (rho - rho.conj().transpose(0, 2, 1)).reshape(ORDER + 1, -1), axis=1
    )
    assert np.all(skew <= 1e-13 * scale), skew / scale


def test_duality_constant_generator():
    """d^k/dt^k tr(X rho(t)) = tr(X_i rho^(k-i)) for every split i when H, L and X
    are constant: the two pictures agree order by order."""
    h = 0.7 * np.asarray(SIGMA_Z) + 0.3 * np.asarray(SIGMA_X)
    jumps = [math.sqrt(0.3) * np.asarray(SM), math.sqrt(0.2) * np.asarray(SIGMA_Z)]
    x = np.asarray(SIGMA_X) + 0.5 * np.asarray(SIGMA_Y)
    order = 12
    levels = np.asarray(hierax.LindbladHierarchy(h, jumps, x, order)(0.0))
    rho = np.asarray(hierax.DensityMatrixDerivatives(h, jumps, order)(0.0, RHO_QUBIT))
    for k in range(order + 1):
        values = [np.trace(levels[i] @ rho[k - i]) for i in range(k + 1)]
        np.testing.assert_allclose(values, values[0], rtol=1e-12, atol=1e-14)


def test_duality_time_dependent(system):
    """d^k/dt^k tr(X_0(t) rho(t)) = tr(X_k(t) rho(t)) with everything
    time-dependent: the left side by Leibniz, sum_i C(k, i) tr(X_0^(i) rho^(k-i))."""
    t0 = float(system["t0"])
    levels, density = _hierarchies(system)
    x = np.asarray(levels(t0))
    rho = np.asarray(density(t0, system["rho"]))
    taylor = np.asarray(system["observable"].taylor(t0, ORDER))
    for k in range(ORDER + 1):
        direct = np.trace(x[k] @ rho[0])
        leibniz = sum(
            math.comb(k, i) * math.factorial(i) * np.trace(taylor[i] @ rho[k - i])
            for i in range(k + 1)
        )
        np.testing.assert_allclose(leibniz, direct, rtol=1e-11, atol=1e-12)


# ----------------------------------------------------------------------------------
# Transformations: gradients, vmap, no retrace
# ----------------------------------------------------------------------------------


def _central_difference(fn, x, eps=1e-6):
    return (fn(x + eps) - fn(x - eps)) / (2 * eps)


def test_gradient_with_respect_to_a_decay_rate():
    """A time-dependent rate in the hierarchy, a constant one in rho's derivatives."""
    h = hierax.Cos(1.3) * SIGMA_Y + 0.4 * SIGMA_Z

    def level(gamma):
        jump = hierax.Exp(-0.3 + 0.5j, jnp.sqrt(gamma)) * SM
        levels = hierax.LindbladHierarchy(h, [jump], SIGMA_X + SIGMA_Z, 6)(0.5)
        return jnp.real(levels[6, 0, 0]) + jnp.imag(levels[5, 0, 1])

    def derivative(gamma):
        jumps = [jnp.sqrt(gamma) * SM, 0.1 * SIGMA_Z]
        rho = hierax.DensityMatrixDerivatives(h, jumps, 6)(0.5, jnp.asarray(RHO_QUBIT))
        return jnp.real(jnp.trace(SIGMA_X @ rho[6]))

    for fn in (level, derivative):
        gamma = jnp.asarray(0.2)
        grad = jax.jit(jax.grad(fn))(gamma)  # one compile, forward and reverse
        fd = _central_difference(fn, gamma)
        np.testing.assert_allclose(grad, fd, rtol=1e-7)


def test_vmap_over_times_equals_a_loop():
    s = qubit_system()
    levels, density = _hierarchies(s)
    ts = jnp.linspace(-1.0, 2.0, 4)
    np.testing.assert_allclose(
        jax.vmap(levels)(ts), jnp.stack([levels(t) for t in ts]), rtol=1e-13, atol=1e-13
    )
    rho = jnp.asarray(s["rho"])
    np.testing.assert_allclose(
        jax.vmap(lambda t: density(t, rho))(ts),
        jnp.stack([density(t, rho) for t in ts]),
        rtol=1e-13,
        atol=1e-13,
    )


@pytest.mark.parametrize("kind", ["hierarchy", "density"])
def test_no_retrace_when_time_or_rate_changes(kind):
    traces = []
    rho = jnp.asarray(RHO_QUBIT)

    def run(gamma, t):
        jump = Counting(hierax.Exp(-0.3, jnp.sqrt(jnp.asarray(gamma))), traces)
        h = hierax.Cos(1.3) * SIGMA_Y
        if kind == "hierarchy":
            return hierax.LindbladHierarchy(h, [jump * SM], SIGMA_X, 6)(t)
        return hierax.DensityMatrixDerivatives(h, [jump * SM], 6)(t, rho)

    run(0.2, 0.5).block_until_ready()
    first = len(traces)
    for gamma, t in [(0.3, 0.7), (0.1, jnp.asarray(-1.0)), (2.0, 3.0)]:
        run(gamma, t).block_until_ready()
    assert len(traces) == first


# ----------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("make", ["hierarchy", "density", "term"])
def test_jump_operators_in_mesolves_forms(make):
    """The forms `mesolve` takes: one operator alone is one jump operator, an
    `(J, n, n)` array J of them (the same levels, or the same vector field of a
    `LindbladTerm`, as the list); None is refused, and a string names the
    entry."""

    def levels(jumps):
        if make == "hierarchy":
            return hierax.LindbladHierarchy(SIGMA_Z, jumps, SIGMA_X, 3)(0.3)
        rho = jnp.array([[0.3, 0.2j], [-0.2j, 0.7]])
        if make == "term":
            return hierax.LindbladTerm(SIGMA_Z, jumps).vf(0.3, rho, None)
        return hierax.DensityMatrixDerivatives(SIGMA_Z, jumps, 3)(0.3, rho)

    sp_ = 0.4 * SM.T
    np.testing.assert_array_equal(np.asarray(levels(SM)), np.asarray(levels([SM])))
    np.testing.assert_array_equal(
        np.asarray(levels(jnp.stack([SM, sp_]))), np.asarray(levels([SM, sp_]))
    )
    with pytest.raises(TypeError, match="`jump_operators` must be a list or tuple"):
        levels(None)
    with pytest.raises(TypeError, match=r"`jump_operators\[0\]`"):
        levels("sm")


@pytest.mark.parametrize("make", ["hierarchy", "density"])
def test_jump_operators_of_the_wrong_size(make):
    with pytest.raises(ValueError, match=r"`jump_operators\[1\]` is 3x3 but"):
        if make == "hierarchy":
            hierax.LindbladHierarchy(SIGMA_Z, [SM, jnp.eye(3)], SIGMA_X, 3)
        else:
            hierax.DensityMatrixDerivatives(SIGMA_Z, [SM, jnp.eye(3)], 3)
    with pytest.raises(ValueError, match=r"jump_operators\[0\]"):
        hierax.LindbladHierarchy(SIGMA_Z, [jnp.ones((2, 3))], SIGMA_X, 3)
    with pytest.raises(TypeError, match=r"jump_operators\[0\]"):
        hierax.DensityMatrixDerivatives(SIGMA_Z, ["sm"], 3)


def test_observable_of_the_wrong_size():
    with pytest.raises(ValueError, match="`observable` is 3x3"):
        hierax.LindbladHierarchy(SIGMA_Z, [SM], jnp.eye(3), 3)


@pytest.mark.parametrize(
    "rho", [jnp.ones((2, 3)), jnp.ones(2), jnp.eye(3), jnp.ones((1, 2, 2))]
)
def test_rho_must_be_square_of_the_hamiltonians_size(rho):
    derivatives = hierax.DensityMatrixDerivatives(SIGMA_Z, [SM], 3)
    for call in (derivatives, derivatives.normalised, derivatives.error_estimate):
        with pytest.raises(ValueError, match=r"`rho` must be a square matrix of shape"):
            call(0.0, rho)


def test_rho_must_be_finite_and_numeric():
    derivatives = hierax.DensityMatrixDerivatives(SIGMA_Z, [SM], 3)
    with pytest.raises(ValueError, match="`rho` must be finite"):
        derivatives(0.0, jnp.array([[jnp.nan, 0], [0, 1.0]]))
    # (Under the test suite's jaxtyping import hook, beartype may answer first; its
    # message also names `rho`.)
    with pytest.raises(TypeError, match="rho"):
        derivatives(0.0, "rho")  # pyright: ignore
