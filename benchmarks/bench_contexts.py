"""One solve in every context a user calls it: from Python, inside `jax.jit`,
under `jax.grad` and under `jax.vmap`, each eagerly and inside `jax.jit`.

    .venv/bin/python benchmarks/bench_contexts.py [--repeats 7]

No speed may depend on how the call is reached: hierax compiles its programs with
XLA's default options, the same a user's own `jax.jit` gets, so the solve inside a
user's jit should run as fast as the top-level call, and a derivative or a batch
inside a jit as fast as the same one called eagerly. The parameters (a drive
amplitude, the initial state) are arguments of the jitted functions, never
constants folded into their program. Three systems, x64, adaptive steps at
rtol 1e-8: a driven qubit in its rotating frame (n = 2), a 6-site Ising chain with
a driven field (n = 64) and a damped, driven 5-level oscillator (`mesolve`,
n = 5). Medians of `--repeats` calls after a first one; the load is printed.
"""

import argparse
import os
import warnings

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("bench_contexts.py")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from rows import emit, row  # noqa: E402
from timing import median_time  # noqa: E402

import hierax  # noqa: E402


warnings.filterwarnings("ignore", message="Complex dtype support")

RTOL, ATOL = 1e-8, 1e-10


def qubit():
    sz = np.diag([1.0, -1.0])
    sx = np.array([[0.0, 1.0], [1.0, 0.0]])

    def hamiltonian(amplitude):
        pulse = hierax.Gaussian(mean=5.0, width=1.5, amplitude=amplitude)
        return 0.1 * sz + pulse * sx

    return hamiltonian, np.array([1.0, 0.0], complex), np.array([0.0, 10.0]), None


def ising(sites=6):
    x, z, i2 = np.array([[0, 1], [1, 0.0]]), np.diag([1.0, -1.0]), np.eye(2)

    def site(op, k):
        out = np.ones((1, 1))
        for j in range(sites):
            out = np.kron(out, op if j == k else i2)
        return out

    zz = sum(site(z, k) @ site(z, k + 1) for k in range(sites - 1))
    xs = sum(site(x, k) for k in range(sites))

    def hamiltonian(amplitude):
        return zz + hierax.Sin(2.0, amplitude=amplitude) * xs + 0.7 * xs

    state = np.zeros(2**sites, complex)
    state[0] = 1
    return hamiltonian, state, np.array([0.0, 2.0]), None


def oscillator(n=5):
    a = np.diag(np.sqrt(np.arange(1, n)), 1)

    def hamiltonian(amplitude):
        return 0.3 * (a.T @ a) + hierax.Cos(0.3, amplitude=amplitude) * (a + a.T)

    rho = np.zeros((n, n), complex)
    rho[0, 0] = 1
    jumps = [np.sqrt(0.05) * a, np.sqrt(0.02) * (a.T @ a)]
    return hamiltonian, rho, np.array([0.0, 20.0]), jumps


SYSTEMS = {
    "qubit (n=2)": qubit,
    "Ising chain (n=64)": ising,
    "oscillator (mesolve, n=5)": oscillator,
}


def contexts(system):
    hamiltonian, state, times, jumps = system()
    times = jnp.asarray(times)
    state = jnp.asarray(state)
    target = state  # the overlap with the initial state

    def final(amplitude, y0):
        h = hamiltonian(amplitude)
        if jumps is None:
            out = hierax.sesolve(h, y0, times, rtol=RTOL, atol=ATOL)
        else:
            out = hierax.mesolve(h, jumps, y0, times, rtol=RTOL, atol=ATOL)
        return out.final_state

    def loss(amplitude, y0):
        return jnp.sum(jnp.abs(final(amplitude, y0) * jnp.conj(target)) ** 2)

    amplitude = jnp.asarray(0.3)
    amplitudes = jnp.linspace(0.2, 0.4, 8)
    grad = jax.grad(loss)
    batched = jax.vmap(final, in_axes=(0, None))
    return {
        "solve": (final, jax.jit(final), (amplitude, state)),
        "grad": (grad, jax.jit(grad), (amplitude, state)),
        "vmap (8)": (batched, jax.jit(batched), (amplitudes, state)),
    }


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    repeats = parser.parse_args().repeats
    print(f"load before: {os.getloadavg()}")
    print(
        "| system | context | from Python (ms) | inside jax.jit (ms) | jit / Python |"
    )
    print("|---|---|---|---|---|")
    rows = []
    for name, system in SYSTEMS.items():
        for context, (eager, jitted, args) in contexts(system).items():
            python = median_time(eager, args, repeats)
            inside = median_time(jitted, args, repeats)
            print(
                f"| {name} | {context} | {python * 1e3:.2f} | {inside * 1e3:.2f} | "
                f"{inside / python:.2f} |"
            )
            case = f"{name}, {context}"
            rows.append(row(case, "from Python", "seconds", python))
            rows.append(row(case, "inside jax.jit", "seconds", inside))
    emit(rows)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
