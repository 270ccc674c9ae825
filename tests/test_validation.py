"""Bad input gets a clear error naming the argument, before any math runs."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hierax

from .helpers import (
    SEED_EXACT,
    SIGMA_X as sx,
    SIGMA_Y as sy,
    fresh_output,
    fresh_script,
)


H = hierax.Cos() * sy


@pytest.mark.parametrize(
    "order,error,match",
    [
        (-1, ValueError, "non-negative"),
        # (Under the test suite's jaxtyping import hook, beartype may answer first;
        # its message also names `order`.)
        (2.0, TypeError, "order"),
        ("3", TypeError, "order"),
        (True, TypeError, "order"),
        (10_001, ValueError, "at most 10,000"),
    ],
)
@pytest.mark.parametrize("make", ["heisenberg", "propagator", "commutators"])
def test_bad_order(order, error, match, make):
    with pytest.raises(error, match=match) as info:
        if make == "heisenberg":
            hierax.HeisenbergHierarchy(H, sx, order)
        elif make == "propagator":
            hierax.PropagatorDerivatives(H, order)
        else:
            hierax.NestedCommutators(sx, sx, order)
    assert "order" in str(info.value)


def test_order_message_names_the_call():
    from hierax._core._validation import check_order

    with pytest.raises(
        TypeError, match=r"`hierax.X\(order=...\)` must be a non-negative int, got 2.0"
    ):
        check_order(2.0, "hierax.X")
    with pytest.raises(TypeError, match="got True"):
        check_order(True, "hierax.X")


def test_numpy_integer_order_is_accepted():
    assert hierax.HeisenbergHierarchy(H, sx, np.int64(3)).order == 3


@pytest.mark.parametrize(
    "observable,error,match",
    [
        (
            jnp.ones((2, 3)),
            ValueError,
            r"`observable` must be a square matrix.*\(2, 3\)",
        ),
        (jnp.ones((3, 3)), ValueError, r"`hamiltonian` is 2x2 but `observable` is 3x3"),
        (jnp.ones((2,)), ValueError, "square matrix"),
        (
            jnp.array([[True, False], [False, True]]),
            TypeError,
            "`observable` must be numeric",
        ),
        (
            np.array([["a", "b"], ["c", "d"]]),
            TypeError,
            "`observable` must be a numeric",
        ),
        (jnp.ones((2, 2), jnp.float16), TypeError, "float16"),
        (hierax.Cos(), TypeError, "scalar time function"),
    ],
)
def test_bad_observable(observable, error, match):
    with pytest.raises(error, match=match):
        hierax.HeisenbergHierarchy(H, observable, 3)


def test_integer_and_real_matrices_are_promoted():
    levels = hierax.HeisenbergHierarchy(hierax.Cos() * sy, [[0, 1], [1, 0]], 2)(1.0)
    assert jnp.issubdtype(levels.dtype, jnp.complexfloating)
    np.testing.assert_allclose(levels[2, 0], SEED_EXACT[2], rtol=1e-13)


@pytest.mark.parametrize(
    "t,error,match",
    [
        (float("nan"), ValueError, "`t` must be finite"),
        (float("inf"), ValueError, "`t` must be finite"),
        (jnp.asarray(jnp.inf), ValueError, "`t` must be finite"),
        (jnp.ones(3), ValueError, "`t` must be a scalar"),
        (True, TypeError, "`t` must be a real or complex number, got True"),
        ("1.0", TypeError, "`t` must be (a numeric|an array or a number)"),
    ],
)
def test_bad_time(t, error, match):
    h = hierax.HeisenbergHierarchy(H, sx, 3)
    with pytest.raises(error, match=match):
        h(t)
    with pytest.raises(error, match=match):
        hierax.PropagatorDerivatives(H, 3)(t, sx)


def test_array_times_are_read_like_numbers():
    """A concrete JAX time (weakly typed, float32, NumPy) is read on the host to the
    default dtype: the same levels as a Python float, one compile for all."""
    h = hierax.HeisenbergHierarchy(H, sx, 3)
    want = np.asarray(h(0.5))
    for t in (jnp.asarray(0.5), jnp.asarray(0.5, jnp.float32), np.float32(0.5)):
        np.testing.assert_array_equal(np.asarray(h(t)), want)
    assert np.asarray(h(jnp.asarray(0.5 + 0j))).shape == want.shape
    with pytest.raises(ValueError, match="`t` must be finite"):
        h(jnp.asarray(jnp.nan, jnp.float32))


def test_non_finite_time_inside_jit_raises():
    h = hierax.HeisenbergHierarchy(H, sx, 3)
    with pytest.raises(Exception, match="`t` must be finite"):
        jax.jit(lambda t: h(t))(jnp.nan).block_until_ready()


def test_bad_state():
    d = hierax.PropagatorDerivatives(H, 3)
    with pytest.raises(ValueError, match=r"`state` must have shape \(2,\) or \(2, m\)"):
        d(0.0, jnp.ones(3))
    with pytest.raises(ValueError, match="`state`"):
        d(0.0, jnp.ones((2, 2, 2)))
    with pytest.raises(TypeError, match="`state` must be numeric"):
        d(0.0, jnp.array([True, False]))


def test_bad_callables():
    with pytest.raises(ValueError, match=r"`fn` must return a square matrix.*\(2, 3\)"):
        hierax.CallableOperator(lambda t: jnp.ones((2, 3)) * t)
    # Callables and values of the wrong type, on purpose (typed Any for pyright).
    returns_a_tuple: Any = lambda t: (sx, sx)
    returns_a_string: Any = lambda t: "not an array"
    not_callable: Any = 3.0
    with pytest.raises(TypeError, match="`fn` must return one array"):
        hierax.CallableOperator(returns_a_tuple)
    with pytest.raises(TypeError, match="`fn` must return a numeric array"):
        hierax.CallableOperator(lambda t: sx > t)
    with pytest.raises(TypeError, match="calling `fn` on a scalar time failed"):
        hierax.CallableOperator(returns_a_string)
    with pytest.raises(TypeError, match="`fn` must be"):
        hierax.CallableOperator(not_callable)
    # Through HeisenbergHierarchy, a callable of the wrong size is named too.
    with pytest.raises(ValueError, match="observable"):
        hierax.HeisenbergHierarchy(H, lambda t: jnp.eye(3) * t, 2)
    with pytest.raises(ValueError, match="`fn` must return a scalar"):
        hierax.CallableTimeFunction(lambda t: jnp.ones(3) * t)


def test_bad_operator_construction():
    with pytest.raises(ValueError, match="same shape"):
        hierax.TimeOperator([hierax.Cos(), hierax.Sin()], [sx, jnp.eye(3)])
    with pytest.raises(ValueError, match="2 time functions but 1 matrices"):
        hierax.TimeOperator([hierax.Cos(), hierax.Sin()], [sx])
    with pytest.raises(ValueError, match="sizes 2 and 3"):
        _ = H + jnp.eye(3)
    with pytest.raises(TypeError, match="`frequency` must be real"):
        hierax.Cos(1j)
    with pytest.raises(ValueError, match="`frequency` must be a scalar"):
        hierax.Cos(jnp.ones(2))
    with pytest.raises(TypeError, match="`rate` must be numeric"):
        hierax.Exp(True)
    with pytest.raises(ValueError, match="non-empty 1-d"):
        hierax.Polynomial(jnp.ones((2, 2)))


def _printed(tmp_path_factory, script: str) -> list[str]:
    """The lines the fresh interpreter's `script` printed (it exited 0)."""
    result = fresh_output(tmp_path_factory, script)
    assert result["status"] == 0, result["stderr"]
    return result["stdout"].splitlines()


# Wrong types at three public entry points, in a plain Python process: jaxtyping's
# pytest plugin (`make test-typed` runs the suite under it) must not be what
# catches them.
_RUNTIME_CHECKS = fresh_script(
    "jaxtyping at run time",
    """
import jax.numpy as jnp
import hierax
import jaxtyping

sx = jnp.array([[0.0, 1.0], [1.0, 0.0]])
cos, operator = hierax.Cos(), hierax.Cos() * sx
hierarchy = hierax.HeisenbergHierarchy(operator, sx, 2)
# The same objects first called well: a check passed once for a module is not
# taken as passed for other arguments.
cos.taylor(0.0, 3), operator.taylor(0.0, 2), hierarchy(0.5)
calls = {
    "order": lambda: cos.taylor(0.0, 3.0),
    "operator order": lambda: operator.taylor(0.0, 2.0),
    "t": lambda: hierarchy("0.5"),
}
for name, call in calls.items():
    try:
        call()
        print(name, "accepted")
    except TypeError as error:
        # jaxtyping's report, as one line naming the call and the argument.
        print(name, "refused:", error, isinstance(error, jaxtyping.TypeCheckError))
    except Exception as error:
        print(name, "refused by", type(error).__name__)
""",
)


def test_jaxtyping_checks_signatures_at_run_time(tmp_path_factory):
    """beartype + jaxtyping guard the public signatures for users, not only in tests
    (a fresh interpreter, without the tests' jaxtyping plugin): the annotations
    refuse a wrong argument before the hand-written checks see it, also after the
    same module's call with right arguments (checks are kept per signature)."""
    assert _printed(tmp_path_factory, _RUNTIME_CHECKS) == [
        "order refused: `hierax.Cos.taylor`: `order` must be int | numpy.integer, "
        "got 3.0. False",
        "operator order refused: `hierax.TimeOperator.taylor`: `order` must be int "
        "| numpy.integer, got 2.0. False",
        "t refused: `hierax.HeisenbergHierarchy.__call__`: `t` must be an array or "
        "a number (or None), got '0.5'. False",
    ]


# Constructors whose arguments only the tests' jaxtyping plugin checked (by their
# annotations) before their own checks were written: in a plain process each one
# refuses a wrong argument with a message naming it.
_CONSTRUCTOR_CHECKS = fresh_script(
    "constructors without the plugin",
    """
import numpy as np
import hierax

calls = {
    "solver flag": lambda: hierax.TaylorSolver(10, adjoint_steps="yes"),
    "solver resolve": lambda: hierax.TaylorSolver(10, resolve_functions=None),
    "functions": lambda: hierax.TimeOperator(3, [np.eye(2)]),
    "operators": lambda: hierax.OperatorSum(3),
    "kron": lambda: hierax.kron("x", np.eye(2)),
    "kron entries": lambda: hierax.kron(np.eye(2), [[1, 0], [0, "a"]]),
}
for name, call in calls.items():
    try:
        call()
        print(name, "accepted")
    except Exception as error:
        print(name, type(error).__name__, str(error).splitlines()[0])
""",
)


def test_constructors_check_their_arguments_without_the_plugin(tmp_path_factory):
    assert _printed(tmp_path_factory, _CONSTRUCTOR_CHECKS) == [
        "solver flag TypeError `hierax.TaylorSolver`: `adjoint_steps` must be a bool, "
        "got 'yes'.",
        "solver resolve TypeError `hierax.TaylorSolver`: `resolve_functions` must be "
        "a bool, got None.",
        "functions TypeError `hierax.TimeOperator`: `functions` must be a list or "
        "tuple of functions, got int.",
        "operators TypeError `hierax.OperatorSum`: `operators` must be a list or "
        "tuple of operators, got int.",
        "kron TypeError `hierax.kron`: `operators[0]` must be a numeric array, got "
        "'x'.",
        "kron entries TypeError `hierax.kron`: `operators[1]` must be a numeric "
        "array, got dtype <U21.",
    ]


_TWO_DEVICES = fresh_script(
    "arrays on two devices",
    """
import jax
import jax.numpy as jnp
import hierax

d0, d1 = jax.devices()[:2]
sx = jax.device_put(jnp.array([[0.0, 1.0], [1.0, 0.0]]), d0)
sy = jax.device_put(jnp.array([[0, -1j], [1j, 0]]), d1)
try:
    hierax.HeisenbergHierarchy(hierax.Cos() * sy, sx, 3)(0.3)
except ValueError as error:
    print(str(error).split(";")[0])
""",
)


def test_arrays_on_different_devices_are_named(tmp_path_factory):
    """A module and arguments on two devices get a message that says so and how to
    fix it, not only JAX's list of internal argument paths."""
    result = fresh_output(tmp_path_factory, _TWO_DEVICES)
    assert result["status"] == 0, result["stderr"]
    assert result["stdout"].strip() == (
        "hierax: the arrays of one call live on different devices (cpu:0, cpu:1)"
    ), result["stdout"]


def test_library_uses_public_jax_only():
    """The compile policy is built on public JAX: no module of hierax imports
    `jax._src` (it changes without notice between JAX versions)."""
    import pathlib
    import re

    root = pathlib.Path(hierax.__file__).parent
    pattern = re.compile(r"^\s*(from|import)\s+jax\._src", re.MULTILINE)
    offenders = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if pattern.search(path.read_text())
    ]
    assert offenders == []


def test_small_constants_placed_once_by_value():
    """`to_jax` keeps small concrete constants by content (a user's code rebuilds
    its operators on every call): equal values give the same placed array, while
    different bytes (-0.0 against 0.0), dtypes, shapes and x64 settings never
    share one, and a NumPy array changed in place is placed anew."""
    from hierax._core._arrays import to_jax

    a = np.array([[0.0, 1.0], [1.0, 0.0]])
    first = to_jax(a)
    assert to_jax(a.copy()) is first
    a[0, 0] = 2.0  # mutated: its new content is a new value
    changed = to_jax(a)
    assert changed is not first and float(changed[0, 0]) == 2.0
    assert float(first[0, 0]) == 0.0
    assert np.signbit(np.asarray(to_jax(-0.0))) and not np.signbit(
        np.asarray(to_jax(0.0))
    )
    assert to_jax(a.astype(np.float32)).dtype == jnp.float32
    assert to_jax(a.reshape(4)).shape == (4,)
    assert to_jax(1.5).weak_type
    try:
        jax.config.update("jax_enable_x64", False)
        assert to_jax(1.5).dtype == jnp.float32
    finally:
        jax.config.update("jax_enable_x64", True)
    assert to_jax(1.5).dtype == jnp.float64

    # A constant first met inside a trace is placed for that trace only: it is not
    # kept, and the same value later (eagerly or in another trace) is no leaked
    # tracer.
    fresh = np.array([[3.25, 0.5], [0.5, -1.75]])
    inside = jax.jit(lambda s: s * to_jax(fresh.copy()))(2.0)
    np.testing.assert_allclose(np.asarray(to_jax(fresh)), fresh)
    np.testing.assert_allclose(np.asarray(inside), 2.0 * fresh)
    again = jax.jit(lambda s: s + to_jax(fresh.copy()))(1.0)
    np.testing.assert_allclose(np.asarray(again), 1.0 + fresh)


def test_values_first_met_inside_a_trace_do_not_leak():
    """Two different jitted functions solving with a tolerance (and a drive
    frequency) that this process meets first inside a trace: what the first trace
    placed is not kept for the second (it would be a leaked tracer), nor for an
    eager call after it."""
    import hierax

    sx = np.array([[0.0, 1.0], [1.0, 0.0]])
    times = jnp.linspace(0.0, 1.0, 3)
    y0 = jnp.array([1.0 + 0j, 0.0])

    def solve(y):
        h = hierax.Cos(1.23456789) * sx
        return hierax.sesolve(h, y, times, rtol=3.21987e-7, atol=1.2345e-9).states[-1]

    first = jax.jit(solve)(y0)
    second = jax.jit(lambda y: solve(y) * 1.0)(y0)
    np.testing.assert_allclose(np.asarray(second), np.asarray(first), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(solve(y0)), np.asarray(first), rtol=1e-12)


def test_object_arrays_say_what_they_hold():
    """Issue 48: `np.asarray(sparse)` is a 0-d object array; every call that takes a
    matrix or a state refuses it in its own name, naming the argument, with the fix;
    an object array of plain numbers is the same numbers."""
    import scipy.sparse

    sx = np.array([[0, 1], [1, 0]], complex)
    sy = np.array([[0, -1j], [1j, 0]])
    wrapped = np.asarray(scipy.sparse.csr_matrix(sx))
    assert wrapped.dtype == object and wrapped.shape == ()
    calls = {
        "`hierax.HeisenbergHierarchy`: `hamiltonian`": lambda: (
            hierax.HeisenbergHierarchy(wrapped, sx, 2)
        ),
        "`hierax.HeisenbergHierarchy`: `observable`": lambda: (
            hierax.HeisenbergHierarchy(sy, wrapped, 2)
        ),
        "`hierax.PropagatorDerivatives(...)(t, state)`: `state`": lambda: (
            hierax.PropagatorDerivatives(sy, 2)(0.1, wrapped)
        ),
        "`hierax.NestedCommutators`: `generator`": lambda: hierax.NestedCommutators(
            wrapped, sx, 2
        ),
    }
    for start, call in calls.items():
        with pytest.raises(TypeError) as info:
            call()
        message = str(info.value)
        assert message.startswith(start), message
        assert "scipy.csr_matrix" in message and "sparse matrix itself" in message
    # A sparse state itself: the solvers' states are dense; the message says so.
    sparse = scipy.sparse.csr_matrix(np.diag([1.0, 0.0]))
    for api, call in (
        ("hierax.mesolve", lambda: hierax.mesolve(sy, [sx], sparse, [0.0, 1.0])),
        ("hierax.sesolve", lambda: hierax.sesolve(sy, sparse, [0.0, 1.0])),
    ):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert message.startswith(f"`{api}`: ") and ".toarray()" in message, message
    # Plain numbers held as objects: the same levels as the numeric array.
    as_objects = hierax.HeisenbergHierarchy(sy.astype(object), sx.astype(object), 3)
    plain = hierax.HeisenbergHierarchy(sy, sx, 3)
    np.testing.assert_array_equal(np.asarray(as_objects(0.2)), np.asarray(plain(0.2)))


def test_failed_check_inside_a_users_jit(caplog):
    """Issue 48: a nan time traced inside a user's `jax.jit` is refused at run time.
    JAX wraps the message in the callback's traceback (not ours to shorten), but the
    message is in the error and JAX's log does not repeat it with a second traceback;
    `hierax` itself, called from Python, raises the message alone."""
    sx = jnp.array([[0, 1], [1, 0]], complex)
    sy = jnp.array([[0, -1j], [1j, 0]])
    hierarchy = hierax.HeisenbergHierarchy(hierax.Cos() * sy, sx, 3)
    message = "`hierax.HeisenbergHierarchy(...)(t)`: `t` must be finite."
    with caplog.at_level("ERROR"), pytest.raises(Exception) as info:
        jax.jit(lambda t: hierarchy(t))(jnp.nan).block_until_ready()
    assert message in str(info.value)
    assert not [r for r in caplog.records if r.name.startswith("jax")]
    with pytest.raises(ValueError) as info:
        hierarchy(jnp.asarray(jnp.nan))
    assert str(info.value) == message


# A NumPy state finite in float64 but not in complex64 (x64 off, the default of a
# fresh process): refused as the Hamiltonian is, not run to `max_steps`.
_OVERFLOWING_STATE = fresh_script(
    "a state that overflows complex64",
    """
import numpy as np
import hierax

sz = np.diag([1.0, -1.0])
for call in (
    lambda: hierax.sesolve(sz, np.array([1e39, 0.0]), [0.0, 1.0]),
    lambda: hierax.mesolve(sz, [], np.diag([1e39, 0.0]), [0.0, 1.0]),
):
    try:
        call()
        print("accepted")
    except ValueError as error:
        print(str(error).split(",")[0])
""",
)


def test_a_state_that_overflows_the_working_dtype_is_refused(tmp_path_factory):
    assert _printed(tmp_path_factory, _OVERFLOWING_STATE) == [
        "`hierax.sesolve`: `state` must be finite",
        "`hierax.mesolve`: `rho` must be finite",
    ]


def test_one_matrix_for_exp_ops_is_named():
    """`exp_ops=sz` (one matrix, where a list is asked): its rows were taken for
    observables ("`exp_ops[0]` has shape (2,)"); the message now says what to pass."""
    sz = np.diag([1.0, -1.0])
    match = r"`exp_ops` must be a list of operators .* pass `\[exp_ops\]`"
    with pytest.raises(TypeError, match=match):
        hierax.sesolve(sz, np.array([1.0, 0.0]), [0.0, 1.0], exp_ops=sz)
    with pytest.raises(TypeError, match=match):
        hierax.mesolve(sz, [], np.diag([1.0, 0.0]), [0.0, 1.0], exp_ops=jnp.asarray(sz))


def test_exp_ops_that_are_no_list_are_named():
    """One QuTiP operator for `exp_ops` is named with what to pass, where the
    annotation's report read "must be an array or a number"; a number, a dict or a
    1-d array are refused as what they are."""
    sz = np.diag([1.0, -1.0])
    qt = pytest.importorskip("qutip")
    for solve in (
        lambda e: hierax.sesolve(sz, np.array([1.0, 0.0]), [0.0, 1.0], exp_ops=e),
        lambda e: hierax.mesolve(sz, [], np.diag([1.0, 0.0]), [0.0, 1.0], exp_ops=e),
    ):
        with pytest.raises(TypeError, match=r"got one Qobj; pass `\[exp_ops\]`"):
            solve(qt.sigmaz())
        for bad, kind in ((3.0, "float"), ({"z": sz}, "dict"), (np.ones(2), "ndarray")):
            with pytest.raises(TypeError, match=rf"list of \(2, 2\) .* got {kind}"):
                solve(bad)
