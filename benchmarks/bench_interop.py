"""A dynamiqs Hamiltonian handed to hierax as it is, against the same Hamiltonian
written in hierax, side by side in one run.

    python benchmarks/bench_interop.py [--repeats R] [--heisenberg-repeats R]
        [--out DIR]

The system: a driven oscillator truncated at n = 32,
H(t) = 0.3 cos(1.1 t) (a + a^dag) + a^dag a + 0.01 (a^dag a)^2, written in dynamiqs
as `dq.modulated(f, a + a.dag()) + dq.constant(h0)` (DIA layout, dynamiqs' default
for these operators) and converted by hierax with its two terms. Each variant is
timed per call of `PropagatorDerivatives(H, 20)(t, psi)` on a ket and of
`HeisenbergHierarchy(H, X, 20)(t)`: the median of warm calls, the variants
interleaved call by call so that a change of machine load hits all of them alike.
The load average is recorded before and after.

Variants: the native `TimeOperator` with dense matrices and with sparse ones (the
storage a DIA conversion gives), the converted dynamiqs Hamiltonian in DIA and in
dense layout, and the structure-losing workaround `lambda t: H(t).to_jax()` (a
dense callable).
"""

import argparse
import json
import os
from pathlib import Path

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("bench_interop.py")

import dynamiqs as dq  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from rows import emit, row  # noqa: E402
from timing import alternating_times  # noqa: E402

import hierax  # noqa: E402


N = 32
ORDER = 20
T = 0.7


def drive(t):
    return 0.3 * jnp.cos(1.1 * t)


def systems() -> dict:
    dq.set_precision("double")
    a = np.diag(np.sqrt(np.arange(1.0, N)), 1)
    number = a.T @ a
    x = (a + a.T).astype(complex)
    h0 = (number + 0.01 * number @ number).astype(complex)
    native_functions = [hierax.Cos(1.1, amplitude=0.3), hierax.Constant(1.0)]
    dia = dq.modulated(drive, dq.asqarray(x, layout=dq.dia)) + dq.constant(
        dq.asqarray(h0, layout=dq.dia)
    )
    dense = dq.modulated(drive, dq.asqarray(x, layout=dq.dense)) + dq.constant(
        dq.asqarray(h0, layout=dq.dense)
    )
    return {
        "native TimeOperator, dense": hierax.TimeOperator(native_functions, [x, h0]),
        "native TimeOperator, sparse": hierax.TimeOperator(
            native_functions,
            [hierax.SparseMatrix.from_matrix(m) for m in (x, h0)],
        ),
        "converted dynamiqs, DIA": hierax.as_operator(dia),
        "converted dynamiqs, dense": hierax.as_operator(dense),
        "workaround lambda t: H(t).to_jax()": hierax.CallableOperator(
            lambda t: dia(t).to_jax()
        ),
    }


def interleaved_medians(calls: dict, repeats: int) -> dict:
    """Each call's median wall time in seconds, the calls taking turns."""
    times = alternating_times(calls, repeats)
    return {name: float(np.median(t)) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description="hierax and dynamiqs side by side")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument(
        "--heisenberg-repeats",
        type=int,
        default=30,
        help="repeats of the Heisenberg calls (each takes tens of ms, the "
        "workaround's half a second)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    load_before = os.getloadavg()
    operators = systems()
    psi = jnp.zeros(N, complex).at[0].set(1.0)
    observable = operators["native TimeOperator, dense"].matrices[0]
    propagators = {
        name: hierax.PropagatorDerivatives(op, ORDER) for name, op in operators.items()
    }
    heisenbergs = {
        name: hierax.HeisenbergHierarchy(op, observable, ORDER)
        for name, op in operators.items()
    }
    # The same numbers, whichever way the Hamiltonian was written.
    reference = propagators["native TimeOperator, dense"](T, psi)
    errors = {
        name: float(
            jnp.max(jnp.abs(p(T, psi) - reference)) / jnp.max(jnp.abs(reference))
        )
        for name, p in propagators.items()
    }
    results = {}
    label = "PropagatorDerivatives(H, 20)(t, psi)"
    calls = {n: (lambda p=p: p(T, psi)) for n, p in propagators.items()}
    results[label] = interleaved_medians(calls, args.repeats)
    label = "HeisenbergHierarchy(H, X, 20)(t)"
    calls = {n: (lambda h=h: h(T)) for n, h in heisenbergs.items()}
    results[label] = interleaved_medians(calls, args.heisenberg_repeats)
    load_after = os.getloadavg()

    print(
        f"n = {N}, order {ORDER}, medians of {args.repeats} (propagator) and "
        f"{args.heisenberg_repeats} (Heisenberg) interleaved calls"
    )
    print(f"load average before {load_before}, after {load_after}")
    for label, medians in results.items():
        print(f"\n{label}")
        print("| variant | per call | vs native (same storage) | relative error |")
        print("|---|---|---|---|")
        for name, seconds in medians.items():
            storage = "sparse" if "DIA" in name or "sparse" in name else "dense"
            native = medians[f"native TimeOperator, {storage}"]
            print(
                f"| {name} | {seconds * 1e6:.0f} us | {seconds / native:.2f}x | "
                f"{errors[name]:.1e} |"
            )
    rows = [
        row(label, name, "seconds", seconds, n=N, order=ORDER)
        for label, medians in results.items()
        for name, seconds in medians.items()
    ]
    label = "PropagatorDerivatives(H, 20)(t, psi)"
    rows += [
        row(label, name, "error", e, n=N, order=ORDER) for name, e in errors.items()
    ]
    emit(rows)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {
            "n": N,
            "order": ORDER,
            "repeats": args.repeats,
            "heisenberg_repeats": args.heisenberg_repeats,
            "load_before": load_before,
            "load_after": load_after,
            "seconds": results,
            "relative_errors": errors,
        }
        (args.out / "interop.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
