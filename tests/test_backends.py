"""What a call needs from its backend, checked on the CPU (CI has no accelerator):
every matrix product of a public call's program at the chosen precision, whatever
JAX's own default says; the user's own products inside `hierax.taylor` at theirs;
the opt-out `hierax.matmul_precision` compiled apart; and 64-bit mode refused on a
TPU before anything compiles (through the backend seam `_backend.platform_of`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hierax
from hierax._core import _backend

from .helpers import SIGMA_X, SIGMA_Y, SIGMA_Z, compile_count


def _precisions(jaxpr, found: list) -> list:
    """The `precision` of every `dot_general` in `jaxpr` and the jaxprs inside it
    (jit, loops, conditionals, custom derivatives)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
                    _precisions(sub.jaxpr, found)
                elif hasattr(sub, "eqns"):
                    _precisions(sub, found)
    return found


def _products(fn) -> list:
    return _precisions(jax.make_jaxpr(fn)().jaxpr, [])


_N = 6
_RNG = np.random.default_rng(7)
_A = _RNG.normal(size=(_N, _N)) + 1j * _RNG.normal(size=(_N, _N))
_H0 = jnp.asarray(_A + _A.conj().T)
_X = jnp.asarray(np.diag(np.arange(_N)) + 0j)
_H = hierax.Constant(1.0) * _H0 + hierax.Cos(1.3) * _X
_PSI = jnp.ones(_N, complex) / _N**0.5
_RHO = jnp.outer(_PSI, _PSI.conj())
_JUMP = 0.2 * _X
_TIMES = jnp.linspace(0.0, 1.0, 3)


def _scaled_final(scale):
    solution = hierax.sesolve(scale * _H, _PSI, _TIMES)
    return jnp.abs(solution.final_state[0]) ** 2


def _scaled_open(scale):
    solution = hierax.mesolve(scale * _H, [_JUMP], _RHO, _TIMES)
    return jnp.abs(solution.final_state[0, 0])


def _scaled_derivative(scale):
    levels = hierax.PropagatorDerivatives(scale * _H, 4)(0.3, _PSI)
    return jnp.abs(levels[-1, 0]) ** 2


_CALLS = {
    "HeisenbergHierarchy": lambda: hierax.HeisenbergHierarchy(_H, _X, 5)(0.3),
    "PropagatorDerivatives": lambda: hierax.PropagatorDerivatives(_H, 5)(0.3, _PSI),
    "NestedCommutators": lambda: hierax.NestedCommutators(_H0, _X, 5)(),
    "LindbladHierarchy": lambda: hierax.LindbladHierarchy(_H, [_JUMP], _X, 4)(0.3),
    "DensityMatrixDerivatives": lambda: hierax.DensityMatrixDerivatives(_H, [_JUMP], 4)(
        0.3, _RHO
    ),
    "sesolve": lambda: hierax.sesolve(_H, _PSI, _TIMES).states,
    "sesolve gradient": lambda: jax.grad(_scaled_final)(1.0),
    "mesolve gradient": lambda: jax.grad(_scaled_open)(1.0),
    "PropagatorDerivatives gradient": lambda: jax.grad(_scaled_derivative)(1.0),
    "mesolve": lambda: hierax.mesolve(_H, [_JUMP], _RHO, _TIMES).states,
    "floquet": lambda: (
        hierax.floquet(
            SIGMA_Z + hierax.Cos(2.0) * SIGMA_X, 2 * np.pi / 2.0
        ).quasienergies
    ),
    "lanczos": lambda: (
        hierax.lanczos(
            hierax.PauliSum.from_strings(["XX", "ZI", "IZ"], [1.0, 0.5, 0.5]),
            hierax.PauliSum.from_strings(["ZI"], [1.0], capacity=32),
            4,
        ).b
    ),
}


# Calls whose programs have no matrix product (Pauli strings multiply by bits).
_PRODUCT_FREE = {"lanczos"}


@pytest.mark.parametrize("name", sorted(_CALLS))
def test_every_product_at_the_highest_precision(name):
    # A user's own default (bfloat16 passes on a TPU) must not reach hierax's
    # products: each records HIGHEST in the program.
    with jax.default_matmul_precision("bfloat16"):
        found = _products(_CALLS[name])
    if name in _PRODUCT_FREE:
        # Bit operations and sums only: the check is empty, and says so.
        assert not found, f"{name} now has matrix products: drop it from the list"
        return
    assert found, f"{name}: no matrix product found; the check would prove nothing"
    highest = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
    assert all(p == highest for p in found), (name, set(map(str, found)))


def test_the_opt_out_is_compiled_apart():
    # A program compiled under `hierax.matmul_precision` is never reused outside it
    # (nor the other way round), also inside a user's `jax.jit`.
    hierarchy = hierax.HeisenbergHierarchy(_H, _X, 4)
    user = jax.jit(lambda t: hierarchy(t))
    text = lambda: user.lower(0.3).as_text()
    assert "DEFAULT" not in text() and "HIGHEST" in text()
    with hierax.matmul_precision("default"):
        found = _products(lambda: hierarchy(0.3))
        assert found and all(p == (lax.Precision.DEFAULT,) * 2 for p in found)
        assert "HIGHEST" not in text()
    assert "DEFAULT" not in text() and "HIGHEST" in text()
    # The values (a CPU computes every precision alike) agree.
    with hierax.matmul_precision("high"):
        opted = user(0.3)
    np.testing.assert_array_equal(opted, user(0.3))


def test_the_opt_out_refuses_unknown_names():
    with pytest.raises(ValueError, match=r"hierax.matmul_precision.*precision"):
        with hierax.matmul_precision("fast"):  # type: ignore[arg-type]
            pass
    # The choice is restored after the block, also when it raised.
    with pytest.raises(RuntimeError):
        with hierax.matmul_precision("default"):
            raise RuntimeError
    assert _backend.chosen_precision() == "highest"


@pytest.mark.parametrize("given", [lax.Precision.DEFAULT, lax.Precision.HIGH, None])
def test_taylor_keeps_the_users_precision(given):
    a = jnp.asarray(_RNG.normal(size=(3, 3)))

    def f(t):
        m = jnp.cos(t) * a
        return jnp.matmul(m, jnp.sin(t) * a, precision=given)

    # The user's own default, which `precision=None` means, reaches their products
    # too (set here: importing dynamiqs elsewhere sets "highest" for the process).
    with jax.default_matmul_precision("bfloat16"):
        found = _products(lambda: hierax.taylor(f, 0.4, 6))
    assert found
    expected = (given, given) if given is not None else (lax.Precision.DEFAULT,) * 2
    assert all(p == expected for p in found), set(map(str, found))


def test_x64_on_a_tpu_is_refused_before_compiling(monkeypatch):
    # The seam: the backend a call would run on, as a TPU would report it.
    monkeypatch.setattr(_backend, "platform_of", lambda args: "tpu")
    assert jax.config.read("jax_enable_x64")  # the suite runs in 64-bit mode
    for name, call in _CALLS.items():
        before = compile_count()
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert "TPU" in message and "complex64" in message and "CPU" in message, name
        assert "hierax" in message, name
        # (Under `jax.grad` the user's `scale * H` multiplies two real scalars
        # eagerly before `sesolve` is called: a float64 product a TPU compiles.)
        expected = 1 if name.endswith("gradient") else 0
        assert compile_count() - before <= expected, f"{name} compiled first"


def test_x64_on_a_tpu_names_the_call(monkeypatch):
    monkeypatch.setattr(_backend, "platform_of", lambda args: "tpu")
    with pytest.raises(ValueError, match=r"`hierax.HeisenbergHierarchy`.*TPU"):
        hierax.HeisenbergHierarchy(hierax.Cos() * SIGMA_Y, SIGMA_X, 3)(0.1)
    with pytest.raises(ValueError, match=r"`hierax.sesolve`.*TPU"):
        hierax.sesolve(_H, _PSI, _TIMES)


def test_the_platform_follows_the_arrays_and_the_default_device():
    cpu = jax.devices("cpu")[0]
    assert _backend.platform_of((jax.device_put(jnp.ones(2), cpu),)) == "cpu"
    assert _backend.platform_of((1.0,)) == jax.default_backend()
    with jax.default_device(cpu):
        assert _backend.platform_of((np.ones(2),)) == "cpu"
