"""What a gradient costs to compile: `jax.jit(jax.value_and_grad(...))` of a
hierarchy level and of a solve, hierax beside the usual way to write each.

    .venv/bin/python benchmarks/bench_gradient_compile.py [--repeats 3]
        [--systems drag,pair,...]

- Hierarchies: the seed problem ($H = \\cos(t)\\,\\sigma_y$, $X_0 = \\sigma_x$),
  the squared norm of level K differentiated with respect to the time, at
  K = 2, 4, 6: `hierax.HeisenbergHierarchy` against the question's naive
  recursion (nested `jax.jacfwd`, `seed.make_naive_recursion`); then a qutrit with
  a cosine drive at K = 6 (hierax alone), with respect to the drive's frequency
  and the time.
- Solves: the six held-back systems of `systems.py` (rtol 1e-8, atol 1e-10,
  over their quick spans), the final population of the initial state
  differentiated with respect to a scale of every drive (at 1):
  `hierax.sesolve` (`mesolve` for the open system) against diffrax Dopri8
  written by hand on the real and imaginary parts
  (`peers.diffrax_final`), both with diffrax's default adjoint
  (`RecursiveCheckpointAdjoint`).

Each program is traced, lowered and compiled anew `--repeats` times in one
process (a new `jax.jit` each time): printed are the first tracing + lowering
(later ones reuse what each library keeps per structure), the median of XLA's
compile and the compiled program's run time; x64, XLA's default options, the
load before and after. The programs run in the order printed, so the first
hierax row also pays hierax's first traces in the process.
"""

import argparse
import os
import statistics
import warnings

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("bench_gradient_compile.py")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from peers import diffrax_final  # noqa: E402
from rows import emit, row  # noqa: E402
from seed import make_naive_recursion  # noqa: E402
from systems import SYSTEMS  # noqa: E402
from timing import compile_phases, median_time  # noqa: E402

import hierax  # noqa: E402


warnings.filterwarnings("ignore", message="Complex dtype support")


def compile_times(make, args: tuple, repeats: int) -> tuple[float, float, float]:
    """Tracing + lowering of the first `jax.jit(make())` at `args` (later ones
    reuse what a library keeps per structure: hierax its inner traces), the
    median of XLA's compile over `repeats` new jits (seconds), and the run time
    of the last compiled program (median of 5 calls)."""
    front, back = [], []
    compiled = None
    for _ in range(repeats):
        lower, xla, compiled = compile_phases(jax.jit(make()), args)
        front.append(lower)
        back.append(xla)
    assert compiled is not None
    return front[0], statistics.median(back), median_time(compiled, args, 5, warm=False)


def hierarchy_cases():
    sx = np.array([[0, 1], [1, 0]], complex)
    sy = np.array([[0, -1j], [1j, 0]])
    naive = make_naive_recursion

    for order in (2, 4, 6):

        def ours(order=order):
            h = hierax.HeisenbergHierarchy(hierax.Cos() * sy, sx, order)
            return jax.value_and_grad(lambda t: jnp.sum(jnp.abs(h(t)[order]) ** 2))

        def theirs(order=order):
            level = naive()  # a fresh function: nothing compiled yet
            return jax.value_and_grad(
                lambda t: jnp.sum(jnp.abs(level(t + 0j, order)) ** 2)
            )

        yield f"seed hierarchy, K = {order}", ours, theirs, (jnp.asarray(0.7),)

    a = np.diag(np.sqrt([1.0, 2.0]), 1)

    def qutrit():
        def loss(w, t):
            h = 2.0 * (a.T @ a) + hierax.Cos(w) * (a + a.T)
            return jnp.sum(jnp.abs(hierax.HeisenbergHierarchy(h, a + a.T, 6)(t)) ** 2)

        return jax.value_and_grad(loss, argnums=(0, 1))

    yield "qutrit hierarchy, K = 6", qutrit, None, (jnp.asarray(1.1), jnp.asarray(0.7))


def solve_cases(keys):
    for key in keys:
        system = SYSTEMS[key](quick=True)
        times = jnp.asarray([0.0, system.span])
        start = jnp.asarray(system.rho() if system.is_open else system.state)
        jumps = [jnp.asarray(j) for j in system.jumps] if system.is_open else None
        index = int(np.argmax(np.abs(np.diag(system.rho()))))

        def population(final, index=index):
            """|<psi0|psi>|^2, or <psi0|rho|psi0>."""
            if final.ndim == 2:
                return jnp.real(final[index, index])
            return jnp.abs(final[index]) ** 2

        def ours(system=system, jumps=jumps, times=times, start=start):
            def loss(scale):
                hamiltonian = system.hamiltonian(scale)
                if jumps is None:
                    out = hierax.sesolve(
                        hamiltonian, start, times, rtol=1e-8, atol=1e-10
                    )
                else:
                    out = hierax.mesolve(
                        hamiltonian, jumps, start, times, rtol=1e-8, atol=1e-10
                    )
                return population(out.final_state)

            return jax.value_and_grad(loss)

        def theirs(system=system, start=start):
            final = diffrax_final(system)
            return jax.value_and_grad(
                lambda scale: population(final(start, 1e-8, 1e-10, scale))
            )

        yield f"{key} solve", ours, theirs, (jnp.asarray(1.0),)


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    options = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    print(
        "| program | hierax: trace + lower | XLA compile | run | peer: trace + lower "
        "| XLA compile | run |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    cases = [*hierarchy_cases(), *solve_cases(options.systems.split(","))]
    rows = []
    for name, ours, theirs, args in cases:
        line = f"| {name} |"
        peer = "diffrax Dopri8" if name.endswith("solve") else "naive recursion"
        for method, make in (("hierax", ours), (peer, theirs)):
            if make is None:
                line += " - | - | - |"
                continue
            front, back, run = compile_times(make, args, options.repeats)
            line += f" {front:.2f} s | {back:.2f} s | {run * 1e3:.2f} ms |"
            rows.append(row(name, method, "trace_and_lower_seconds", front, "s"))
            rows.append(row(name, method, "xla_compile_seconds", back, "s"))
            rows.append(row(name, method, "seconds", run))
        print(line, flush=True)
    emit(rows)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
