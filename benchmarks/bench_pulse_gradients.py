"""Gradients through sampled pulses: `jax.value_and_grad` of a state-transfer loss
through `hierax.sesolve` with respect to a pulse's samples, against a hand-written
diffrax Dopri8 on the real and imaginary parts, at matched error of the gradient.

    .venv/bin/python benchmarks/bench_pulse_gradients.py [--quick] [--out PATH]

Three problems, float64/complex128, on the CPU; the loss is the infidelity
$1 - |\\langle \\text{target} | \\psi(T) \\rangle|^2$ and the gradient is taken with
respect to every sample of the pulse (fixed seed, not tuned):

- `qubit pwc`: $H = \\frac{\\Delta}{2} \\sigma_z + \\frac{\\Omega(t)}{2} \\sigma_x$,
  $\\Delta = 0.4$, $\\Omega$ a `hierax.PiecewiseConstant` of 40 equal segments over
  $[0, 10]$ (a pi-pulse area, the samples jittered by 30 %), $|0\\rangle \\to
  |1\\rangle$: 40 samples;
- `transmon pwc`: a 3-level transmon in its rotating frame, $H = \\delta n +
  \\frac{\\alpha}{2} n(n - 1) + \\Omega_x(t) \\frac{a + a^\\dagger}{2} + \\Omega_y(t)
  \\frac{i(a^\\dagger - a)}{2}$, $\\delta = 0.1$, $\\alpha = -2$, two quadratures of
  40 constant segments each over $[0, 10]$, $|0\\rangle \\to |1\\rangle$: 80 samples;
- `transmon spline`: the same transmon with both quadratures `hierax.CubicSpline`
  (not-a-knot, as scipy) through 32 knots each over $[0, 10]$: 64 samples.

Methods, each `jax.jit(jax.value_and_grad(loss))` of `(samples, rtol)` with rtol
traced (one compile serves the ladder), atol = rtol / 100:

- `hierax`: `hierax.sesolve` with its default adjoint (reverse mode through the
  steps, `diffrax.RecursiveCheckpointAdjoint`); `sesolve` stops at the pulses'
  knots by itself;
- `hierax forward`: the same with `adjoint=diffrax.ForwardMode()` and `jax.jacfwd`
  (one tangent per sample; forward mode is the other documented way);
- `dopri8`: `diffrax.Dopri8` on the real embedding, the same pulse evaluated in JAX
  (the segment by `jnp.searchsorted`; the spline's cubic coefficients are a fixed
  linear map of the samples, scipy's `CubicSpline` of the unit vectors),
  `PIDController(rtol, atol)` in `ClipStepSizeController(..., jump_ts=knots)` (as
  a careful user would write it, and as `sesolve` does inside),
  `RecursiveCheckpointAdjoint` (diffrax's default), diffrax's default `max_steps`;
- `dopri8 no jump_ts`: the same without the jump times.

The reference gradient is independent of both: for the piecewise-constant pulses
exact, the product of each segment's `scipy.linalg.expm` and the derivative of each
factor by `scipy.linalg.expm_frechet`; for the spline, the forward sensitivity
equations (the state and its derivative with respect to every sample, the spline's
basis function of each sample from scipy's `CubicSpline` of a unit vector)
integrated knot to knot by scipy's DOP853 at rtol 1e-13. The error of a method is
the largest absolute difference of its gradient to the reference (the loss's is
reported beside it).

For each method a ladder of rtol, the methods taking turns
(`timing.alternating_times`, so the machine's load moves all alike; calls under
10 ms several in a row per turn); the time at a gradient error of 1e-6 and 1e-10
read off the ladder (`timing.time_at`: where the loosest rtol already meets the
target, that rtol's time, marked `bound`), with the steps of the loosest rtol that
met it. Before the ladder, the first call of each jitted `value_and_grad` at rtol
1e-8 in its phases (trace and lower, XLA compile, run: `timing.compile_phases`),
the methods in turn in this process, hierax's first in every other problem (the
first method traced pays the Python caches of diffrax and JAX that all of them
use); the ladder runs the programs compiled there. `os.getloadavg()` goes with the
results.
"""

import argparse
import math
import os
import warnings
from typing import Any

import jax


jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.integrate  # noqa: E402
import scipy.interpolate  # noqa: E402
import scipy.linalg  # noqa: E402
from peers import real_embedding  # noqa: E402
from rows import emit, row, save  # noqa: E402
from timing import (  # noqa: E402
    Stopwatch,
    alternating_times,
    at_targets,
    compile_phases,
    time_call,
    warm_up,
)

import hierax  # noqa: E402


warnings.filterwarnings("ignore", message="Complex dtype support")

TARGETS = (1e-6, 1e-10)
SX = np.array([[0, 1], [1, 0]], complex)
SZ = np.diag([1.0, -1.0]).astype(complex)


# --- the problems -------------------------------------------------------------------


class PulseProblem:
    """A drift $H_0$ and drives $M_q$ under sampled pulses $f_q(t)$ (one per
    quadrature, `segments` samples each), a start and a target state."""

    def __init__(
        self,
        name: str,
        kind: str,
        drift: np.ndarray,
        drives: list[np.ndarray],
        samples: np.ndarray,
        span: float = 10.0,
    ):
        self.name, self.kind, self.span = name, kind, span
        self.drift = drift
        self.drives = drives
        self.count = samples.shape[1]  # samples per quadrature
        self.params = samples.ravel()
        n = drift.shape[0]
        self.n = n
        self.start = np.eye(n, dtype=complex)[0]
        self.target = np.eye(n, dtype=complex)[1]
        if kind == "pwc":
            self.knots = np.linspace(0.0, span, self.count + 1)  # the edges
        else:
            self.knots = np.linspace(0.0, span, self.count)
            # The spline of each unit vector: coefficients (4, segments, samples),
            # highest degree first, so that the spline's are `basis @ samples`.
            unit = scipy.interpolate.CubicSpline(self.knots, np.eye(self.count))
            self.basis = np.asarray(unit.c)
            self.unit_spline = unit

    def quadratures(self, params):
        return params.reshape(len(self.drives), self.count)

    # hierax ------------------------------------------------------------------------

    def hamiltonian(self, params):
        knots = jnp.asarray(self.knots)
        pulse = hierax.PiecewiseConstant if self.kind == "pwc" else hierax.CubicSpline
        functions = [1.0] + [pulse(knots, v) for v in self.quadratures(params)]
        return hierax.TimeOperator(functions, [self.drift, *self.drives])

    def hierax_loss(self, adjoint=None):
        times = jnp.array([0.0, self.span])
        start, target = jnp.asarray(self.start), jnp.asarray(self.target)

        def loss(params, rtol):
            s = hierax.sesolve(
                self.hamiltonian(params),
                start,
                times,
                rtol=rtol,
                atol=rtol / 100,
                adjoint=adjoint,
            )
            a = jnp.vdot(target, s.final_state)
            # sesolve raises where it fails (max_steps): always a result here.
            ok = jnp.asarray(True)
            return 1.0 - (a.real**2 + a.imag**2), (s.stats["num_steps"], ok)

        return loss

    # diffrax Dopri8 on the real embedding -------------------------------------------

    def coefficients(self, params):
        """What the JAX pulse evaluates: the samples (piecewise constant) or the
        spline's cubic coefficients `(quadratures, 4, segments)`."""
        values = self.quadratures(params)
        if self.kind == "pwc":
            return values
        return jnp.einsum("kin,qn->qki", jnp.asarray(self.basis), values)

    def evaluate(self, coefficients, t):
        knots = jnp.asarray(self.knots)
        if self.kind == "pwc":
            i = jnp.clip(
                jnp.searchsorted(knots, t, side="right") - 1, 0, self.count - 1
            )
            return coefficients[:, i]
        i = jnp.clip(jnp.searchsorted(knots, t, side="right") - 1, 0, self.count - 2)
        u = t - knots[i]
        c = coefficients[:, :, i]
        return ((c[:, 0] * u + c[:, 1]) * u + c[:, 2]) * u + c[:, 3]

    def diffrax_loss(self, jumps=True):
        g0 = jnp.asarray(real_embedding(-1j * self.drift))
        gq = jnp.asarray(np.stack([real_embedding(-1j * m) for m in self.drives]))
        y0 = jnp.concatenate(
            [jnp.asarray(self.start.real), jnp.asarray(self.start.imag)]
        )
        target, n = jnp.asarray(self.target), self.n

        def field(t, y, coefficients):
            f = self.evaluate(coefficients, t)
            return g0 @ y + jnp.einsum("q,qij,j->i", f, gq, y)

        def loss(params, rtol):
            controller = diffrax.PIDController(rtol=rtol, atol=rtol / 100)
            if jumps:
                controller = diffrax.ClipStepSizeController(
                    controller, jump_ts=jnp.asarray(self.knots)
                )
            s = diffrax.diffeqsolve(
                diffrax.ODETerm(field),
                diffrax.Dopri8(),
                0.0,
                self.span,
                None,
                y0,
                args=self.coefficients(params),
                stepsize_controller=controller,
                adjoint=diffrax.RecursiveCheckpointAdjoint(),
                throw=False,  # past max_steps: marked as failed, no exception
            )
            y = s.ys[-1]  # pyright: ignore[reportOptionalSubscript]
            a = jnp.vdot(target, y[:n] + 1j * y[n:])
            ok = s.result == diffrax.RESULTS.successful
            return 1.0 - (a.real**2 + a.imag**2), (s.stats["num_steps"], ok)

        return loss

    # the reference ------------------------------------------------------------------

    def reference(self) -> tuple[float, np.ndarray]:
        return self.reference_pwc() if self.kind == "pwc" else self.reference_spline()

    def _loss_and_gradient(self, psi, sensitivities):
        a = np.vdot(self.target, psi)
        da = self.target.conj() @ sensitivities
        return float(1.0 - abs(a) ** 2), -2.0 * np.real(np.conj(a) * da)

    def reference_pwc(self):
        """Exact: psi(T) = U_N ... U_1 psi(0), U_k = expm(-i H_k dt), and
        dU_k / dy_qk = expm_frechet(-i H_k dt, -i M_q dt)."""
        values = self.quadratures(self.params)
        dt = self.span / self.count
        forward = [self.start]
        props = []
        for k in range(self.count):
            h = self.drift + sum(v[k] * m for v, m in zip(values, self.drives))
            props.append(scipy.linalg.expm(-1j * h * dt))
            forward.append(props[-1] @ forward[-1])
        # Backward: the bra <target| U_N ... U_{k+1}.
        bra = self.target.conj()
        grads = np.zeros(values.shape)
        a = bra @ forward[-1]
        for k in reversed(range(self.count)):
            h = self.drift + sum(v[k] * m for v, m in zip(values, self.drives))
            for q, m in enumerate(self.drives):
                _, du = scipy.linalg.expm_frechet(-1j * h * dt, -1j * m * dt)
                da = bra @ (du @ forward[k])
                grads[q, k] = -2.0 * np.real(np.conj(a) * da)
            bra = bra @ props[k]
        return float(1.0 - abs(a) ** 2), grads.ravel()

    def reference_spline(self):
        """The forward sensitivity equations, knot to knot, DOP853 at rtol 1e-13:
        dS_qj/dt = -i H S_qj - i b_j(t) M_q psi."""
        values = self.quadratures(self.params)
        splines = [scipy.interpolate.CubicSpline(self.knots, v) for v in values]
        n, p = self.n, self.params.size

        def rhs(t, y):
            z = (y[: y.size // 2] + 1j * y[y.size // 2 :]).reshape(n, 1 + p)
            psi, s = z[:, 0], z[:, 1:]
            h = self.drift + sum(f(t) * m for f, m in zip(splines, self.drives))
            b = self.unit_spline(t)
            forcing = np.concatenate([np.outer(m @ psi, b) for m in self.drives], 1)
            out = np.concatenate([(-1j * h @ z[:, :1]), -1j * (h @ s + forcing)], 1)
            out = out.ravel()
            return np.concatenate([np.real(out), np.imag(out)])

        z = np.zeros((n, 1 + p), complex)
        z[:, 0] = self.start
        y = np.concatenate([np.real(z).ravel(), np.imag(z).ravel()])
        for t0, t1 in zip(self.knots[:-1], self.knots[1:]):
            sol = scipy.integrate.solve_ivp(
                rhs, (t0, t1), y, "DOP853", rtol=1e-13, atol=1e-15
            )
            y = sol.y[:, -1]
        z = (y[: y.size // 2] + 1j * y[y.size // 2 :]).reshape(n, 1 + p)
        return self._loss_and_gradient(z[:, 0], z[:, 1:])


def jittered(rng, count: int, area: float, span: float, jitter: float = 0.3):
    """A Gaussian envelope of the given area over the span, sampled at `count`
    points and each sample jittered by a relative `jitter`."""
    t = (np.arange(count) + 0.5) * span / count
    envelope = np.exp(-((t - span / 2) ** 2) / (2 * (span / 5) ** 2))
    envelope *= area / (np.sum(envelope) * span / count)
    return envelope * (1 + jitter * rng.uniform(-1, 1, count))


def qubit_pwc(segments: int = 40) -> PulseProblem:
    rng = np.random.default_rng(1)
    samples = jittered(rng, segments, np.pi, 10.0)
    return PulseProblem(
        f"qubit pwc ({segments} samples)",
        "pwc",
        0.4 / 2 * SZ,
        [SX / 2],
        samples[None, :],
    )


def transmon_operators(levels: int = 3):
    a = np.diag(np.sqrt(np.arange(1, levels)), 1).astype(complex)
    number = np.diag(np.arange(levels)).astype(complex)
    drift = 0.1 * number + (-2.0) / 2 * number @ (number - np.eye(levels))
    return drift, [(a + a.conj().T) / 2, 1j * (a.conj().T - a) / 2]


def transmon_pwc(segments: int = 40) -> PulseProblem:
    rng = np.random.default_rng(2)
    x = jittered(rng, segments, np.pi, 10.0)
    y = 0.1 * rng.uniform(-1, 1, segments)
    drift, drives = transmon_operators()
    return PulseProblem(
        f"transmon pwc ({2 * segments} samples)", "pwc", drift, drives, np.stack([x, y])
    )


def transmon_spline(knots: int = 32) -> PulseProblem:
    rng = np.random.default_rng(3)
    # Samples at the knots, the envelope's area about pi.
    x = jittered(rng, knots, np.pi, 10.0)
    y = 0.1 * rng.uniform(-1, 1, knots)
    drift, drives = transmon_operators()
    return PulseProblem(
        f"transmon spline ({2 * knots} samples)",
        "spline",
        drift,
        drives,
        np.stack([x, y]),
    )


# --- measurements -------------------------------------------------------------------


def methods(problem: PulseProblem) -> dict[str, Any]:
    """Each method as a jitted `f(params, rtol) -> (loss, gradient, (steps, ok))`,
    `ok` false where the solve failed (diffrax's `max_steps`)."""

    def reverse(loss):
        def f(params, rtol):
            (value, aux), grad = jax.value_and_grad(loss, has_aux=True)(params, rtol)
            return value, grad, aux

        return jax.jit(f)

    def forward(loss):
        def f(params, rtol):
            def with_value(p):
                value, aux = loss(p, rtol)
                return value, (value, aux)

            grad, (value, aux) = jax.jacfwd(with_value, has_aux=True)(params)
            return value, grad, aux

        return jax.jit(f)

    return {
        "hierax": reverse(problem.hierax_loss()),
        "hierax forward": forward(problem.hierax_loss(diffrax.ForwardMode())),
        "dopri8": reverse(problem.diffrax_loss()),
        "dopri8 no jump_ts": reverse(problem.diffrax_loss(jumps=False)),
    }


def first_calls(calls, args, r, hierax_first: bool) -> tuple[dict, dict]:
    """Each jitted method's first call at `args, r`, in its phases (trace and
    lower, XLA compile, run: `timing.compile_phases`), the methods in turn, hierax's
    first or last (whoever goes first pays the Python caches of diffrax and JAX
    that both use); and the compiled programs."""
    names = sorted(calls, key=lambda k: k.startswith("hierax") != hierax_first)
    phases, compiled = {}, {}
    for name in names:
        lower, build, compiled[name] = compile_phases(calls[name], (args, r))
        run, _ = time_call(compiled[name], args, r)
        phases[name] = dict(
            trace_lower=lower, compile=build, run=run, total=lower + build + run
        )
    return phases, compiled


def run_ladder(calls, params, reference, rtols, repeats):
    """For each rtol, the methods take turns: errors, steps, times. A call shorter
    than 10 ms runs several times in a row per turn (`alternating_times`'s
    `batch`), about 10 ms in all, so that the clock's and the load's noise weighs
    less."""
    ref_loss, ref_grad = reference
    out = {name: [] for name in calls}
    args = jnp.asarray(params)
    for rtol in rtols:
        r = jnp.asarray(rtol)
        turns = {name: (lambda f=f, r=r: f(args, r)) for name, f in calls.items()}
        once = {name: time_call(call)[0] for name, call in turns.items()}
        batch = {name: max(1, round(0.01 / t)) for name, t in once.items()}
        times = alternating_times(turns, repeats, batch=batch)
        for name, f in calls.items():
            value, grad, (steps, ok) = f(args, r)
            failed = not bool(ok)
            out[name].append(
                dict(
                    rtol=rtol,
                    failed=failed,
                    error=math.inf
                    if failed
                    else float(np.max(np.abs(np.asarray(grad) - ref_grad))),
                    loss_error=math.inf if failed else abs(float(value) - ref_loss),
                    steps=int(steps),
                    seconds=float(np.median(times[name])),
                    spread=[float(np.min(times[name])), float(np.max(times[name]))],
                )
            )
    return out


def bench_problem(problem: PulseProblem, rtols, repeats, hierax_first: bool) -> dict:
    print(f"\n== {problem.name}", flush=True)
    clock = Stopwatch()
    reference = problem.reference()
    how = (
        "expm and expm_frechet"
        if problem.kind == "pwc"
        else "DOP853 sensitivities, rtol 1e-13"
    )
    print(
        f"reference ({how}): {clock.seconds:.1f} s; loss {reference[0]:.6f}, "
        f"|gradient|_max {np.max(np.abs(reference[1])):.3f}"
    )
    calls = methods(problem)
    args, r = jnp.asarray(problem.params), jnp.asarray(1e-8)
    first, compiled = first_calls(calls, args, r, hierax_first)
    print(
        "first call at rtol 1e-8 (trace and lower + XLA compile + run), in order: "
        + ", ".join(
            f"{k} {v['total']:.2f} s = {v['trace_lower']:.2f} + {v['compile']:.2f}"
            f" + {v['run'] * 1e3:.1f} ms"
            for k, v in first.items()
        )
    )
    ladder = run_ladder(compiled, problem.params, reference, rtols, repeats)
    ladder = run_ladder(calls, problem.params, reference, rtols, repeats)
    for name, points in ladder.items():
        for p in points:
            print(
                f"{name:>18} rtol {p['rtol']:.0e}: gradient error {p['error']:.1e}, "
                f"loss error {p['loss_error']:.1e}, {p['steps']} steps, "
                f"{p['seconds'] * 1e3:.2f} ms"
            )
    targets = {name: at_targets(points, TARGETS) for name, points in ladder.items()}
    for target in TARGETS:
        key = f"{target:.0e}"
        words = []
        for name, t in targets.items():
            s, met = t[key]["seconds"], t[key]["loosest_met"]
            steps = "-" if met is None else met["steps"]
            words.append(
                f"{name} {'-' if s is None else f'{s * 1e3:.2f} ms'} ({steps} steps)"
            )
        hierax_s, dopri_s = (
            targets["hierax"][key]["seconds"],
            targets["dopri8"][key]["seconds"],
        )
        ratio = (
            ""
            if not (hierax_s and dopri_s)
            else f"; dopri8 / hierax = {dopri_s / hierax_s:.2f}x"
        )
        print(f"at gradient error {key}: " + ", ".join(words) + ratio)
    return dict(
        samples=int(problem.params.size),
        reference_loss=reference[0],
        reference_gradient=reference[1].tolist(),
        first_call=first,
        ladder=ladder,
        targets=targets,
    )


def result_rows(results: dict) -> list:
    """The headline numbers as the runner's rows: time and steps at each target
    gradient error, the error at the tightest rtol, and the first call."""
    out = []
    for name, problem in results["problems"].items():
        for method, targets in problem["targets"].items():
            for key, value in targets.items():
                met = value["loosest_met"]
                out.append(row(name, method, "seconds", value["seconds"], error=key))
                steps = None if met is None else met["steps"]
                out.append(row(name, method, "steps", steps, error=key))
        for method, points in problem["ladder"].items():
            tight = min(points, key=lambda p: p["rtol"])
            out.append(row(name, method, "error", tight["error"], rtol=tight["rtol"]))
        for method, phases in problem["first_call"].items():
            out.append(row(name, method, "first_call_seconds", phases["total"]))
            out.append(row(name, method, "compile_seconds", phases["compile"]))
    return out


def main():
    parser = argparse.ArgumentParser(
        description="gradients through sampled pulses: hierax and Dopri8"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    ns = parser.parse_args()
    warm_up()
    load = [list(os.getloadavg())]
    print(f"load before: {load[0]}")
    if ns.quick:
        rtols, repeats = [1e-4, 1e-6, 1e-8, 1e-10, 1e-12], 7
    else:
        rtols, repeats = [10.0**-k for k in range(3, 14)], 15
    results: dict[str, Any] = {
        "quick": ns.quick,
        "jax": jax.__version__,
        "diffrax": diffrax.__version__,
        "problems": {},
    }
    problems = (qubit_pwc(), transmon_pwc(), transmon_spline())
    for i, problem in enumerate(problems):
        results["problems"][problem.name] = bench_problem(
            problem, rtols, repeats, hierax_first=i % 2 == 1
        )
        load.append(list(os.getloadavg()))
    results["load"] = load
    emit(result_rows(results))
    save(results, ns.out)


if __name__ == "__main__":
    main()
