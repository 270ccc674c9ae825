"""Floquet quasienergies over a sweep of drive amplitudes: `hierax.floquet` (one
`jax.vmap`) against QuTiP's `FloquetBasis` in a loop and dynamiqs' `floquet`
batched (`jax.vmap`); and the high-frequency expansion at order 10 for n = 100.

    .venv/bin/python benchmarks/bench_floquet.py [--quick] [--levels 4,6,10]
        [--phase 0.3] [--second 0.5]

A transmon of n levels (frequency 1, anharmonicity -0.3, x64) driven through
a + a^dagger at frequency 0.9 (lab frame, counter-rotating terms kept), amplitudes
0 ... 0.05 (1000 of them; `--quick`: 100). A cosine drive from t0 = 0 on real
matrices is symmetric about the middle of the period, H(T/2 + s) = conj(H(T/2 - s)),
and `hierax.floquet` then solves half the period; `--phase 0.3` drives
cos(0.9 t + 0.3) instead, symmetric about a maximum of the cosine inside the
period (hierax solves half a period there, and carries the propagator to t0);
`--second 0.5` adds a second harmonic, 0.5 A cos(1.8 t + 0.7), whose phase
shares no centre with the first: no symmetry, every method solves the whole
period. The reference is hierax at rtol 1e-13; its distance to QuTiP at rtol
1e-13 is printed for the largest amplitude. Each method runs a ladder of
tolerances (half decades); the loosest whose largest quasienergy error over the
sweep is below 1e-9 is timed (median of 5 after a first call for the JAX
methods; one call for the QuTiP loop). Ratios are the best peer's time over
hierax's; the load is printed before and after.
"""

import argparse
import importlib
import os
import statistics
import warnings

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("bench_floquet.py")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from rows import emit, row  # noqa: E402
from timing import call_times, time_call  # noqa: E402

import hierax  # noqa: E402


warnings.filterwarnings("ignore")
OMEGA = 0.9
TARGET = 1e-9
PHASE = 0.0  # of the drive, cos(OMEGA t + PHASE); set by --phase
SECOND = 0.0  # relative amplitude of SECOND cos(2 OMEGA t + 0.7); set by --second
SECOND_PHASE = 0.7


def drive(t, amplitude, cos=np.cos):
    """The drive's value: A (cos(w t + phase) + SECOND cos(2 w t + 0.7))."""
    return amplitude * (
        cos(OMEGA * t + PHASE) + SECOND * cos(2 * OMEGA * t + SECOND_PHASE)
    )


def transmon(levels: int) -> tuple[np.ndarray, np.ndarray]:
    a = np.diag(np.sqrt(np.arange(1, levels)), 1)
    n = a.T @ a
    return n - 0.15 * n @ (n - np.eye(levels)), a + a.T


def folded(e: np.ndarray) -> np.ndarray:
    e = np.mod(np.asarray(e) + OMEGA / 2, OMEGA) - OMEGA / 2
    return np.sort(np.where(e <= -OMEGA / 2 + 1e-12, e + OMEGA, e), axis=-1)


def hierax_sweep(levels: int, tol: float):
    h0, v = transmon(levels)

    def energies(amplitude):
        h = h0 + hierax.Cos(OMEGA, PHASE, amplitude) * v
        if SECOND:
            h = h + hierax.Cos(2 * OMEGA, SECOND_PHASE, SECOND * amplitude) * v
        return hierax.floquet(
            h, 2 * jnp.pi / OMEGA, rtol=tol, atol=tol * 1e-2
        ).quasienergies

    batched = jax.jit(jax.vmap(energies))
    return lambda amplitudes: np.asarray(batched(jnp.asarray(amplitudes)))


def dynamiqs_sweep(levels: int, tol: float):
    import dynamiqs as dq

    h0, v = transmon(levels)
    methods = importlib.import_module("dynamiqs.method")
    method = methods.Dopri8(rtol=tol, atol=tol * 1e-2, max_steps=10**6)

    def energies(amplitude):
        h = dq.constant(h0) + dq.modulated(lambda t: drive(t, amplitude, jnp.cos), v)
        period = 2 * np.pi / OMEGA
        result = dq.floquet(
            h, period, jnp.array([0.0]), method=method, progress_meter=False
        )
        return result.quasienergies

    batched = jax.jit(jax.vmap(energies))
    return lambda amplitudes: folded(np.asarray(batched(jnp.asarray(amplitudes))))


def qutip_sweep(levels: int, tol: float):
    import qutip

    h0, v = transmon(levels)
    period = 2 * np.pi / OMEGA

    def run(amplitudes):
        out = []
        for amplitude in np.asarray(amplitudes):
            basis = qutip.FloquetBasis(
                [
                    qutip.Qobj(h0),
                    [
                        qutip.Qobj(v),
                        lambda t, a=float(amplitude): drive(t, a),
                    ],
                ],
                period,
                options={"rtol": tol, "atol": tol * 1e-2, "nsteps": 10**7},
            )
            out.append(basis.e_quasi)
        return folded(np.array(out))

    return run


METHODS = {
    "hierax": hierax_sweep,
    "dynamiqs Dopri8 (vmap)": dynamiqs_sweep,
    "QuTiP FloquetBasis (loop)": qutip_sweep,
}


def _ladder(loosest: float, tightest: float) -> list[float]:
    """Tolerances from `loosest` to `tightest` in half decades."""
    count = round(2 * np.log10(loosest / tightest)) + 1
    return [float(f"{loosest * 10 ** (-k / 2):.0e}") for k in range(count)]


# Half-decade ladders, each starting where its method's error is still above the
# target (so every method is timed at its loosest tolerance that meets it).
LADDERS = {
    "hierax": _ladder(1e-5, 1e-11),
    "dynamiqs Dopri8 (vmap)": _ladder(1e-7, 1e-12),
    "QuTiP FloquetBasis (loop)": _ladder(1e-8, 1e-12),
}


def expansion_row(levels: int = 100, order: int = 10) -> list[dict]:
    """`hierax.high_frequency_expansion` at `order` for a large spin S = (n - 1)/2
    (n levels) driven fast: H = Sz / S + 0.8 cos(w t) Sx / S + 0.3 sin(w t) Sy / S,
    w = 20. Timed from Python: the first call (compile included) and the median of
    3 later calls at new frequencies (no compile); the error of the order-10
    quasienergies against `hierax.floquet` at rtol 1e-13. Returns the result
    rows."""
    s = (levels - 1) / 2
    m = s - np.arange(levels)
    raising = np.diag(np.sqrt(s * (s + 1) - m[1:] * (m[1:] + 1)), 1)
    sx, sy = (raising + raising.T) / 2, (raising - raising.T) / 2j
    sz = np.diag(m)

    def hamiltonian(omega: float):
        drive = (
            hierax.Cos(omega, amplitude=0.8) * sx
            + hierax.Sin(omega, amplitude=0.3) * sy
        )
        return (sz + drive) / s

    def run(omega: float):
        period = 2 * np.pi / omega
        expansion = hierax.high_frequency_expansion(
            hamiltonian(omega), period, order=order
        )
        return expansion, expansion.terms.block_until_ready()

    first, (expansion, _) = time_call(run, 20.0)
    times = [time_call(run, omega)[0] for omega in (20.1, 20.2, 20.3)]
    exact = hierax.floquet(hamiltonian(20.0), 2 * np.pi / 20.0, rtol=1e-13, atol=1e-15)
    errors = np.asarray(expansion.convergence(exact))
    print(
        f"\nhigh-frequency expansion, n = {levels}, order {order}: first call "
        f"{first:.2f} s, later calls {statistics.median(times):.2f} s (median of 3); "
        f"quasienergy error by order: " + " ".join(f"{e:.1e}" for e in errors)
    )
    case, method = f"high-frequency expansion, n = {levels}", "hierax"
    return [
        row(case, method, "first_call_seconds", first, order=order),
        row(case, method, "seconds", statistics.median(times), order=order),
        row(case, method, "error", errors[-1], order=order),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--levels", default="4,6,10")
    parser.add_argument("--expansion-only", action="store_true")
    parser.add_argument("--phase", type=float, default=0.0)
    parser.add_argument("--second", type=float, default=0.0)
    args = parser.parse_args()
    global PHASE, SECOND
    PHASE, SECOND = args.phase, args.second
    if args.expansion_only:
        print(f"load before: {os.getloadavg()}")
        emit(expansion_row())
        print(f"load after: {os.getloadavg()}")
        return
    count = 100 if args.quick else 1000
    amplitudes = np.linspace(0.0, 0.05, count)
    print(f"load before: {os.getloadavg()}")
    rows = []
    for levels in [int(x) for x in args.levels.split(",")]:
        reference = hierax_sweep(levels, 1e-13)(amplitudes)
        check = qutip_sweep(levels, 1e-13)(amplitudes[-1:])
        print(
            f"n = {levels}: reference against QuTiP at 1e-13 (largest amplitude): "
            f"{np.abs(check[0] - reference[-1]).max():.1e}",
            flush=True,
        )
        for name, build in METHODS.items():
            # The QuTiP loop is timed once, on a tenth of the sweep, and scaled.
            loop = name.startswith("QuTiP")
            subset = amplitudes[:: 10 if loop else 1]
            for tol in LADDERS[name]:
                run = build(levels, tol)
                times, result = call_times(run, (subset,), 1 if loop else 5)
                seconds = statistics.median(times)
                error = np.abs(result - reference[:: 10 if loop else 1]).max()
                print(f"  {name} tol {tol:.0e}: {seconds:.3f} s, error {error:.1e}")
                if error < TARGET:
                    rows.append((levels, name, tol, seconds * (10 if loop else 1)))
                    break
            else:
                rows.append((levels, name, None, float("nan")))
    expansion = expansion_row()
    print(f"load after: {os.getloadavg()}")
    print(
        f"\n{count} amplitudes, drive phase {PHASE:g}, second harmonic {SECOND:g}, "
        "largest quasienergy error "
        f"below {TARGET:g}:\n"
    )
    print("| n | method | tolerance | time (s) | time / hierax |")
    print("|---:|---|---:|---:|---:|")
    for levels, name, tol, seconds in rows:
        base = next(s for n, m, _, s in rows if n == levels and m == "hierax")
        shown = f"{tol:.0e}" if tol else "not reached"
        print(
            f"| {levels} | {name} | {shown} | {seconds:.2f} | {seconds / base:.1f}x |"
        )
    case = f"transmon, {count} amplitudes"
    measured = [
        row(case, name, metric, value, n=levels)
        for levels, name, tol, seconds in rows
        for metric, value in (("seconds", seconds), ("tolerance", tol))
    ]
    emit(measured + expansion)


if __name__ == "__main__":
    main()
