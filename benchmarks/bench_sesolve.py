"""`hierax.sesolve` against diffrax, QuTiP and dynamiqs at matched final error.

    .venv/bin/python benchmarks/bench_sesolve.py [--quick] [--out PATH] [--plot PNG]

Three systems, dense matrices for every method, float64/complex128:

- a driven transmon, 4 levels in the lab frame (5 GHz, anharmonicity -300 MHz,
  a 50 MHz drive at the qubit frequency), over 2394 carrier periods (`--quick`: 240);
- a 5-qubit Ising chain $\\sum Z_k Z_{k+1} + h(t) \\sum X_k$ with
  $h(t) = 1 + 0.5 \\sin 2t$, over $T = 50\\pi$ (`--quick`: $5\\pi$);
- the same chain of 10 qubits (n = 1024, dense), over $T = \\pi / 2$
  (`--quick`: $\\pi / 8$).

The reference final state is hierax itself with fixed steps short enough that each
step's series converges far below rounding ($\\|H_0\\| dt \\le 1$, order 30); its
distance to diffrax Dopri8 and QuTiP vern9 at rtol 1e-14 is printed. (On the
transmon, QuTiP vern9 at 1e-14 sits 3.5e-10 from both hierax and Dopri8, which
agree to 1e-12: a lab-frame phase of 2e4 rad at relative accuracy 1e-14.)

For each method a ladder of tolerances (half decades; whole decades on the
10-qubit chain) is run once, each point timed after a first call for the JAX
methods (a new tolerance may recompile); these points are the work-precision plot.
At each target final error (1e-6 and 1e-10) the loosest tolerance that meets it is
timed again: the median of several calls, side by side in one process. A JAX
method's compile time is its first call minus a run. Ratios are run time over
hierax's. The machine load (`uptime`) is printed before and after.

A second table prices diffrax's machinery: `sesolve` with a fixed step against the
same Taylor steps in a bare `lax.scan` (the 30-line loop of issue 10), per step.
"""

import argparse
import json
import subprocess
import sys
import warnings

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("bench_sesolve.py")

import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from rows import emit, row  # noqa: E402
from timing import first_and_median, median_time, timed  # noqa: E402
from work_precision import (  # noqa: E402
    COARSE_LADDER,
    LADDER,
    TARGETS,
    at_plateau,
    coefficient_hierax,
    coefficient_jnp,
    coefficient_np,
    ising,
    ladder_rows,
    plot,
    transmon,
)

import hierax  # noqa: E402


sesolve = hierax.sesolve
SchrodingerTerm = hierax.SchrodingerTerm

warnings.filterwarnings("ignore", message="Complex dtype support")

# --- the methods: each returns (solve(tol) -> final state, is_jax) ----------------


def method_hierax(system):
    hamiltonian = hierax.TimeOperator(
        [hierax.Constant(1.0), coefficient_hierax(system["f"])],
        [system["h0"], system["h1"]],
    )
    state = jnp.asarray(system["state"])
    times = jnp.array([0.0, system["span"]])

    def solve(tol):
        return sesolve(
            hamiltonian, state, times, rtol=tol, atol=tol * 1e-2, max_steps=10**6
        ).final_state

    return solve


def method_diffrax(system, solver):
    h0, h1 = jnp.asarray(system["h0"]), jnp.asarray(system["h1"])
    f = coefficient_jnp(system["f"])
    term = diffrax.ODETerm(lambda t, y, args: -1j * ((h0 + f(t) * h1) @ y))

    @jax.jit
    def run(state, rtol, atol):
        return diffrax.diffeqsolve(
            term,
            solver,
            0.0,
            system["span"],
            None,
            state,
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            max_steps=10**7,
        ).ys[-1]  # pyright: ignore[reportOptionalSubscript]

    state = jnp.asarray(system["state"])
    return lambda tol: run(state, tol, tol * 1e-2)


def method_qutip(system, name):
    import qutip

    h = qutip.QobjEvo(
        [
            qutip.Qobj(system["h0"]),
            [qutip.Qobj(system["h1"]), coefficient_np(system["f"])],
        ]
    )
    psi = qutip.Qobj(system["state"].reshape(-1, 1))

    def solve(tol):
        out = qutip.sesolve(
            h,
            psi,
            [0.0, system["span"]],
            options=dict(method=name, rtol=tol, atol=tol * 1e-2, nsteps=10**8),
        )
        return out.states[-1].full().reshape(-1)

    return solve


def method_dynamiqs(system, name):
    import dynamiqs as dq
    import dynamiqs.method as dq_method

    dq.set_precision("double")
    f = coefficient_jnp(system["f"])
    h = dq.constant(jnp.asarray(system["h0"])) + dq.modulated(
        f, jnp.asarray(system["h1"])
    )
    state = jnp.asarray(system["state"]).reshape(-1, 1)
    solver = {"dopri8": dq_method.Dopri8, "tsit5": dq_method.Tsit5}[name]

    def solve(tol):
        out = dq.sesolve(
            h,
            state,
            jnp.array([0.0, system["span"]]),
            method=solver(rtol=tol, atol=tol * 1e-2, max_steps=10**7),
            progress_meter=False,
        )
        return jnp.asarray(out.final_state.to_jax()).reshape(-1)

    return solve


METHODS = {
    "hierax Taylor": lambda s: method_hierax(s),
    "diffrax Dopri8": lambda s: method_diffrax(s, diffrax.Dopri8()),
    "diffrax Tsit5": lambda s: method_diffrax(s, diffrax.Tsit5()),
    "QuTiP vern9": lambda s: method_qutip(s, "vern9"),
    "QuTiP adams": lambda s: method_qutip(s, "adams"),
    "dynamiqs Dopri8": lambda s: method_dynamiqs(s, "dopri8"),
    "dynamiqs Tsit5": lambda s: method_dynamiqs(s, "tsit5"),
}


# --- measurement -----------------------------------------------------------------


def error(state, reference):
    return float(np.linalg.norm(np.asarray(state).reshape(-1) - reference))


def converged_reference(system, order=30):
    """hierax with fixed steps of x = |H_0| dt <= 1 (the trace of H's constant part
    removed) at order 30: each step's series is converged far below rounding, and
    the terms never exceed the state, so what is left is N e eps of rounding."""
    hamiltonian = hierax.TimeOperator(
        [hierax.Constant(1.0), coefficient_hierax(system["f"])],
        [system["h0"], system["h1"]],
    )
    h0 = system["h0"] - np.trace(system["h0"]) / len(system["h0"]) * np.eye(
        len(system["h0"])
    )
    size = np.linalg.norm(h0, 2) + np.linalg.norm(system["h1"], 2) * 1.5
    steps = int(np.ceil(system["span"] * size))
    return np.asarray(
        sesolve(
            hamiltonian,
            jnp.asarray(system["state"]),
            jnp.array([0.0, system["span"]]),
            dt=system["span"] / steps,
            order=order,
            max_steps=steps + 1,
        ).final_state
    )


def bench_system(system, methods, budget, slow_limit):
    reference = converged_reference(system)
    spreads = {}
    if not system.get("large"):
        spreads = {
            name: error(np.asarray(solve(1e-14)), reference)
            for name, solve in [
                ("diffrax Dopri8 1e-14", method_diffrax(system, diffrax.Dopri8())),
                ("QuTiP vern9 1e-14", method_qutip(system, "vern9")),
            ]
        }
    distances = spreads or "(not computed on a large system)"
    print(
        f"\n## {system['name']}: reference = hierax, fixed steps with |H_0| dt <= 1 "
        f"at order 30; its distance to {distances}",
        flush=True,
    )
    rows = []
    ladders = {}
    for name in methods:
        try:
            solve = METHODS[name](system)
        except ImportError as e:
            print(f"{name}: not installed ({e})")
            continue
        is_jax = name.split()[0] in ("hierax", "diffrax", "dynamiqs")
        ladder = []
        compile_time = None
        for tol in COARSE_LADDER if system.get("large") else LADDER:
            seconds, out = timed(solve, tol)
            if is_jax:
                # The first call at a tolerance may compile (hierax's order follows
                # the tolerance); time a second one.
                first = seconds
                seconds, out = timed(solve, tol)
                if compile_time is None:
                    compile_time = first - seconds
            err = error(out, reference)
            ladder.append(dict(tol=tol, error=err, seconds=seconds))
            plateau = at_plateau([r["error"] for r in ladder])
            if err < min(TARGETS) / 10 or seconds > slow_limit or plateau:
                break
        ladders[name] = ladder
        for target in TARGETS:
            met = [r for r in ladder if r["error"] <= target]
            if not met:
                rows.append(dict(method=name, target=target, tol=None))
                continue
            best = met[0]
            seconds = median_time(
                solve, (best["tol"],), 3, warm=False, budgets=((21, budget),)
            )
            rows.append(
                dict(
                    method=name,
                    target=target,
                    tol=best["tol"],
                    error=best["error"],
                    seconds=seconds,
                    compile=compile_time,
                )
            )
        points = ", ".join(
            "({tol:.1e}, {error:.1e}, {seconds:.4f})".format(**r) for r in ladder
        )
        print(f"  {name}: ladder (tol, error, s) {points}", flush=True)
    for target in TARGETS:
        ours = next(
            (
                r["seconds"]
                for r in rows
                if r["method"] == "hierax Taylor"
                and r["target"] == target
                and r.get("tol")
            ),
            None,
        )
        print(f"\n### {system['name']}, final error <= {target:.0e}")
        print("| method | tol | final error | run time (median) | ratio | compile |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            if r["target"] != target:
                continue
            if r["tol"] is None:
                print(f"| {r['method']} | - | not reached | - | - | - |")
                continue
            ratio = f"{r['seconds'] / ours:.2f}" if ours else "-"
            comp = f"{r['compile']:.2f} s" if r.get("compile") is not None else "-"
            print(
                f"| {r['method']} | {r['tol']:.0e} | {r['error']:.1e} | "
                f"{r['seconds'] * 1e3:.1f} ms | {ratio} | {comp} |",
                flush=True,
            )
    return dict(
        system=system["name"], rows=rows, ladders=ladders, reference_spreads=spreads
    )


def bench_compile(system, orders=(10, 20, 30, 60)):
    """Compile time (first call minus a run) of `sesolve` at several orders and of
    diffrax Dopri8, each a fresh compile, side by side."""
    hamiltonian = hierax.TimeOperator(
        [hierax.Constant(1.0), coefficient_hierax(system["f"])],
        [system["h0"], system["h1"]],
    )
    # One state as a column, a structure the ladders did not compile, so that each
    # order compiles afresh.
    state = jnp.asarray(system["state"])[:, None]
    times = jnp.array([0.0, system["span"]])
    out = {}
    for order in orders:
        # The tolerance is traced; the order is static, so each order compiles.
        def solve(order=order):
            return sesolve(
                hamiltonian, state, times, rtol=1e-8, order=order, max_steps=10**6
            ).states

        first, _ = timed(solve)
        run, _ = timed(solve)
        out[f"hierax order {order}"] = first - run
    dopri = method_diffrax(
        dict(system, state=system["state"][:, None]), diffrax.Dopri8()
    )
    first, _ = timed(dopri, 1e-8)
    run, _ = timed(dopri, 1e-8)
    out["diffrax Dopri8"] = first - run
    print(
        f"\n### compile time (first call minus a run), {system['name']}\n"
        + " | ".join(f"{k}: {v:.2f} s" for k, v in out.items()),
        flush=True,
    )
    return out


def bench_machinery(system, order=24):
    """diffrax's cost per step: `sesolve` with fixed steps against a bare scan of
    the same Taylor steps (the solver's own kernel, the term's `taylor_terms`;
    steps short enough, |H| dt <= 2, that the series converges)."""
    hamiltonian = hierax.TimeOperator(
        [hierax.Constant(1.0), coefficient_hierax(system["f"])],
        [system["h0"], system["h1"]],
    )
    state = jnp.asarray(system["state"])
    span = system["span"]
    h0 = system["h0"] - np.trace(system["h0"]) / len(system["h0"]) * np.eye(
        len(system["h0"])
    )
    size = np.linalg.norm(h0, 2) + 1.5 * np.linalg.norm(system["h1"], 2)
    steps = max(2000, int(np.ceil(span * size / 2)))
    dt = span / steps
    times = jnp.array([0.0, span])
    # The kernel and energy shift that sesolve's solver steps with.
    term = SchrodingerTerm(hamiltonian)

    @jax.jit
    def scan_loop(state):
        def body(y, k):
            v, phase = term.taylor_terms(k * dt, jnp.asarray(dt), y, order, None)
            return jnp.exp(phase) * jnp.sum(v, axis=0), None

        return jax.lax.scan(body, state, jnp.arange(steps))[0]

    def fixed(state):
        return sesolve(
            hamiltonian, state, times, dt=dt * (1 + 1e-12), order=order, max_steps=steps
        ).final_state

    # A first call each (it compiles), then one more (discarded) and five timed.
    timed(scan_loop, state)
    timed(fixed, state)
    t_scan = first_and_median(scan_loop, (state,), 5)[1]
    t_fixed = first_and_median(fixed, (state,), 5)[1]
    print(
        f"\n### diffrax machinery, {system['name']}, order {order}, {steps} steps\n"
        f"bare lax.scan: {t_scan / steps * 1e6:.1f} us/step; sesolve(dt=...): "
        f"{t_fixed / steps * 1e6:.1f} us/step; diffrax adds "
        f"{(t_fixed - t_scan) / steps * 1e6:.1f} us/step ({t_fixed / t_scan:.2f}x)",
        flush=True,
    )
    return dict(system=system["name"], scan=t_scan / steps, sesolve=t_fixed / steps)


def result_rows(results, machinery, compiles) -> list[dict]:
    """The run as result rows: at each system and target error, each method's run
    time, tolerance and final error, and its compile time; diffrax's cost per
    step; the compile time by order."""
    out = ladder_rows(results)
    for m in machinery:
        for method, key in (("bare lax.scan", "scan"), ("sesolve(dt=...)", "sesolve")):
            out.append(row(m["system"], method, "seconds_per_step", m[key], "s"))
    for name, seconds in compiles.items():
        out.append(
            row("ising compile, first call minus a run", name, "seconds", seconds)
        )
    return out


DEFAULT_METHODS = (
    "hierax Taylor",
    "diffrax Dopri8",
    "QuTiP vern9",
    "QuTiP adams",
    "dynamiqs Dopri8",
)
SYSTEMS = {
    "transmon": transmon,
    "ising": ising,
    "ising10": lambda quick: ising(quick, sites=10),
}


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short spans")
    parser.add_argument("--out", default=None, help="write the results as JSON")
    parser.add_argument("--plot", default=None, help="write the work-precision PNG")
    parser.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        help=f"comma-separated subset of {', '.join(METHODS)}",
    )
    parser.add_argument("--systems", default="transmon,ising,ising10")
    args = parser.parse_args()
    load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout
    print(
        f"# bench_sesolve {'(quick)' if args.quick else ''}\nload before: {load_before}"
    )
    methods = args.methods.split(",")
    budget = 2.0 if args.quick else 6.0
    slow_limit = 30.0 if args.quick else 60.0
    results = []
    machinery = []
    compiles = {}
    for key in args.systems.split(","):
        system = SYSTEMS[key](args.quick)
        results.append(bench_system(system, methods, budget, slow_limit))
        if not system.get("large"):
            machinery.append(bench_machinery(system))
        if key == "ising":
            compiles = bench_compile(system)
    load_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout
    print(f"\nload after: {load_after}")
    if args.plot:
        plot(
            results,
            args.plot,
            f"sesolve work-precision (x64, CPU{', quick' if args.quick else ''}); "
            f"load {load_before.split('load')[-1].strip()}",
        )
    emit(result_rows(results, machinery, compiles))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(
                    results=results,
                    machinery=machinery,
                    compile=compiles,
                    load=[load_before, load_after],
                    quick=args.quick,
                    python=sys.version,
                    jax=jax.__version__,
                ),
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
