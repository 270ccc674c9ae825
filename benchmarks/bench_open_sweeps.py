"""Open-system parameter sweeps under `jax.vmap`: `hierax.mesolve` against a
hand-written diffrax Dopri8 under the same `vmap` and dynamiqs' `mesolve` (Dopri8,
which batches over operators itself), at matched final error.

    .venv/bin/python benchmarks/bench_open_sweeps.py [--quick] [--out PATH]
        [--skip-first-call]

The system (float64/complex128, CPU): a driven, damped transmon-like qutrit in the
frame rotating at its 0-1 frequency, $H(t) = \\frac{\\alpha}{2} n(n - 1) +
\\Omega(t) \\frac{a + a^\\dagger}{2}$, anharmonicity $\\alpha = -3$, a Gaussian pi
pulse on the 0-1 transition $\\Omega(t) = s A e^{-(t - 10)^2 / (2 \\cdot 3^2)}$,
$A = \\pi / (3 \\sqrt{2 \\pi})$, over $t \\in [0, 20]$ from $|0\\rangle$; jump
operators $\\sqrt{\\gamma_1}\\, a$ and $\\sqrt{\\gamma_\\phi}\\, n$. Two sweeps of
64 elements (`--quick`: 16):

- `decay`: $\\gamma_1 \\in [0.001, 0.1]$ (linear), $\\gamma_\\phi = 0.01$, $s = 1$;
  the swept rate is a traced value in the jump operator's scale;
- `amplitude`: $s \\in [0, 3]$ (pulse areas up to $3\\pi$), $\\gamma_1 = 0.02$,
  $\\gamma_\\phi = 0.01$; the amplitude is the traced amplitude of the
  `hierax.Gaussian`.

The methods, each one jitted program over the whole batch with rtol traced (one
compile serves a ladder):

- `hierax`: `hierax.mesolve` of one element under `jax.vmap`, the decay jump
  operator written `jnp.sqrt(gamma1) * hierax.as_operator(a)` (a traced constant
  times a known matrix, the form `bench_traced_parameters.py` measures);
- `dopri8`: diffrax Dopri8 on the real and imaginary parts of the row-major
  vec(rho), the Liouvillian's parts as real matrices (`peers.real_embedding`) and
  the swept parameter scaling its part, one product per part, under the same
  `jax.vmap`;
- `dynamiqs dopri8`: dynamiqs' `mesolve` with the batch in its operators (a
  `(B, 3, 3)` decay jump operator; a `dq.modulated` drive whose function returns
  the B amplitudes), no `vmap`.

The reference is scipy's DOP853 on the whole batch at once (rtol 1e-13, atol
1e-15, real and imaginary parts of every rho, the Lindblad equation written with
matrix products, not the Liouvillian): independent of every method. The error of a
sweep is the largest Frobenius norm of an element's final rho minus its reference.

For each method a ladder of rtol 1e-2, 1e-3 ... 1e-13 (`--quick`: 1e-4, 1e-6 ...
1e-12), atol = rtol / 100, is timed with the methods taking turns
(`timing.alternating_times`); the time at final error 1e-6 and 1e-10 is read off
the ladder (`timing.at_targets`), with whether the loosest rtol already
met it (the loosest rtol that met it is a row too). Reported besides: steps per
element (min, median, max; the solvers' own counts) and the first call of each
jitted sweep (build, trace, compile and run, after `timing.warm_up`): in this
process, hierax first (so it pays the process's first traces of diffrax and
hierax code), and in a fresh process per method (this script run with
`--first-call`, the imports before the clock; the methods taking turns, median of
3; not with `--quick` or `--skip-first-call`).
`os.getloadavg()` goes with the results.
"""

import argparse
import os
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
from peers import import_dynamiqs, real_embedding  # noqa: E402
from rows import emit, row, save  # noqa: E402
from sweeps import ladder_calls, print_ladder, run_ladder  # noqa: E402
from systems import dop853_final  # noqa: E402
from timing import (  # noqa: E402
    Stopwatch,
    at_targets,
    time_call,
    warm_up,
)

import hierax  # noqa: E402


warnings.filterwarnings("ignore", message="Complex dtype support")
warnings.filterwarnings("ignore", category=FutureWarning)

TARGETS = (1e-6, 1e-10)

N = 3
A_OP = np.diag(np.sqrt(np.arange(1.0, N)), 1).astype(complex)
NUMBER = A_OP.conj().T @ A_OP
DRIVE = (A_OP + A_OP.conj().T) / 2


def liouvillian_parts(h: np.ndarray) -> np.ndarray:
    """-i[h, .] on the row-major vec(rho)."""
    eye = np.eye(N)
    return -1j * (np.kron(h, eye) - np.kron(eye, h.T))


def dissipator(j: np.ndarray) -> np.ndarray:
    """D[j] = j . j^dag - {j^dag j, .}/2 on the row-major vec(rho)."""
    eye = np.eye(N)
    jj = j.conj().T @ j
    return np.kron(j, j.conj()) - 0.5 * np.kron(jj, eye) - 0.5 * np.kron(eye, jj.T)


class QutritSweep:
    """A driven, damped qutrit, swept over the decay rate gamma1 (`decay`) or the
    drive's amplitude (`amplitude`)."""

    anharmonicity = -3.0
    span, mean, width = 20.0, 10.0, 3.0

    def __init__(self, kind: str, count: int = 64):
        self.kind = kind
        self.amplitude = np.pi / (self.width * np.sqrt(2 * np.pi))
        self.h0 = self.anharmonicity / 2 * NUMBER @ (NUMBER - np.eye(N))
        self.gamma_phi = 0.01
        if kind == "decay":
            self.name = f"decay sweep ({count} gamma1 under vmap)"
            self.params = np.linspace(0.001, 0.1, count)
        elif kind == "amplitude":
            self.name = f"amplitude sweep ({count} amplitudes under vmap)"
            self.params = np.linspace(0.0, 3.0, count)
            self.fixed_gamma1 = 0.02
        else:
            raise ValueError(kind)
        self.rho0 = np.zeros((N, N), complex)
        self.rho0[0, 0] = 1.0

    def gamma1(self, param):
        """The decay rate of the element of parameter `param` (NumPy or JAX)."""
        return param if self.kind == "decay" else self.fixed_gamma1 + 0.0 * param

    def scale(self, param):
        """The factor on the pulse of the element of parameter `param`."""
        return param if self.kind == "amplitude" else 1.0 + 0.0 * param

    def pulse(self, t, xp=np):
        return self.amplitude * xp.exp(-((t - self.mean) ** 2) / (2 * self.width**2))

    # --- hierax ---------------------------------------------------------------------

    def hierax_one(self, rtol):
        times = jnp.array([0.0, self.span])
        dephasing = np.sqrt(self.gamma_phi) * NUMBER

        def one(param):
            peak = (
                param * self.amplitude if self.kind == "amplitude" else self.amplitude
            )
            h = hierax.TimeOperator(
                [
                    hierax.Constant(1.0),
                    hierax.Gaussian(self.mean, self.width, peak),
                ],
                [self.h0, DRIVE],
            )
            if self.kind == "decay":
                decay = jnp.sqrt(param) * hierax.as_operator(A_OP)
            else:
                decay = np.sqrt(self.fixed_gamma1) * A_OP
            s = hierax.mesolve(
                h, [decay, dephasing], self.rho0, times, rtol=rtol, atol=rtol / 100
            )
            return s.final_state, s.stats["num_steps"]

        return one

    # --- diffrax Dopri8 on vec(rho) -----------------------------------------------

    def diffrax_one(self, rtol):
        fixed = liouvillian_parts(self.h0) + self.gamma_phi * dissipator(NUMBER)
        if self.kind == "amplitude":
            fixed = fixed + self.fixed_gamma1 * dissipator(A_OP)
        e0 = jnp.asarray(real_embedding(fixed))
        ea = jnp.asarray(real_embedding(dissipator(A_OP)))
        ex = jnp.asarray(real_embedding(liouvillian_parts(DRIVE)))
        v0 = self.rho0.ravel()
        y0 = jnp.concatenate([jnp.asarray(np.real(v0)), jnp.asarray(np.imag(v0))])
        m = N * N

        if self.kind == "decay":

            def field(t, y, param):
                return e0 @ y + param * (ea @ y) + self.pulse(t, jnp) * (ex @ y)

        else:

            def field(t, y, param):
                return e0 @ y + (param * self.pulse(t, jnp)) * (ex @ y)

        term = diffrax.ODETerm(field)

        def one(param):
            s = diffrax.diffeqsolve(
                term,
                diffrax.Dopri8(),
                0.0,
                self.span,
                None,
                y0,
                args=param,
                stepsize_controller=diffrax.PIDController(rtol=rtol, atol=rtol / 100),
                max_steps=100_000,
            )
            y = s.ys[-1]  # pyright: ignore[reportOptionalSubscript]
            return (y[:m] + 1j * y[m:]).reshape(N, N), s.stats["num_steps"]

        return one

    # --- dynamiqs, the batch in its operators ---------------------------------------

    def dynamiqs_batch(self):
        """`f(params, rtol) -> (final rhos, steps)`, jitted: dynamiqs' `mesolve`
        (Dopri8) with the batch carried by its operators."""
        import dynamiqs as dq
        import dynamiqs.method as dq_method

        h0, drive = jnp.asarray(self.h0), jnp.asarray(DRIVE)
        a, number = jnp.asarray(A_OP), jnp.asarray(NUMBER)
        rho0 = jnp.asarray(self.rho0)
        tsave = jnp.asarray([0.0, self.span])

        @jax.jit
        def run(params, rtol):
            if self.kind == "decay":
                hamiltonian = dq.constant(h0) + dq.modulated(
                    lambda t: self.pulse(t, jnp), drive
                )
                decay = jnp.sqrt(params)[:, None, None] * a
            else:
                hamiltonian = dq.constant(h0) + dq.modulated(
                    lambda t: params * self.pulse(t, jnp), drive
                )
                decay = np.sqrt(self.fixed_gamma1) * a
            jumps: list[Any] = [decay, np.sqrt(self.gamma_phi) * number]
            out = dq.mesolve(
                hamiltonian,
                jumps,
                rho0,
                tsave,
                method=dq_method.Dopri8(rtol=rtol, atol=rtol / 100, max_steps=10**6),
                progress_meter=False,
            )
            infos: Any = out.infos
            return out.final_state.to_jax(), infos.nsteps

        return run

    # --- the reference ------------------------------------------------------------

    def reference(self) -> np.ndarray:
        """The whole batch as one real ODE for scipy's DOP853, the Lindblad equation
        in matrix products (no Liouvillian)."""
        b = len(self.params)
        rates = self.gamma1(self.params)[:, None, None]
        scales = self.scale(self.params)[:, None, None]
        a, ad = A_OP, A_OP.conj().T
        n_op = NUMBER
        aa, nn = ad @ a, n_op @ n_op

        def derivative(t, rho):
            h = self.h0 + scales * self.pulse(t) * DRIVE
            out = -1j * (h @ rho - rho @ h)
            out += rates * (a @ rho @ ad - 0.5 * (aa @ rho + rho @ aa))
            out += self.gamma_phi * (n_op @ rho @ n_op - 0.5 * (nn @ rho + rho @ nn))
            return out

        return dop853_final(derivative, np.tile(self.rho0, (b, 1, 1)), self.span)


# --- measurements -------------------------------------------------------------------


def sweep_error(states, reference) -> float:
    """The largest Frobenius norm of an element's difference to its reference."""
    diff = np.asarray(states).reshape(reference.shape) - reference
    return float(np.max(np.linalg.norm(diff, axis=(-2, -1))))


METHODS = {
    "hierax": lambda sweep: ladder_calls(sweep.hierax_one),
    "dopri8": lambda sweep: ladder_calls(sweep.diffrax_one),
    "dynamiqs dopri8": lambda sweep: sweep.dynamiqs_batch(),
}


def first_calls(methods, params, rtol) -> dict:
    """Each jitted sweep's first call (trace, compile and run), in turn."""
    args, r = jnp.asarray(params), jnp.asarray(rtol)
    out = {}
    for name, f in methods.items():
        seconds, _ = time_call(f, args, r)
        out[name] = seconds
    return out


def bench_sweep(sweep: QutritSweep, rtols, repeats) -> dict:
    print(f"\n== {sweep.name}", flush=True)
    clock = Stopwatch()
    reference = sweep.reference()
    print(f"reference (scipy DOP853, rtol 1e-13): {clock.seconds:.1f} s")
    methods = {name: build(sweep) for name, build in METHODS.items()}
    first = first_calls(methods, sweep.params, rtols[0])
    print(
        "first call in this process (trace, compile, run; in this order): "
        + ", ".join(f"{k} {v:.2f} s" for k, v in first.items())
    )
    ladder = run_ladder(methods, sweep.params, reference, rtols, repeats, sweep_error)
    print_ladder(ladder)
    targets = {name: at_targets(points, TARGETS) for name, points in ladder.items()}
    for target in TARGETS:
        key = f"{target:.0e}"
        words = []
        for name, t in targets.items():
            s, bound = t[key]["seconds"], t[key]["bound"]
            words.append(
                f"{name} "
                + ("-" if s is None else f"{'<= ' if bound else ''}{s * 1e3:.2f} ms")
            )
        at = {n: t[key]["seconds"] for n, t in targets.items()}
        peers = [at[n] for n in at if n != "hierax" and at[n] is not None]
        ratio = min(peers) / at["hierax"] if peers and at["hierax"] else None
        print(
            f"at error {key}: {', '.join(words)}"
            + ("" if ratio is None else f"; best peer / hierax = {ratio:.2f}")
        )
    return dict(
        elements=len(sweep.params),
        params=[float(p) for p in sweep.params],
        ladder=ladder,
        targets=targets,
        first_call=first,
    )


def fresh_first_call(kind: str, count: int, method: str, rtol: float) -> None:
    """The child of `fresh_first_calls`: after the imports (dynamiqs' too) and
    `timing.warm_up`, one method's jitted sweep built and called once; prints the
    seconds."""
    import dynamiqs  # noqa: F401

    warm_up()
    sweep = QutritSweep(kind, count)
    args, r = jnp.asarray(sweep.params), jnp.asarray(rtol)
    seconds, _ = time_call(lambda: METHODS[method](sweep)(args, r))
    print(f"first call seconds: {seconds!r}")


def fresh_first_calls(kind: str, count: int, rtol: float, repeats: int) -> dict:
    """Each method's first call (build, trace, compile, run) in a fresh process of
    its own (this script with `--first-call`), the methods taking turns, the
    median of `repeats`."""
    out: dict[str, Any] = {name: {"seconds": []} for name in METHODS}
    for _ in range(repeats):
        for name in METHODS:
            done = subprocess.run(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--first-call",
                    name,
                    "--kind",
                    kind,
                    "--count",
                    str(count),
                    "--rtol",
                    repr(rtol),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            line = [x for x in done.stdout.splitlines() if "first call seconds" in x]
            out[name]["seconds"].append(float(line[-1].split(":")[1]))
    for r in out.values():
        r["median"] = statistics.median(r["seconds"])
    print(
        "first call in a fresh process (median of "
        f"{repeats}): " + ", ".join(f"{k} {v['median']:.2f} s" for k, v in out.items())
    )
    return out


def result_rows(results: dict) -> list:
    """The headline numbers as the runner's rows: time and steps at each target
    error (steps: the largest count of an element at the loosest rtol that met
    it), and the first call."""
    out = []
    for kind in ("decay", "amplitude"):
        sweep = results[kind]
        name = sweep["name"]
        for method, targets in sweep["targets"].items():
            for key, value in targets.items():
                met = value["loosest_met"]
                out.append(row(name, method, "seconds", value["seconds"], error=key))
                steps = None if met is None else met["steps"]["max"]
                out.append(row(name, method, "steps", steps, error=key))
                rtol = None if met is None else met["rtol"]
                out.append(row(name, method, "loosest_rtol_met", rtol, error=key))
        for method, seconds in sweep["first_call"].items():
            out.append(row(name, method, "first_call_seconds", seconds))
        for method, r in sweep.get("fresh_first_call", {}).items():
            out.append(
                row(name, method, "fresh_process_first_call_seconds", r["median"], "s")
            )
    return out


def main():
    parser = argparse.ArgumentParser(
        description="hierax mesolve sweeps under vmap against diffrax and dynamiqs"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--skip-first-call",
        action="store_true",
        help="no first calls in fresh processes",
    )
    # The child process of `fresh_first_calls`.
    parser.add_argument("--first-call", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="decay", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=64, help=argparse.SUPPRESS)
    parser.add_argument("--rtol", type=float, default=1e-3, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.first_call is not None:
        fresh_first_call(ns.kind, ns.count, ns.first_call, ns.rtol)
        return
    warm_up()
    load = [list(os.getloadavg())]
    print(f"load before: {load[0]}")
    precision = import_dynamiqs()
    import dynamiqs

    if ns.quick:
        count, rtols, repeats = 16, [1e-4, 1e-6, 1e-8, 1e-10, 1e-12], 3
    else:
        count, rtols, repeats = 64, [10.0**-k for k in range(2, 14)], 7
    results: dict[str, Any] = {
        "quick": ns.quick,
        "jax": jax.__version__,
        "diffrax": diffrax.__version__,
        "dynamiqs": dynamiqs.__version__,
        "precision": precision,
        "rtols": rtols,
        "repeats": repeats,
    }
    for kind in ("decay", "amplitude"):
        sweep = QutritSweep(kind, count)
        results[kind] = dict(name=sweep.name, **bench_sweep(sweep, rtols, repeats))
        load.append(list(os.getloadavg()))
    # Not in the quick run (a fresh process is 8-10 s of imports and compiles).
    if not (ns.skip_first_call or ns.quick):
        for kind in ("decay", "amplitude"):
            results[kind]["fresh_first_call"] = fresh_first_calls(
                kind, count, rtols[0], 3
            )
            load.append(list(os.getloadavg()))
    results["load"] = load
    emit(result_rows(results))
    save(results, ns.out)


if __name__ == "__main__":
    main()
