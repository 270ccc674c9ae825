"""Many-body sizes: sparse formats, PropagatorDerivatives scaling, and sesolve on
12- and 16-qubit transverse-field Ising chains against QuTiP (CSR) and dynamiqs
(sparse DIA), side by side in one run.

    python benchmarks/bench_sparse.py [--quick] [--out DIR]

The chain: H(t) = h(t) sum_i X_i - sum_i Z_i Z_{i+1}, h(t) = 1 + 0.5 sin 2t, from
all spins up. Errors are final-state 2-norm errors against scipy's DOP853 at rtol
1e-12 on the same sparse equation; each method runs at a ladder of tolerances and
the fastest run whose error is at most the target counts (matched final error).
Times are medians of repeated warm runs (compile excluded, reported apart).
"""

import argparse
import functools
import json
import os
from pathlib import Path
from typing import Any

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("bench_sparse.py")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.integrate  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from jax.experimental import sparse as jsparse  # noqa: E402
from rows import emit, row  # noqa: E402
from timing import Stopwatch, median_time, time_call  # noqa: E402

import hierax  # noqa: E402


SX = np.array([[0.0, 1.0], [1.0, 0.0]])
SZ = np.diag([1.0, -1.0])
TARGET = 1e-8


def scipy_terms(sites: int):
    def chain(op, i):
        out = sp.identity(1, format="csr")
        for j in range(sites):
            out = sp.kron(out, sp.csr_matrix(op) if j == i else sp.identity(2), "csr")
        return out

    xs = functools.reduce(lambda a, b: a + b, [chain(SX, i) for i in range(sites)])
    zz = functools.reduce(
        lambda a, b: a + b,
        [chain(SZ, i).multiply(chain(SZ, i + 1)) for i in range(sites - 1)],
    )
    return sp.csr_matrix(xs), sp.csr_matrix(-zz)


def hierax_chain(sites: int):
    x = [hierax.site_operator(SX, i, sites) for i in range(sites)]
    z = [hierax.site_operator(SZ, i, sites) for i in range(sites)]
    field = 1.0 + hierax.Sin(2.0, amplitude=0.5)
    return field * sum(x) - sum(z[i] @ z[i + 1] for i in range(sites - 1))


def product_times(m, repeats) -> dict:
    """Time of one product of the sparse matrix `m` with a state, per format."""
    n = m.shape[0]
    v = np.random.default_rng(0).normal(size=n) + 0j
    vj = jnp.asarray(v)
    ours = hierax.SparseMatrix.from_matrix(m)
    bcoo = jsparse.BCOO.from_scipy_sparse(m)
    bcsr = jsparse.BCSR.from_scipy_sparse(m)
    coo = m.tocoo()
    r, c, d = jnp.asarray(coo.row), jnp.asarray(coo.col), jnp.asarray(coo.data)
    # Every matrix is an argument of the compiled product, as in the solvers (a
    # matrix closed over is a constant, whose gather XLA may simplify).
    cases = {
        "hierax row layout": (jax.jit(lambda m, v: m.matvec(v)), ours),
        "BCOO": (jax.jit(lambda m, v: m @ v), bcoo),
        "BCSR": (jax.jit(lambda m, v: m @ v), bcsr),
        "COO segment sum": (
            jax.jit(
                lambda m, v: jax.ops.segment_sum(
                    m[2] * v[m[1]], m[0], n, indices_are_sorted=True
                )
            ),
            (r, c, d),
        ),
    }
    row = {"n": n, "entries per row": ours.width}
    for label, (fn, arg) in cases.items():
        row[label] = median_time(
            lambda fn=fn, arg=arg: fn(arg, vj).block_until_ready(), (), repeats
        )
    row["scipy CSR"] = median_time(lambda: m @ v, (), repeats)
    return row


def formats(sizes, repeats):
    """Time of one product with a state, per format, for the two terms."""
    rows = []
    for sites in sizes:
        xs, zz = scipy_terms(sites)
        for name, m in (("sum of X_i", xs), ("sum of Z_i Z_i+1", zz)):
            row = {"term": name, **product_times(m, repeats)}
            rows.append(row)
            labels = [k for k in row if k not in ("term", "n", "entries per row")]
            print(
                f"  n = {row['n']:6d} {name:17s} "
                + "  ".join(f"{k}: {row[k] * 1e6:8.1f} us" for k in labels),
                flush=True,
            )
    return rows


def scaling_row(sites, order, repeats) -> dict:
    """One PropagatorDerivatives call on a state against K x A plain products."""
    n = 2**sites
    pd = hierax.PropagatorDerivatives(hierax_chain(sites), order)
    psi = jnp.zeros(n, complex).at[0].set(1.0)
    call = jax.jit(lambda t, psi: pd(t, psi))
    compile_time, _ = time_call(call, 0.3, psi)
    ours = median_time(lambda: call(0.3, psi).block_until_ready(), (), repeats)
    xs, zz = scipy_terms(sites)
    bx, bz = jsparse.BCOO.from_scipy_sparse(xs), jsparse.BCOO.from_scipy_sparse(zz)
    sx_ = hierax.SparseMatrix.from_matrix(xs)
    sz_ = hierax.SparseMatrix.from_matrix(zz)
    # The matrices are arguments, as in the call (closed over, they are constants).
    plain_bcoo = jax.jit(lambda bx, bz, v: bx @ v + bz @ v)
    plain_ours = jax.jit(lambda sx_, sz_, v: sx_.matvec(v) + sz_.matvec(v))
    bcoo = median_time(lambda: plain_bcoo(bx, bz, psi).block_until_ready(), (), repeats)
    own = median_time(
        lambda: plain_ours(sx_, sz_, psi).block_until_ready(), (), repeats
    )
    return {
        "n": n,
        "order": order,
        "call": ours,
        "compile": compile_time,
        "K x A products, BCOO": order * bcoo,
        "K x A products, row layout": order * own,
    }


def derivatives_scaling(sizes, order, repeats):
    rows = []
    for sites in sizes:
        row = scaling_row(sites, order, repeats)
        rows.append(row)
        ours, bcoo = row["call"], row["K x A products, BCOO"]
        own = row["K x A products, row layout"]
        print(
            f"  n = {row['n']:6d}: call {ours * 1e3:8.2f} ms; K x A products: BCOO "
            f"{bcoo * 1e3:8.2f} ms ({ours / bcoo:.2f}x), row layout "
            f"{own * 1e3:8.2f} ms ({ours / own:.2f}x); first call "
            f"{row['compile']:.1f} s",
            flush=True,
        )
    return rows


def reference(sites, span):
    xs, zz = scipy_terms(sites)
    n = 2**sites
    psi = np.zeros(n, complex)
    psi[0] = 1.0

    def rhs(t, y):
        return -1j * ((1.0 + 0.5 * np.sin(2 * t)) * (xs @ y) + zz @ y)

    watch = Stopwatch()
    out = scipy.integrate.solve_ivp(
        rhs, (0.0, span), psi, "DOP853", rtol=1e-12, atol=1e-14
    )
    return out.y[:, -1], watch.seconds


def matched(label, run, tolerances, exact, repeats):
    """Fastest run (median) whose final error is at most TARGET."""
    best = None
    for tol in tolerances:
        first, final = time_call(run, tol)
        error = float(np.linalg.norm(np.asarray(final) - exact))
        if error > TARGET:
            print(f"    {label} tol {tol:.0e}: error {error:.1e} (above target)")
            continue
        seconds = median_time(lambda tol=tol: np.asarray(run(tol)), (), repeats)
        print(
            f"    {label} tol {tol:.0e}: error {error:.1e}, {seconds:.3f} s "
            f"(first call {first:.1f} s)",
            flush=True,
        )
        if best is None or seconds < best["seconds"]:
            best = {"tol": tol, "error": error, "seconds": seconds, "first": first}
        break  # looser tolerances failed already; tighter ones only cost more
    return best


def solvers(sites, span, repeats):
    import dynamiqs as dq
    import dynamiqs.method as dq_method
    import qutip as qt

    dq.set_precision("double")
    n = 2**sites
    exact, ref_time = reference(sites, span)
    print(f"  {sites} qubits (n = {n}), T = {span}: DOP853 reference {ref_time:.1f} s")
    h = hierax_chain(sites)
    psi = jnp.zeros(n, complex).at[0].set(1.0)
    times = jnp.array([0.0, span])

    def run_hierax(tol):
        return hierax.sesolve(h, psi, times, rtol=tol, atol=tol * 1e-2).final_state

    xs, zz = scipy_terms(sites)
    dims = [[2] * sites, [2] * sites]
    qx, qz = qt.Qobj(xs, dims=dims), qt.Qobj(zz, dims=dims)
    qh = qt.QobjEvo([qz, [qx, lambda t: 1.0 + 0.5 * np.sin(2 * t)]])
    qpsi = qt.Qobj(np.asarray(psi).reshape(-1, 1), dims=[[2] * sites, [1] * sites])

    def run_qutip(tol, method="adams"):
        options = {"method": method, "atol": tol * 1e-2, "rtol": tol, "nsteps": 10**7}
        result = qt.sesolve(qh, qpsi, [0.0, span], options=options)
        return result.states[-1].full().ravel()

    x = [
        dq.tensor(*[dq.sigmax() if j == i else dq.eye(2) for j in range(sites)])
        for i in range(sites)
    ]
    z = [
        dq.tensor(*[dq.sigmaz() if j == i else dq.eye(2) for j in range(sites)])
        for i in range(sites)
    ]
    dx = functools.reduce(lambda a, b: a + b, x)
    dzz = functools.reduce(
        lambda a, b: a + b, [z[i] @ z[i + 1] for i in range(sites - 1)]
    )
    dh = dq.modulated(lambda t: 1.0 + 0.5 * jnp.sin(2 * t), dx) + dq.constant(-dzz)
    dpsi = dq.tensor(*[dq.basis(2, 0)] * sites)

    def run_dynamiqs(tol, method: Any = dq_method.Tsit5):
        m = method(rtol=tol, atol=tol * 1e-2, max_steps=10**7)
        result = dq.sesolve(
            dh, dpsi, jnp.array([0.0, span]), method=m, progress_meter=False
        )
        return jnp.asarray(result.final_state.to_jax()).reshape(-1)

    # Half decades, as in bench_sesolve.py: whole decades left every method up to
    # 10x more accurate than the target, and decided the ranking by where each
    # ladder happened to fall.
    ladder = [float(f"{10 ** (-k / 2):.0e}") for k in range(10, 23)]
    out = {"n": n, "span": span, "reference seconds": ref_time, "methods": {}}
    for label, run in (
        ("hierax sesolve", run_hierax),
        ("QuTiP adams (CSR)", run_qutip),
        ("QuTiP vern9 (CSR)", functools.partial(run_qutip, method="vern9")),
        ("dynamiqs Tsit5 (DIA)", run_dynamiqs),
        (
            "dynamiqs Dopri8 (DIA)",
            functools.partial(run_dynamiqs, method=dq_method.Dopri8),
        ),
    ):
        out["methods"][label] = matched(label, run, ladder, exact, repeats)
    # Memory: what XLA allocates for one hierax step, against one dense matrix.
    term = hierax.SchrodingerTerm(h)
    step = jax.jit(
        lambda y: term.taylor_terms(jnp.asarray(0.1), jnp.asarray(0.05), y, 20, None)
    )
    memory = step.lower(psi).compile().memory_analysis()
    if memory is not None:
        used = memory.temp_size_in_bytes + memory.argument_size_in_bytes
        out["step bytes"] = used
        out["dense matrix bytes"] = n * n * 16
        print(
            f"    one step (K = 20) allocates {used / 2**20:.1f} MiB; one dense "
            f"{n}x{n} complex matrix is {n * n * 16 / 2**30:.2f} GiB",
            flush=True,
        )
    return out


def result_rows(results: dict[str, Any]) -> list[dict]:
    """The three parts as result rows: each format's product time; the call
    against K x A products; each solver's time, tolerance and error at the
    target."""
    out = []
    for r in results.get("formats", []):
        for label, seconds in r.items():
            if label not in ("term", "n", "entries per row"):
                out.append(row(r["term"], label, "seconds", seconds, n=r["n"]))
    for r in results.get("scaling", []):
        case = f"PropagatorDerivatives, order {r['order']}"
        for label in ("call", "K x A products, BCOO", "K x A products, row layout"):
            out.append(row(case, label, "seconds", r[label], n=r["n"]))
        out.append(row(case, "call", "first_call_seconds", r["compile"], n=r["n"]))
    for r in results.get("sesolve", []):
        case = f"sesolve, final error <= {TARGET:g}"
        for label, best in r["methods"].items():
            best = best or {}
            for metric, key in (("seconds", "seconds"), ("tolerance", "tol")):
                out.append(row(case, label, metric, best.get(key), n=r["n"]))
            out.append(
                row(case, label, "first_call_seconds", best.get("first"), n=r["n"])
            )
    return out


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="benchmarks/out")
    parser.add_argument(
        "--parts", default="abc", help="which parts to run (default: abc, all)"
    )
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"jax {jax.__version__}, {jax.default_backend()}, load {load[0]:.1f}")
    repeats = 3 if args.quick else 7
    results: dict[str, Any] = {"load at start": load}
    if "a" in args.parts:
        print("(a) one product with a state, per sparse format")
        sizes = [8, 12] if args.quick else [12, 16]
        results["formats"] = formats(sizes, repeats * 3)
    if "b" in args.parts:
        print("(b) PropagatorDerivatives(H, 20)(t, state) against K x A products")
        sizes = [8, 10] if args.quick else [8, 10, 12, 14, 16]
        results["scaling"] = derivatives_scaling(sizes, 20, repeats)
    if "c" in args.parts:
        print("(c) sesolve at matched final error 1e-8")
        chains = [(8, 1.0)] if args.quick else [(12, 1.0), (16, 0.5)]
        results["sesolve"] = [solvers(s, span, 3) for s, span in chains]
    results["load at end"] = os.getloadavg()
    emit(result_rows(results))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sparse.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {out / 'sparse.json'}")


if __name__ == "__main__":
    main()
