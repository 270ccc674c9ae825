"""Compiled once: new times and new parameter values reuse the compiled call.

The user's callable inside the Hamiltonian counts how often it runs. JAX runs Python
code only while tracing, so once the first call has compiled, calls at other times
and with other parameter values (array leaves) must not run it again; without
compilation every call would. (A test that counts the traces of a user's own
`jax.jit` around the call could not tell: that jit alone traces once.)
"""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import hierax

from .helpers import SIGMA_X, SIGMA_Y


def _counting(runs: list) -> Callable[[Any], Any]:
    def envelope(t):
        runs.append(None)
        return jnp.exp(-(t**2))

    return envelope


@pytest.mark.parametrize("hierarchy", ["heisenberg", "propagator"])
def test_assert_max_traces_guard(hierarchy):
    runs: list = []
    envelope = hierax.CallableTimeFunction(_counting(runs))

    def call(frequency, t):
        hamiltonian = envelope * SIGMA_Y + hierax.Cos(frequency) * SIGMA_X
        if hierarchy == "heisenberg":
            return hierax.HeisenbergHierarchy(hamiltonian, SIGMA_X, 6)(t)
        return hierax.PropagatorDerivatives(hamiltonian, 6)(t, jnp.eye(2))

    first = call(jnp.asarray(1.0), 0.5)
    traced = len(runs)
    assert traced >= 1
    for frequency, t in [(1.5, 0.7), (2.0, 0.1), (0.5, -1.0)]:
        call(jnp.asarray(frequency), t)
    assert len(runs) == traced, "a new time or parameter value retraced the call"
    # The reused program computes with the new values, not the first ones.
    assert not np.allclose(call(jnp.asarray(2.0), 0.5), first)
