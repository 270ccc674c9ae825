"""Compile and run time of `hierax.taylor` against `jax.experimental.jet`, side by side.

    .venv/bin/python benchmarks/bench_taylor.py [--quick] [--out PATH]
        [--function matrix|softmax|gelu|logsumexp]
    .venv/bin/python benchmarks/bench_taylor.py --diffrax [--order 10]
    .venv/bin/python benchmarks/bench_taylor.py --check [--order 10]

`--function` picks the function expanded (the neural-network ones act on a vector of
16 entries, `f(t * w)`). `--diffrax` times a diffrax solve's coefficients against
nested `jax.jvp`s of the same solve (compile and run, side by side, the nested jvp in
a child process with `--jet-timeout`). `--check` is the slow cross-check the test
suite leaves out: linear algebra, sorting and cumulative ops against nested `jax.jvp`
at `--order` (default 10), maximum relative error per case. Every mode prints the
machine's load (`uptime`) first.

The function expanded is a 4x4 complex matrix function of about twenty primitives
(sin, exp, tanh, cos, sqrt, division, matrix products, conjugate transpose). For each
order, a fresh function is traced, lowered and compiled (`jax.jit(...).lower(t)
.compile()`, timed as one), then called many times through `jax.jit` (median,
`block_until_ready`).
`jet` runs in a child process with a time limit (`--jet-timeout`, default 300 s) and
is skipped at an order once its compile at the previous order exceeded 30 s.
`hierax.Recursion` on the seed step is timed alike at orders 9 and 100.

Targets: our compile at order 200 within 1.5x of order 10 and under 1 s; our run
time within 2x of jet wherever jet compiles in under 60 s; the Recursion compiles
under 1 s at both orders.
"""

import argparse
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from typing import Any

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("bench_taylor.py")

import jax.numpy as jnp  # noqa: E402
from jax.experimental.jet import jet  # noqa: E402
from rows import emit, row  # noqa: E402
from taylor_cases import LINALG  # noqa: E402
from timing import Stopwatch, call_times, compile_phases  # noqa: E402

from hierax import Recursion, taylor  # noqa: E402


H = (jnp.arange(16.0).reshape(4, 4) / 10 + 0.3j * jnp.eye(4)).astype(jnp.complex128)
G = (jnp.eye(4) - 0.05 * jnp.arange(16.0).reshape(4, 4).T) * (1 + 0.5j)
SIGMA_X = jnp.array([[0.0, 1.0], [1.0, 0.0]])
SIGMA_Y = jnp.array([[0.0, -1j], [1j, 0.0]])
T = 0.7


W = jnp.linspace(-1.5, 2.0, 16)
FUNCTION = "matrix"


def make_function():
    """A fresh closure each time, so no trace or compile is ever reused."""
    if FUNCTION == "softmax":
        return lambda t: jax.nn.softmax(jnp.sin(t * W))
    if FUNCTION == "gelu":
        return lambda t: jax.nn.gelu(t * W)
    if FUNCTION == "logsumexp":
        return lambda t: jax.scipy.special.logsumexp(jnp.cos(t * W) * W)

    def matrix_function(t):
        a = jnp.sin(t * H)
        b = jnp.exp(-0.1 * t * G)
        c = a @ b
        d = jnp.tanh(0.2 * c)
        e = d / (2.0 + jnp.cos(t))
        f = e @ e.conj().T
        return f + jnp.sqrt(1.5 + t) * H

    return matrix_function


def seed_step(t, x, dx):
    hx = jnp.cos(t) * SIGMA_Y @ x
    return 1j * (hx - hx.conj().T) + dx


def ours(order):
    fn = make_function()
    return jax.jit(lambda t: taylor(fn, t, order))


def jets(order):
    fn = make_function()
    direction = [jnp.ones(())] + [jnp.zeros(())] * (order - 1)

    def expand(t):
        primal, series = jet(fn, (t,), (direction,))
        scaled = [s / float(math.factorial(j + 1)) for j, s in enumerate(series)]
        return jnp.stack([primal] + scaled)

    return jax.jit(expand)


def recursion(order):
    return jax.jit(lambda t: Recursion(seed_step, SIGMA_X, order)(t))


def measure(make, calls, repeats=1):
    """Compile time (the least of `repeats` compiles, each of a fresh function: the
    machine may be shared) and median run time of `make()`'s jitted function."""
    t = jnp.asarray(T)
    compile_times = []
    jitted = None
    for _ in range(repeats):
        jitted = make()
        lower, xla, _ = compile_phases(jitted, (t,))
        compile_times.append(lower + xla)
    assert jitted is not None
    # Run time through `jax.jit`'s own dispatch, as users call it (an AOT
    # `Compiled` object's Python call path adds tens of microseconds); the first
    # call compiles again, into the jit cache, and is not timed.
    times, out = call_times(jitted, (t,), calls)
    return min(compile_times), statistics.median(times), out


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer orders and calls")
    parser.add_argument("--out", default="benchmarks/out/taylor.json")
    parser.add_argument("--jet-timeout", type=float, default=300.0)
    parser.add_argument("--jet-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--function",
        default="matrix",
        choices=["matrix", "softmax", "gelu", "logsumexp"],
    )
    parser.add_argument("--diffrax", action="store_true")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--order", type=int, default=10)
    parser.add_argument("--cases", help="comma-separated `--check` cases (default all)")
    parser.add_argument("--nested-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global FUNCTION
    FUNCTION = args.function
    if args.jet_child is None and args.nested_child is None:
        print(
            "load:", subprocess.run(["uptime"], capture_output=True, text=True).stdout
        )
    if args.nested_child is not None:
        compile_s, run_s, out = measure(
            lambda: jax.jit(_nested(_diffrax_solve, args.nested_child)), args.calls
        )
        print(json.dumps({"compile_s": compile_s, "run_s": run_s, "out": _encode(out)}))
        return
    if args.diffrax:
        return _bench_diffrax(args)
    if args.check:
        return _check(args.order, args.cases.split(",") if args.cases else None)
    if args.jet_child is not None:
        compile_s, run_s, out = measure(lambda: jets(args.jet_child), args.calls)
        print(json.dumps({"compile_s": compile_s, "run_s": run_s, "out": _encode(out)}))
        return

    our_orders = [5, 10, 40] if args.quick else [5, 10, 20, 40, 100, 200]
    jet_orders = [5, 10] if args.quick else [5, 10, 20, 40]
    recursion_orders = [9, 100]
    calls = 20 if args.quick else 200

    n_primitives = len(jax.make_jaxpr(make_function())(T).eqns)
    print(f"function {FUNCTION}: {n_primitives} primitives, t = {T}")
    print(f"jax {jax.__version__} on {jax.default_backend()}, {platform.machine()}")

    # All of ours first, then jet (in child processes), so neither disturbs the other.
    rows: dict[int, dict[str, Any]] = {
        order: {"order": order} for order in sorted({*our_orders, *jet_orders})
    }
    outputs = {}
    for order in our_orders:
        c, r, outputs[order] = measure(functools.partial(ours, order), calls, repeats=3)
        rows[order].update(ours_compile_s=c, ours_run_s=r)
        print(_format_row(rows[order]), flush=True)
    jet_skipped_after = None
    for order in jet_orders:
        row = rows[order]
        if jet_skipped_after is not None:
            row["jet_skipped"] = f"compile at order {jet_skipped_after} > 30 s"
        else:
            result = _jet_in_child(order, calls, args.jet_timeout)
            if result is None:
                row["jet_skipped"] = f"compile did not finish in {args.jet_timeout} s"
                jet_skipped_after = order
            else:
                c, r, jet_out = result
                row.update(jet_compile_s=c, jet_run_s=r)
                if order in outputs:
                    error = jnp.max(jnp.abs(outputs[order] - jet_out)) / jnp.max(
                        jnp.abs(jet_out)
                    )
                    row["max_relative_difference"] = float(error)
                if c > 30:
                    jet_skipped_after = order
        print(_format_row(row), flush=True)

    recursion_rows = []
    for order in recursion_orders:
        c, r, _ = measure(functools.partial(recursion, order), calls, repeats=3)
        recursion_rows.append({"order": order, "compile_s": c, "run_s": r})

    print()
    print(_table(rows))
    print()
    print("hierax.Recursion, seed step (2x2 complex):")
    for row in recursion_rows:
        print(
            f"  order {row['order']:>4}: compile {row['compile_s']:.3f} s, "
            f"run {1e3 * row['run_s']:.3f} ms"
        )

    summary = _summary(rows, recursion_rows)
    print()
    for key, value in summary.items():
        print(f"{key}: {value}")

    emit(result_rows(rows, recursion_rows))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(
            {
                "function_primitives": n_primitives,
                "jax_version": jax.__version__,
                "backend": jax.default_backend(),
                "quick": args.quick,
                "taylor": list(rows.values()),
                "recursion": recursion_rows,
                "summary": summary,
            },
            f,
            indent=2,
        )
    print(f"\nwrote {args.out}")


def result_rows(rows, recursion_rows) -> list[dict]:
    """The tables as result rows: compile and run time of hierax.taylor and jet
    by order, and of hierax.Recursion."""
    out = []
    case = f"{FUNCTION} function"
    for r in rows.values():
        for method, prefix in (("hierax.taylor", "ours"), ("jet", "jet")):
            for metric in ("compile", "run"):
                key = f"{prefix}_{metric}_s"
                if key in r:
                    name = "compile_seconds" if metric == "compile" else "seconds"
                    out.append(row(case, method, name, r[key], order=r["order"]))
    for r in recursion_rows:
        case = "hierax.Recursion, seed step"
        out.append(
            row(case, "hierax", "compile_seconds", r["compile_s"], order=r["order"])
        )
        out.append(row(case, "hierax", "seconds", r["run_s"], order=r["order"]))
    return out


def _encode(out):
    out = jnp.asarray(out)
    return {"real": out.real.tolist(), "imag": out.imag.tolist()}


def _jet_in_child(order, calls, timeout):
    """jet's compile time explodes with the order: measure it in a child process
    that is killed after `timeout` seconds (None then)."""
    command = [sys.executable, os.path.abspath(__file__), "--jet-child", str(order)]
    command += ["--calls", str(calls), "--function", FUNCTION]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=True
        )
    except subprocess.TimeoutExpired:
        return None
    result = json.loads(done.stdout.strip().splitlines()[-1])
    out = jnp.asarray(result["out"]["real"]) + 1j * jnp.asarray(result["out"]["imag"])
    return result["compile_s"], result["run_s"], out


def _format_row(row):
    parts = [f"order {row['order']:>4}"]
    if "ours_compile_s" in row:
        parts.append(f"ours compile {row['ours_compile_s']:.3f} s")
    if "jet_compile_s" in row:
        parts.append(f"jet compile {row['jet_compile_s']:.3f} s")
    if "jet_skipped" in row:
        parts.append(f"jet skipped: {row['jet_skipped']}")
    return ", ".join(parts)


def _cell(row, key, scale=1.0, fmt="{:.3f}"):
    return fmt.format(scale * row[key]) if key in row else "-"


def _table(rows):
    header = (
        f"{'order':>5} | {'ours compile s':>14} | {'jet compile s':>13} | "
        f"{'ours run ms':>11} | {'jet run ms':>10} | {'run ours/jet':>12}"
    )
    lines = [header, "-" * len(header)]
    for r in rows.values():
        ratio = (
            f"{r['ours_run_s'] / r['jet_run_s']:.2f}"
            if "ours_run_s" in r and "jet_run_s" in r
            else "-"
        )
        lines.append(
            f"{r['order']:>5} | {_cell(r, 'ours_compile_s'):>14} | "
            f"{_cell(r, 'jet_compile_s'):>13} | "
            f"{_cell(r, 'ours_run_s', 1e3):>11} | "
            f"{_cell(r, 'jet_run_s', 1e3):>10} | {ratio:>12}"
        )
    return "\n".join(lines)


def _summary(rows, recursion_rows):
    summary = {}
    ours_compile = {
        o: r["ours_compile_s"] for o, r in rows.items() if "ours_compile_s" in r
    }
    top = max(ours_compile)
    if 10 in ours_compile:
        summary[f"ours compile order {top} / order 10"] = round(
            ours_compile[top] / ours_compile[10], 3
        )
    summary["ours max compile s"] = round(max(ours_compile.values()), 3)
    ratios = [
        r["ours_run_s"] / r["jet_run_s"]
        for r in rows.values()
        if "ours_run_s" in r and "jet_run_s" in r and r["jet_compile_s"] < 60
    ]
    if ratios:
        summary["max run ours / jet (jet compile < 60 s)"] = round(max(ratios), 3)
    summary["recursion max compile s"] = round(
        max(r["compile_s"] for r in recursion_rows), 3
    )
    return summary


# --- diffrax: a solve's coefficients against nested jvp ------------------------------


def _diffrax_solve(t):
    import diffrax

    term = diffrax.ODETerm(lambda s, y, a: -a * y + jnp.sin(s) * y[::-1])
    solution = diffrax.diffeqsolve(
        term,
        diffrax.Tsit5(),
        0.0,
        1.0,
        0.05,
        jnp.array([1.0, 2.0]) * jnp.cos(t),
        args=0.5 + t,
        adjoint=diffrax.ForwardMode(),
    )
    assert solution.ys is not None
    return solution.ys[-1]


def _nested(fn, order):
    """Normalised coefficients from `order` nested `jax.jvp`s."""

    def derivative(g):
        return lambda s: jax.jvp(g, (s,), (jnp.ones_like(s),))[1]

    def coefficients(t):
        out, g = [], fn
        for j in range(order + 1):
            out.append(g(t) / math.factorial(j))
            g = derivative(g)
        return jnp.stack(out)

    return coefficients


def _bench_diffrax(args):
    order, calls = args.order, 5 if args.quick else 20
    c, r, ours_out = measure(
        lambda: jax.jit(lambda t: taylor(_diffrax_solve, t, order)), calls
    )
    print(f"diffrax Tsit5, 20 steps, order {order}")
    print(f"  hierax.taylor : compile {c:.2f} s, run {1e3 * r:.3f} ms")
    command = [sys.executable, os.path.abspath(__file__), "--nested-child", str(order)]
    command += ["--calls", str(calls)]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=args.jet_timeout,
            check=True,
        )
    except subprocess.TimeoutExpired:
        print(f"  nested jvp    : compile did not finish in {args.jet_timeout} s")
        return
    result = json.loads(done.stdout.strip().splitlines()[-1])
    nested_out = jnp.asarray(result["out"]["real"])
    error = jnp.max(jnp.abs(ours_out - nested_out) / jnp.abs(nested_out))
    print(
        f"  nested jvp    : compile {result['compile_s']:.2f} s, "
        f"run {1e3 * result['run_s']:.3f} ms"
    )
    print(
        f"  compile ratio nested/ours {result['compile_s'] / c:.1f}, run ratio "
        f"{result['run_s'] / r:.1f}; max relative difference {float(error):.2e}"
    )


# --- the slow cross-check ---------------------------------------------------------


def _check(order, cases=None):
    print(f"hierax.taylor against {order} nested jax.jvp, t = 0.3")
    for name, fn in LINALG.items():
        if cases is not None and name not in cases:
            continue
        watch = Stopwatch()
        ours_out = taylor(fn, 0.3, order)
        reference = jax.jit(
            lambda t, fn=fn: jax.tree.map(
                lambda *leaves: jnp.stack(leaves),
                *[_nested_leaf(fn, j)(t) for j in range(order + 1)],
            )
        )(jnp.asarray(0.3))
        errors = [
            float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
            for a, b in zip(jax.tree.leaves(ours_out), jax.tree.leaves(reference))
        ]
        print(
            f"  {name:<22} max relative error {max(errors):.1e} "
            f"({watch.seconds:.0f} s)",
            flush=True,
        )


def _nested_leaf(fn, j):
    g = fn
    for _ in range(j):
        g = (lambda h: lambda s: jax.jvp(h, (s,), (jnp.ones_like(s),))[1])(g)
    return lambda t: jax.tree.map(lambda x: x / math.factorial(j), g(t))


if __name__ == "__main__":
    main()
