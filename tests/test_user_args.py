"""A user's diffrax `args` reach their callables (`takes_args=True`) through
`hierax.SchrodingerTerm` and `hierax.LindbladTerm`: solves against scipy's DOP853
for two values of a parameter held in `args` (one trace), gradients against a
central difference of DOP853 solves, direct calls against closed forms, and the
errors."""

from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import hierax

from .helpers import compile_count


# diffrax's warning on complex states concerns its own solvers' norms, not the
# Taylor solver's exact complex step.
pytestmark = pytest.mark.filterwarnings("ignore:Complex dtype support")

SX = np.array([[0, 1], [1, 0]], complex)
SZ = np.array([[1, 0], [0, -1]], complex)
SM = np.array([[0, 0], [1, 0]], complex)
GAMMA = 0.2
T1 = 2.0
KET = np.array([1.0, 0.0], complex)
RTOL = 1e-10


def _drive(t, a):
    return a["w"] * jnp.cos(t)


def _matrix(t, a):
    return _drive(t, a) * SX + SZ


def _h(t, w):
    """The Hamiltonian w cos(t) sx + sz, in NumPy (independent of hierax)."""
    return w * np.cos(t) * SX + SZ


def _time_function_hamiltonian():
    f = hierax.CallableTimeFunction(_drive, takes_args=True, args={"w": 1.0})
    return f * SX + SZ


def _operator_hamiltonian():
    return hierax.CallableOperator(_matrix, takes_args=True, args={"w": 1.0})


def _schrodinger_reference(w):
    out = solve_ivp(
        lambda t, y: -1j * _h(t, w) @ y,
        (0.0, T1),
        KET,
        method="DOP853",
        rtol=1e-13,
        atol=1e-14,
    )
    return out.y[:, -1]


def _lindblad_reference(w):
    def rhs(t, y):
        rho = y.reshape(2, 2)
        h = _h(t, w)
        jump = np.sqrt(GAMMA) * SM
        n = jump.conj().T @ jump
        out = -1j * (h @ rho - rho @ h) + jump @ rho @ jump.conj().T
        return (out - 0.5 * (n @ rho + rho @ n)).reshape(-1)

    rho0 = np.outer(KET, KET.conj())
    out = solve_ivp(
        rhs, (0.0, T1), rho0.reshape(-1), method="DOP853", rtol=1e-13, atol=1e-14
    )
    return out.y[:, -1].reshape(2, 2)


def _solver(term, y0):
    """A user's solve: `diffrax.diffeqsolve` with the term and `args={"w": w}`,
    compiled once (a second trace fails)."""

    @jax.jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def solve(w):
        solution = diffrax.diffeqsolve(
            term,
            hierax.TaylorSolver(16),
            0.0,
            T1,
            0.1,
            jnp.asarray(y0),
            args={"w": w},
            stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=1e-12),
        )
        return solution.ys[-1]  # pyright: ignore[reportOptionalSubscript]

    return solve


@pytest.mark.parametrize(
    "hamiltonian",
    [_time_function_hamiltonian, _operator_hamiltonian],
    ids=["CallableTimeFunction", "CallableOperator"],
)
def test_schrodinger_args_reach_the_callable(hamiltonian):
    solve = _solver(hierax.SchrodingerTerm(hamiltonian()), KET)
    for w in (0.7, 1.6):
        error = np.max(np.abs(np.asarray(solve(w)) - _schrodinger_reference(w)))
        assert error < 1e-8, (w, error)


def test_lindblad_args_reach_the_callable():
    term = hierax.LindbladTerm(_time_function_hamiltonian(), [np.sqrt(GAMMA) * SM])
    solve = _solver(term, np.outer(KET, KET.conj()))
    for w in (0.7, 1.6):
        error = np.max(np.abs(np.asarray(solve(w)) - _lindblad_reference(w)))
        assert error < 1e-8, (w, error)


def test_lindblad_jump_operator_args():
    # A callable jump operator reads the args too: L = sqrt(gamma) w sm.
    jump = hierax.CallableOperator(
        lambda t, a: a["w"] * np.sqrt(GAMMA) * SM, takes_args=True, args={"w": 1.0}
    )
    term = hierax.LindbladTerm(SZ, [jump])
    rho0 = np.full((2, 2), 0.5, complex)
    y = diffrax.diffeqsolve(
        term,
        hierax.TaylorSolver(16),
        0.0,
        T1,
        0.1,
        jnp.asarray(rho0),
        args={"w": 2.0},
        stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=1e-12),
    ).ys
    # Decay from |0> to |1> at rate gamma w^2, and the coherence's closed form.
    rate = GAMMA * 2.0**2
    p0 = 0.5 * np.exp(-rate * T1)
    coherence = 0.5 * np.exp(-rate * T1 / 2) * np.exp(-2j * T1)
    expected = np.array([[p0, coherence], [np.conj(coherence), 1 - p0]])
    assert np.max(np.abs(np.asarray(y)[-1] - expected)) < 1e-8


def test_gradient_through_args():
    solve = _solver(hierax.SchrodingerTerm(_time_function_hamiltonian()), KET)

    def population(w):
        return jnp.abs(solve(w)[1]) ** 2

    w, h = 1.1, 1e-4
    grad = float(jax.grad(population)(jnp.asarray(w)))

    def reference(w):
        return np.abs(_schrodinger_reference(w)[1]) ** 2

    difference = (reference(w + h) - reference(w - h)) / (2 * h)
    assert abs(grad - difference) < 1e-7, (grad, difference)


@pytest.mark.parametrize(
    "hamiltonian",
    [_time_function_hamiltonian, _operator_hamiltonian],
    ids=["CallableTimeFunction", "CallableOperator"],
)
def test_vector_field_reads_args(hamiltonian):
    term = hierax.SchrodingerTerm(hamiltonian())
    t, w = 0.4, 1.7
    y = jnp.asarray([0.6, 0.8j])
    expected = -1j * _h(t, w) @ np.asarray(y)
    out = term.vf(jnp.asarray(t), y, {"w": jnp.asarray(w)})
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-14, atol=1e-14)


def test_direct_calls_use_their_own_args():
    w, t = 1.3, 0.5
    f = hierax.CallableTimeFunction(_drive, takes_args=True, args={"w": 1.0})
    f = f.with_args({"w": jnp.asarray(w)})
    np.testing.assert_allclose(float(f(t)), w * np.cos(t), rtol=1e-15)
    # The series in t, args held fixed: w cos(t + s), coefficient j w cos^(j)(t)/j!.
    expected = w * np.array([np.cos(t), -np.sin(t), -np.cos(t) / 2, np.sin(t) / 6])
    np.testing.assert_allclose(np.asarray(f.taylor(t, 3)), expected, rtol=1e-14)
    op = hierax.CallableOperator(_matrix, takes_args=True, args={"w": w})
    np.testing.assert_allclose(np.asarray(op(t)), _h(t, w), rtol=1e-15)
    coefficients = op.taylor(t, 3)
    np.testing.assert_allclose(
        np.asarray(coefficients[1:]), expected[1:, None, None] * SX, atol=1e-15
    )


def test_new_args_never_recompile_a_direct_call():
    f = hierax.CallableTimeFunction(_drive, takes_args=True, args={"w": 1.0})
    op = hierax.CallableOperator(_matrix, takes_args=True, args={"w": 1.0})

    def calls(w):
        args = {"w": jnp.asarray(w)}
        g, o = f.with_args(args), op.with_args(args)
        return [
            np.asarray(x) for x in (g(0.3), g.taylor(0.3, 3), o(0.3), o.taylor(0.3, 3))
        ]

    calls(1.0)
    before = compile_count()
    for w in (2.0, 3.0):
        value, series, matrix, _ = calls(w)
        np.testing.assert_allclose(value, w * np.cos(0.3), rtol=1e-15)
        np.testing.assert_allclose(series[1], -w * np.sin(0.3), rtol=1e-14)
        np.testing.assert_allclose(matrix, _h(0.3, w), rtol=1e-15)
    assert compile_count() == before


@pytest.mark.parametrize("kind", ["python", "numpy"])
def test_new_float_args_never_recompile_a_solve(kind):
    """`with_args({"w": 2.0})`, as the docs write it: a Python (or NumPy) float
    is held as a JAX array (a Python float in a module's field is static, and each
    new one compiled the solve again)."""
    f = hierax.CallableTimeFunction(_drive, takes_args=True, args={"w": 1.0})
    op = hierax.CallableOperator(_matrix, takes_args=True, args={"w": 1.0})
    value = float if kind == "python" else np.float64

    def final(w):
        h = 0.5 * SZ + f.with_args({"w": value(w)}) * SX
        h = h + op.with_args({"w": value(w)})
        return np.asarray(hierax.sesolve(h, KET, [0.0, 1.0]).final_state)

    final(1.0)
    before = compile_count()
    states = [final(w) for w in (2.0, 3.0)]
    assert compile_count() == before
    assert not np.allclose(states[0], states[1])


def test_without_args_nothing_changes():
    plain = hierax.CallableTimeFunction(lambda t: 1.3 * jnp.cos(t))
    assert plain.takes_args is False and plain.args is None
    term = hierax.SchrodingerTerm(plain * SX + SZ)

    def solve(args):
        return diffrax.diffeqsolve(
            term,
            hierax.TaylorSolver(16),
            0.0,
            T1,
            0.1,
            jnp.asarray(KET),
            args=args,
            stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=1e-12),
        ).ys

    # A callable without `takes_args` never sees diffrax's args.
    np.testing.assert_array_equal(
        np.asarray(solve(None)), np.asarray(solve({"w": jnp.asarray(5.0)}))
    )
    np.testing.assert_allclose(
        np.asarray(solve(None))[-1], _schrodinger_reference(1.3), atol=1e-8
    )
    # `args=None` leaves a callable that takes them with its own.
    own = hierax.SchrodingerTerm(_time_function_hamiltonian())
    y = jnp.asarray(KET)
    np.testing.assert_array_equal(
        np.asarray(own.vf(0.3, y, None)), np.asarray(own.vf(0.3, y, {"w": 1.0}))
    )


def test_errors():
    with pytest.raises(ValueError, match=r"CallableTimeFunction\(takes_args=True\)"):
        hierax.CallableTimeFunction(_drive, takes_args=True)
    with pytest.raises(ValueError, match=r"CallableOperator\(takes_args=True\).*args"):
        hierax.CallableOperator(_matrix, takes_args=True)
    with pytest.raises(ValueError, match="`args=` is only read"):
        hierax.CallableTimeFunction(lambda t: jnp.cos(t), args={"w": 1.0})
    with pytest.raises(TypeError, match="takes_args"):
        not_a_bool: Any = 1
        hierax.CallableOperator(_matrix, takes_args=not_a_bool, args={"w": 1.0})
    with pytest.raises(TypeError, match="CallableTimeFunction.with_args"):
        hierax.CallableTimeFunction(lambda t: jnp.cos(t)).with_args({"w": 1.0})
    # The example args check `fn` as ever: a wrong output shape is named.
    with pytest.raises(ValueError, match="must return a scalar"):
        hierax.CallableTimeFunction(
            lambda t, a: a["w"] * jnp.ones(2), takes_args=True, args={"w": 1.0}
        )
    # Evaluated with no args available.
    f = hierax.CallableTimeFunction(_drive, takes_args=True, args={"w": 1.0})
    with pytest.raises(ValueError, match=r"takes `args`.*none are set"):
        f.with_args(None)(0.3)
    op = hierax.CallableOperator(_matrix, takes_args=True, args={"w": 1.0})
    with pytest.raises(ValueError, match=r"CallableOperator.*none are set"):
        op.with_args(None).taylor(0.3, 2)
