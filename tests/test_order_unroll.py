"""The loops over a Schrodinger step's orders, unrolled by the backend's factor
(`BackendChoices.order_unroll`: 4 on a TPU, 1 on the CPU): the program holds the
factor, and the states are those of the loop as it was, and of an independent
solve (the suite has no TPU: the backend is set through the seam
`_choices.default_platform`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

import hierax
from hierax._core import _cache, _choices


@pytest.fixture
def on(monkeypatch):
    """`on("tpu")`: the backend the choices are read for, from then on, with the
    compiled programs dropped (on a real device the default device keys them)."""

    def set_platform(platform: str) -> None:
        monkeypatch.setattr(_choices, "default_platform", lambda: platform)
        _cache.clear()
        jax.clear_caches()

    yield set_platform
    _cache.clear()


def _system():
    """A driven 5-level system of its own (no other test's structure):
    H(t) = H0 + 0.4 sin(1.7 t) V, H0 and V random Hermitian."""
    rng = np.random.default_rng(17)

    def hermitian():
        m = rng.normal(size=(5, 5)) + 1j * rng.normal(size=(5, 5))
        return (m + m.conj().T) / 2

    h0, v = hermitian(), hermitian()
    psi = rng.normal(size=5) + 1j * rng.normal(size=5)
    return h0, v, psi / np.linalg.norm(psi)


def _reference(h0, v, psi, span):
    """scipy's DOP853 on the real and imaginary parts, rtol 1e-13."""

    def field(t, y):
        h = h0 + 0.4 * np.sin(1.7 * t) * v
        z = y[:5] + 1j * y[5:]
        dz = -1j * (h @ z)
        return np.concatenate([dz.real, dz.imag])

    y0 = np.concatenate([psi.real, psi.imag])
    out = scipy.integrate.solve_ivp(
        field, (0, span), y0, method="DOP853", rtol=1e-13, atol=1e-15
    )
    return out.y[:5, -1] + 1j * out.y[5:, -1]


@pytest.mark.parametrize("order", [7, 28])  # 7: a trip count off the factor
def test_unrolled_orders_give_the_same_states(on, order):
    h0, v, psi = _system()
    hamiltonian = hierax.TimeOperator(
        [hierax.Constant(1.0), hierax.Sin(1.7, 0.0, 0.4)], [h0, v]
    )
    times = jnp.array([0.0, 2.5])
    exact = _reference(h0, v, psi, 2.5)

    def final(psi):
        return hierax.sesolve(
            hamiltonian, psi, times, rtol=1e-12, atol=1e-14, order=order
        ).final_state

    finals = {}
    for platform, factor in (("cpu", 1), ("tpu", 4)):
        on(platform)
        assert _choices.backend_choices().order_unroll == factor
        program = str(jax.make_jaxpr(final)(jnp.asarray(psi)))
        assert ("unroll=4" in program) == (factor == 4)
        finals[platform] = np.asarray(final(jnp.asarray(psi)))
        np.testing.assert_allclose(finals[platform], exact, atol=1e-10)
    np.testing.assert_allclose(finals["tpu"], finals["cpu"], atol=1e-12)


def test_unrolled_orders_give_the_same_gradient(on):
    """The adjoint's loops over the orders unrolled too: d|<0|psi(T)>|^2 / d(drive
    amplitude) the same on both backends' choices, and the central difference of
    the independent solve's."""
    h0, v, psi = _system()
    times = jnp.array([0.0, 2.5])

    def population(amplitude):
        hamiltonian = hierax.TimeOperator(
            [hierax.Constant(1.0), hierax.Sin(1.7, 0.0, amplitude)], [h0, v]
        )
        final = hierax.sesolve(
            hamiltonian, jnp.asarray(psi), times, rtol=1e-12, atol=1e-14
        ).final_state
        return jnp.abs(final[0]) ** 2

    def reference(amplitude):
        return abs(_reference(h0, v * amplitude / 0.4, psi, 2.5)[0]) ** 2

    step = 1e-4
    expected = (reference(0.4 + step) - reference(0.4 - step)) / (2 * step)
    grads = {}
    for platform in ("cpu", "tpu"):
        on(platform)
        program = str(jax.make_jaxpr(jax.grad(population))(0.4))
        assert ("unroll=4" in program) == (platform == "tpu")
        grads[platform] = float(jax.grad(population)(0.4))
        np.testing.assert_allclose(grads[platform], expected, rtol=1e-6)
    np.testing.assert_allclose(grads["tpu"], grads["cpu"], rtol=1e-11)
