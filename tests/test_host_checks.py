"""Checks read on the host: where the backend chooses it (a TPU), a call from Python
returns its first failed check beside its result and raises on the host, and its
program holds no host callback (`hierax._core._checks`). Forced here on the CPU."""

import os
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hierax
from hierax._core import _choices, module_jit, raise_if


SX = np.array([[0, 1], [1, 0]], complex)
SZ = np.array([[1, 0], [0, -1]], complex)
SZ3 = np.diag([1.0, 0.0, -1.0]).astype(complex)
SX3 = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], complex)


def _qutrit():
    """A structure of its own (3 levels), so that each mode traces afresh."""
    drift = np.diag([0.0, 1.0, 2.5]).astype(complex)
    kick = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], complex)
    return hierax.TimeOperator([hierax.Constant(1.0), hierax.Cos(1.3)], [drift, kick])


@pytest.fixture
def host_checks(monkeypatch):
    """The CPU with `host_checks` chosen."""
    monkeypatch.setitem(
        _choices._BY_PLATFORM, "cpu", _choices.CPU._replace(host_checks=True)
    )


def _callbacks_traced(monkeypatch, call) -> int:
    """How many host callbacks `call` traces into its programs."""
    count = []
    original = jax.pure_callback

    def spy(*args, **kwargs):
        count.append(1)
        return original(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(jax, "pure_callback", spy)
        jax.block_until_ready(call())
    return len(count)


def test_failed_checks_raise_from_the_host_with_the_same_messages(host_checks):
    """Each check of a solve's values and of a hierarchy's time raises the
    `ValueError` the callbacks raise, naming the argument; the values that failed
    never reach the steps (decreasing times would trip diffrax's own check of
    them first, and a negative tolerance would step until `max_steps`)."""
    h, psi = _qutrit(), jnp.array([1.0, 0.0, 0.0], complex)
    times = jnp.array([0.0, 1.0])
    for kwargs, match in (
        (dict(y=jnp.array([jnp.nan, 0, 0], complex)), "`state` must be finite"),
        (dict(t=jnp.array([0.0, 2.0, 1.0])), "`times` must be strictly increasing"),
        (dict(t=jnp.array([0.0, jnp.inf])), "`times` must be finite"),
        (dict(rtol=jnp.asarray(-1e-6)), "`rtol` must be positive and finite"),
        (
            dict(max_steps=2, t=jnp.array([0.0, 30.0])),
            r"hierax.sesolve`: the solve took `max_steps` = 2 steps",
        ),
    ):
        with pytest.raises(ValueError, match=match):
            hierax.sesolve(
                h,
                kwargs.get("y", psi),
                kwargs.get("t", times),
                rtol=kwargs.get("rtol", 1e-8),
                max_steps=kwargs.get("max_steps", 1000),
            )
    with pytest.raises(ValueError, match="`observable` must be Hermitian"):
        hierax.lanczos(
            hierax.PauliSum.ising_chain(3, 1.0, 1.0),
            hierax.PauliSum.from_strings("XII", [1j]),
            3,
        )
    rho = jnp.array([[jnp.nan, 0, 0], [0, 1, 0], [0, 0, 0]], complex)
    with pytest.raises(ValueError, match="`rho` must be finite"):
        hierax.mesolve(h, [], rho, times)
    with pytest.raises(ValueError, match="`t` must be finite"):
        hierax.HeisenbergHierarchy(h, SZ[:1, :1] * np.eye(3), 3)(jnp.asarray(jnp.nan))


def test_programs_from_python_hold_no_callback(host_checks, monkeypatch):
    """A solve, a hierarchy and `lanczos` called from Python trace no host
    callback, and give
    exactly what the callbacks' programs give; inside a user's `jax.jit` the
    checks are callbacks again (nothing there returns to the host). (Two times:
    with more, diffrax's own checks of the save times are callbacks, traced or
    not by this test depending on which test compiled the program first.)"""
    h, psi = _qutrit(), jnp.array([1.0, 0.0, 0.0], complex)
    times = jnp.array([0.0, 1.0])
    observable = np.diag([1.0, 0.0, -1.0]).astype(complex)

    chain = hierax.PauliSum.ising_chain(4, 1.0, 0.7)
    spin = hierax.PauliSum.from_strings("ZIII")

    def calls():
        solution = hierax.sesolve(h, psi, times, exp_ops=[observable])
        return (
            solution.states,
            hierax.HeisenbergHierarchy(h, observable, 3)(0.4),
            hierax.lanczos(chain, spin, 3, capacity=16).b,
        )

    assert _callbacks_traced(monkeypatch, calls) == 0
    host = calls()
    inside = jax.jit(lambda y: hierax.sesolve(h, y, times).states)
    # (Read off the lowered program: its solve may have been traced before.)
    assert inside.lower(psi).as_text().count("callback") > 0
    with pytest.raises(Exception, match="`state` must be finite"):
        jax.block_until_ready(inside(jnp.array([jnp.nan, 0, 0], complex)))
    # Concrete values closed over by a user's jit are traced all the same.
    bad = jnp.array([jnp.nan, 0, 0], complex)
    with pytest.raises(Exception, match="`state` must be finite"):
        jax.block_until_ready(jax.jit(lambda: hierax.sesolve(h, bad, times).states)())
    monkeypatch.undo()  # the CPU's own choice: callbacks
    assert _callbacks_traced(monkeypatch, calls) > 0
    for a, b in zip(host, calls(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_running_out_of_steps_names_max_steps():
    """With the CPU's callbacks, from Python and inside a user's jit: a solve that
    runs out of `max_steps` says so, naming it (diffrax's own check is off: hierax
    checks the steps' result itself, in the check of the call)."""
    h, psi = _qutrit(), jnp.array([1.0, 0.0, 0.0], complex)
    times = jnp.array([0.0, 30.0])
    with pytest.raises(ValueError, match=r"hierax.sesolve`: the solve took `max_s"):
        hierax.sesolve(h, psi, times, max_steps=2)
    solve = jax.jit(lambda y: hierax.mesolve(h, [], y, times, max_steps=2).states)
    with pytest.raises(Exception, match=r"hierax.mesolve`: the solve took `max_s"):
        jax.block_until_ready(solve(jnp.diag(psi)))


class _Scale(eqx.Module):
    factor: jax.Array


def _looped(module: _Scale, x: jax.Array) -> jax.Array:
    """A check at the program's top level and one in a loop's body."""
    x = raise_if(x, [x[0] > 100], ["`hierax.test`: too large at the start."])

    def body(i, y):
        y = y * module.factor
        return raise_if(y, [y[0] < 0], ["`hierax.test`: negative in the loop."])

    return jax.lax.fori_loop(0, 3, body, x)


def test_only_the_programs_top_level_is_collected(host_checks):
    """In a program traced from Python, a check in a loop's body (a value of the
    loop's own trace) raises by its callback, and one at the top level from the
    host; neither escapes its trace."""
    looped = module_jit(_looped, "hierax.test")
    x = jnp.array([1.0, 2.0])
    np.testing.assert_allclose(looped(_Scale(jnp.asarray(2.0)), x), 8 * x)
    with pytest.raises(ValueError, match="too large at the start"):
        looped(_Scale(jnp.asarray(2.0)), jnp.array([200.0, 0.0]))
    with pytest.raises(Exception, match="negative in the loop"):
        jax.block_until_ready(looped(_Scale(jnp.asarray(-1.0)), x))


_NAN_MODE = """
import jax, jax.numpy as jnp, numpy as np
import hierax
sx = np.array([[0, 1], [1, 0]], complex)
h = hierax.TimeOperator([hierax.Constant(0.5)], [np.diag([1.0, -1.0])]) + hierax.Cos(
    1.0
) * sx
psi, times = jnp.array([1, 0], complex), jnp.array([0.0, 1.0])
solve = jax.jit(lambda y, t, r: hierax.sesolve(h, y, t, rtol=r, max_steps=50).states)
cases = {
    "good": lambda: solve(psi, times, 1e-8),
    "nan state": lambda: solve(jnp.array([jnp.nan, 0], complex), times, 1e-8),
    "decreasing times": lambda: solve(psi, jnp.array([0.0, 2.0, 1.0]), 1e-8),
    "negative rtol": lambda: solve(psi, times, -1.0),
    "max_steps": lambda: solve(psi, jnp.array([0.0, 500.0]), 1e-8),
    "nan time": lambda: jax.jit(lambda t: hierax.HeisenbergHierarchy(h, sx, 3)(t))(
        jnp.nan
    ),
}
for name, call in cases.items():
    print(name, bool(np.all(np.isfinite(np.asarray(call())))))
"""


def test_equinox_nan_mode_gives_nan_for_every_failed_check():
    """Under `EQX_ON_ERROR=nan` (equinox's switch, which takes the callbacks out of
    every program, a user's jit included) each failed check gives nan results,
    never a finite wrong number, and a good call is finite."""
    done = subprocess.run(
        [sys.executable, "-c", _NAN_MODE],
        capture_output=True,
        text=True,
        env={**os.environ, "EQX_ON_ERROR": "nan", "JAX_PLATFORMS": "cpu"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    finite = dict(line.rsplit(" ", 1) for line in done.stdout.splitlines())
    assert finite == {
        "good": "True",
        "nan state": "False",
        "decreasing times": "False",
        "negative rtol": "False",
        "max_steps": "False",
        "nan time": "False",
    }


def _pauli(a):
    chain = ["XX", "ZI", "IZ"]
    return hierax.PauliSum.from_strings(chain, jnp.stack([a, 0.5 + 0 * a, 0.5 + 0 * a]))


_SPIN = hierax.PauliSum.from_strings(["ZI"], [1.0], capacity=16)
_TIMES = jnp.array([0.0, 0.5, 1.0])
_KET = jnp.array([1.0, 0.0, 0.0], complex)

# Each kind of entry point, of one batched argument: (the call, one element).
_BATCHED = {
    "sesolve over states": (
        lambda y: hierax.sesolve(_qutrit(), y, _TIMES).states,
        _KET,
    ),
    "sesolve over amplitudes": (
        lambda a: hierax.sesolve(a * _qutrit(), _KET, _TIMES, exp_ops=[SZ3]).expects,
        0.5,
    ),
    "sesolve over times, throw=False": (
        lambda t: hierax.sesolve(_qutrit(), _KET, t, throw=False).failure.code,
        _TIMES,
    ),
    "sesolve of a closure": (
        lambda a: hierax.sesolve(lambda t: a * jnp.cos(t) * SX3, _KET, _TIMES).states,
        0.5,
    ),
    "Solution.evaluate": (
        lambda a: hierax.sesolve(a * _qutrit(), _KET, _TIMES, dense=True).evaluate(0.3),
        0.5,
    ),
    "mesolve over states": (
        lambda rho: hierax.mesolve(_qutrit(), [0.2 * SX3], rho, _TIMES).states,
        jnp.diag(_KET),
    ),
    "floquet over amplitudes": (
        lambda a: hierax.floquet(SZ + a * hierax.Cos(2.0) * SX, np.pi).quasienergies,
        0.5,
    ),
    "floquet over periods": (
        lambda p: hierax.floquet(SZ + hierax.Cos(2.0) * SX, p).modes_at(0.1),
        np.pi,
    ),
    "high_frequency_expansion": (
        lambda a: hierax.high_frequency_expansion(
            SZ + a * hierax.Cos(2.0) * SX, np.pi, order=2
        ).quasienergies(),
        0.5,
    ),
    "HeisenbergHierarchy over times": (
        lambda t: hierax.HeisenbergHierarchy(_qutrit(), SZ3, 4)(t),
        0.3,
    ),
    "PropagatorDerivatives over states": (
        lambda y: hierax.PropagatorDerivatives(_qutrit(), 4)(0.3, y),
        _KET,
    ),
    "DensityMatrixDerivatives over states": (
        lambda rho: hierax.DensityMatrixDerivatives(_qutrit(), [0.2 * SX3], 3)(
            0.3, rho
        ),
        jnp.diag(_KET),
    ),
    "NestedCommutators over scales": (
        lambda a: hierax.NestedCommutators(a * SX3, SZ3, 4)(),
        0.5,
    ),
    "lanczos over couplings": (lambda a: hierax.lanczos(_pauli(a), _SPIN, 3).b, 0.5),
    "PauliHierarchy over couplings": (
        lambda a: hierax.PauliHierarchy(_pauli(a), _SPIN, 2)(0.2)[-1].coefficients,
        0.5,
    ),
}


@pytest.mark.parametrize("name", sorted(_BATCHED))
def test_a_vmap_over_no_elements_gives_empty_results(name):
    """`jax.vmap` over zero elements is valid JAX: each kind of call gives the
    shapes of a mapped call with a leading axis of zero (from Python, and inside
    a user's jit as the outer of two vmaps), where a check of the batch once
    raised equinox's bare error (a maximum over no elements)."""
    call, element = _BATCHED[name]
    element = jnp.asarray(element)
    two = jnp.stack([element, element])
    expected = [
        s.shape[1:] for s in jax.tree.leaves(jax.eval_shape(jax.vmap(call), two))
    ]
    for mapped, batch in (
        (jax.vmap(call), two[:0]),
        (jax.jit(jax.vmap(jax.vmap(call))), jnp.stack([two, two])[:0]),
    ):
        lead = batch.shape[: batch.ndim - element.ndim]
        shapes = [x.shape for x in jax.tree.leaves(mapped(batch))]
        assert shapes == [lead + s for s in expected]


def test_a_mapped_check_names_the_first_check_any_element_fails():
    """Under `jax.vmap` the checks still raise for a batch with a bad element,
    naming the first check that any element fails (equinox alone named the last);
    an empty batch checks nothing."""

    def checked(x):
        return raise_if(
            x, [x < 0, x > 100], ["`hierax.test`: negative.", "`hierax.test`: large."]
        )

    for mapped in (jax.vmap(checked), jax.jit(jax.vmap(checked))):
        np.testing.assert_array_equal(mapped(jnp.array([1.0, 2.0])), [1.0, 2.0])
        assert mapped(jnp.zeros((0,))).shape == (0,)
        with pytest.raises(Exception, match="negative"):
            jax.block_until_ready(mapped(jnp.array([200.0, -1.0])))
        with pytest.raises(Exception, match="large"):
            jax.block_until_ready(mapped(jnp.array([200.0, 1.0])))
    bad = jnp.stack([_KET, jnp.array([jnp.nan, 0, 0], complex)])
    solve = jax.vmap(lambda y: hierax.sesolve(_qutrit(), y, _TIMES).states)
    with pytest.raises(Exception, match="`state` must be finite"):
        jax.block_until_ready(solve(bad))
    with pytest.raises(Exception, match="`t` must be finite"):
        jax.block_until_ready(
            jax.vmap(hierax.HeisenbergHierarchy(_qutrit(), SZ3, 3))(
                jnp.array([0.1, jnp.nan])
            )
        )
