"""The hierarchy benchmarks: compile time, run time and memory, side by side.

    .venv/bin/python benchmarks/bench_hierarchies.py [--quick] [--out DIR]

Everything is measured in one process and one run, so that ratios between methods
are meaningful even on a busy machine where absolute times are not. Three parts:

- **Compile time against the order** $K$ for the seed hierarchy
  ($H = \\cos(t)\\,\\sigma_y$, $X_0 = \\sigma_x$): the question's naive recursion
  (level $K$ after levels $0..K-1$, as the question ran it), a
  `jax.experimental.jet` hierarchy in a `lax.fori_loop`, and
  [`hierax.HeisenbergHierarchy`][] with a closed-form and with a callable
  Hamiltonian. A method whose next measurement is predicted to exceed the time
  budget is not run further (its growth would only make the benchmark slow).
- **Steady-state run time against the matrix size** $n$ for a two-term Hamiltonian
  $\\cos(1.3t)A + \\sin(0.7t)B$, also in matmul-equivalents: the time divided by
  the time of one jitted $n \\times n$ complex product measured in the same run.
- **Peak memory** at $n = 256$, $K = 32$ from XLA's memory analysis of the compiled
  call, against the size of the output, and the resident-set growth of one call
  in a fresh subprocess.

Results go to `results.json`, `results.md` and PNG plots (if matplotlib is
installed).
"""

import argparse
import dataclasses
import itertools
import json
import math
import pathlib
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import memory as _memory
import numpy as np
from device import require_cpu
from jax import lax
from jax.experimental import jet
from rows import emit, row as result_row
from seed import complex_dtype, make_naive_recursion, pauli_x, pauli_y
from timing import (
    Stopwatch,
    call_times,
    first_call_time,
    format_seconds,
    median_time,
    warm_up,
)

import hierax


def make_jet_hierarchy(order: int) -> Callable[[Any], Any]:
    """The seed hierarchy with `jax.experimental.jet` inside a `lax.fori_loop`.

    What this measures, precisely: `jet` gives the Taylor series of
    $H(t+\\tau) = \\cos(t+\\tau)\\,\\sigma_y$ once; the loop then carries the
    series of the level $X_{k-1}(t+\\tau)$ and, each iteration, pushes the series of
    $H$ and $X_{k-1}$ through the commutator $i[H, X_{k-1}]$ with `jet` and adds the
    derivative term by shifting the carried series. This is the most economical use
    of `jet` for the hierarchy we found (an earlier variant that differentiated the
    level function as a polynomial in $\\tau$ compiled 5x slower at $K = 9$). The
    level loop is a `fori_loop` and does not grow with $K$, but `jet`'s rules for
    `cos` and for products are unrolled double loops over the orders, so the traced
    program grows like $K^2$.
    """

    @jax.jit
    def levels(t: Any) -> Any:
        dtype = complex_dtype()
        real = jnp.zeros((), dtype).real.dtype
        sx, sy = pauli_x(), pauli_y()
        out = jnp.zeros((order + 1, 2, 2), dtype).at[0].set(sx)
        if order == 0:
            return out
        # jet's series are derivatives, ours normalised coefficients: x^(j) = j! x_j.
        factorials = jnp.exp(lax.lgamma(jnp.arange(1, order + 2, dtype=real)))
        factorials = factorials[:, None, None]
        direction = [jnp.ones((), real)] + [jnp.zeros((), real)] * (order - 1)
        h0, h_series = jet.jet(
            lambda s: jnp.cos(s) * sy, (jnp.asarray(t, real),), (direction,)
        )
        h_derivatives = jnp.stack(h_series)

        def commutator(h: Any, x: Any) -> Any:
            return 1j * (h @ x - x @ h)

        def body(k: Any, carry: Any) -> Any:
            x, out = carry
            derivatives = x * factorials
            c0, c_series = jet.jet(
                commutator,
                (h0, derivatives[0]),
                (h_derivatives, derivatives[1:]),
            )
            series = jnp.stack([c0, *c_series]) / factorials
            shifted = jnp.arange(1, order + 1, dtype=real)[:, None, None] * x[1:]
            x = series + jnp.concatenate([shifted, jnp.zeros_like(x[:1])])
            return x, out.at[k].set(x[0])

        x0 = jnp.zeros((order + 1, 2, 2), dtype).at[0].set(sx)
        _, out = lax.fori_loop(1, order + 1, body, (x0, out))
        return out

    return levels


@dataclasses.dataclass
class _Budget:
    """Predicts the next measurement of a method from its last two and refuses it
    when the prediction exceeds the budget, so that an exponential method is
    stopped before, not after, an expensive run.

    Below `floor` seconds the last time is taken as the prediction: there,
    scheduling noise on a shared machine swamps any growth, and extrapolating it
    would stop a flat method at random. The first `minimum` measurements are always
    taken, so what a run covers never depends on how loaded the machine is.
    """

    seconds: float
    floor: float = 1.0
    minimum: int = 3
    history: list[tuple[float, float]] = dataclasses.field(default_factory=list)

    def predict(self, size: float) -> float:
        if not self.history:
            return 0.0
        (s1, t1), *rest = self.history[-2:]
        if not rest:
            return t1
        s2, t2 = rest[0]
        if s2 == s1 or t1 <= 0 or t2 < self.floor:
            return t2
        exponent = max(0.0, math.log(t2 / t1) / math.log(s2 / s1))
        return t2 * (size / s2) ** exponent

    def allows(self, size: float) -> bool:
        if len(self.history) < self.minimum:
            return True
        return self.predict(size) <= self.seconds

    def record(self, size: float, seconds: float) -> None:
        self.history.append((size, seconds))


def _log(text: str) -> None:
    print(text, flush=True)


def bench_compile(orders: Sequence[int], budget: float, naive_budget: float) -> dict:
    """Part (a): first-call (compile + run) time against the order, per method."""
    t = 1.0
    t_complex = jnp.asarray(t, complex_dtype())
    sx, sy = pauli_x(), pauli_y()
    results: dict[str, Any] = {"orders": list(orders), "budget_seconds": budget}

    _log(f"(a) compile time against the order; budget {budget:g} s per measurement")
    # The naive recursion is run level by level, as in the question: level K is
    # timed after levels 0..K-1 have been compiled (which does not help it).
    naive = make_naive_recursion()
    naive_rows = []
    naive_budget_tracker = _Budget(naive_budget)
    cumulative = 0.0
    for k in range(max(orders) + 1):
        # Level k costs ~3x level k-1: predict from the ratio of the last two.
        # Sizes on an exponential scale make the predicted growth a ratio per level.
        if not naive_budget_tracker.allows(math.exp(k)):
            _log(
                f"  naive recursion: stop before level {k} (predicted "
                f"{naive_budget_tracker.predict(math.exp(k)):.1f} s > "
                f"{naive_budget:g} s)"
            )
            break
        elapsed = first_call_time(lambda k=k: naive(t_complex, k))
        cumulative += elapsed
        naive_budget_tracker.record(math.exp(k), elapsed)
        naive_rows.append(
            {"order": k, "seconds": elapsed, "cumulative_seconds": cumulative}
        )
        if elapsed > 1.0:
            _log(f"  naive recursion level {k}: {elapsed:.2f} s")
    results["naive"] = naive_rows

    def measure(name: str, make: Callable[[int], Callable[[], Any]]) -> list[dict]:
        tracker = _Budget(budget)
        rows = []
        for order in orders:
            if not tracker.allows(order):
                _log(
                    f"  {name}: stop before order {order} (predicted "
                    f"{tracker.predict(order):.1f} s > {budget:g} s)"
                )
                break
            fn = make(order)
            first = first_call_time(fn)
            steady = median_time(fn, (), 3, budgets=((2000, 0.1),))
            tracker.record(order, first)
            rows.append(
                {
                    "order": order,
                    "first_call_seconds": first,
                    "steady_seconds": steady,
                    "compile_seconds": max(first - steady, 0.0),
                }
            )
            _log(f"  {name} order {order}: first call {first:.3f} s")
        return rows

    def jet_method(order: int) -> Callable[[], Any]:
        levels = make_jet_hierarchy(order)
        return lambda: levels(t)

    def closed_form(order: int) -> Callable[[], Any]:
        hierarchy = hierax.HeisenbergHierarchy(hierax.Cos() * sy, sx, order)
        return lambda: hierarchy(t)

    def callable_operator(order: int) -> Callable[[], Any]:
        # A fresh lambda per order: a new static structure, so a fresh compile.
        operator = hierax.CallableOperator(lambda s: jnp.cos(s) * sy)
        hierarchy = hierax.HeisenbergHierarchy(operator, sx, order)
        return lambda: hierarchy(t)

    results["jet"] = measure("jet in fori_loop", jet_method)
    results["hierax_closed_form"] = measure("hierax closed form", closed_form)
    results["hierax_callable"] = measure("hierax callable", callable_operator)
    return results


def bench_sizes(sizes: Sequence[int], orders: Sequence[int], budget: float) -> dict:
    """Part (b): steady-state time against n for a two-term Hamiltonian, with a
    Hermitian observable (one product per term and coefficient) and a general one
    (two)."""
    _log(f"(b) steady-state run time against n at orders {list(orders)}")
    rng = np.random.default_rng(0)
    dtype = complex_dtype()
    matmul = jax.jit(lambda a, b: a @ b)
    rows = []
    for n in sizes:
        a, b, c, d = (
            jnp.asarray(_memory.random_hermitian(rng, n), dtype) for _ in range(4)
        )
        matmul_seconds = median_time(
            lambda a=a, b=b: matmul(a, b), (), 5, budgets=((2000, budget),)
        )
        hamiltonian = hierax.Cos(1.3) * a + hierax.Sin(0.7) * b
        observables = {"hermitian": c, "general": c + 1j * d}
        for order, (kind, observable) in itertools.product(orders, observables.items()):
            hierarchy = hierax.HeisenbergHierarchy(hamiltonian, observable, order)
            call = lambda hierarchy=hierarchy: hierarchy(1.0)
            first = first_call_time(call)
            times, _ = call_times(call, (), 3, budgets=((2000, budget),))
            seconds, calls = statistics.median(times), len(times)
            rows.append(
                {
                    "n": n,
                    "order": order,
                    "observable": kind,
                    "first_call_seconds": first,
                    "seconds": seconds,
                    "calls": calls,
                    "matmul_seconds": matmul_seconds,
                    "matmul_equivalents": seconds / matmul_seconds,
                }
            )
            _log(
                f"  n = {n:>3}, order {order:>2}, {kind:>9} X: "
                f"{seconds * 1e3:9.3f} ms per call "
                f"= {seconds / matmul_seconds:8.1f} matmuls (median of {calls})"
            )
    return {"sizes": list(sizes), "orders": list(orders), "rows": rows}


def bench_memory(n: int, order: int, rss: bool) -> dict:
    """Part (c): XLA's memory analysis of one call at size n, order K, and the
    resident-set growth of that call in a fresh process."""
    _log(f"(c) memory at n = {n}, order {order}")
    dtype = complex_dtype()
    hierarchy = _memory.two_term_hierarchy(n, order)
    t = jnp.asarray(1.0)
    compiled = jax.jit(lambda h, s: h(s)).lower(hierarchy, t).compile()
    analysis = compiled.memory_analysis()
    output_bytes = (order + 1) * n * n * jnp.dtype(dtype).itemsize
    result: dict[str, Any] = {
        "n": n,
        "order": order,
        "output_array_bytes": output_bytes,
    }
    if analysis is None:
        result["memory_analysis"] = None
        _log("  XLA memory analysis: not available on this backend")
    else:
        fields = (
            "temp_size_in_bytes",
            "output_size_in_bytes",
            "argument_size_in_bytes",
            "alias_size_in_bytes",
            "generated_code_size_in_bytes",
        )
        memory = {f: int(getattr(analysis, f, 0) or 0) for f in fields}
        peak = memory["temp_size_in_bytes"] + memory["output_size_in_bytes"]
        result["memory_analysis"] = memory
        result["peak_bytes"] = peak
        # The arguments (A, B, C and t) are the baseline the target allows on top.
        result["baseline_bytes"] = memory["argument_size_in_bytes"]
        result["peak_over_output"] = peak / output_bytes
        result["peak_allowed_bytes"] = 3 * output_bytes + result["baseline_bytes"]
        _log(
            f"  XLA: temp {memory['temp_size_in_bytes'] / 2**20:.1f} MiB + output "
            f"{memory['output_size_in_bytes'] / 2**20:.1f} MiB = "
            f"{peak / output_bytes:.2f}x the output array "
            f"({output_bytes / 2**20:.1f} MiB)"
        )
    if not rss:
        result["rss"] = "not measured (--quick)"
        return result
    try:
        process = subprocess.run(
            [
                sys.executable,
                str(pathlib.Path(__file__).with_name("memory.py")),
                str(n),
                str(order),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        measured = json.loads(process.stdout.strip().splitlines()[-1])
        measured["growth_over_output"] = measured["growth"] / output_bytes
        result["rss"] = measured
        _log(
            f"  resident-set growth of one call (fresh process): "
            f"{measured['growth'] / 2**20:.1f} MiB = "
            f"{measured['growth_over_output']:.2f}x the output array"
        )
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as error:
        result["rss"] = f"not measured: {type(error).__name__}"
        _log(f"  resident-set growth: not measured ({type(error).__name__})")
    return result


def _by_order(rows: list[dict], key: str) -> dict[int, float]:
    return {row["order"]: row[key] for row in rows}


def check_targets(results: dict) -> list[dict]:
    """The issue's targets, each with the measured value and whether it is met
    (`None` when this run did not measure it)."""
    compile_part = results["compile"]
    closed = _by_order(compile_part["hierax_closed_form"], "first_call_seconds")
    targets = []

    def add(name: str, value: str, met: bool | None) -> None:
        targets.append({"target": name, "measured": value, "met": met})

    if closed:
        worst = max(closed.values())
        add(
            "seed compile <= 1 s at every order (closed form, first call)",
            f"max {worst:.3f} s over orders {sorted(closed)}",
            worst <= 1.0 if max(closed) >= 200 else None,
        )
    if 10 in closed and 200 in closed:
        ratio = closed[200] / closed[10]
        add("compile(200) / compile(10) <= 1.5", f"{ratio:.2f}", ratio <= 1.5)
    else:
        add("compile(200) / compile(10) <= 1.5", "orders 10, 200 not run", None)
    if 9 in closed:
        add(
            "all ten seed levels, one call, compile + run <= 0.5 s",
            f"{closed[9]:.3f} s",
            closed[9] <= 0.5,
        )
    steady = _by_order(compile_part["hierax_closed_form"], "steady_seconds")
    if 9 in steady:
        add(
            "steady state, n = 2, order 9 <= 100 us per call (seed H)",
            f"{steady[9] * 1e6:.0f} us",
            steady[9] <= 100e-6,
        )
    sizes = {(r["n"], r["order"], r["observable"]): r for r in results["sizes"]["rows"]}
    for kind, limit in (("hermitian", 2000), ("general", 3500)):
        name = f"n = 128, order 40, two-term H, {kind} X <= {limit} matmul-equivalents"
        row = sizes.get((128, 40, kind))
        if row is None:
            add(name, "not run", None)
        else:
            equivalents = row["matmul_equivalents"]
            add(name, f"{equivalents:.0f}", equivalents <= limit)
    memory = results["memory"]
    if "peak_over_output" in memory:
        add(
            f"n = {memory['n']}, order {memory['order']}: peak <= 3x output + baseline",
            f"{memory['peak_over_output']:.2f}x output "
            f"(+ {memory['baseline_bytes'] / 2**20:.1f} MiB arguments)",
            memory["peak_bytes"] <= memory["peak_allowed_bytes"],
        )
    return targets


def result_rows(results: dict) -> list[dict]:
    """The run as result rows: each method's first call and steady time by order
    (the naive recursion's level K alone and levels 0..K), the run time against n
    (also in matmul-equivalents), and the memory at one size."""
    out = []
    case = "seed hierarchy"
    part = results["compile"]
    for r in part["naive"]:
        order = dict(order=r["order"])
        out.append(
            result_row(
                case, "naive level K", "first_call_seconds", r["seconds"], **order
            )
        )
        seconds = r["cumulative_seconds"]
        out.append(
            result_row(case, "naive 0..K", "first_call_seconds", seconds, **order)
        )
    for key, method in (
        ("jet", "jet in fori_loop"),
        ("hierax_closed_form", "hierax closed form"),
        ("hierax_callable", "hierax callable"),
    ):
        for r in part[key]:
            order = dict(order=r["order"])
            first = r["first_call_seconds"]
            out.append(result_row(case, method, "first_call_seconds", first, **order))
            out.append(
                result_row(case, method, "seconds", r["steady_seconds"], **order)
            )
    for r in results["sizes"]["rows"]:
        case = f"two-term H, {r['observable']} X"
        size = dict(n=r["n"], order=r["order"])
        out.append(result_row(case, "hierax", "seconds", r["seconds"], **size))
        equivalents = r["matmul_equivalents"]
        out.append(
            result_row(case, "hierax", "matmul_equivalents", equivalents, "", **size)
        )
    memory = results["memory"]
    if "peak_over_output" in memory:
        size = dict(n=memory["n"], order=memory["order"])
        case = "XLA memory analysis"
        out.append(
            result_row(case, "hierax", "peak_bytes", memory["peak_bytes"], "B", **size)
        )
        ratio = memory["peak_over_output"]
        out.append(result_row(case, "hierax", "peak_over_output", ratio, "", **size))
    return out


def _cell(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def write_markdown(results: dict, path: pathlib.Path) -> None:
    """`results.md`: the tables of a run."""
    compile_part = results["compile"]
    naive = {row["order"]: row for row in compile_part["naive"]}
    jet_rows = _by_order(compile_part["jet"], "first_call_seconds")
    closed = _by_order(compile_part["hierax_closed_form"], "first_call_seconds")
    callable_rows = _by_order(compile_part["hierax_callable"], "first_call_seconds")
    lines = [
        "# hierax benchmark results",
        "",
        f"{results['platform']}. Medians where repeated; times in seconds unless "
        "marked. Preliminary unless the machine was otherwise idle.",
        "",
        "## Compile time against the order (seed hierarchy, first call = compile + "
        "run)",
        "",
        "Naive: level K after levels 0..K-1 (the question's sequence), and the total "
        "for levels 0..K. `—`: not run (predicted over the "
        f"{compile_part['budget_seconds']:g} s budget).",
        "",
        "| order K | naive level K | naive 0..K | jet in fori_loop | hierax closed "
        "form | hierax callable | naive level K / hierax | naive 0..K / hierax | "
        "jet / hierax |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for order in compile_part["orders"]:
        row = naive.get(order)
        hierax = closed.get(order)
        level_ratio = f"{row['seconds'] / hierax:.1f}x" if row and hierax else "—"
        naive_ratio = (
            f"{row['cumulative_seconds'] / hierax:.1f}x" if row and hierax else "—"
        )
        jet_ratio = (
            f"{jet_rows[order] / hierax:.1f}x" if order in jet_rows and hierax else "—"
        )
        lines.append(
            f"| {order} | {_cell(row and row['seconds'])} | "
            f"{_cell(row and row['cumulative_seconds'])} | "
            f"{_cell(jet_rows.get(order))} | {_cell(hierax)} | "
            f"{_cell(callable_rows.get(order))} | {level_ratio} | {naive_ratio} | "
            f"{jet_ratio} |"
        )
    lines += [
        "",
        "## Steady-state run time against n (two-term H = cos(1.3t) A + sin(0.7t) B)",
        "",
        "| n | order | observable | per call | matmul (n x n, same dtype) "
        "| matmul-equivalents |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    for row in results["sizes"]["rows"]:
        lines.append(
            f"| {row['n']} | {row['order']} | {row['observable']} | "
            f"{format_seconds(row['seconds'])} | "
            f"{format_seconds(row['matmul_seconds'])} | "
            f"{row['matmul_equivalents']:.1f} |"
        )
    memory = results["memory"]
    lines += ["", f"## Memory at n = {memory['n']}, order {memory['order']}", ""]
    if memory.get("memory_analysis"):
        analysis = memory["memory_analysis"]
        lines += [
            "| quantity | MiB |",
            "|---|---:|",
            "| output array, (K+1) n^2 x 16 B | "
            f"{memory['output_array_bytes'] / 2**20:.1f} |",
            f"| XLA temp | {analysis['temp_size_in_bytes'] / 2**20:.1f} |",
            f"| XLA output | {analysis['output_size_in_bytes'] / 2**20:.1f} |",
            f"| XLA arguments (baseline) | "
            f"{analysis['argument_size_in_bytes'] / 2**20:.1f} |",
            f"| peak = temp + output | {memory['peak_bytes'] / 2**20:.1f} "
            f"({memory['peak_over_output']:.2f}x output) |",
        ]
        rss = memory.get("rss")
        if isinstance(rss, dict):
            lines.append(
                f"| resident-set growth of one call (fresh process) | "
                f"{rss['growth'] / 2**20:.1f} ({rss['growth_over_output']:.2f}x "
                "output) |"
            )
        else:
            lines.append(f"| resident-set growth | {rss} |")
    else:
        lines.append("XLA memory analysis not available on this backend.")
    lines += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for target in results["targets"]:
        met = {True: "yes", False: "**no**", None: "not measured"}[target["met"]]
        lines.append(f"| {target['target']} | {target['measured']} | {met} |")
    path.write_text("\n".join(lines) + "\n")


def write_plots(results: dict, out: pathlib.Path) -> list[str]:
    """PNG plots of parts (a) and (b); returns the file names written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    compile_part = results["compile"]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    series = [
        ("naive recursion (level K)", compile_part["naive"], "seconds", "o-"),
        ("jet in fori_loop", compile_part["jet"], "first_call_seconds", "s-"),
        (
            "hierax closed form",
            compile_part["hierax_closed_form"],
            "first_call_seconds",
            "^-",
        ),
        (
            "hierax callable",
            compile_part["hierax_callable"],
            "first_call_seconds",
            "v-",
        ),
    ]
    for label, rows, key, style in series:
        rows = [r for r in rows if r["order"] >= 1]
        if rows:
            ax.plot(
                [r["order"] for r in rows], [r[key] for r in rows], style, label=label
            )
    ax.set_xscale("log")
    _finish_plot(
        plt,
        fig,
        ax,
        ("order K", "first call (compile + run), s"),
        "Seed hierarchy: compile time against order",
        out / "compile_vs_order.png",
    )

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    rows = results["sizes"]["rows"]
    for order, kind in itertools.product(
        results["sizes"]["orders"], ("hermitian", "general")
    ):
        selected = [r for r in rows if r["order"] == order and r["observable"] == kind]
        ax.plot(
            [r["n"] for r in selected],
            [r["matmul_equivalents"] for r in selected],
            "o-" if kind == "hermitian" else "s--",
            label=f"order {order}, {kind} X",
        )
    ax.set_xscale("log", base=2)
    _finish_plot(
        plt,
        fig,
        ax,
        ("matrix size n", "time per call / time of one n x n matmul"),
        "Two-term H: run time in matmul-equivalents",
        out / "runtime_vs_size.png",
    )
    return ["compile_vs_order.png", "runtime_vs_size.png"]


def _finish_plot(plt, fig, ax, labels, title, path) -> None:
    """Log y axis, labels, grid and legend; save and close."""
    ax.set_yscale("log")
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_benchmarks(quick: bool, out: pathlib.Path) -> int:
    """Run all parts, write the results to `out`. Returns 0."""
    # Before anything creates an array: every measurement is in double precision.
    jax.config.update("jax_enable_x64", True)
    require_cpu("bench_hierarchies.py")
    watch = Stopwatch()
    if quick:  # a smoke run of every part, as small as it goes: three low orders
        orders = [1, 2, 3]
        budget, naive_budget = 2.0, 1.5
        sizes, size_orders, size_budget = [2], [3], 0.05
        memory_n, memory_order = 64, 8
        rss = False
    else:
        orders = [1, 2, 3, 5, 7, 8, 9, 10, 20, 40, 100, 200]
        budget, naive_budget = 10.0, 10.0
        sizes, size_orders, size_budget = [2, 4, 8, 16, 32, 64, 128, 256], [9, 40], 0.5
        memory_n, memory_order = 256, 32
        rss = True
    out.mkdir(parents=True, exist_ok=True)
    device = jax.devices()[0]
    results: dict[str, Any] = {
        "quick": quick,
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "platform": (
            f"jax {jax.__version__}, {device.platform} ({device.device_kind}), "
            f"{platform.machine()}, Python {platform.python_version()}, x64"
        ),
        "hierax_version": hierax.__version__,
    }
    _log(f"bench_hierarchies{' --quick' if quick else ''}: {results['platform']}")
    warm_up()
    results["compile"] = bench_compile(orders, budget, naive_budget)
    results["sizes"] = bench_sizes(sizes, size_orders, size_budget)
    results["memory"] = bench_memory(memory_n, memory_order, rss)
    results["targets"] = check_targets(results)
    results["total_seconds"] = watch.seconds
    emit(result_rows(results))

    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    write_markdown(results, out / "results.md")
    written = ["results.json", "results.md"]
    try:
        written += write_plots(results, out)
    except ImportError:
        _log(
            "matplotlib is not installed: plots skipped "
            "(pip install 'hierax[bench]' to get them)"
        )
    _log(f"Wrote {', '.join(written)} to {out} in {results['total_seconds']:.0f} s")
    for target in results["targets"]:
        met = {True: "met", False: "NOT MET", None: "not measured"}[target["met"]]
        _log(f"  {target['target']}: {target['measured']} ({met})")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer orders and sizes (under a minute)"
    )
    parser.add_argument(
        "--out", type=pathlib.Path, default=pathlib.Path("benchmarks/out")
    )
    arguments = parser.parse_args()
    arguments.out.mkdir(parents=True, exist_ok=True)
    sys.exit(run_benchmarks(quick=arguments.quick, out=arguments.out))
