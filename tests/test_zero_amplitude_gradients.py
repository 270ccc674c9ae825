"""Derivatives with respect to a drive's amplitude at and near 0 (a pulse optimised
from a zero or small guess): the solve then barely moves and its own error
estimate lets one step cover the whole interval, which the derivative, the solve
driven at amplitude 1, does not survive (before: 5.3e9 instead of -0.59 over 20
units). Each step now also resolves every time function at amplitude 1
(`_resolution`). Checked against closed forms (first-order perturbation theory is
exact at a = 0) and against scipy's DOP853 of the sensitivity equations."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

import hierax


SX = np.array([[0, 1], [1, 0]], complex)
SZ = np.diag([1.0, -1.0]).astype(complex)
KET = jnp.array([1.0, 0.0], complex)


def _first_order(a_of_t, span):
    """d<1|psi(T)>/da at a = 0 for H = a f(t) sx, psi(0) = |0>: -i int f."""
    integral, _ = scipy.integrate.quad(a_of_t, 0.0, span, limit=400, epsabs=1e-13)
    return -1j * integral


@pytest.mark.parametrize("span", [5.0, 20.0])
@pytest.mark.parametrize(
    "form",
    ["function amplitude", "matrix amplitude", "gaussian", "gaussian times cosine"],
)
def test_the_gradient_at_amplitude_zero_is_first_order_perturbation_theory(form, span):
    shapes = {
        "function amplitude": (lambda t: np.cos(1.3 * t)),
        "matrix amplitude": (lambda t: np.cos(1.3 * t)),
        "gaussian": (lambda t: np.exp(-((t - span / 2) ** 2) / 2)),
        "gaussian times cosine": (
            lambda t: np.exp(-((t - span / 2) ** 2) / 2) * np.cos(2.0 * t)
        ),
    }

    def hamiltonian(a):
        if form == "function amplitude":
            return a * hierax.Cos(1.3) * SX
        if form == "matrix amplitude":
            return hierax.Cos(1.3) * (a * SX)
        gaussian = hierax.Gaussian(span / 2, 1.0, a)
        if form == "gaussian":
            return gaussian * SX
        return (gaussian * hierax.Cos(2.0)) * SX

    def amplitude(a, adjoint=None):
        """<1|psi(T)> as its real and imaginary parts."""
        final = hierax.sesolve(
            hamiltonian(a),
            KET,
            jnp.array([0.0, span]),
            rtol=1e-10,
            atol=1e-12,
            adjoint=adjoint,
        ).final_state[1]
        return jnp.stack([jnp.real(final), jnp.imag(final)])

    expected = _first_order(shapes[form], span)
    want = np.array([np.real(expected), np.imag(expected)])
    reverse = jax.jacrev(amplitude)(0.0)
    forward = jax.jacfwd(lambda a: amplitude(a, diffrax.ForwardMode()))(0.0)
    for got in (reverse, forward):
        assert np.all(
            np.abs(np.asarray(got) - want) <= 1e-8 * np.maximum(1.0, abs(want))
        )


@pytest.mark.parametrize("amplitude", [0.0, 1e-6, 1e-3])
def test_gradients_at_small_amplitudes_against_the_sensitivity_equations(amplitude):
    """A detuned qubit driven at a small amplitude over 30 units: the gradient of
    the final excited population's amplitude against DOP853 of the state and
    its derivative (the sensitivity equations), at rtol 1e-10."""
    span, detuning = 30.0, 0.4

    def derivative(t, y):
        psi, dpsi = y[:2] + 1j * y[2:4], y[4:6] + 1j * y[6:8]
        drive = np.cos(1.1 * t)
        h = detuning / 2 * SZ + amplitude * drive * SX
        d = -1j * (h @ psi)
        dd = -1j * (h @ dpsi) - 1j * drive * (SX @ psi)
        return np.concatenate([d.real, d.imag, dd.real, dd.imag])

    start = np.array([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    end = scipy.integrate.solve_ivp(
        derivative, (0.0, span), start, method="DOP853", rtol=1e-13, atol=1e-15
    ).y[:, -1]
    want = end[5] + 1j * end[7]  # d<1|psi>/da

    def part(a, which):
        h = detuning / 2 * SZ + a * hierax.Cos(1.1) * SX
        final = hierax.sesolve(
            h, KET, jnp.array([0.0, span]), rtol=1e-10, atol=1e-12
        ).final_state[1]
        return jnp.real(final) if which == "real" else jnp.imag(final)

    got = complex(
        jax.grad(lambda a: part(a, "real"))(amplitude),
        jax.grad(lambda a: part(a, "imag"))(amplitude),
    )
    assert abs(got - want) <= 1e-8 * max(1.0, abs(want))


def test_a_batch_in_lockstep_resolves_each_elements_functions():
    """256 amplitudes of a drive under `jax.vmap`, the first exactly 0: the
    lockstep's steps read every column's functions, and each element equals its
    solve alone, and DOP853."""
    span = 15.0
    amplitudes = jnp.linspace(0.0, 0.3, 256)
    times = jnp.array([0.0, span])

    def final(a):
        h = 0.2 * SZ + a * hierax.Cos(1.3) * SX
        return hierax.sesolve(h, KET, times, rtol=1e-10, atol=1e-12).final_state

    batch = jax.jit(jax.vmap(final))(amplitudes)
    for k in (0, 1, 100, 255):
        a = float(amplitudes[k])

        def rhs(t, y, a=a):
            psi = y[:2] + 1j * y[2:]
            d = -1j * ((0.2 * SZ + a * np.cos(1.3 * t) * SX) @ psi)
            return np.concatenate([d.real, d.imag])

        y = scipy.integrate.solve_ivp(
            rhs, (0.0, span), [1.0, 0, 0, 0], method="DOP853", rtol=1e-13, atol=1e-15
        ).y[:, -1]
        reference = y[:2] + 1j * y[2:]
        np.testing.assert_allclose(np.asarray(batch[k]), reference, atol=1e-9)
        np.testing.assert_allclose(
            np.asarray(batch[k]), np.asarray(final(a)), atol=1e-9
        )


def test_mesolve_gradient_at_amplitude_zero_against_the_sensitivity_equations():
    """A damped qubit's coherence after 20 units, differentiated with respect to
    a drive's amplitude at exactly 0 (before: -34.1 instead of 0.417), against
    DOP853 of the Lindblad equation and its derivative."""
    lowering = np.array([[0, 1], [0, 0]], complex)
    rho0 = np.diag([1.0, 0.0]).astype(complex)
    span, jump = 20.0, 0.1 * lowering

    def lindblad(h, r):
        number = jump.conj().T @ jump
        return (
            -1j * (h @ r - r @ h)
            + jump @ r @ jump.conj().T
            - 0.5 * (number @ r + r @ number)
        )

    def derivative(t, y):
        r = y[:4].reshape(2, 2) + 1j * y[4:8].reshape(2, 2)
        dr = y[8:12].reshape(2, 2) + 1j * y[12:].reshape(2, 2)
        v = np.cos(1.3 * t) * SX
        d = lindblad(0.2 * SZ, r)
        dd = lindblad(0.2 * SZ, dr) - 1j * (v @ r - r @ v)
        parts = (np.real(d), np.imag(d), np.real(dd), np.imag(dd))
        return np.concatenate([p.ravel() for p in parts])

    start = np.concatenate([np.real(rho0).ravel(), np.imag(rho0).ravel(), np.zeros(8)])
    end = scipy.integrate.solve_ivp(
        derivative, (0.0, span), start, method="DOP853", rtol=1e-13, atol=1e-15
    ).y[:, -1]

    def coherence(a):
        final = hierax.mesolve(
            0.2 * SZ + a * hierax.Cos(1.3) * SX,
            [jump],
            jnp.asarray(rho0),
            jnp.array([0.0, span]),
            rtol=1e-10,
            atol=1e-12,
        ).final_state
        return jnp.imag(final[0, 1])

    got = float(jax.grad(coherence)(0.0))
    assert abs(got - end[13]) <= 1e-8


def test_the_check_runs_where_a_value_of_the_equation_is_traced():
    """Concrete values cannot be differentiated, so a solve from Python skips the
    check (its compile), and one whose equation holds a traced value (`jax.jit`,
    `jax.grad`, `jax.vmap` over a parameter) runs it. At amplitude 0 the state
    stays |0> either way; only the steps differ."""

    def solve(a):
        solution = hierax.sesolve(
            a * hierax.Cos(1.3) * SX, KET, jnp.array([0.0, 20.0]), rtol=1e-10
        )
        return solution.final_state, solution.stats["num_steps"]

    eager_state, eager_steps = solve(0.0)
    closed_state, closed_steps = jax.jit(lambda: solve(0.0))()
    traced_state, traced_steps = jax.jit(solve)(0.0)
    for state in (eager_state, closed_state, traced_state):
        np.testing.assert_allclose(state, KET, atol=1e-15)
    assert int(eager_steps) == int(closed_steps) <= 2
    assert int(traced_steps) >= 5


def _gaussian(t):
    return jnp.exp(-(((t - 10.0) / 2.0) ** 2))


def _detuned_first_order(span):
    """d<1|psi(T)>/dp at p = 0 for H = 0.2 sz + p g(t) sx from |0>, g `_gaussian`:
    -i e^{0.2 i T} int_0^T e^{-0.4 i t} g(t) dt, by scipy's quad (second order in
    p at p = 1e-8)."""

    def weight(t):
        return np.exp(-0.4j * t) * np.exp(-(((t - 10.0) / 2.0) ** 2))

    integral = complex(
        scipy.integrate.quad(lambda t: weight(t).real, 0, span, epsabs=1e-14)[0],
        scipy.integrate.quad(lambda t: weight(t).imag, 0, span, epsabs=1e-14)[0],
    )
    return -1j * np.exp(0.2j * span) * integral


@pytest.mark.parametrize("p", [0.0, 1e-8])
@pytest.mark.parametrize("form", ["closure", "args", "callable operator"])
def test_a_callable_with_its_amplitude_inside_is_resolved(form, p):
    """`CallableTimeFunction(lambda t: p * g(t))`: the amplitude hides inside the
    callable, which at p = 0 is 0 (before: 1.9e11 for -3.02 at p = 0, 1e-3 off at
    p = 1e-8). The callable's derivative with respect to the traced values it
    reads is resolved instead (`CallableTangents`): against first-order
    perturbation theory, in reverse and forward mode."""
    span = 20.0

    def hamiltonian(p):
        if form == "closure":
            drive = hierax.CallableTimeFunction(lambda t: p * _gaussian(t))
        elif form == "args":
            drive = hierax.CallableTimeFunction(
                lambda t, args: args["p"] * _gaussian(t),
                takes_args=True,
                args={"p": 1.0},
            ).with_args({"p": p})
        else:
            return hierax.CallableOperator(lambda t: 0.2 * SZ + p * _gaussian(t) * SX)
        return 0.2 * SZ + drive * SX

    def amplitude(p, adjoint=None):
        final = hierax.sesolve(
            hamiltonian(p), KET, jnp.array([0.0, span]), rtol=1e-10, adjoint=adjoint
        ).final_state[1]
        return jnp.stack([jnp.real(final), jnp.imag(final)])

    expected = _detuned_first_order(span)
    want = np.array([expected.real, expected.imag])
    reverse = jax.jacrev(amplitude)(p)
    forward = jax.jacfwd(lambda a: amplitude(a, diffrax.ForwardMode()))(p)
    for got in (reverse, forward):
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-8)


def test_a_network_pulse_from_a_zero_last_layer_is_resolved():
    """A small network pulse whose last layer starts at 0 (a common
    initialisation): the pulse is 0, and the gradient with respect to each
    last-layer weight is the solve driven by that hidden unit's activation
    (before: off by up to 70, for gradients of size 1.8). Against first-order
    perturbation theory of each activation, by scipy's quad."""
    import equinox as eqx

    span = 20.0
    mlp = eqx.nn.MLP(1, "scalar", 6, 2, activation=jnp.tanh, key=jax.random.key(3))
    last = mlp.layers[-1]
    assert last.bias is not None
    mlp = eqx.tree_at(
        lambda m: (m.layers[-1].weight, m.layers[-1].bias),
        mlp,
        (jnp.zeros_like(last.weight), jnp.zeros_like(last.bias)),
    )

    def scaled(t):
        return jnp.reshape(4 * t / span - 2, (1,))

    def loss(m):
        pulse = hierax.CallableTimeFunction(lambda t: m(scaled(t)))
        final = hierax.sesolve(
            0.2 * SZ + pulse * SX, KET, jnp.array([0.0, span]), rtol=1e-10
        ).final_state[1]
        return jnp.imag(final)

    got = np.asarray(eqx.filter_grad(loss)(mlp).layers[-1].weight[0])
    hidden = jax.jit(
        lambda t: jnp.tanh(mlp.layers[1](jnp.tanh(mlp.layers[0](scaled(t)))))
    )
    want = []
    for j in range(6):

        def part(t, j=j):
            value = -1j * np.exp(0.2j * span - 0.4j * t) * float(hidden(t)[j])
            return value.imag

        want.append(scipy.integrate.quad(part, 0, span, epsabs=1e-13, limit=200)[0])
    np.testing.assert_allclose(got, np.array(want), atol=1e-8)


def test_a_callables_closure_counts_as_traced():
    """A value a callable reads from its closure is traced under `jax.jit` as a
    field is: the check runs there, and not from Python."""

    def solve(p):
        drive = hierax.CallableTimeFunction(lambda t: p * jnp.cos(1.3 * t))
        solution = hierax.sesolve(drive * SX, KET, jnp.array([0.0, 20.0]), rtol=1e-10)
        return solution.final_state, solution.stats["num_steps"]

    eager_state, eager_steps = solve(0.0)
    traced_state, traced_steps = jax.jit(solve)(0.0)
    for state in (eager_state, traced_state):
        np.testing.assert_allclose(state, KET, atol=1e-15)
    assert int(eager_steps) <= 2
    assert int(traced_steps) >= 5


def test_two_traced_values_that_cancel_in_the_callable_are_each_resolved():
    """`(p - q) * g` at p = q = 0: a derivative along equal directions of p and q
    would be 0 and resolve nothing; each gradient is still first-order
    perturbation theory (the closure's case above, with opposite signs)."""
    span = 20.0

    def part(p, q):
        drive = hierax.CallableTimeFunction(lambda t: (p - q) * _gaussian(t))
        final = hierax.sesolve(
            0.2 * SZ + drive * SX, KET, jnp.array([0.0, span]), rtol=1e-10
        ).final_state[1]
        return jnp.imag(final)

    want = _detuned_first_order(span).imag
    dp, dq = jax.grad(part, argnums=(0, 1))(0.0, 0.0)
    np.testing.assert_allclose([float(dp), float(dq)], [want, -want], atol=1e-8)


def test_a_derivative_the_transform_cannot_expand_falls_back(monkeypatch):
    """Where the program of a callable's derivative has a step the Taylor
    transform cannot expand, the check differentiates the callable's series
    instead: the same gradient (the transform made to refuse every derivative
    here)."""
    from hierax._solvers import _resolution

    expand = _resolution.callable_series

    def refusing(fn, *args, **kwargs):
        if ".derivative" in getattr(fn, "__qualname__", ""):
            raise NotImplementedError("no rule")
        return expand(fn, *args, **kwargs)

    def part(p):
        drive = hierax.CallableTimeFunction(lambda t: p * _gaussian(t))
        final = hierax.sesolve(
            0.2 * SZ + drive * SX, KET, jnp.array([0.0, 20.0]), rtol=1e-10
        ).final_state[1]
        return jnp.imag(final)

    direct = float(jax.grad(part)(0.0))
    monkeypatch.setattr(_resolution, "callable_series", refusing)
    fallen_back = float(jax.grad(part)(0.0))
    want = _detuned_first_order(20.0).imag
    np.testing.assert_allclose([direct, fallen_back], [want, want], atol=1e-8)


def test_a_callable_with_its_amplitude_inside_in_complex64():
    """The callable check in complex64 (float32 times): the gradient at p = 0
    against first-order perturbation theory, to float32's tolerance (before:
    1.6e5 for -3.02)."""

    def part(p):
        drive = hierax.CallableTimeFunction(lambda t: p * _gaussian(t))
        h = jnp.asarray(0.2 * SZ, jnp.complex64) + drive * jnp.asarray(
            SX, jnp.complex64
        )
        final = hierax.sesolve(
            h,
            jnp.asarray(KET, jnp.complex64),
            jnp.array([0.0, 20.0], jnp.float32),
            rtol=1e-6,
        ).final_state[1]
        return jnp.imag(final)

    got = jax.grad(part)(jnp.float32(0.0))
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(float(got), _detuned_first_order(20.0).imag, atol=1e-4)
