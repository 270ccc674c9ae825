"""Where the time of a short solve goes: the fixed cost of a solve and its cost per
step, inside a user's `jax.jit` and from Python, beside hand-written diffrax Dopri8,
and the kernels of the compiled program.

    .venv/bin/python benchmarks/bench_short_solves.py [--systems drag,stirap]
        [--calls 300]

For each held-back system (`systems.py`, full span, x64): fixed steps (`dt`) of
1, 2, 8 and 32 steps inside a jit (the slope is the cost of a step, the rest the
cost of a solve), the adaptive solve at rtol 1e-6 inside a jit and from Python,
and Dopri8 at the same tolerance (`peers.diffrax_final`, jitted, from
Python). The calls alternate in one process; the 5th, 50th and 75th percentiles
are printed (XLA's CPU runtime hands work to its thread pool when several
operations are ready at once, which makes the times of a small program bimodal:
compare percentiles, not one median). Then the kernels (fusions), loops and
conditionals of the adaptive solve's program inside a jit.
"""

import argparse
import os
import re
import warnings

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("bench_short_solves.py")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from peers import diffrax_final  # noqa: E402
from rows import emit, row  # noqa: E402
from systems import SYSTEMS  # noqa: E402
from timing import alternating_times  # noqa: E402

import hierax  # noqa: E402


warnings.filterwarnings("ignore", message="Complex dtype support")


def _kernels(compiled_text: str) -> str:
    fusions = len(re.findall(r"^ *%\S*fusion\S* = ", compiled_text, re.M))
    loops = compiled_text.count(" while(")
    branches = compiled_text.count(" conditional(")
    return f"{fusions} kernels (fusions), {loops} loops, {branches} conditionals"


def _calls(system):
    """The calls to time for one system, the adaptive solve jitted, the initial
    state and how many steps that solve takes."""
    hamiltonian = system.hamiltonian()
    state = jnp.asarray(system.state).astype(complex)
    times = jnp.asarray([0.0, system.span])

    def solve(y, rtol, atol):
        return hierax.sesolve(hamiltonian, y, times, rtol=rtol, atol=atol)

    def fixed(steps):
        run = jax.jit(
            lambda y: (
                hierax.sesolve(
                    hamiltonian,
                    y,
                    times,
                    dt=system.span / steps,
                    # A step's cost, not its accuracy: tolerances so loose that
                    # `sesolve`'s check of too long fixed steps lets 1 and 2 pass.
                    rtol=1e12,
                    atol=1e12,
                ).final_state
            )
        )
        return lambda: run(state).block_until_ready()

    adaptive = jax.jit(lambda y, r, a: solve(y, r, a).final_state)
    dopri8 = jax.jit(diffrax_final(system))
    calls = {f"{s} fixed steps, in a jit": fixed(s) for s in (1, 2, 8, 32)}
    calls["rtol 1e-6, in a jit"] = lambda: adaptive(
        state, 1e-6, 1e-8
    ).block_until_ready()
    calls["rtol 1e-6, from Python"] = lambda: solve(
        state, 1e-6, 1e-8
    ).final_state.block_until_ready()
    calls["Dopri8 1e-6, jitted"] = lambda: dopri8(state, 1e-6, 1e-8).block_until_ready()
    steps = int(solve(state, 1e-6, 1e-8).stats["num_steps"])
    return calls, adaptive, state, steps


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--systems", default="drag,stirap")
    parser.add_argument("--calls", type=int, default=300)
    options = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    rows = []
    for key in options.systems.split(","):
        system = SYSTEMS[key]()
        if system.is_open:
            raise SystemExit(f"{key}: open systems are not measured here")
        calls, adaptive, state, steps = _calls(system)
        print(f"\n{key}: {system.name}; rtol 1e-6 takes {steps} steps")
        print(f"  {'call':28s} {'p5':>8s} {'p50':>8s} {'p75':>8s}  (us)")
        for name, times in alternating_times(calls, options.calls).items():
            p5, p50, p75 = np.percentile(times * 1e6, [5, 50, 75])
            print(f"  {name:28s} {p5:8.1f} {p50:8.1f} {p75:8.1f}")
            rows.append(row(key, name, "seconds", np.median(times)))
            rows.append(row(key, name, "p5_seconds", np.percentile(times, 5), "s"))
        rows.append(row(key, "hierax, rtol 1e-6", "steps", steps))
        text = adaptive.lower(state, 1e-6, 1e-8).compile().as_text() or ""
        print(f"  the solve's program inside a jit: {_kernels(text)}")
    emit(rows)
    print(f"\nload after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
