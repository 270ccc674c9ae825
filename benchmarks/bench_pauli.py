"""Pauli sums: `hierax.PauliSum` against qiskit `SparsePauliOp` and `paulistrings`.

    .venv/bin/python benchmarks/bench_pauli.py [--quick] [--out results.json]

Needs `pip install "hierax[bench]"` (qiskit and paulistrings; neither is a dependency
of hierax).

1. The commutator [H, O] of the chaotic Ising chain
   H = sum Z_j Z_{j+1} + 1.05 sum X_j + 0.5 sum Z_j (N = 30: 89 terms; N = 64: 191)
   with O a sum of 2^14, 2^16, 2^18 random strings (random coefficients, seed 0),
   exact on every side: hierax with room for every product (no truncation),
   qiskit as `(H.dot(O) - O.dot(H)).simplify()`, paulistrings' C++ `commutator`
   (which returns every anticommuting product without merging equal strings).
   Median of 3 calls after a first (hierax's first call compiles); the peak
   resident-set growth of one call (Linux `VmHWM`, reset before the call).
2. 30 Lanczos steps of the same chain at N = 30 from the edge observable Z_0 and
   from the uniform sum sum_j X_j, at capacities 2^14, 2^16, 2^18: `hierax.lanczos`
   (first call with its compilation, then a second call), and the same recursion
   written with paulistrings as its users write it (commutator, add, `trim` to the
   capacity) where it finishes in the budget; b_n of the two are compared.

The machine's load is printed before and after; all in one process.
"""

import argparse
import gc
import json
import os
import statistics

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("bench_pauli.py")

import numpy as np  # noqa: E402
from memory import proc_status  # noqa: E402
from rows import emit, row  # noqa: E402
from timing import time_call  # noqa: E402

import hierax  # noqa: E402


def time_and_memory(call, repeats: int = 3) -> tuple[float, float, int]:
    """(first call s, median of `repeats` further calls s, peak RSS growth bytes)."""
    first, _ = time_call(call)
    times = []
    for _ in range(repeats):
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = proc_status("VmRSS")
        times.append(time_call(call)[0])
        growth = proc_status("VmHWM") - before
    return first, statistics.median(times), growth


def chain_terms(n: int) -> list[tuple[str, list[int], float]]:
    return (
        [("ZZ", [j, j + 1], 1.0) for j in range(n - 1)]
        + [("X", [j], 1.05) for j in range(n)]
        + [("Z", [j], 0.5) for j in range(n)]
    )


def random_strings(n: int, k: int, seed: int = 0) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    chars = np.array(list("IXYZ"))
    strings = ["".join(r) for r in chars[rng.integers(0, 4, (k, n))]]
    return strings, rng.normal(size=k)


# --- the peers -----------------------------------------------------------------


def qiskit_sum(strings, coefficients):
    from qiskit.quantum_info import SparsePauliOp

    # qiskit labels put qubit 0 rightmost.
    return SparsePauliOp([s[::-1] for s in strings], np.asarray(coefficients))


def qiskit_chain(n):
    from qiskit.quantum_info import SparsePauliOp

    return SparsePauliOp.from_sparse_list(chain_terms(n), n)


def paulistrings_sum(strings, coefficients, n):
    import paulistrings as ps
    from paulistrings import inout

    op = ps.Operator(n)
    uv = [inout.string_to_vw(s) for s in strings]
    op.strings = np.array([(u, v) for u, v, _ in uv], dtype=np.uint64)
    op.coeffs = np.array(
        [c * phase for (_, _, phase), c in zip(uv, coefficients)], dtype=complex
    )
    return op


def paulistrings_chain(n):
    strings, coefficients = [], []
    for ops, sites, c in chain_terms(n):
        s = ["I"] * n
        for op, j in zip(ops, sites):
            s[j] = op
        strings.append("".join(s))
        coefficients.append(c)
    return paulistrings_sum(strings, coefficients, n)


def paulistrings_lanczos(h, o, steps, capacity):
    """The Lanczos recursion with paulistrings' operations, trimmed to `capacity`
    strings each step (its `trim`), as in its documentation's examples."""
    import paulistrings as ps

    norm = lambda a: np.sqrt(np.sum(np.abs(a.coeffs) ** 2))
    previous, current = None, o * (1 / norm(o))
    b_prev, bs = 0.0, []
    for _ in range(steps):
        a = ps.commutator(h, current)
        if previous is not None:
            a = a + previous * (-b_prev)
        a = ps.trim(a, capacity)
        b = norm(a)
        bs.append(b)
        previous, current, b_prev = current, a * (1 / b), b
    return np.array(bs)


def qiskit_commutator(n, strings, coefficients):
    h, o = qiskit_chain(n), qiskit_sum(strings, coefficients)
    return lambda: (h.dot(o) - o.dot(h)).simplify()


def paulistrings_commutator(n, strings, coefficients):
    import paulistrings as ps

    h, o = paulistrings_chain(n), paulistrings_sum(strings, coefficients, n)
    return lambda: ps.commutator(h, o)


# --- the benchmarks ------------------------------------------------------------


# A peer is not run at a size where its last size's memory, times the growth in
# strings, predicts more than this (qiskit's dense boolean strings: 9 GB at N = 64
# and 2^16 strings).
_MEMORY_BUDGET = 12 * 2**30


def commutators(sizes: list[int], qubits: list[int]) -> list[dict]:
    rows = []
    for n in qubits:
        h = hierax.PauliSum.ising_chain(n, 1.0, 1.05, 0.5)
        last: dict[str, tuple[int, int]] = {}
        for k in sizes:
            strings, coefficients = random_strings(n, k)
            o = hierax.PauliSum.from_strings(strings, coefficients)
            row: dict = {"n_qubits": n, "strings": k, "terms": h.capacity}
            first, run, memory = time_and_memory(
                lambda h=h, o=o: h.commutator(o).coefficients
            )
            result = h.commutator(o)
            row["hierax"] = {"s": run, "first_s": first, "rss": memory}
            row["result_strings"] = int(result.count)
            peers = {
                "qiskit": qiskit_commutator,
                "paulistrings": paulistrings_commutator,
            }
            for name, build in peers.items():
                size, rss = last.get(name, (k, 0))
                if rss * k / size > _MEMORY_BUDGET:
                    row[name] = None
                    continue
                _, run, memory = time_and_memory(build(n, strings, coefficients), 1)
                row[name] = {"s": run, "rss": memory}
                last[name] = (k, memory)
            rows.append(row)
            print(json.dumps(row), flush=True)
            gc.collect()
    return rows


def lanczos_runs(capacities: list[int], peer_budget: float) -> list[dict]:
    n, steps = 30, 30
    h = hierax.PauliSum.ising_chain(n, 1.0, 1.05, 0.5)
    observables = {
        "Z_0": (["Z" + "I" * (n - 1)], [1.0]),
        "sum X_j": (["I" * j + "X" + "I" * (n - j - 1) for j in range(n)], [1.0] * n),
    }
    hp = paulistrings_chain(n)
    rows = []
    for name, (strings, coefficients) in observables.items():
        o = hierax.PauliSum.from_strings(strings, coefficients)
        op = paulistrings_sum(strings, coefficients, n)
        peer_last = 0.0
        for capacity in capacities:
            row = {"observable": name, "capacity": capacity, "steps": steps}
            run = lambda o=o, capacity=capacity: hierax.lanczos(
                h, o, steps, capacity=capacity
            )
            row["hierax_first_s"], result = time_call(run)
            row["hierax_s"], result = time_call(run)
            row["b"] = np.asarray(result.b).tolist()
            row["dropped_last"] = float(result.dropped[-1])
            # The peer runs while its previous capacity's time predicts the budget.
            if peer_last * capacity / max(1, capacity // 4) <= peer_budget:
                peer_last, b_peer = time_call(
                    paulistrings_lanczos, hp, op, steps, capacity
                )
                row["paulistrings_s"] = peer_last
                row["b_difference"] = float(np.max(np.abs(b_peer - result.b)))
            else:
                peer_last = float("inf")
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "b"}), flush=True)
    return rows


def markdown(commutator_rows: list[dict], lanczos_rows: list[dict]) -> str:
    lines = [
        "| N | strings in O | strings in [H, O] | hierax (s) | qiskit (s) | "
        "paulistrings (s) | best peer / hierax | RSS growth hierax / qiskit / "
        "paulistrings (MB) |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in commutator_rows:
        peers = [r[k]["s"] for k in ("qiskit", "paulistrings") if r[k]]
        best = f"{min(peers) / r['hierax']['s']:.1f}x" if peers else "—"
        seconds = [
            f"{r[k]['s']:.3f}" if r[k] else "— (memory)"
            for k in ("hierax", "qiskit", "paulistrings")
        ]
        mb = "/".join(
            f"{r[k]['rss'] / 2**20:.0f}" if r[k] else "—"
            for k in ("hierax", "qiskit", "paulistrings")
        )
        lines.append(
            f"| {r['n_qubits']} | 2^{int(np.log2(r['strings']))} | "
            f"{r['result_strings']} | {' | '.join(seconds)} | {best} | {mb} |"
        )
    lines += [
        "",
        "| observable | capacity | hierax first call (s) | hierax (s) | "
        "paulistrings (s) | paulistrings / hierax | max b_n difference | "
        "weight dropped at step 30 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in lanczos_rows:
        peer = r.get("paulistrings_s")
        lines.append(
            f"| {r['observable']} | 2^{int(np.log2(r['capacity']))} | "
            f"{r['hierax_first_s']:.1f} | {r['hierax_s']:.1f} | "
            + (f"{peer:.1f} | {peer / r['hierax_s']:.1f}x | " if peer else "— | — | ")
            + (f"{r['b_difference']:.1e} | " if peer else "— | ")
            + f"{r['dropped_last']:.1e} |"
        )
    return "\n".join(lines)


def result_rows(commutator_rows: list[dict], lanczos_rows: list[dict]) -> list[dict]:
    """The tables as result rows: the commutators' times and memory by method,
    Lanczos' times by method and its coefficients' difference to the peer's."""
    out = []
    for r in commutator_rows:
        case = f"[H, O], N = {r['n_qubits']}"
        strings = dict(strings=r["strings"])
        for method in ("hierax", "qiskit", "paulistrings"):
            measured = r[method] or {}
            out.append(row(case, method, "seconds", measured.get("s"), **strings))
            out.append(
                row(
                    case,
                    method,
                    "rss_growth_bytes",
                    measured.get("rss"),
                    "B",
                    **strings,
                )
            )
    for r in lanczos_rows:
        case = f"lanczos of {r['observable']}, {r['steps']} steps"
        capacity = dict(capacity=r["capacity"])
        out.append(
            row(case, "hierax", "first_call_seconds", r["hierax_first_s"], **capacity)
        )
        out.append(row(case, "hierax", "seconds", r["hierax_s"], **capacity))
        out.append(
            row(case, "paulistrings", "seconds", r.get("paulistrings_s"), **capacity)
        )
        out.append(
            row(case, "paulistrings", "error", r.get("b_difference"), **capacity)
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    sizes = [2**14, 2**16] if args.quick else [2**14, 2**16, 2**18]
    capacities = [2**14, 2**16] if args.quick else [2**14, 2**16, 2**18]
    commutator_rows = commutators(sizes, [30, 64])
    lanczos_rows = lanczos_runs(capacities, peer_budget=60 if args.quick else 300)
    print(f"load after: {os.getloadavg()}")
    print(markdown(commutator_rows, lanczos_rows))
    emit(result_rows(commutator_rows, lanczos_rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"commutators": commutator_rows, "lanczos": lanczos_rows}, f)


if __name__ == "__main__":
    main()
