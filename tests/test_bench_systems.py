"""The held-back benchmark systems (`benchmarks/systems.py`): each coefficient's
four forms agree, and hierax's final state agrees with scipy's DOP853 on a short
span of each system. (The suite's rules and its report: `test_benchmarks_suite.py`.)
"""

import jax.numpy as jnp
import numpy as np
import pytest
from benchmarks.systems import SYSTEMS

import hierax

from .helpers import relative_error


# Spans short enough for a few steps of each system (the benchmark's are longer).
SPANS = {
    "drag": 20.0,
    "pair": 2.0,
    "stirap": 8.0,
    "xxz": 1.0,
    "open_pair": 5.0,
    "random": 2.0,
}


def test_every_system_has_a_span():
    assert set(SPANS) == set(SYSTEMS)


@pytest.mark.parametrize("key", sorted(SYSTEMS))
def test_coefficient_forms_agree(key):
    """hierax's time function, the NumPy and JAX functions and the QuTiP string
    (read by Python with NumPy's functions) give the same value."""
    system = SYSTEMS[key](span=SPANS[key])
    functions = {"cos": np.cos, "exp": np.exp}
    for coefficient, _ in system.drives:
        for t in (0.3 * system.span, 0.55 * system.span):
            values = [
                coefficient(t),
                float(coefficient(jnp.asarray(t), jnp)),
                float(coefficient.hierax()(t)),
                eval(coefficient.string(), {**functions, "t": t}),
            ]
            np.testing.assert_allclose(values, values[0], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("key", sorted(SYSTEMS))
def test_hierax_agrees_with_dop853(key):
    system = SYSTEMS[key](span=SPANS[key])
    times = jnp.asarray(system.times)
    if system.is_open:
        out = hierax.mesolve(
            system.hamiltonian(),
            [jnp.asarray(j) for j in system.jumps],
            jnp.asarray(system.rho()),
            times,
            rtol=1e-6,
            atol=1e-8,
        )
    else:
        out = hierax.sesolve(
            system.hamiltonian(), jnp.asarray(system.state), times, rtol=1e-6, atol=1e-8
        )
    reference = system.reference(rtol=1e-11, atol=1e-12)
    assert relative_error(out.states[-1], reference) < 1e-5
