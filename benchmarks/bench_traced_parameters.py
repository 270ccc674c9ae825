"""Parameters traced the ways users write them: a solve inside a user's `jax.jit`,
and its gradient, with an amplitude, a rate or a coupling as the traced argument.

    .venv/bin/python benchmarks/bench_traced_parameters.py [--repeats 15]

The held-back systems of `systems.py`, x64, rtol 1e-8 (atol 1e-10), medians of
`--repeats` calls after a first one (which compiles); the load is printed.

- `sesolve` systems: H with no traced parameter (closed over by the jit), each
  drive scaled by the traced number (`scale * c(t) * M`), and the whole operator
  scaled (`scale * H`), each inside a jit and as `jax.grad` of a population.
- Beside them, a hand-written diffrax Dopri8 (as in `bench_systems.py`: the
  real and imaginary parts, one real matrix per term, `PIDController(rtol,
  atol)`) with each drive scaled by the traced number: the peer's solve and
  gradient in the same context.
- The open transmon pair (`mesolve`): the four rates traced, as a number times a
  matrix (`jnp.sqrt(r) * M`: traced matrices) and as a number times the matrix's
  operator (`jnp.sqrt(r) * hierax.as_operator(M)`: known matrices, traced
  constants), against the rates as NumPy numbers.
"""

import argparse
import os
import warnings

import diffrax
import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("bench_traced_parameters.py")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from peers import generators, real_embedding  # noqa: E402
from rows import emit, row  # noqa: E402
from systems import SYSTEMS  # noqa: E402
from timing import median_time  # noqa: E402

import hierax  # noqa: E402


warnings.filterwarnings("ignore", message="Complex dtype support")

RTOL, ATOL = 1e-8, 1e-10

# The result rows of every table row printed (`rows.row`), emitted at the end.
MEASURED: list[dict] = []


def table_row(key: str, name: str, final, population, args: tuple, repeats: int) -> str:
    """A table row: `final` inside a jit and `jax.grad(population)` inside a jit,
    with the traced parameter first in `args` (no gradient where nothing depends
    on it: `population` is `None`)."""
    solve = median_time(jax.jit(final), args, repeats) * 1e3
    MEASURED.append(row(key, name, "seconds", solve / 1e3, context="jax.jit"))
    gradient = "-"
    if population is not None:
        grad = jax.jit(jax.grad(population))
        seconds = median_time(grad, args, repeats)
        gradient = f"{seconds * 1e3:.2f} ms"
        MEASURED.append(row(key, name, "seconds", seconds, context="jax.grad"))
    return f"| `{key}` | {name} | {solve:.2f} ms | {gradient} |"


def closed_system_rows(key: str, repeats: int) -> list[str]:
    system = SYSTEMS[key]()
    span = jnp.asarray([0.0, system.span])
    y0 = jnp.asarray(system.state)
    plain = system.hamiltonian()
    forms = {
        "no traced parameter": lambda a: plain,
        "scale * c(t) * M per drive": lambda a: system.hamiltonian(a),
        "scale * H": lambda a: a * plain,
    }
    rows = []
    for name, build in forms.items():

        def final(a, y, build=build):
            return hierax.sesolve(build(a), y, span, rtol=RTOL, atol=ATOL).final_state

        def population(a, y, final=final):
            return jnp.abs(final(a, y)[0]) ** 2

        depends = name != "no traced parameter"
        args = (jnp.asarray(1.0), y0)
        rows.append(
            table_row(key, name, final, population if depends else None, args, repeats)
        )
    dopri8 = dopri8_final(system)
    rows.append(
        table_row(
            key,
            "diffrax Dopri8, scale * c(t) * M per drive",
            dopri8,
            lambda a, y: jnp.abs(dopri8(a, y)[0]) ** 2,
            (jnp.asarray(1.0), y0),
            repeats,
        )
    )
    return rows


def dopri8_final(system):
    """`final(scale, y0)`: a hand-written diffrax Dopri8 on (Re y, Im y) with each
    drive's coefficient times `scale` (the peer of the rows above)."""
    g0, gk = generators(system)
    g0 = jnp.asarray(real_embedding(g0))
    gk = jnp.asarray(np.stack([real_embedding(g) for g in gk]))

    def vector_field(t, y, scale):
        return g0 @ y + (scale * system.coefficients(t, jnp)) @ (gk @ y)

    def final(scale, y0):
        start = jnp.concatenate([jnp.real(y0), jnp.imag(y0)])
        y = diffrax.diffeqsolve(
            diffrax.ODETerm(vector_field),
            diffrax.Dopri8(),
            0.0,
            system.span,
            None,
            start,
            args=scale,
            stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
            max_steps=10**6,
        ).ys[-1]  # pyright: ignore[reportOptionalSubscript]
        half = y0.size
        return y[:half] + 1j * y[half:]

    return final


def open_system_rows(repeats: int) -> list[str]:
    system = SYSTEMS["open_pair"]()
    span = jnp.asarray([0.0, system.span])
    rho = jnp.asarray(system.rho())
    hamiltonian = system.hamiltonian()
    matrices = [np.asarray(j) for j in system.jumps]
    forms = {
        "rates as NumPy numbers": lambda r: matrices,
        "jnp.sqrt(r) * M (traced matrices)": lambda r: [
            jnp.sqrt(r) * m for m in matrices
        ],
        "jnp.sqrt(r) * as_operator(M)": lambda r: [
            jnp.sqrt(r) * hierax.as_operator(m) for m in matrices
        ],
    }
    rows = []
    for name, build in forms.items():

        def final(r, build=build):
            jumps = build(r)
            return hierax.mesolve(
                hamiltonian, jumps, rho, span, rtol=RTOL, atol=ATOL
            ).final_state

        def population(r, final=final):
            return jnp.real(final(r)[1, 1])

        depends = name != "rates as NumPy numbers"
        args = (jnp.asarray(1.0),)
        rows.append(
            table_row(
                "open_pair", name, final, population if depends else None, args, repeats
            )
        )
    return rows


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--systems", default="drag,pair,xxz,random")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    print("| system | form | inside `jax.jit` | `jax.grad` inside a jit |")
    print("|---|---|---:|---:|")
    for key in args.systems.split(","):
        for line in closed_system_rows(key, args.repeats):
            print(line, flush=True)
    for line in open_system_rows(args.repeats):
        print(line, flush=True)
    emit(MEASURED)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
