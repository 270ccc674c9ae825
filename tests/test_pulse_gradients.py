"""Gradients through piecewise-constant pulses, whose terms the kernels apply as
constants over each step (`has_constant_series`): the values and the gradients
with respect to every sample, in reverse mode (the adjoint recursion), forward
mode and `DirectAdjoint`, against the exact product of each segment's
`scipy.linalg.expm` and the derivative of each factor by `expm_frechet`."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.linalg

import hierax


SX = np.array([[0, 1], [1, 0]], complex)
SZ = np.diag([1.0, -1.0]).astype(complex)
EDGES = np.array([0.0, 0.6, 1.1, 2.0, 2.4, 3.3])


def _transmon():
    a = np.diag(np.sqrt([1.0, 2.0]), 1).astype(complex)
    number = np.diag([0.0, 1.0, 2.0]).astype(complex)
    drift = 0.1 * number - 1.0 * number @ (number - np.eye(3))
    return drift, [(a + a.conj().T) / 2, 1j * (a.conj().T - a) / 2]


def _exact(drift, drives, samples, start, target):
    """The overlap <target|psi(T)> and its gradient with respect to every sample
    (real samples: d/dx of the complex overlap), exactly."""
    factors, derivatives = [], []
    for k in range(len(EDGES) - 1):
        span = EDGES[k + 1] - EDGES[k]
        h = drift + sum(s[k] * d for s, d in zip(samples, drives))
        generator = -1j * span * h
        factors.append(scipy.linalg.expm(generator))
        derivatives.append(
            [scipy.linalg.expm_frechet(generator, -1j * span * d)[1] for d in drives]
        )
    state = start
    for f in factors:
        state = f @ state
    overlap = target.conj() @ state
    gradient = np.zeros(np.shape(samples), complex)
    for k in range(len(factors)):
        before = start
        for f in factors[:k]:
            before = f @ before
        for q, derivative in enumerate(derivatives[k]):
            after = derivative @ before
            for f in factors[k + 1 :]:
                after = f @ after
            gradient[q, k] = target.conj() @ after
    return overlap, gradient


CASES = {
    "qubit": (0.2 * SZ, [SX / 2], np.array([[0.9, 1.4, -0.3, 0.7, 1.1]])),
    "transmon, two quadratures": (
        *_transmon(),
        np.array([[0.8, 1.3, 0.2, -0.6, 1.0], [0.1, -0.2, 0.05, 0.3, -0.1]]),
    ),
}


@pytest.mark.parametrize(
    "case, adjoint",
    [
        ("qubit", "default"),
        ("transmon, two quadratures", "default"),
        ("qubit", "forward"),
        ("transmon, two quadratures", "direct"),
    ],
)
def test_gradients_through_piecewise_constant_pulses_are_exact(case, adjoint):
    drift, drives, samples = CASES[case]
    n = drift.shape[0]
    start, target = np.eye(n, dtype=complex)[0], np.eye(n, dtype=complex)[1]
    overlap, gradient = _exact(drift, drives, samples, start, target)
    chosen = {
        "default": None,
        "direct": diffrax.DirectAdjoint(),
        "forward": diffrax.ForwardMode(),
    }[adjoint]

    def parts(x):
        """The overlap's real and imaginary parts."""
        h = hierax.TimeOperator(
            [1.0] + [hierax.PiecewiseConstant(EDGES, row) for row in x],
            [drift, *drives],
        )
        final = hierax.sesolve(
            h,
            start,
            jnp.array([0.0, EDGES[-1]]),
            rtol=1e-12,
            atol=1e-14,
            adjoint=chosen,
        ).final_state
        value = jnp.vdot(jnp.asarray(target), final)
        return jnp.stack([jnp.real(value), jnp.imag(value)])

    x = jnp.asarray(samples)
    differentiate = jax.jacfwd if adjoint == "forward" else jax.jacrev
    values, jacobian = jax.jit(lambda x: (parts(x), differentiate(parts)(x)))(x)
    want = np.array([np.real(overlap), np.imag(overlap)])
    np.testing.assert_allclose(np.asarray(values), want, atol=1e-11)
    np.testing.assert_allclose(
        np.asarray(jacobian),
        np.stack([np.real(gradient), np.imag(gradient)]),
        atol=1e-10,
    )


@pytest.mark.parametrize("adjoint", ["default", "forward"])
def test_fixed_steps_stop_at_the_edges_of_a_pulse(adjoint):
    """With a fixed `dt`, steps stop at the edges of a piecewise-constant pulse as
    adaptive ones do: a step across an edge summed the series of the segment it
    started in, silently (the overlap off by 4e-2 at `dt` = 0.25, edges off the
    grid of steps), and the gradient with respect to the edges read 0 (a jump
    inside a step moves nothing). Against the product of each segment's exact
    propagator, and d psi / d e_k = U(T, e_k) i (H_{k+1} - H_k) psi(e_k)."""
    drift, samples = 0.2 * SZ, np.array([0.9, 1.4, -0.3, 0.7, 1.1])
    start, target = np.array([1.0, 0.0], complex), np.array([0.0, 1.0], complex)
    steps = [drift + x * SX / 2 for x in samples]
    factors = [
        scipy.linalg.expm(-1j * h * span) for h, span in zip(steps, np.diff(EDGES))
    ]
    states = [start]
    for f in factors:
        states.append(f @ states[-1])
    want = [target.conj() @ states[-1]]
    for k in range(1, len(EDGES) - 1):  # the inner edges
        moved = 1j * (steps[k] - steps[k - 1]) @ states[k]
        for f in factors[k:]:
            moved = f @ moved
        want.append(target.conj() @ moved)
    want = np.array(want)
    chosen = diffrax.ForwardMode() if adjoint == "forward" else None

    def overlap(inner):
        edges = jnp.concatenate([EDGES[:1], inner, EDGES[-1:]])
        h = drift + hierax.PiecewiseConstant(edges, samples) * (SX / 2)
        final = hierax.sesolve(
            h, start, jnp.array([0.0, EDGES[-1]]), dt=0.25, adjoint=chosen
        ).final_state
        value = jnp.vdot(jnp.asarray(target), final)
        return jnp.stack([jnp.real(value), jnp.imag(value)])

    differentiate = jax.jacfwd if adjoint == "forward" else jax.jacrev
    inner = jnp.asarray(EDGES[1:-1])
    value, jacobian = jax.jit(lambda x: (overlap(x), differentiate(overlap)(x)))(inner)
    got = np.concatenate([[value[0] + 1j * value[1]], jacobian[0] + 1j * jacobian[1]])
    np.testing.assert_allclose(got, want, atol=1e-10)


def test_a_piecewise_constant_pulse_times_a_cosine_is_not_a_constant_term():
    """A product with a time-dependent factor keeps its Cauchy product (its series
    is not constant), and a sum of pulses is one: both against DOP853."""
    pulse = hierax.PiecewiseConstant(EDGES, np.array([0.9, 1.4, -0.3, 0.7, 1.1]))
    other = hierax.PiecewiseConstant(EDGES, np.array([0.2, -0.5, 0.4, 0.0, 0.3]))
    assert pulse.has_constant_series and not pulse.is_constant
    assert (pulse + other).has_constant_series
    assert not (pulse * hierax.Cos(2.0)).has_constant_series
    h = 0.2 * SZ + (pulse * hierax.Cos(2.0) + other) * SX

    def matrix(t):
        k = np.searchsorted(EDGES, t, side="right") - 1
        k = min(max(k, 0), len(EDGES) - 2)
        values = ([0.9, 1.4, -0.3, 0.7, 1.1][k], [0.2, -0.5, 0.4, 0.0, 0.3][k])
        return 0.2 * SZ + (values[0] * np.cos(2.0 * t) + values[1]) * SX

    state = np.array([1.0, 0.0], complex)
    for a, b in zip(EDGES[:-1], EDGES[1:]):
        solved = scipy.integrate.solve_ivp(
            lambda t, y, b=b: -1j * matrix(min(t, b - 1e-15)) @ y,
            (a, b),
            state,
            method="DOP853",
            rtol=1e-13,
            atol=1e-14,
        )
        state = solved.y[:, -1]
    ours = hierax.sesolve(
        h, np.array([1.0, 0.0]), np.array([0.0, EDGES[-1]]), rtol=1e-12, atol=1e-14
    ).final_state
    np.testing.assert_allclose(np.asarray(ours), state, atol=1e-10)


def test_hierarchies_take_a_piecewise_constant_pulse_as_its_local_constant():
    """Within a segment a pulse's series is its value: the Heisenberg and
    propagator hierarchies at t equal those of the segment's `Constant`."""
    sy = np.array([[0, -1j], [1j, 0]])
    t, value = 1.5, -0.3  # in the third segment, [1.1, 2.0)
    pulse = hierax.PiecewiseConstant(EDGES, np.array([0.9, 1.4, -0.3, 0.7, 1.1]))

    def hamiltonian(f):
        return 0.4 * SZ + f * sy + hierax.Cos(1.3) * SX

    for make in (
        lambda h: hierax.HeisenbergHierarchy(h, SX, order=8)(t),
        lambda h: hierax.PropagatorDerivatives(h, order=8)(t, np.eye(2, dtype=complex)),
    ):
        ours = make(hamiltonian(pulse))
        np.testing.assert_array_equal(ours, make(hamiltonian(hierax.Constant(value))))
