"""`throw=False`: a solve returns its first failed check in `Solution.failure`
instead of raising it, with the states nan where it failed, and its program holds
no host callback (on an accelerator any callback costs a call about 2 ms)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hierax


DRIFT = np.diag([0.0, 1.0, 2.5]).astype(complex)
KICK = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], complex)
PSI = jnp.array([1.0, 0.0, 0.0], complex)
TIMES = jnp.array([0.0, 0.5, 1.0])
# Each bad value and what it breaks (`max_steps` = 3 throughout).
BAD = {
    "state": (PSI.at[0].set(jnp.nan), TIMES, 1e-8),
    "decreasing times": (PSI, jnp.array([0.0, 1.0, 0.5]), 1e-8),
    "infinite time": (PSI, jnp.array([0.0, 0.5, jnp.inf]), 1e-8),
    "rtol": (PSI, TIMES, -1.0),
    "max_steps": (PSI, jnp.array([0.0, 15.0, 30.0]), 1e-8),
}


def _hamiltonian():
    """A structure of its own (3 levels, a `Sin` drive: `test_host_checks.py`
    counts the callbacks its `Cos`-driven qutrit traces), so that the programs
    here are traced afresh."""
    return hierax.TimeOperator([hierax.Constant(1.0), hierax.Sin(1.3)], [DRIFT, KICK])


def _solve(throw: bool):
    h = _hamiltonian()
    return lambda y, t, r: hierax.sesolve(
        h, y, t, rtol=r, max_steps=3, throw=throw, exp_ops=[DRIFT]
    )


def _raised(call) -> str:
    with pytest.raises(ValueError) as info:
        jax.block_until_ready(call())
    return str(info.value)


def test_each_failure_is_returned_with_the_message_it_raises():
    """Inside a `jax.jit`, each failed check (the state, the times, a tolerance,
    `max_steps`) comes back as the `Failure` whose message is the `ValueError`
    that `throw=True` raises from Python, with the states, final state and
    expectation values nan; `Failure.throw()` raises it. A solve that passes
    every check gives exactly the states of `throw=True`, and code -1."""
    returned = jax.jit(_solve(False))
    raising = _solve(True)
    for name, (y, t, r) in BAD.items():
        message = _raised(lambda y=y, t=t, r=r: raising(y, t, jnp.asarray(r)))
        solution = returned(y, t, jnp.asarray(r))
        failure = solution.failure
        assert not bool(failure.succeeded), name
        assert failure.messages[int(failure.code)] == message, name
        assert bool(jnp.all(jnp.isnan(solution.states))), name
        assert bool(jnp.all(jnp.isnan(solution.final_state))), name
        assert bool(jnp.all(jnp.isnan(solution.expects))), name
        assert _raised(failure.throw) == message, name
    good = returned(PSI, TIMES, jnp.asarray(1e-8))
    assert int(good.failure.code) == -1 and bool(good.failure.succeeded)
    good.failure.throw()  # raises nothing
    reference = raising(PSI, TIMES, jnp.asarray(1e-8))
    assert reference.failure is None
    np.testing.assert_array_equal(good.states, reference.states)
    np.testing.assert_array_equal(good.expects, reference.expects)


def test_a_fixed_step_far_too_long_is_returned_too():
    """The fixed step's own check (its series does not converge) stops the steps
    and is returned as well; from Python with `throw=True` it raises the same
    message."""
    state, times = np.array([1.0, 0.0, 0.0]), np.array([0.0, 10.0])
    message = _raised(lambda: hierax.sesolve(_hamiltonian(), state, times, dt=10.0))
    assert "fixed step `dt` is far too long" in message
    solution = hierax.sesolve(_hamiltonian(), state, times, dt=10.0, throw=False)
    assert solution.failure.messages[int(solution.failure.code)] == message
    assert bool(jnp.all(jnp.isnan(solution.final_state)))


def test_mesolve_returns_its_failures_too():
    """`mesolve` with `throw=False`: out of `max_steps`, and a nan in the density
    matrix, each returned with the message `throw=True` raises; a solve that
    passes gives `throw=True`'s states exactly."""
    h, jumps = _hamiltonian(), [0.3 * np.diag([1.0, 0.0, 0.0])]
    rho = jnp.diag(jnp.array([0.5, 0.5, 0.0], complex))
    long_times = jnp.array([0.0, 30.0])

    def solve(r, t, throw):
        return hierax.mesolve(h, jumps, r, t, max_steps=3, throw=throw)

    returned = jax.jit(lambda r, t: solve(r, t, False))
    for r, t in ((rho, long_times), (rho.at[0, 0].set(jnp.nan), TIMES[:2])):
        message = _raised(lambda r=r, t=t: solve(r, t, True).states)
        solution = returned(r, t)
        assert solution.failure.messages[int(solution.failure.code)] == message
        assert bool(jnp.all(jnp.isnan(solution.final_state)))
    good = returned(rho, TIMES[:2])
    assert bool(good.failure.succeeded)
    np.testing.assert_array_equal(good.states, solve(rho, TIMES[:2], True).states)


def _callbacks_in(call, *args) -> int:
    """How many host callbacks the program of `jax.jit(call)(*args)` holds (equinox
    raises through `jax.pure_callback`, a custom call named for it)."""
    return jax.jit(call).lower(*args).as_text().count("callback")


def test_programs_with_throw_false_hold_no_callback():
    """Inside a user's `jax.jit`, under `jax.vmap` (a lockstep batch) and with a
    fixed step, `sesolve` and `mesolve` with `throw=False` hold no host callback;
    with `throw=True` they do (so the count can fail). (Two times: with more,
    diffrax's own checks of the save times are callbacks too.)"""
    h, ends = _hamiltonian(), jnp.array([0.0, 1.0])
    rho = jnp.diag(jnp.array([1.0, 0.0, 0.0], complex))
    jumps = [0.3 * np.diag([1.0, 0.0, 0.0])]

    def counts(throw: bool) -> list[int]:
        return [
            _callbacks_in(
                lambda y: hierax.sesolve(h, y, ends, throw=throw).states, PSI
            ),
            _callbacks_in(
                jax.vmap(lambda y: hierax.sesolve(h, y, ends, throw=throw).states),
                jnp.stack([PSI, PSI[::-1]]),
            ),
            _callbacks_in(
                lambda y: hierax.sesolve(h, y, ends, dt=0.25, throw=throw).states, PSI
            ),
            _callbacks_in(
                lambda r: hierax.mesolve(h, jumps, r, ends, throw=throw).states, rho
            ),
        ]

    assert counts(False) == [0, 0, 0, 0]
    assert min(counts(True)) > 0


def test_a_batch_reports_each_element():
    """Under `jax.vmap` over states (stepped in lockstep) each element has its own
    code: the finite ones succeed with the states of `throw=True`, the one with a
    nan fails alone."""
    solve = _solve(False)
    states = jnp.stack([PSI, PSI.at[1].set(jnp.nan), PSI[::-1]])
    batch = jax.vmap(lambda y: solve(y, TIMES, jnp.asarray(1e-8)))(states)
    assert batch.failure.code.tolist() == [-1, 4, -1]
    assert batch.failure.messages[4].endswith("`state` must be finite (no nan or inf).")
    assert bool(jnp.all(jnp.isnan(batch.states[1])))
    good = jnp.stack([PSI, PSI[::-1]])
    reference = jax.vmap(lambda y: _solve(True)(y, TIMES, jnp.asarray(1e-8)))(good)
    np.testing.assert_allclose(batch.states[::2], reference.states, atol=1e-9)
    with pytest.raises(ValueError, match="`state` must be finite"):
        batch.failure.throw()


def test_gradients_and_retraces_are_those_of_throw_true():
    """A gradient through a solve with `throw=False` is that of `throw=True`, and
    new values of the state, the times and the tolerance never retrace."""
    h = _hamiltonian()
    traces = []

    def population(y, rtol, throw):
        traces.append(throw)
        solution = hierax.sesolve(h, y, TIMES, rtol=rtol, throw=throw)
        return jnp.abs(solution.final_state[1]) ** 2

    grad = jax.jit(jax.grad(population), static_argnums=2)
    ours = grad(PSI, jnp.asarray(1e-9), False)
    np.testing.assert_allclose(ours, grad(PSI, jnp.asarray(1e-9), True), atol=1e-12)
    count = len(traces)
    grad(PSI[::-1], jnp.asarray(1e-7), False)
    assert len(traces) == count


def test_throw_is_a_bool():
    """`throw` must be a bool, named in the error (`floquet`'s: `test_floquet`)."""
    with pytest.raises(
        TypeError, match=r"hierax.TaylorOptions`: `throw` must be a bool"
    ):
        hierax.TaylorOptions(throw="no")
    with pytest.raises(TypeError, match=r"`hierax.sesolve`: `throw` must be bool"):
        hierax.sesolve(_hamiltonian(), PSI, TIMES, throw=0)
