"""Issue 49: no host round trip inside a call. A second call of each hierarchy,
with its time and state already on the device, moves nothing between host and
device; the values of device arrays are checked by the compiled program."""

import jax
import jax.numpy as jnp
import pytest

import hierax

from .helpers import no_reads_to_the_host


def _pauli():
    sx = jnp.array([[0, 1], [1, 0]], jnp.complex128)
    sy = jnp.array([[0, -1j], [1j, 0]], jnp.complex128)
    sz = jnp.array([[1, 0], [0, -1]], jnp.complex128)
    return sx, sy, sz


def _cases():
    sx, sy, sz = _pauli()
    t = jnp.asarray(0.3)
    psi = jnp.array([0.6, 0.8j])
    rho = jnp.outer(psi, psi.conj())
    drive = hierax.Cos(jnp.asarray(1.3)) * sy + sz
    return {
        "HeisenbergHierarchy": (hierax.HeisenbergHierarchy(drive, sx, 6), (t,)),
        "PropagatorDerivatives": (hierax.PropagatorDerivatives(drive, 5), (t, psi)),
        "NestedCommutators": (hierax.NestedCommutators(sy, sx, 5), ()),
        "LindbladHierarchy": (
            hierax.LindbladHierarchy(drive, [0.3 * sz], sx, 4),
            (t,),
        ),
        "DensityMatrixDerivatives": (
            hierax.DensityMatrixDerivatives(drive, [0.3 * sz], 4),
            (t, rho),
        ),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_second_call_moves_nothing(name):
    hierarchy, arguments = _cases()[name]
    first = hierarchy(*arguments)
    # Another time, on the device too: the same compiled program, and no transfer.
    if arguments:
        arguments = (jnp.asarray(0.7),) + arguments[1:]
    with no_reads_to_the_host():
        second = hierarchy(*arguments)
        if name != "NestedCommutators":
            hierarchy.normalised(*arguments)
    assert second.shape == first.shape


def test_operator_evaluation_moves_nothing():
    sx, sy, _ = _pauli()
    operator = hierax.Cos() * sy + sx
    t, psi = jnp.asarray(0.3), jnp.array([1.0, 0j])
    expected = (operator(t), operator.taylor(t, 3), operator.apply(t, psi))
    with no_reads_to_the_host():
        got = (operator(t), operator.taylor(t, 3), operator.apply(t, psi))
    for a, b in zip(got, expected):
        assert jnp.array_equal(a, b)


def test_time_function_evaluation_moves_nothing():
    # Parameters and the time on the device: the time is checked in the program.
    f = hierax.Cos(jnp.asarray(2.0), jnp.asarray(0.3)) * hierax.Gaussian(
        jnp.asarray(0.5), jnp.asarray(1.0)
    )
    t = jnp.asarray(0.7)
    expected = (f(t), f.taylor(t, 4))
    with no_reads_to_the_host():
        got = jax.block_until_ready((f(t), f.taylor(t, 4)))
    for a, b in zip(got, expected):
        assert jnp.array_equal(a, b)
    # cos(2t + 0.3) exp(-(t - 0.5)^2 / 2), a closed form.
    value = jnp.cos(2 * 0.7 + 0.3) * jnp.exp(-((0.7 - 0.5) ** 2) / 2)
    assert abs(float(got[0]) - float(value)) <= 1e-14
    with pytest.raises(ValueError, match=r"hierax.TimeFunctionProduct.*`t` must be"):
        f(jnp.asarray(jnp.nan))


@pytest.mark.parametrize(
    "name, bad",
    [
        ("HeisenbergHierarchy", "t"),
        ("PropagatorDerivatives", "t"),
        ("PropagatorDerivatives", "state"),
        ("DensityMatrixDerivatives", "rho"),
    ],
)
def test_nan_on_the_device_is_refused(name, bad):
    """A nan in a time or state on the device is refused at run time, by the
    compiled call, with a short `ValueError` naming the argument."""
    hierarchy, arguments = _cases()[name]
    if bad == "t":
        arguments = (jnp.asarray(jnp.nan),) + arguments[1:]
    else:
        arguments = (arguments[0], arguments[1].at[0].set(jnp.nan))
    with pytest.raises(ValueError, match=f"`{bad}` must be finite") as info:
        hierarchy(*arguments)
    message = str(info.value)
    assert message.startswith(f"`hierax.{name}(...)(")
    assert "\n" not in message


def test_operator_nan_time_on_the_device_is_refused():
    sx, sy, _ = _pauli()
    operator = hierax.Cos() * sy + sx
    nan = jnp.asarray(jnp.nan)
    with pytest.raises(ValueError, match=r"^`hierax.TimeOperator\(...\)\(t\)`: `t`"):
        operator(nan)
    with pytest.raises(ValueError, match=r"^`hierax.TimeOperator.taylor`: `t`"):
        operator.taylor(nan, 2)
    with pytest.raises(ValueError, match=r"^`hierax.TimeOperator.apply`: `t`"):
        operator.apply(nan, jnp.array([1.0, 0j]))
