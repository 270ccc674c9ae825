"""The cost of a call from Python over the same solve inside `jax.jit`, and the
re-solve at a new tolerance (which must not compile).

    .venv/bin/python benchmarks/bench_overhead.py [--calls 300]

Short solves (a span of 0.01) so that the solve itself is a few tens of
microseconds and what remains is the call: a driven qubit (`sesolve`) and a
4-level oscillator with decay and dephasing (`mesolve`), x64; then the six
held-back systems of `systems.py` over 1e-4 of their spans (their operators
as `bench_systems.py` builds them). Each call returns `final_state` (taken
inside the solve). The two calls alternate in one process (medians), so the
machine's load moves both alike; the load is printed before and after.
"""

import argparse
import os
import warnings

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("bench_overhead.py")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from rows import emit, row  # noqa: E402
from systems import SYSTEMS  # noqa: E402
from timing import alternating_times, time_call  # noqa: E402

import hierax  # noqa: E402


warnings.filterwarnings("ignore", message="Complex dtype support")


def _held_back(system):
    """A held-back system's solve over 1e-4 of its span, eager and jitted."""
    hamiltonian = system.hamiltonian()
    span = jnp.asarray([0.0, system.span * 1e-4])
    if system.is_open:
        jumps = [jnp.asarray(j) for j in system.jumps]
        state = jnp.asarray(system.rho())

        def solve(y):
            return hierax.mesolve(hamiltonian, jumps, y, span, rtol=1e-6, atol=1e-8)

    else:
        state = jnp.asarray(system.state)

        def solve(y):
            return hierax.sesolve(hamiltonian, y, span, rtol=1e-6, atol=1e-8)

    jitted = jax.jit(lambda y: solve(y).final_state)
    return lambda: solve(state).final_state.block_until_ready(), jitted, state


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    calls = parser.parse_args().calls
    print(f"load before: {os.getloadavg()}")
    sz, sx = jnp.diag(jnp.array([1.0, -1.0])), jnp.array([[0.0, 1.0], [1.0, 0.0]])
    qubit = 0.5 * sz + hierax.Cos(1.0) * (0.2 * sx)
    psi, times = jnp.array([1.0, 0.0j]), jnp.array([0.0, 0.01])
    n = 4
    a = jnp.asarray(np.diag(np.sqrt(np.arange(1, n)), 1).astype(complex))
    oscillator = 2 * np.pi * 0.2 * (a.T @ a) + hierax.Cos(1.3) * (0.1 * (a + a.T))
    jumps = [np.sqrt(0.05) * a, np.sqrt(0.02) * (a.T @ a)]
    rho = jnp.zeros((n, n), complex).at[1, 1].set(1)
    cases = {
        "sesolve": (
            lambda: hierax.sesolve(qubit, psi, times).final_state.block_until_ready(),
            jax.jit(lambda y: hierax.sesolve(qubit, y, times).final_state),
            psi,
        ),
        "mesolve": (
            lambda: hierax.mesolve(
                oscillator, jumps, rho, times
            ).final_state.block_until_ready(),
            jax.jit(lambda r: hierax.mesolve(oscillator, jumps, r, times).final_state),
            rho,
        ),
    }
    for key, make in SYSTEMS.items():
        cases[key] = _held_back(make())
    rows = []
    for name, (eager, jitted, state) in cases.items():
        measured = alternating_times(
            {"python": eager, "inside": lambda f=jitted, y=state: f(y)}, calls
        )
        python, inside = (float(np.median(measured[k])) for k in ("python", "inside"))
        print(
            f"{name}: from Python {python * 1e3:.3f} ms, inside jit "
            f"{inside * 1e3:.3f} ms, overhead {(python - inside) * 1e3:.3f} ms"
        )
        rows.append(row(name, "from Python", "seconds", python))
        rows.append(row(name, "inside jax.jit", "seconds", inside))
    # A new tolerance: the solve runs again without compiling.
    new_tol, _ = time_call(
        lambda: hierax.sesolve(qubit, psi, times, rtol=3.7e-7, atol=1e-9).states
    )
    print(f"sesolve at a new tolerance: {new_tol * 1e3:.2f} ms")
    rows.append(row("sesolve", "at a new tolerance (first call)", "seconds", new_tol))
    emit(rows)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
