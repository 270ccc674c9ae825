"""The held-back systems: `hierax.sesolve` and `hierax.mesolve` against diffrax,
QuTiP and dynamiqs on six systems the solvers were not tuned on.

    .venv/bin/python benchmarks/bench_systems.py [--quick] [--systems drag,xxz]
        [--methods ...] [--out results.json] [--plot work_precision.png]

The systems are in `systems.py` (a DRAG pulse on a qutrit, a lab-frame transmon
pair, STIRAP, a driven XXZ chain, the open transmon pair with four jump operators,
a random 16-level system with 12 drives), float64/complex128, dense matrices
except QuTiP's.

- Reference: scipy DOP853 on the real and imaginary parts at rtol 3e-14, atol
  1e-15 (at rtol = atol = 1e-13 it is 1.5e-11 off on the lab-frame pair); its
  distances to DOP853 at 1e-13 and to hierax at rtol 1e-13 are printed.
- Methods: hierax (`sesolve`, or `mesolve` for the open system; default order);
  diffrax Dopri8 written by hand on the real and imaginary parts (the generator
  and, for the open system, the vectorised Lindbladian as one real matrix per
  term, `diffrax.PIDController(rtol, atol)` with its defaults, i.e. an integral
  controller); QuTiP `sesolve`/`mesolve` with `method` 'vern9' and 'adams', the
  operators in CSR and the coefficients as strings (compiled by Cython when it is
  installed: QuTiP's fastest path; the run says whether they were); dynamiqs
  Dopri8 and Tsit5. Every method gets rtol = tol and atol = tol / 100.
- Ladder: tol from 1e-3 to 1e-13 in half decades (`--quick`: whole decades,
  shorter spans), each point the median of at least 3 calls after a first call
  (which compiles, for the JAX methods); a method's ladder stops below a tenth of
  the smallest target, at an error plateau, or when a call takes too long.
- Final error: the norm of the final state's (density matrix's) difference to the
  reference over the reference's norm. The run time at final errors 1e-6 and
  1e-10 is interpolated log-log between the two ladder points around the last
  crossing of the target (a ladder's errors are not always monotone; from the
  later point on, every tolerance measured met the target); `<=`: the loosest
  tolerance already met it.
- For hierax, at rtol 1e-8: the first solve in a fresh process (a subprocess
  running one solve; the wall time of the call, compile included; diffrax Dopri8
  beside it), the same solve inside a user's `jax.jit` of the drives' scale and
  the initial state (the tolerance a constant, and also an argument), and a call
  at a never-seen rtol (its time and the number of XLA compiles it triggered).

The load average is printed before and after each system.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from typing import Any

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("bench_systems.py")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from peers import diffrax_final, dynamiqs_final  # noqa: E402
from rows import emit, row  # noqa: E402
from systems import SYSTEMS, System  # noqa: E402
from timing import Stopwatch, median_time, time_at, timed  # noqa: E402
from work_precision import at_plateau  # noqa: E402

import hierax  # noqa: E402


warnings.filterwarnings("ignore", message="Complex dtype support")

TARGETS = (1e-6, 1e-10)
LADDER = tuple(10.0 ** -(k / 2) for k in range(6, 27))
QUICK_LADDER = tuple(10.0**-k for k in range(3, 14))
PROBE_TOL = 1e-8
NEW_RTOL = 2.7e-9  # in neither ladder
# DOP853 at rtol = atol = 1e-13 sits 1.5e-11 from this on the lab-frame pair (10
# ns), where hierax and DOP853 at these tolerances agree to 2e-13.
REFERENCE_TOLS = (3e-14, 1e-15)


# --- the methods: each gives solve(tol) -> final state ------------------------------


def method_hierax(system: System, order: int | None = None):
    hamiltonian = system.hamiltonian()
    times = jnp.asarray(system.times)

    def settings(tol):
        return dict(rtol=tol, atol=tol * 1e-2, order=order, max_steps=10**6)

    if system.is_open:
        jumps = [jnp.asarray(j) for j in system.jumps]
        rho = jnp.asarray(system.rho())

        def solve(tol):
            return hierax.mesolve(
                hamiltonian, jumps, rho, times, **settings(tol)
            ).final_state

    else:
        psi = jnp.asarray(system.state)

        def solve(tol):
            return hierax.sesolve(hamiltonian, psi, times, **settings(tol)).final_state

    return solve


def hierax_in_jit(system: System, traced_tol: bool = False, jnp_matrices=False):
    """The solve inside a user's `jax.jit` of the drives' scale and the initial
    state (nothing of them folded into the program), the tolerance a constant as a
    user writes it, or with `traced_tol` an argument too. The system is built inside
    the jit from its NumPy matrices, or with `jnp_matrices` from `jnp.asarray` of
    them there (traced: hierax sees their shapes only)."""
    times = jnp.asarray(system.times)
    jumps = [jnp.asarray(j) for j in system.jumps]
    matrix = jnp.asarray if jnp_matrices else np.asarray

    def final(scale, y0, rtol):
        hamiltonian = system.hamiltonian(scale, matrix)
        if system.is_open:
            out = hierax.mesolve(
                hamiltonian, jumps, y0, times, rtol=rtol, atol=rtol * 1e-2
            )
        else:
            out = hierax.sesolve(hamiltonian, y0, times, rtol=rtol, atol=rtol * 1e-2)
        return out.final_state

    y0 = jnp.asarray(system.rho() if system.is_open else system.state)
    one = jnp.asarray(1.0)
    if traced_tol:
        jitted = jax.jit(final)
        return lambda tol: jitted(one, y0, jnp.asarray(tol))
    constant = jax.jit(final, static_argnums=2)
    return lambda tol: constant(one, y0, tol)


def method_diffrax(system: System, solver=None):
    # The complex final state formed inside the jit, as a user would write it (as
    # eager operations after the call it cost about 0.1-0.3 ms a solve).
    run = jax.jit(diffrax_final(system, solver))
    start = jnp.asarray(system.rho() if system.is_open else system.state)
    return lambda tol: run(start, tol, tol * 1e-2)


def qutip_compiled() -> bool:
    """Whether QuTiP compiles string coefficients (Cython present), else it falls
    back to Python's `eval` for each evaluation."""
    import qutip

    coefficient = qutip.coefficient("cos(t)")
    return type(coefficient).__name__ != "StrFunctionCoefficient"


def method_qutip(system: System, name: str):
    import qutip

    hamiltonian = qutip.QobjEvo(
        [qutip.Qobj(system.constant).to("CSR")]
        + [[qutip.Qobj(m).to("CSR"), c.string()] for c, m in system.drives]
    )
    tlist = list(system.times)

    def options(tol):
        return dict(method=name, rtol=tol, atol=tol * 1e-2, nsteps=10**8)

    jumps = [qutip.Qobj(j).to("CSR") for j in system.jumps]
    if system.is_open:
        start = qutip.Qobj(system.rho())
    else:
        start = qutip.Qobj(system.state.reshape(-1, 1))

    def solve(tol):
        if system.is_open:
            out = qutip.mesolve(
                hamiltonian, start, tlist, c_ops=jumps, options=options(tol)
            )
            return out.states[-1].full()
        out = qutip.sesolve(hamiltonian, start, tlist, options=options(tol))
        return out.states[-1].full().reshape(-1)

    return solve


def method_dynamiqs(system: System, name: str):
    final = dynamiqs_final(system, name, "double")
    start = jnp.asarray(system.rho() if system.is_open else system.state)
    return lambda tol: final(start, tol, tol * 1e-2)


METHODS = {
    "hierax": method_hierax,
    "diffrax Dopri8": method_diffrax,
    "QuTiP vern9": lambda s: method_qutip(s, "vern9"),
    "QuTiP adams": lambda s: method_qutip(s, "adams"),
    "dynamiqs Dopri8": lambda s: method_dynamiqs(s, "dopri8"),
    "dynamiqs Tsit5": lambda s: method_dynamiqs(s, "tsit5"),
}
# Opt-in (`--methods "hierax,hierax order 20"`): hierax at another series order
# than its default, to weigh the default against others on systems it was not
# tuned on. Never a peer.
ORDER_METHOD = "hierax order "


def method(name: str):
    """The method `name`: one of `METHODS`, or `ORDER_METHOD` and an order."""
    if name.startswith(ORDER_METHOD):
        return lambda s: method_hierax(s, int(name.removeprefix(ORDER_METHOD)))
    return METHODS[name]


# --- measurement -------------------------------------------------------------------

# A median of at least 3 (or 5) calls: 5 when they take under 2 s in all, and up to
# 25 until 0.25 s have passed (short calls vary most with load).
BUDGETS = ((5, 2.0), (25, 0.25))


def relative_error(state, reference) -> float:
    state = np.asarray(state).reshape(reference.shape)
    return float(np.linalg.norm(state - reference) / np.linalg.norm(reference))


_COMPILES = [0]


def _count_compiles(event: str, duration_secs: float, **kwargs: Any) -> None:
    del duration_secs, kwargs
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILES[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compiles)


def run_ladder(solve, reference, tols, slow_limit):
    """(tol, error, seconds, first call) for each tolerance, until the error is a
    tenth of the smallest target, stops improving, or a call takes over
    `slow_limit`."""
    points = []
    for tol in tols:
        first, out = timed(solve, tol)
        seconds = median_time(solve, (tol,), 3, warm=False, budgets=BUDGETS)
        err = relative_error(out, reference)
        points.append(dict(tol=tol, error=err, seconds=seconds, first=first))
        # A floor (the reference's, or the method's rounding).
        plateau = at_plateau([p["error"] for p in points])
        if err < min(TARGETS) / 10 or plateau or seconds > slow_limit:
            break
    return points


def first_solve_child(key, quick, method):
    """Run in a fresh process: build the system and the method, then time one
    solve (its compile included) and print it as JSON."""
    watch = Stopwatch()
    system = SYSTEMS[key](quick=quick)
    solve = {"hierax": method_hierax, "diffrax Dopri8": method_diffrax}[method](system)
    setup = watch.seconds
    seconds, _ = timed(solve, PROBE_TOL)
    print(json.dumps(dict(seconds=seconds, setup=setup)))


def first_solve(key, quick, method):
    command = [sys.executable, __file__, "--first-solve", key, "--first-method", method]
    if quick:
        command.append("--quick")
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        print(done.stderr[-2000:])
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def hierax_probes(system, quick):
    """Fresh-process first solve, the solve in a user's jit, a new tolerance."""
    eager = method_hierax(system)
    inside = hierax_in_jit(system)
    inside_traced = hierax_in_jit(system, traced_tol=True)
    inside_jnp = hierax_in_jit(system, jnp_matrices=True)
    timed(eager, PROBE_TOL)
    first_jit, _ = timed(inside, PROBE_TOL)
    timed(inside_traced, PROBE_TOL)
    timed(inside_jnp, PROBE_TOL)
    eager_time = median_time(eager, (PROBE_TOL,), 5, warm=False, budgets=BUDGETS)
    jit_time = median_time(inside, (PROBE_TOL,), 5, warm=False, budgets=BUDGETS)
    jit_traced_time = median_time(
        inside_traced, (PROBE_TOL,), 5, warm=False, budgets=BUDGETS
    )
    jit_jnp_time = median_time(inside_jnp, (PROBE_TOL,), 5, warm=False, budgets=BUDGETS)
    before = _COMPILES[0]
    new_tol_time, _ = timed(eager, NEW_RTOL)
    compiles = _COMPILES[0] - before
    new_tol_steady = median_time(eager, (NEW_RTOL,), 3, warm=False, budgets=BUDGETS)
    out = dict(
        eager=eager_time,
        jit=jit_time,
        jit_traced_tol=jit_traced_time,
        jit_jnp_matrices=jit_jnp_time,
        jit_first=first_jit,
        new_tol=new_tol_time,
        new_tol_steady=new_tol_steady,
        new_tol_compiles=compiles,
        fresh=first_solve(system.key, quick, "hierax"),
        fresh_dopri8=first_solve(system.key, quick, "diffrax Dopri8"),
    )
    return out


def bench_system(system, methods, tols, slow_limit, quick):
    print(f"\n## {system.name}\nload before: {os.getloadavg()}", flush=True)
    seconds, reference = timed(system.reference, *REFERENCE_TOLS)
    spread = dict(
        dop853_1e13=relative_error(system.reference(1e-13, 1e-13), reference),
        hierax_1e13=relative_error(method_hierax(system)(1e-13), reference),
    )
    print(
        f"reference: scipy DOP853 at rtol {REFERENCE_TOLS[0]:g}, atol "
        f"{REFERENCE_TOLS[1]:g} ({seconds:.1f} s); relative distance to it of "
        f"DOP853 at rtol = atol = 1e-13: {spread['dop853_1e13']:.1e}, of hierax at "
        f"rtol 1e-13: {spread['hierax_1e13']:.1e}",
        flush=True,
    )
    ladders = {}
    for name in methods:
        try:
            solve = method(name)(system)
        except ImportError as e:
            print(f"  {name}: not installed ({e})")
            continue
        ladders[name] = run_ladder(solve, reference, tols, slow_limit)
        points = ", ".join(
            "({tol:.0e}, {error:.1e}, {seconds:.4f})".format(**p) for p in ladders[name]
        )
        print(f"  {name}: (tol, error, s) {points}", flush=True)
    at = {
        name: {str(t): time_at(points, t) for t in TARGETS}
        for name, points in ladders.items()
    }
    probes = hierax_probes(system, quick) if "hierax" in ladders else None
    load_after = os.getloadavg()
    result = dict(
        key=system.key,
        system=system.name,
        reference_seconds=seconds,
        reference_spread=spread,
        ladders=ladders,
        at=at,
        probes=probes,
        load=load_after,
    )
    print_tables(result)
    print(f"load after: {load_after}", flush=True)
    return result


def _fmt(entry):
    if entry is None:
        return "not reached"
    seconds, bound = entry
    if seconds < 0.01:
        text = f"{seconds * 1e3:.2f} ms"
    else:
        text = f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"
    return ("<= " if bound else "") + text


def best_peer(result, target):
    peers = [
        (entry[0], name)
        for name, entries in result["at"].items()
        if not name.startswith("hierax") and (entry := entries[str(target)]) is not None
    ]
    return min(peers) if peers else None


def print_tables(result):
    at = result["at"]
    ours = at.get("hierax", {})
    print(f"\n### {result['system']}")
    print("| method | time at 1e-6 | / hierax | time at 1e-10 | / hierax |")
    print("|---|---:|---:|---:|---:|")
    for name, entries in at.items():
        cells = []
        for t in TARGETS:
            entry, base = entries[str(t)], ours.get(str(t))
            ratio = f"{entry[0] / base[0]:.2f}" if entry and base else "-"
            cells += [_fmt(entry), ratio]
        print(f"| {name} | " + " | ".join(cells) + " |")
    cells = []
    for t in TARGETS:
        peer, base = best_peer(result, t), ours.get(str(t))
        cells += [
            f"{peer[1]}" if peer else "-",
            f"{peer[0] / base[0]:.2f}" if peer and base else "-",
        ]
    print(
        f"| **best peer / hierax** | {cells[0]} | **{cells[1]}** | {cells[2]} | "
        f"**{cells[3]}** |"
    )
    probes = result["probes"]
    if probes:
        fresh, dopri = probes["fresh"], probes["fresh_dopri8"]
        line = (
            f"\nhierax at rtol {PROBE_TOL:.0e}: from Python "
            f"{probes['eager'] * 1e3:.2f} ms, inside jax.jit {probes['jit'] * 1e3:.2f} "
            f"ms (rtol an argument of the jitted function: "
            f"{probes['jit_traced_tol'] * 1e3:.2f} ms; matrices made by jnp inside "
            f"the jit: {probes['jit_jnp_matrices'] * 1e3:.2f} ms); first solve in a "
            "fresh process "
        )
        line += f"{fresh['seconds']:.2f} s" if fresh else "failed"
        if dopri:
            line += f" (diffrax Dopri8 {dopri['seconds']:.2f} s)"
        line += (
            f"; a never-seen rtol {NEW_RTOL:g}: {probes['new_tol'] * 1e3:.2f} ms, "
            f"{probes['new_tol_compiles']} XLA compiles (then "
            f"{probes['new_tol_steady'] * 1e3:.2f} ms)"
        )
        print(
            line,
            flush=True,
        )


def print_summary(results):
    print("\n## Summary: best peer against hierax")
    print(
        "| system | 1e-6: best peer | its time | hierax | ratio | 1e-10: best peer "
        "| its time | hierax | ratio | first solve, fresh process (Dopri8) "
        "| in jit / eager | new rtol |"
    )
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        cells = []
        for t in TARGETS:
            peer, ours = best_peer(r, t), r["at"].get("hierax", {}).get(str(t))
            cells += [
                peer[1] if peer else "-",
                _fmt((peer[0], False)) if peer else "-",
                _fmt(ours),
                f"{peer[0] / ours[0]:.2f}" if peer and ours else "-",
            ]
        p = r["probes"] or {}
        fresh, dopri = p.get("fresh"), p.get("fresh_dopri8")
        cells += [
            (f"{fresh['seconds']:.2f} s" if fresh else "-")
            + (f" ({dopri['seconds']:.2f} s)" if dopri else ""),
            f"{p['jit'] * 1e3:.2f} / {p['eager'] * 1e3:.2f} ms" if p else "-",
            f"{p['new_tol'] * 1e3:.2f} ms, {p['new_tol_compiles']} compiles"
            if p
            else "-",
        ]
        print(f"| {r['system']} | " + " | ".join(cells) + " |")


def result_rows(results) -> list[dict]:
    """The run as result rows: each method's time at each target error (read off
    its ladder), and hierax's probes (from Python, inside a jit, the first solve
    in a fresh process beside Dopri8's, a new tolerance)."""
    out = []
    for r in results:
        for name, entries in r["at"].items():
            for t in TARGETS:
                entry = entries[str(t)]
                seconds = entry[0] if entry else None
                out.append(row(r["system"], name, "seconds", seconds, target=t))
        p = r["probes"]
        if not p:
            continue
        case = f"{r['system']}, rtol {PROBE_TOL:g}"
        for label, key in (
            ("from Python", "eager"),
            ("inside jax.jit", "jit"),
            ("inside jax.jit, rtol traced", "jit_traced_tol"),
            ("inside jax.jit, jnp matrices", "jit_jnp_matrices"),
            (f"from Python, new rtol {NEW_RTOL:g} (first call)", "new_tol"),
        ):
            out.append(row(case, label, "seconds", p[key]))
        for label, key in (("hierax", "fresh"), ("diffrax Dopri8", "fresh_dopri8")):
            fresh = p[key] or {}
            seconds = fresh.get("seconds")
            out.append(
                row(r["system"], label, "fresh_process_first_seconds", seconds, "s")
            )
        out.append(row(case, "hierax", "new_rtol_compiles", p["new_tol_compiles"]))
    return out


STYLES = {
    "hierax": dict(color="black", marker="o", linewidth=2),
    "diffrax Dopri8": dict(color="tab:blue", marker="s"),
    "QuTiP vern9": dict(color="tab:red", marker="^"),
    "QuTiP adams": dict(color="tab:orange", marker="v"),
    "dynamiqs Dopri8": dict(color="tab:green", marker="D"),
    "dynamiqs Tsit5": dict(color="tab:olive", marker="D"),
}


def plot(results, path, title):
    try:
        import matplotlib
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    columns = min(3, len(results))
    rows = -(-len(results) // columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(4.6 * columns, 3.9 * rows), squeeze=False
    )
    for ax, result in zip(axes.flat, results):
        for name, points in result["ladders"].items():
            ax.loglog(
                [p["seconds"] for p in points],
                [p["error"] for p in points],
                label=name,
                markersize=4,
                **STYLES.get(name, {}),
            )
        for target in TARGETS:
            ax.axhline(target, color="gray", linewidth=0.5, linestyle=":")
        ax.set_title(result["system"], fontsize=9)
        ax.set_xlabel("run time (s)")
        ax.set_ylabel("relative final error")
        ax.grid(True, which="major", alpha=0.3)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    for ax in list(axes.flat)[len(results) :]:
        ax.set_visible(False)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"work-precision plot: {path}")


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short spans, decades")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--out", default=None, help="write the results as JSON")
    parser.add_argument("--plot", default=None, help="write the work-precision PNG")
    parser.add_argument("--first-solve", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--first-method", default="hierax", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_solve:
        first_solve_child(args.first_solve, args.quick, args.first_method)
        return
    load_before = os.getloadavg()
    watch = Stopwatch()
    print(
        f"# bench_systems{' (quick)' if args.quick else ''}, jax {jax.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}\nload before: {load_before}"
    )
    methods = [m for m in args.methods.split(",") if m]
    if any(m.startswith("QuTiP") for m in methods):
        try:
            print(f"QuTiP string coefficients compiled (Cython): {qutip_compiled()}")
        except ImportError:
            pass
    tols = QUICK_LADDER if args.quick else LADDER
    slow_limit = 3.0 if args.quick else 20.0
    results = [
        bench_system(
            SYSTEMS[key](quick=args.quick), methods, tols, slow_limit, args.quick
        )
        for key in args.systems.split(",")
        if key
    ]
    print_summary(results)
    load_after = os.getloadavg()
    elapsed = watch.seconds
    emit(result_rows(results))
    print(f"\nload after: {load_after}; {elapsed:.0f} s in all")
    if args.plot and results:
        plot(
            results,
            args.plot,
            f"held-back systems, work-precision (x64, CPU"
            f"{', quick' if args.quick else ''}); load {load_before[0]:.1f}-"
            f"{load_after[0]:.1f}",
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(
                    results=results,
                    load=[load_before, load_after],
                    seconds=elapsed,
                    quick=args.quick,
                    date=time.strftime("%Y-%m-%d %H:%M"),
                    python=sys.version,
                    jax=jax.__version__,
                ),
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
