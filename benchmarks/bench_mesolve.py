"""`hierax.mesolve` against QuTiP, dynamiqs and diffrax at matched final error, and
the cost of the Lindblad hierarchies.

    .venv/bin/python benchmarks/bench_mesolve.py [--quick] [--out PATH] [--plot PNG]

Two open systems, float64/complex128:

- a driven transmon, 4 levels in the lab frame (as in `bench_sesolve.py`) with
  T1 = 200 ns and pure dephasing T_phi = 300 ns (jump operators
  $\\sqrt{1/T_1}\\, a$ and $\\sqrt{2/T_\\phi}\\, a^\\dagger a$), over 600 carrier
  periods (`--quick`: 120);
- a 6-qubit Ising chain (n = 64) $\\sum Z_k Z_{k+1} + h(t) \\sum X_k$,
  $h(t) = 1 + 0.5 \\sin 2t$, with dephasing $\\sqrt{0.05}\\, Z_k$ on every site,
  over $T = 2\\pi$ (`--quick`: $\\pi / 2$).

Peers: QuTiP `mesolve` (adams, vern9; its Liouvillian in QuTiP's default sparse
format, its fastest), dynamiqs `mesolve` (Dopri8) and diffrax Dopri8 on the master
equation as an ODE for rho (the vector field as matrix products, the Liouvillian
never formed). The reference final state is hierax `mesolve` with fixed steps short
enough that each step's series converges far below rounding; its distance to diffrax
Dopri8 at rtol 1e-13 is printed. Errors are Frobenius norms of the final rho's
difference. Ladders, medians, ratios and compile times as in `bench_sesolve.py`.

The hierarchies: compile time (first call minus a run) of
`hierax.LindbladHierarchy` and `hierax.DensityMatrixDerivatives` at orders 10 and
100; and at n = 32, order 20, a two-term H and three jump operators (one
time-dependent), the run time in matrix-product equivalents (the time of one
n x n complex128 product measured in the same run) against the count in the
algorithms' docstrings.
"""

import argparse
import json
import statistics
import subprocess
import sys
import warnings
from typing import Any

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("bench_mesolve.py")

import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from rows import emit, row  # noqa: E402
from timing import alternating_times, median_time, timed  # noqa: E402
from work_precision import (  # noqa: E402
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


warnings.filterwarnings("ignore", message="Complex dtype support")


# --- the systems -----------------------------------------------------------------


def open_transmon(quick):
    system: dict[str, Any] = dict(transmon(quick))
    periods = 120 if quick else 600
    omega = 2 * np.pi * 5.0
    levels = len(system["h0"])
    a = np.diag(np.sqrt(np.arange(1, levels)), 1).astype(complex)
    t1, tphi = 200.0, 300.0
    system.update(
        name=f"transmon-4, T1/T2 ({periods} periods)",
        span=periods * 2 * np.pi / omega,
        jumps=[np.sqrt(1 / t1) * a, np.sqrt(2 / tphi) * (a.conj().T @ a)],
        rho=np.outer(system["state"], system["state"].conj()),
    )
    return system


def dephasing_ising(quick, sites=6):
    system: dict[str, Any] = dict(ising(quick, sites))
    sz = np.diag([1.0, -1.0]).astype(complex)

    def at(op, k):
        out = np.eye(1)
        for j in range(sites):
            out = np.kron(out, op if j == k else np.eye(2))
        return out.astype(complex)

    span, label = (np.pi / 2, "pi/2") if quick else (2 * np.pi, "2 pi")
    system.update(
        name=f"ising-{sites}, dephasing (T = {label})",
        span=span,
        jumps=[np.sqrt(0.05) * at(sz, k) for k in range(sites)],
        rho=np.outer(system["state"], system["state"].conj()),
    )
    return system


def hamiltonian_hierax(system):
    return hierax.TimeOperator(
        [hierax.Constant(1.0), coefficient_hierax(system["f"])],
        [system["h0"], system["h1"]],
    )


# --- the methods: each returns solve(tol) -> final rho ------------------------------


def method_hierax(system):
    hamiltonian = hamiltonian_hierax(system)
    jumps = [jnp.asarray(j) for j in system["jumps"]]
    rho = jnp.asarray(system["rho"])
    times = jnp.array([0.0, system["span"]])

    def solve(tol):
        return hierax.mesolve(
            hamiltonian, jumps, rho, times, rtol=tol, atol=tol * 1e-2, max_steps=10**6
        ).final_state

    return solve


def method_diffrax(system, solver=None):
    solver = diffrax.Dopri8() if solver is None else solver
    h0, h1 = jnp.asarray(system["h0"]), jnp.asarray(system["h1"])
    f = coefficient_jnp(system["f"])
    jumps = jnp.stack([jnp.asarray(j) for j in system["jumps"]])
    adjoints = jnp.conj(jnp.swapaxes(jumps, -1, -2))
    number = jnp.einsum("jab,jbc->ac", adjoints, jumps)

    def vector_field(t, rho, args):
        del args
        h = h0 + f(t) * h1
        out = -1j * (h @ rho - rho @ h) - 0.5 * (number @ rho + rho @ number)
        return out + jnp.einsum("jab,bc,jcd->ad", jumps, rho, adjoints)

    term = diffrax.ODETerm(vector_field)

    @jax.jit
    def run(rho, rtol, atol):
        return diffrax.diffeqsolve(
            term,
            solver,
            0.0,
            system["span"],
            None,
            rho,
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            max_steps=10**7,
        ).ys[-1]  # pyright: ignore[reportOptionalSubscript]

    rho = jnp.asarray(system["rho"])
    return lambda tol: run(rho, tol, tol * 1e-2)


def method_qutip(system, name):
    import qutip

    h = qutip.QobjEvo(
        [
            qutip.Qobj(system["h0"]).to("CSR"),
            [qutip.Qobj(system["h1"]).to("CSR"), coefficient_np(system["f"])],
        ]
    )
    jumps = [qutip.Qobj(j).to("CSR") for j in system["jumps"]]
    rho = qutip.Qobj(system["rho"])

    def solve(tol):
        out = qutip.mesolve(
            h,
            rho,
            [0.0, system["span"]],
            c_ops=jumps,
            options=dict(method=name, rtol=tol, atol=tol * 1e-2, nsteps=10**8),
        )
        return out.states[-1].full()

    return solve


def method_dynamiqs(system):
    import dynamiqs as dq
    import dynamiqs.method as dq_method

    dq.set_precision("double")
    f = coefficient_jnp(system["f"])
    h = dq.constant(jnp.asarray(system["h0"])) + dq.modulated(
        f, jnp.asarray(system["h1"])
    )
    jumps: list[Any] = [jnp.asarray(j) for j in system["jumps"]]
    rho = jnp.asarray(system["rho"])

    def solve(tol):
        out = dq.mesolve(
            h,
            jumps,
            rho,
            jnp.array([0.0, system["span"]]),
            method=dq_method.Dopri8(rtol=tol, atol=tol * 1e-2, max_steps=10**7),
            progress_meter=False,
        )
        return jnp.asarray(out.final_state.to_jax())

    return solve


METHODS = {
    "hierax Taylor": method_hierax,
    "diffrax Dopri8": method_diffrax,
    "QuTiP vern9": lambda s: method_qutip(s, "vern9"),
    "QuTiP adams": lambda s: method_qutip(s, "adams"),
    "dynamiqs Dopri8": method_dynamiqs,
}


# --- measurement -----------------------------------------------------------------


def error(rho, reference):
    return float(np.linalg.norm(np.asarray(rho) - reference))


def converged_reference(system, order=30):
    """hierax `mesolve` with fixed steps of x = |L| dt <= 1 at order 30 (|L| the
    size bound of the generator: twice |H_0| plus twice the jump operators' squared
    norms, H's trace part removed)."""
    h0 = system["h0"] - np.trace(system["h0"]) / len(system["h0"]) * np.eye(
        len(system["h0"])
    )
    size = 2 * (np.linalg.norm(h0, 2) + 1.5 * np.linalg.norm(system["h1"], 2))
    size += 2 * sum(np.linalg.norm(j, 2) ** 2 for j in system["jumps"])
    steps = int(np.ceil(system["span"] * size))
    return np.asarray(
        hierax.mesolve(
            hamiltonian_hierax(system),
            [jnp.asarray(j) for j in system["jumps"]],
            jnp.asarray(system["rho"]),
            jnp.array([0.0, system["span"]]),
            dt=system["span"] / steps,
            order=order,
            max_steps=steps + 1,
        ).final_state
    )


def bench_system(system, methods, budget, slow_limit):
    reference = converged_reference(system)
    spread = error(np.asarray(method_diffrax(system)(1e-13)), reference)
    print(
        f"\n## {system['name']}: reference = hierax, fixed steps with |L| dt <= 1 at "
        f"order 30; its distance to diffrax Dopri8 at rtol 1e-13: {spread:.1e}",
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
        for tol in LADDER:
            seconds, out = timed(solve, tol)
            if is_jax:
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
        points = ", ".join(
            "({tol:.1e}, {error:.1e}, {seconds:.4f})".format(**r) for r in ladder
        )
        print(f"  {name}: ladder (tol, error, s) {points}", flush=True)
        for target in TARGETS:
            met = [r for r in ladder if r["error"] <= target]
            if not met:
                rows.append(dict(method=name, target=target, tol=None))
                continue
            best = met[0]
            rows.append(
                dict(
                    method=name,
                    target=target,
                    tol=best["tol"],
                    error=best["error"],
                    seconds=median_time(
                        solve, (best["tol"],), 3, warm=False, budgets=((21, budget),)
                    ),
                    compile=compile_time,
                )
            )
    for target in TARGETS:
        ours = next(
            (
                r["seconds"]
                for r in rows
                if r["method"] == "hierax Taylor" and r["target"] == target and r["tol"]
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
    return dict(system=system["name"], rows=rows, ladders=ladders, spread=spread)


# --- the hierarchies ---------------------------------------------------------------


def hierarchy_system(n, seed=0):
    """A two-term H = cos(1.3t) A + sin(0.7t) B, three jump operators (a lowering
    operator, its adjoint, and a time-dependent dephasing), an observable C."""
    rng = np.random.default_rng(seed)

    def hermitian():
        m = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
        return (m + m.conj().T) / (2 * np.sqrt(n))

    lower = np.diag(np.sqrt(np.arange(1, n)), 1).astype(complex) / np.sqrt(n)
    hamiltonian = hierax.Cos(1.3) * jnp.asarray(hermitian()) + hierax.Sin(
        0.7
    ) * jnp.asarray(hermitian())
    jumps = [
        jnp.asarray(np.sqrt(0.1) * lower),
        jnp.asarray(np.sqrt(0.05) * lower.conj().T),
        hierax.Polynomial(jnp.array([0.2, 0.05]))
        * jnp.asarray(np.diag(np.linspace(-1, 1, n))),
    ]
    return hamiltonian, jumps, jnp.asarray(hermitian()), jnp.asarray(hermitian())


def hierarchy_calls(hamiltonian, jumps, observable, rho, order):
    return {
        "LindbladHierarchy": lambda: hierax.LindbladHierarchy(
            hamiltonian, jumps, observable, order
        )(0.3),
        "DensityMatrixDerivatives": lambda: hierax.DensityMatrixDerivatives(
            hamiltonian, jumps, order
        )(0.3, rho),
    }


def bench_hierarchy_compile(orders=(10, 100), sizes=(4, 5)):
    """First call minus a run, the least over two sizes (each a fresh compile), so
    that one burst of load on the shared machine does not decide a ratio."""
    out = {}
    for order in orders:
        for n in sizes:
            calls = hierarchy_calls(*hierarchy_system(n), order)
            for name, call in calls.items():
                first, _ = timed(call)
                run, _ = timed(call)
                key = f"{name} order {order}"
                out[key] = min(out.get(key, np.inf), first - run)
    print(
        f"\n### hierarchy compile (first call minus a run, least of n = {sizes})",
        flush=True,
    )
    for name in ("LindbladHierarchy", "DensityMatrixDerivatives"):
        c = [out[f"{name} order {k}"] for k in orders]
        print(
            f"{name}: "
            + ", ".join(f"order {k}: {v:.2f} s" for k, v in zip(orders, c))
            + f"; ratio {c[-1] / c[0]:.2f}"
        )
    return out


def bench_hierarchy_cost(n=32, order=20, calls=30):
    hamiltonian, jumps, observable, rho = hierarchy_system(n)
    a = jnp.asarray(np.random.default_rng(1).normal(size=(n, n)) + 0j) / n
    # The unit: one product inside a compiled loop (no dispatch), 100 per call.
    matmul = jax.jit(lambda x: jax.lax.fori_loop(0, 100, lambda i, y: y @ x, x))
    single = jax.jit(lambda x: x @ x)
    lindblad = hierax.LindbladHierarchy(hamiltonian, jumps, observable, order)
    density = hierax.DensityMatrixDerivatives(hamiltonian, jumps, order)
    fns = {
        "matmul": lambda: matmul(a),
        "single": lambda: single(a),
        "LindbladHierarchy": lambda: lindblad(0.3),
        "DensityMatrixDerivatives": lambda: density(0.3, rho),
    }
    # Interleaved rounds, so a load change hits all alike.
    samples = alternating_times(
        fns,
        5,
        warm=1,
        batch={k: calls * (10 if k in ("matmul", "single") else 1) for k in fns},
    )
    per_call = {k: float(statistics.median(v)) for k, v in samples.items()}
    per_call["matmul"] /= 100
    # The docstrings' counts: products per coefficient update (LindbladHierarchy:
    # one phase of K levels by K + 1 coefficients at this size, n^2 K^2 (n + K)
    # under 2^25, down to about 0.56 K^2 updates for large n K) and per order
    # (DensityMatrixDerivatives, K orders). H: two time-dependent terms;
    # N = sum L^+ L: one constant (merged) and one time-dependent term; jump
    # operators one term each; one product per term of H and N when the hierarchy
    # is Hermitian (as here), two otherwise.
    updates = order * (order + 1)
    h_and_n_terms = 2 + 2
    jump_terms = 3
    lindblad_low = (h_and_n_terms + 2 * jump_terms) * updates
    lindblad_high = (2 * h_and_n_terms + 2 * jump_terms) * updates
    density_count = (2 * h_and_n_terms + 2 * jump_terms) * order
    rows = {
        "LindbladHierarchy": (lindblad_low, lindblad_high),
        "DensityMatrixDerivatives": (density_count, density_count),
    }
    print(
        f"\n### hierarchy run time, n = {n}, order {order}, 3 jump operators; one "
        f"{n}x{n} complex128 matmul = {per_call['matmul'] * 1e6:.2f} us inside a "
        f"compiled loop ({per_call['single'] * 1e6:.1f} us as one jitted call)"
    )
    print("| hierarchy | per call | matmul-equivalents | algorithm's count | ratio |")
    print("|---|---:|---:|---:|---:|")
    out: dict[str, Any] = dict(matmul=per_call["matmul"], single=per_call["single"])
    for name, (low, high) in rows.items():
        equivalents = per_call[name] / per_call["matmul"]
        count = f"{low:.0f}" if low == high else f"{low:.0f}-{high:.0f}"
        print(
            f"| {name} | {per_call[name] * 1e3:.2f} ms | {equivalents:.0f} | {count} "
            f"| {equivalents / high:.2f}-{equivalents / low:.2f} |"
            if low != high
            else f"| {name} | {per_call[name] * 1e3:.2f} ms | {equivalents:.0f} | "
            f"{count} | {equivalents / low:.2f} |",
            flush=True,
        )
        out[name] = dict(seconds=per_call[name], equivalents=equivalents, count=count)
    return out


def result_rows(results, hierarchies) -> list[dict]:
    """The run as result rows: at each system and target error, each method's run
    time, tolerance and final error, and its compile time; the hierarchies'
    compile times and run times (also in matrix-product equivalents)."""
    out = ladder_rows(results)
    for key, seconds in hierarchies.get("compile", {}).items():
        name, order = key.split(" order ")
        out.append(
            row("hierarchy compile", name, "compile_seconds", seconds, order=int(order))
        )
    cost = hierarchies.get("cost", {})
    for name in ("LindbladHierarchy", "DensityMatrixDerivatives"):
        if name in cost:
            case = "hierarchy run time, n = 32, order 20"
            out.append(row(case, name, "seconds", cost[name]["seconds"]))
            equivalents = cost[name]["equivalents"]
            out.append(row(case, name, "matmul_equivalents", equivalents, ""))
    return out


DEFAULT_METHODS = tuple(METHODS)
SYSTEMS = {"transmon": open_transmon, "ising6": dephasing_ising}


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short spans")
    parser.add_argument("--out", default=None, help="write the results as JSON")
    parser.add_argument("--plot", default=None, help="write the work-precision PNG")
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument(
        "--skip-hierarchies", action="store_true", help="only the solves"
    )
    args = parser.parse_args()
    load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout
    print(
        f"# bench_mesolve {'(quick)' if args.quick else ''}\nload before: {load_before}"
    )
    methods = args.methods.split(",")
    budget = 2.0 if args.quick else 6.0
    slow_limit = 30.0 if args.quick else 60.0
    results = [
        bench_system(SYSTEMS[key](args.quick), methods, budget, slow_limit)
        for key in args.systems.split(",")
        if key
    ]
    hierarchies = {}
    if not args.skip_hierarchies:
        hierarchies = dict(
            compile=bench_hierarchy_compile(), cost=bench_hierarchy_cost()
        )
    load_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout
    print(f"\nload after: {load_after}")
    if args.plot and results:
        plot(
            results,
            args.plot,
            f"mesolve work-precision (x64, CPU{', quick' if args.quick else ''}); "
            f"load {load_before.split('load')[-1].strip()}",
        )
    emit(result_rows(results, hierarchies))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(
                    results=results,
                    hierarchies=hierarchies,
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
