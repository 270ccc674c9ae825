"""Compiled once: new times and new parameter values reuse the compiled call.

The user's callable inside the Hamiltonian is wrapped in
`eqx.debug.assert_max_traces`, which counts how often it runs and raises once it runs
more often than allowed. JAX runs Python code only while tracing, so once the first
call has compiled, calls at other times and with other parameter values (array
leaves) must not run it again; without compilation every call would. (A test that
counts the traces of a user's own `jax.jit` around the call could not tell: that jit
alone traces once.)
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import hierax

from .helpers import SIGMA_X, SIGMA_Y, SIGMA_Z, compile_count


def _envelope(t):
    return jnp.exp(-(t**2))


def _hierarchy_call(envelope, hierarchy: str) -> Callable[[Any, Any], Any]:
    def call(frequency, t):
        hamiltonian = envelope * SIGMA_Y + hierax.Cos(frequency) * SIGMA_X
        if hierarchy == "heisenberg":
            return hierax.HeisenbergHierarchy(hamiltonian, SIGMA_X, 6)(t)
        return hierax.PropagatorDerivatives(hamiltonian, 6)(t, jnp.eye(2))

    return call


@pytest.mark.parametrize("hierarchy", ["heisenberg", "propagator"])
def test_assert_max_traces_guard(hierarchy):
    """The user's callable, wrapped in `eqx.debug.assert_max_traces`, raises as soon
    as it runs more often than one compilation runs it: never at new times and
    parameter values, and at once for a new dtype (a new program, to JAX)."""
    # How often one compilation runs it (hierax traces a callable more than once:
    # on construction, and for the series and the time scale): counted on a first
    # hierarchy, whose guard allows any number.
    counted = eqx.debug.assert_max_traces(_envelope, max_traces=None)
    _hierarchy_call(hierax.CallableTimeFunction(counted), hierarchy)(
        jnp.asarray(1.0), 0.5
    )
    per_compilation = eqx.debug.get_num_traces(counted)
    assert per_compilation >= 1

    guarded = eqx.debug.assert_max_traces(_envelope, max_traces=per_compilation)
    call = _hierarchy_call(hierax.CallableTimeFunction(guarded), hierarchy)
    first = call(jnp.asarray(1.0), 0.5)
    assert eqx.debug.get_num_traces(guarded) == per_compilation
    for frequency, t in [(1.5, 0.7), (2.0, 0.1), (0.5, -1.0)]:
        call(jnp.asarray(frequency), t)  # raises if it retraced
    assert eqx.debug.get_num_traces(guarded) == per_compilation
    # The reused program computes with the new values, not the first ones.
    assert not np.allclose(call(jnp.asarray(2.0), 0.5), first)
    # The guard does fire: a float32 frequency is a new program.
    with pytest.raises(RuntimeError, match="can only be traced"):
        call(jnp.asarray(1.0, jnp.float32), 0.5)


def test_solves_with_new_values_compile_nothing():
    """`sesolve` and `mesolve` check the values of JAX-array inputs inside their
    compiled program and those of NumPy inputs before it: either way, new times,
    states, tolerances, a new fixed step and new parameter values (a drive's
    frequency, a decay rate) compile nothing once each kind of input has run."""
    lowering = np.array([[0.0, 1.0], [0.0, 0.0]])

    def solve(frequency, rate, state, rho, times, rtol, dt):
        hamiltonian = hierax.Cos(frequency) * SIGMA_X + 0.5 * SIGMA_Z
        jumps = [hierax.Constant(rate) * lowering]
        return (
            hierax.sesolve(hamiltonian, state, times, rtol=rtol).final_state,
            hierax.sesolve(hamiltonian, state, times, dt=dt).final_state,
            hierax.mesolve(hamiltonian, jumps, rho, times, atol=rtol).final_state,
        )

    def values(k, on_device):
        put = jnp.asarray if on_device else np.asarray
        return (
            jnp.asarray(1.0 + 0.1 * k),
            jnp.asarray(0.3 + 0.1 * k),
            put(np.array([1.0, 0.0]) * np.exp(0.2j * k)),
            put(np.diag([0.1 * k, 1.0 - 0.1 * k]).astype(complex)),
            put(np.array([0.0, 0.5, 1.0 + 0.1 * k])),
            jnp.asarray(10.0 ** -(6 + k)) if on_device else 10.0 ** -(6 + k),
            0.1 + 0.01 * k,
        )

    for on_device in (False, True):
        first = solve(*values(0, on_device))
        before = compile_count()
        for k in (1, 2):
            again = solve(*values(k, on_device))
            assert not np.allclose(again[2], first[2])
        assert compile_count() == before, on_device


def test_int_parameters_are_the_floats_they_equal():
    """An int given for a time function's float parameter is the Python float it
    equals, weakly typed as that float is: `Cos(4)` after `Cos(4.0)` compiles
    nothing (it was a strong float array, a new type to `jax.jit`), for every
    constructor and for a number in the arithmetic (`2 * f`, `f + 1`)."""
    state = np.array([1.0, 0.0], complex)

    def solve(a, b, c):
        drive = (
            hierax.Cos(a, b, c)
            + hierax.Sin(a, b, c)
            + hierax.Exp(-b, c)
            + hierax.Gaussian(b, a, c)
            + hierax.Constant(c)
            + hierax.Polynomial([c, b])  # pyright: ignore
            + hierax.PiecewiseConstant([0, a], [c])
            + hierax.PiecewiseLinear([0, a], [b, c])
            + hierax.CubicSpline([0, 1, a], [b, c, b])
        )
        hamiltonian = (c * drive + b) * SIGMA_X + a * np.asarray(SIGMA_Z)
        return hierax.sesolve(hamiltonian, state, [0.0, 0.5]).final_state

    first = solve(4.0, 1.0, 2.0)
    before = compile_count()
    for a, b, c in [(4, 1, 2), (5, 2, 3), (5.0, 2, 3.0)]:
        out = solve(a, b, c)
        assert compile_count() == before, (a, b, c)
        np.testing.assert_array_equal(out, solve(float(a), float(b), float(c)))
    np.testing.assert_array_equal(solve(4, 1, 2), first)
