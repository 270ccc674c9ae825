"""The seed hierarchy's call three ways (issue 8's limits): from Python, inside a
user's `jax.jit`, and per time under `jax.vmap` over 10^5 times.

    .venv/bin/python benchmarks/bench_seed_calls.py [--rounds 3]

$H(t) = \\cos(t)\\,\\sigma_y$, $X_0 = \\sigma_x$, order 9, x64. Medians of 400 calls
(the vmap: of 5 calls over 10^5 times), after warm-up; each round in the same
process, and the machine's load printed before and after.
"""

import argparse
import os

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("bench_seed_calls.py")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from rows import emit, row  # noqa: E402
from timing import median_time  # noqa: E402

import hierax  # noqa: E402


SX = np.array([[0, 1], [1, 0]], complex)
SY = np.array([[0, -1j], [1j, 0]])


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    h = hierax.HeisenbergHierarchy(hierax.Cos() * SY, SX, 9)
    inside = jax.jit(lambda t: h(t))
    times = jnp.linspace(0.0, 10.0, 10**5)
    batched = jax.jit(jax.vmap(lambda t: h(t)))
    rows = []
    for round_ in range(args.rounds):
        python = median_time(lambda: h(1.0).block_until_ready(), (), 400)
        jitted = median_time(lambda: inside(1.0).block_until_ready(), (), 400)
        vmapped = median_time(lambda: batched(times).block_until_ready(), (), 5) / 1e5
        print(
            f"seed, order 9: from Python {python * 1e6:.0f} us, inside a user's jit "
            f"{jitted * 1e6:.0f} us, under vmap {vmapped * 1e6:.1f} us per time",
            flush=True,
        )
        for method, seconds in (
            ("from Python", python),
            ("inside jit", jitted),
            ("vmap, per time", vmapped),
        ):
            rows.append(row("seed, order 9", method, "seconds", seconds, round=round_))
    emit(rows)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
