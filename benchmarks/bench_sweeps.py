"""Parameter sweeps under `jax.vmap`: `hierax.sesolve` against a hand-written
diffrax Dopri8 under the same `vmap`, at matched final error, and where the time goes.

    .venv/bin/python benchmarks/bench_sweeps.py [--quick] [--out PATH]

Three sweeps, float64/complex128, on the CPU:

- `qubit`: a driven qubit $H = \\frac{\\Delta}{2} \\sigma_z + \\frac{\\Omega(t)}{2}
  \\sigma_x$, a Gaussian pi pulse $\\Omega(t) = A e^{-(t - 6)^2 / (2 \\cdot 1.5^2)}$
  over $t \\in [0, 12]$, swept over 256 detunings $\\Delta \\in [-2, 2]$ from
  $|0\\rangle$ (`vmap` over $\\Delta$, a traced parameter of the Hamiltonian);
- `rabi`: the same qubit at $\\Delta = 0.3$, the pulse times 256 amplitudes
  $s \\in [0, 4]$ (pulse areas up to $4\\pi$; `vmap` over $s$, the amplitude of
  the `Gaussian`);
- `states`: a random 32-level Hermitian $H_0$ (spectral radius about 2) plus
  $0.3 \\cos(1.3 t) V$ (random Hermitian V, fixed seed) over $t \\in [0, 10]$,
  64 random initial kets (`vmap` over the state; hierax also with the 64 kets as
  the columns of one state, which `sesolve` takes natively).

The reference final states are scipy's DOP853 on the whole batch at once (real and
imaginary parts, rtol 1e-13): independent of both methods. The error of a sweep is
the largest 2-norm distance of a final state to its reference.

For each method a ladder of rtol (atol = rtol / 100) is timed with the methods
taking turns (`timing.alternating_times`, so the machine's load moves both alike);
the time at final error 1e-6 and 1e-10 is read off the ladder (`timing.time_at`).
Reported besides: steps per element (min, median, max; under `vmap` the while loop
runs until the slowest element is done), the time per step batched (a batched call
over its largest step count) and unbatched (one element, jitted), hierax at several
series orders, the share of hierax's batched step spent in its series kernel, and
op counts of the jaxpr and the compiled HLO of the batched solves (while loops,
dots, gathers, scatters). Finally the first call in a fresh process (compile and
run, and the imports) for each method on the qubit sweep: a subprocess each, the
methods taking turns, median of 3. `os.getloadavg()` goes with the results.
"""

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import warnings
from typing import Any

import jax


jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from rows import emit, row, save  # noqa: E402
from sweeps import (  # noqa: E402
    SX,
    SZ,
    QubitSweep,
    RabiSweep,
    StatesSweep,
    ladder_calls,
    print_ladder,
    run_ladder,
)
from timing import (  # noqa: E402
    Stopwatch,
    alternating_times,
    at_targets,
    call_times,
    warm_up,
)

import hierax  # noqa: E402


warnings.filterwarnings("ignore", message="Complex dtype support")

TARGETS = (1e-6, 1e-10)


# --- measurements -------------------------------------------------------------------


def sweep_error(states, reference) -> float:
    return float(np.max(np.linalg.norm(np.asarray(states) - reference, axis=-1)))


def describe(targets: dict) -> str:
    """`at_targets`' result in words: the time and the steps at each target."""
    words = []
    for key, value in targets.items():
        seconds, met = value["seconds"], value["loosest_met"]
        time_ = "-" if seconds is None else f"{seconds * 1e3:.2f} ms"
        steps = "-" if met is None else met["steps"]["max"]
        words.append(f"{key}: {time_} ({steps} steps)")
    return ", ".join(words)


def count_primitives(jaxpr, counts):
    for eqn in jaxpr.eqns:
        counts[eqn.primitive.name] += 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, list | tuple) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    count_primitives(inner, counts)
    return counts


HLO_OPS = ("while", "dot", "gather", "scatter", "conditional", "fusion", "call")


def op_counts(f, *args) -> dict:
    jaxpr = jax.make_jaxpr(f)(*args)
    counts = count_primitives(jaxpr.jaxpr, collections.Counter())
    keep = ("while", "cond", "dot_general", "gather", "scatter", "select_n")
    hlo = f.lower(*args).compile().as_text()
    return dict(
        jaxpr={k: counts.get(k, 0) for k in keep} | {"total": sum(counts.values())},
        hlo={k: len(re.findall(rf"\b{k}\(", hlo)) for k in HLO_OPS},
    )


def per_step(batch_f, one_f, params, rtol, calls) -> dict:
    """Time per step of the batch (over its largest count) and of one element
    (jitted, the median over a few elements)."""
    args, r = jnp.asarray(params), jnp.asarray(rtol)
    times, (_, steps) = call_times(batch_f, (args, r), calls)
    batch = statistics.median(times)
    single = jax.jit(one_f)
    rows = []
    for k in np.linspace(0, len(params) - 1, 4).astype(int):
        t, (_, s) = call_times(single, (args[k], r), calls)
        rows.append((statistics.median(t), int(s)))
    one_time = statistics.median(t for t, _ in rows)
    one_steps = statistics.median(s for _, s in rows)
    return dict(
        batch_seconds=batch,
        batch_max_steps=int(np.max(steps)),
        batch_per_step=batch / int(np.max(steps)),
        batch_per_element_step=batch / int(np.max(steps)) / len(params),
        single_seconds=one_time,
        single_steps=one_steps,
        single_per_step=one_time / one_steps,
    )


def window_cost(sweep, batch_f, rtol, repeats, steps=24) -> dict:
    """Where hierax's batched step goes, through the public API: the batched
    `sesolve` with `steps` fixed steps (`dt`), at orders 28 and 12, with the
    Gaussian pulse and with the pulse held at a constant (then every coefficient
    is constant and the step has no Cauchy product over the drive's series: the
    products alone), per step, against the adaptive solve per step (its batch's
    largest step count); all taking turns."""
    times = jnp.array([0.0, sweep.span])
    start = jnp.asarray(sweep.start)
    dt = sweep.span / steps

    def fixed(order, constant):
        def one(delta):
            pulse = (
                hierax.Constant(sweep.amplitude / 2)
                if constant
                else hierax.Gaussian(sweep.mean, sweep.width, sweep.amplitude / 2)
            )
            h = hierax.TimeOperator([hierax.Constant(delta / 2), pulse], [SZ, SX])
            # Loose tolerances: with `dt` they only bound the step's estimate.
            s = hierax.sesolve(
                h, start, times, dt=dt, order=order, rtol=1e-2, atol=1e-2
            )
            return s.final_state

        return jax.jit(jax.vmap(one))

    args, r = jnp.asarray(sweep.params), jnp.asarray(rtol)
    adaptive_steps = int(np.max(batch_f(args, r)[1]))
    calls = {"adaptive": lambda: batch_f(args, r)}
    for order in (28, 12):
        for constant in (False, True):
            f = fixed(order, constant)
            name = f"fixed {order}{' constant' if constant else ''}"
            calls[name] = lambda f=f: f(args)
    medians = {
        k: float(np.median(v)) for k, v in alternating_times(calls, repeats).items()
    }
    per_step = {k: v / steps for k, v in medians.items() if k != "adaptive"}
    per_step["adaptive"] = medians["adaptive"] / adaptive_steps
    return dict(
        rtol=rtol,
        fixed_steps=steps,
        adaptive_steps=adaptive_steps,
        per_step=per_step,
        window_share=1 - per_step["fixed 28 constant"] / per_step["fixed 28"],
    )


def bench_sweep(sweep, rtols, repeats, orders, extra=None) -> dict:
    print(f"\n== {sweep.name}: {len(sweep.params)} elements", flush=True)
    clock = Stopwatch()
    reference = sweep.reference()
    print(f"reference (scipy DOP853, rtol 1e-13): {clock.seconds:.1f} s")
    methods = {
        "hierax": ladder_calls(sweep.hierax_one),
        "dopri8": ladder_calls(sweep.diffrax_one),
    }
    if extra is not None:
        methods.update(extra)
    ladder = run_ladder(methods, sweep.params, reference, rtols, repeats, sweep_error)
    print_ladder(ladder)
    targets = {name: at_targets(points, TARGETS) for name, points in ladder.items()}
    for target in TARGETS:
        key = f"{target:.0e}"
        at = {n: t[key]["seconds"] for n, t in targets.items()}
        text = ", ".join(
            f"{n} {'-' if s is None else f'{s * 1e3:.2f} ms'}" for n, s in at.items()
        )
        ratio = (
            at["dopri8"] / at["hierax"]
            if at.get("dopri8") and at.get("hierax")
            else None
        )
        print(
            f"at error {key}: {text}"
            + ("" if ratio is None else f"; hierax speed / Dopri8 = {ratio:.2f}x")
        )
    # Orders: hierax's step count and time at the same ladder.
    by_order = {}
    for order in orders:
        f = jax.jit(
            jax.vmap(
                lambda p, rtol, order=order: sweep.hierax_one(rtol, order)(p),
                in_axes=(0, None),
            )
        )
        by_order[order] = run_ladder(
            {f"order {order}": f}, sweep.params, reference, rtols, repeats, sweep_error
        )[f"order {order}"]
        print(
            f"hierax order {order}: " + describe(at_targets(by_order[order], TARGETS))
        )
    # Per-step cost and op counts at rtol 1e-8.
    rtol = 1e-8
    steps = {
        "hierax": per_step(
            methods["hierax"],
            lambda p, r: sweep.hierax_one(r)(p),
            sweep.params,
            rtol,
            repeats,
        ),
        "dopri8": per_step(
            methods["dopri8"],
            lambda p, r: sweep.diffrax_one(r)(p),
            sweep.params,
            rtol,
            repeats,
        ),
    }
    for name, s in steps.items():
        print(
            f"{name} per step at rtol 1e-8: batch {s['batch_per_step'] * 1e6:.1f} us "
            f"({s['batch_per_element_step'] * 1e6:.2f} us an element), one element "
            f"{s['single_per_step'] * 1e6:.1f} us ({s['single_steps']:.0f} steps)"
        )
    args = (jnp.asarray(sweep.params), jnp.asarray(rtol))
    ops = {name: op_counts(f, *args) for name, f in methods.items()}
    for name, c in ops.items():
        print(f"{name} ops: jaxpr {c['jaxpr']}; HLO {c['hlo']}")
    return dict(
        elements=len(sweep.params),
        ladder=ladder,
        targets=targets,
        orders={str(k): v for k, v in by_order.items()},
        per_step=steps,
        ops=ops,
    )


# --- first call in a fresh process --------------------------------------------------

FIRST_CALL = """
import sys
sys.path.insert(0, {here!r})
from timing import Stopwatch, compile_phases, time_call
import jax
jax.config.update("jax_enable_x64", True)
clock = Stopwatch()
import jax.numpy as jnp
from sweeps import QubitSweep
sweep = QubitSweep()
params = jnp.asarray(sweep.params)
imported = clock.seconds
first = jax.jit(jax.vmap(sweep.{method}(1e-8)))
lower_1, build_1, compiled = compile_phases(first, (params,))
run_1, _ = time_call(compiled, params)
again = jax.jit(jax.vmap(sweep.{method}(1e-8 * 1.0001)))
lower, build, compiled = compile_phases(again, (params,))
run, _ = time_call(compiled, params)
print(imported, lower_1 + build_1 + run_1, lower_1, build_1, run_1, lower, build, run)
"""

PHASES = (
    "imports",
    "first_call",
    "first_trace_lower",
    "first_compile",
    "first_run",
    "trace_lower",
    "compile",
    "run",
)


def first_calls(repeats: int) -> dict:
    """The first call in a fresh process, after the imports (those of the sweep's
    module: hierax, diffrax, scipy; `timing` and so JAX before the clock starts),
    in its phases (trace and lowering, XLA compile, run: `timing.compile_phases`);
    then, in the same process, a second program of the same kind (a new closure),
    in the same phases (the first call's caches warm)."""
    here = os.path.dirname(os.path.abspath(__file__))
    out: dict[str, dict[str, Any]] = {
        m: {p: [] for p in PHASES} for m in ("hierax", "dopri8")
    }
    for _ in range(repeats):
        for name, method in (("hierax", "hierax_one"), ("dopri8", "diffrax_one")):
            code = FIRST_CALL.format(here=here, method=method)
            done = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            )
            values = map(float, done.stdout.split()[-len(PHASES) :])
            for phase, value in zip(PHASES, values, strict=True):
                out[name][phase].append(value)
    for name, r in out.items():
        r["median"] = {p: statistics.median(r[p]) for p in PHASES}
        m = r["median"]
        print(
            f"first call, fresh process, {name}: {m['first_call']:.2f} s = trace and "
            f"lower {m['first_trace_lower']:.2f} s + compile {m['first_compile']:.2f}"
            f" s + run {m['first_run'] * 1e3:.1f} ms (imports {m['imports']:.2f} s); "
            f"a second program: {m['trace_lower']:.2f} s + {m['compile']:.2f} s + "
            f"{m['run'] * 1e3:.1f} ms"
        )
    return out


def result_rows(results: dict) -> list:
    """The headline numbers as the runner's rows: time and steps at each target
    error, time per step batched and alone, and the first call."""
    out = []
    for case in ("qubit", "rabi", "states"):
        if case not in results:
            continue
        sweep = results[case]
        name = f"{case} sweep ({sweep['elements']} under vmap)"
        for method, targets in sweep["targets"].items():
            for key, value in targets.items():
                met = value["loosest_met"]
                out.append(row(name, method, "seconds", value["seconds"], error=key))
                steps = None if met is None else met["steps"]["max"]
                out.append(row(name, method, "steps", steps, error=key))
        for method, s in sweep["per_step"].items():
            for metric in ("batch_per_step", "single_per_step"):
                out.append(row(name, method, metric, s[metric], "s"))
    for method, r in results.get("first_call", {}).items():
        out.append(
            row(
                "qubit sweep, fresh process",
                method,
                "first_call_seconds",
                r["median"]["first_call"],
            )
        )
    return out


def main():
    parser = argparse.ArgumentParser(description="hierax and Dopri8 sweeps under vmap")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--skip-first-call", action="store_true")
    ns = parser.parse_args()
    warm_up()
    load = [list(os.getloadavg())]
    print(f"load before: {load[0]}")
    if ns.quick:
        rtols, repeats, orders = [1e-4, 1e-6, 1e-8, 1e-10, 1e-12], 3, (14,)
    else:
        rtols = [10.0**-k for k in range(3, 14)]
        repeats, orders = 7, (8, 10, 12, 14, 16, 20)
    results = {
        "quick": ns.quick,
        "jax": jax.__version__,
        "diffrax": diffrax.__version__,
    }
    qubit = QubitSweep()
    results["qubit"] = bench_sweep(qubit, rtols, repeats, orders)
    w = window_cost(qubit, ladder_calls(qubit.hierax_one), 1e-8, 3 * repeats)
    results["qubit"]["window"] = w
    print(
        "hierax batched step, fixed steps: "
        + ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in w["per_step"].items())
        + f"; the Cauchy product over the pulse's series: {w['window_share']:.0%} of"
        " a step at order 28"
    )
    load.append(list(os.getloadavg()))
    results["rabi"] = bench_sweep(RabiSweep(), rtols, repeats, ())
    load.append(list(os.getloadavg()))
    states = StatesSweep(count=16 if ns.quick else 64)
    columns = jax.jit(lambda p, rtol: states.hierax_columns(rtol)(p), static_argnums=())
    results["states"] = bench_sweep(
        states,
        rtols[1:-1] if ns.quick else rtols,
        repeats,
        () if ns.quick else (14, 20),
        extra={"hierax columns": columns},
    )
    load.append(list(os.getloadavg()))
    if not ns.skip_first_call:
        results["first_call"] = first_calls(1 if ns.quick else 3)
    load.append(list(os.getloadavg()))
    results["load"] = load
    emit(result_rows(results))
    save(results, ns.out)


if __name__ == "__main__":
    main()
