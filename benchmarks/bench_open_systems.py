"""`hierax.mesolve` of a driven, lossy nonlinear oscillator against dynamiqs and
QuTiP at matched final error, and what bounds hierax's step.

    .venv/bin/python benchmarks/bench_open_systems.py [--quick] [--out PATH]
        [--n 30,50] [--sizes 20,25,30] [--steps STEPS]

The system (float64/complex128, CPU), n Fock levels (30 and 50, the ladders of each;
`--quick`: 20; `--n`):
$H = \\Delta a^\\dagger a + \\frac{K}{2} a^{\\dagger 2} a^2
+ \\epsilon(t)(a + a^\\dagger)$, $\\Delta = -1$, $K = 0.6$, a drive switched on as
$\\epsilon(t) = 1.5\\,(1 - e^{-t})$; jump operators $\\sqrt{0.1}\\, a$ (one-photon
loss), $\\sqrt{0.05}\\, a^2$ (two-photon loss), $\\sqrt{0.02}\\, a^\\dagger a$
(dephasing); from the vacuum over $t \\in [0, 10]$ (`--quick`: 5). The Kerr
energy at the cutoff is $0.3 (n-1)(n-2)$: 244 at n = 30, while the state stays in
the first dozen levels.

The reference is scipy's DOP853 on vec(rho) with the sparse Liouvillian (rtol
1e-13), independent of every method; its distance to hierax with short fixed steps
is printed. Errors are Frobenius norms of the final rho's difference.

1. Ladders of rtol (atol = rtol / 100 for every method), the methods taking turns
   at each rtol (`timing.alternating_times`): hierax `mesolve`, dynamiqs `mesolve`
   (Dopri8) and QuTiP `mesolve` (adams, its default). Steps: hierax's and
   dynamiqs' own counts; QuTiP's right-hand-side evaluations, counted in a separate
   untimed run. hierax also with its default atol (1e-10), rtol alone. The time at
   final error 1e-6 and 1e-10 is read off the ladders (`timing.time_at`).
2. What bounds hierax's step: the Liouvillian's largest eigenvalue $\\lambda$
   (dense eigenvalues for n <= 30; and the estimate from the diagonals of H and
   $\\sum L^\\dagger L$ in the Fock basis), the stability boundary $R_K$ of the
   order-K Taylor polynomial along $\\arg\\lambda$ (the largest $r$ with
   $|\\sum_{j \\le K} (r e^{i\\theta})^j / j!| \\le 1$), the predicted step
   $R_K / |\\lambda|$ against the measured one, the step control replayed in Python
   with the library's step (which entry of the estimate decides, how it grows at
   a fixed step), steps and time against the order K, and the rounding of a step
   $m$ times longer: one step of order 160 against `expm` of the Liouvillian;
   and the scale left in the frame of the Liouvillian's diagonal (exact phases).
3. Cost per step against n (fixed steps): hierax `mesolve` (vec(rho) with the
   superoperators held by their diagonals where they beat the structured
   kernel's n x n products, `_kernels/density.py`; up to n = 24 only before issue
   52), the vec(rho) layout on diagonals written out here (`DiagonalSteps`) at
   every n, and the time of one n x n complex product.

Importing dynamiqs sets JAX's default matmul precision to "highest" for the whole
process (on a CPU in float64 it changes no product; recorded). `os.getloadavg()`
goes with the results.
"""

import argparse
import json
import math
import os
import warnings
from typing import Any

import jax


jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.linalg  # noqa: E402
import scipy.sparse  # noqa: E402
from peers import import_dynamiqs  # noqa: E402
from rows import emit, row  # noqa: E402
from systems import dop853_final  # noqa: E402
from timing import Stopwatch, alternating_times, time_at, warm_up  # noqa: E402

import hierax  # noqa: E402


warnings.filterwarnings("ignore", message="Complex dtype support")
warnings.filterwarnings("ignore", category=FutureWarning)

TARGETS = (1e-6, 1e-10)


class Oscillator:
    """The driven Kerr oscillator with one- and two-photon loss and dephasing."""

    detuning, kerr, drive, rise = -1.0, 0.6, 1.5, 1.0
    rates = (0.1, 0.05, 0.02)

    def __init__(self, n: int, span: float):
        self.n, self.span = n, span
        a = np.diag(np.sqrt(np.arange(1, n)), 1).astype(complex)
        ad = a.conj().T
        self.a = a
        self.h0 = self.detuning * ad @ a + 0.5 * self.kerr * ad @ ad @ a @ a
        self.h1 = a + ad
        k1, k2, kphi = self.rates
        self.jumps = [np.sqrt(k1) * a, np.sqrt(k2) * a @ a, np.sqrt(kphi) * ad @ a]
        self.rho0 = np.zeros((n, n), complex)
        self.rho0[0, 0] = 1

    def envelope(self, t, xp=np):
        return self.drive * (1 - xp.exp(-t / self.rise))

    def envelope_string(self) -> str:
        return f"{self.drive!r}*(1-exp(-t/{self.rise!r}))"

    def hierax_hamiltonian(self):
        ramp = hierax.Constant(self.drive) + hierax.Exp(-1.0 / self.rise) * (
            -self.drive
        )
        return hierax.TimeOperator([hierax.Constant(1.0), ramp], [self.h0, self.h1])

    def liouvillian(self):
        """Sparse superoperators (L0, L1) on row-major vec(rho): L0 + eps(t) L1."""
        eye = scipy.sparse.identity(self.n, format="csr")

        def commutator(h):
            h = scipy.sparse.csr_matrix(h)
            return -1j * (scipy.sparse.kron(h, eye) - scipy.sparse.kron(eye, h.T))

        l0 = commutator(self.h0)
        for j in self.jumps:
            j = scipy.sparse.csr_matrix(j)
            number = j.conj().T @ j
            l0 = l0 + scipy.sparse.kron(j, j.conj())
            l0 = l0 - 0.5 * scipy.sparse.kron(number, eye)
            l0 = l0 - 0.5 * scipy.sparse.kron(eye, number.T)
        return l0.tocsr(), commutator(self.h1).tocsr()

    def reference(self) -> np.ndarray:
        l0, l1 = self.liouvillian()

        def derivative(t, v):
            return l0 @ v + self.envelope(t) * (l1 @ v)

        final = dop853_final(derivative, self.rho0.ravel(), self.span)
        return final.reshape(self.n, self.n)


# --- the methods: each `solve(rtol) -> (final rho, steps)` -------------------------


def method_hierax(system, atol_ratio: float | None = 1e-2, order=None):
    hamiltonian = system.hierax_hamiltonian()
    times = np.array([0.0, system.span])

    def solve(rtol):
        atol = None if atol_ratio is None else rtol * atol_ratio
        s = hierax.mesolve(
            hamiltonian,
            system.jumps,
            system.rho0,
            times,
            rtol=rtol,
            atol=atol,
            order=order,
        )
        return s.final_state, s.stats["num_steps"]

    return solve


def method_dynamiqs(system):
    import dynamiqs as dq
    import dynamiqs.method as dq_method

    h = dq.constant(jnp.asarray(system.h0)) + dq.modulated(
        lambda t: system.envelope(t, jnp), jnp.asarray(system.h1)
    )
    jumps: list[Any] = [jnp.asarray(j) for j in system.jumps]
    rho0 = jnp.asarray(system.rho0)
    tsave = jnp.asarray([0.0, system.span])

    @jax.jit
    def run(rtol):
        out = dq.mesolve(
            h,
            jumps,
            rho0,
            tsave,
            method=dq_method.Dopri8(rtol=rtol, atol=rtol / 100, max_steps=10**6),
            progress_meter=False,
        )
        infos: Any = out.infos
        return out.final_state.to_jax(), infos.nsteps

    def solve(rtol):
        return run(jnp.asarray(rtol))

    return solve


def method_qutip(system):
    import qutip

    # Sparse (CSR) operators: QuTiP's fastest layout for a Liouvillian (its default
    # for NumPy input is dense).
    h0, h1 = qutip.Qobj(system.h0).to("CSR"), qutip.Qobj(system.h1).to("CSR")
    h = [h0, [h1, system.envelope_string()]]
    jumps = [qutip.Qobj(j).to("CSR") for j in system.jumps]
    rho0 = qutip.Qobj(system.rho0)
    # The string coefficient is compiled once; later calls reuse it.
    qutip.mesolve(h, rho0, [0.0, system.span], jumps, options={"nsteps": 10**6})

    def solve(rtol):
        options = {"rtol": rtol, "atol": rtol / 100, "nsteps": 10**6}
        out = qutip.mesolve(h, rho0, [0.0, system.span], jumps, options=options)
        return out.final_state.full(), -1

    def evaluations(rtol):
        """Right-hand-side evaluations, with a counting Python coefficient
        (untimed: a Python coefficient is slower than the compiled string)."""
        count = [0]

        def coefficient(t):
            count[0] += 1
            return system.envelope(t)

        counted = [h0, [h1, coefficient]]
        options = {"rtol": rtol, "atol": rtol / 100, "nsteps": 10**6}
        qutip.mesolve(counted, rho0, [0.0, system.span], jumps, options=options)
        return count[0]

    solve.evaluations = evaluations  # pyright: ignore[reportFunctionMemberAccess]
    return solve


def error(rho, reference) -> float:
    return float(np.linalg.norm(np.asarray(rho) - reference))


def run_ladders(methods, reference, rtols, repeats) -> dict:
    out = {name: [] for name in methods}
    for rtol in rtols:
        calls = {
            name: (lambda f=f, rtol=rtol: f(rtol)[0]) for name, f in methods.items()
        }
        times = alternating_times(calls, repeats)
        for name, f in methods.items():
            rho, steps = f(rtol)
            point: dict[str, Any] = dict(
                rtol=rtol,
                error=error(rho, reference),
                steps=int(steps),
                seconds=float(np.median(times[name])),
                spread=[float(np.min(times[name])), float(np.max(times[name]))],
            )
            evaluations = getattr(f, "evaluations", None)
            if evaluations is not None:
                point["evaluations"] = evaluations(rtol)
            out[name].append(point)
            count = point.get("evaluations", point["steps"])
            print(
                f"{name:>22} rtol {rtol:.0e}: error {point['error']:.1e}, "
                f"{'evaluations' if 'evaluations' in point else 'steps'} {count}, "
                f"{point['seconds'] * 1e3:.1f} ms",
                flush=True,
            )
    return out


def at_targets(points) -> dict:
    points = sorted(points, key=lambda p: -p["rtol"])
    out = {}
    for target in TARGETS:
        hit = time_at(points, target)
        met = [p for p in points if p["error"] <= target]
        out[f"{target:.0e}"] = dict(
            seconds=None if hit is None else hit[0],
            loosest_met=met[0] if met else None,
        )
    return out


# --- what bounds the step -----------------------------------------------------------


def taylor_polynomial(z, order):
    """sum_{j <= order} z^j / j! by Horner's rule (z complex, any shape)."""
    total = np.ones_like(z)
    for j in range(order, 0, -1):
        total = 1 + z * total / j
    return total


def stability_boundary(order: int, angle: float) -> float:
    """The largest r with |p_K(r e^{i angle})| <= 1 on [0, r] (the first crossing
    past r = 0.01; a fine scan)."""
    r = np.linspace(0.01, 3.0 * order, 300_001)
    modulus = np.abs(taylor_polynomial(r * np.exp(1j * angle), order))
    above = np.nonzero(modulus > 1 + 1e-12)[0]
    return float(r[above[0] - 1]) if above.size else float(r[-1])


def largest_eigenvalue(system, dense_limit=30) -> dict:
    """The Liouvillian's eigenvalue of largest modulus at the full drive: dense
    eigenvalues up to n = `dense_limit`, and the diagonal estimate
    -i (E_m - E_k) - (G_m + G_k) / 2 (E, G: diagonals of H0 and sum L^dagger L)."""
    energies = np.real(np.diag(system.h0))
    number = sum(j.conj().T @ j for j in system.jumps)
    decay = np.real(np.diag(number))
    estimate = (
        -1j * (energies[:, None] - energies[None, :])
        - (decay[:, None] + decay[None, :]) / 2
    )
    index = np.unravel_index(np.argmax(np.abs(estimate)), estimate.shape)
    out: dict[str, Any] = dict(
        diagonal_estimate=[float(estimate[index].real), float(estimate[index].imag)],
        diagonal_entry=[int(i) for i in index],
    )
    # In the frame of the Liouvillian's diagonal on vec(rho) (taken exactly, as
    # elementwise exponentials), what is left couples entries p and q with the
    # phase e^{(d_p - d_q) t}: its scale is the largest |d_p - d_q| over the
    # couplings plus the size of the couplings (their largest row sum).
    l0, l1 = system.liouvillian()
    full = (l0 + system.drive * l1).tocsr()
    d = full.diagonal()
    off = (full - scipy.sparse.diags(d)).tocoo()
    out["frame"] = dict(
        largest_phase_rate=float(np.max(np.abs(d[off.row] - d[off.col]))),
        coupling_row_sum=float(np.max(np.abs(off).sum(axis=1))),
    )
    if system.n <= dense_limit:
        values = np.linalg.eigvals(full.toarray())
        top = values[np.argmax(np.abs(values))]
        out["eigenvalue"] = [float(top.real), float(top.imag)]
        out["spectral_abscissa"] = float(np.max(values.real))
    return out


def replay_control(system, rtol, order=28, limit=400) -> dict:
    """The adaptive solve replayed in Python, one jitted step at a time, with the
    library's term and solver and the step control `mesolve` builds (PID 0.3 /
    0.6 / 0.1, safety 0.9, the largest entry of error / (atol + rtol |rho|)):
    each attempt's step, the estimate's ratio to the tolerance, and the entry
    that decides it."""
    atol = rtol / 100
    term = hierax.LindbladTerm(system.hierax_hamiltonian(), system.jumps)
    solver = hierax.TaylorSolver(order)
    controller = diffrax.PIDController(
        rtol=rtol,
        atol=atol,
        safety=0.9,
        pcoeff=0.3,
        icoeff=0.6,
        dcoeff=0.1,
        norm=lambda x: jnp.max(jnp.abs(x)),
    )
    step = jax.jit(
        lambda t0, t1, y: solver.step(term, t0, t1, y, None, None, False)[:2]
    )
    adapt = jax.jit(
        lambda t0, t1, y0, y1, e, s: controller.adapt_step_size(
            t0, t1, y0, y1, None, e, order, s
        )
    )
    y, t0 = jnp.asarray(system.rho0), 0.0
    t1, state = controller.init(
        term, 0.0, system.span, y, 0.01, None, solver.func, order
    )
    attempts = []
    while t0 < system.span - 1e-12 and len(attempts) < limit:
        t1 = min(float(t1), system.span)
        y1, estimate = step(t0, t1, y)
        scale = atol + rtol * jnp.maximum(jnp.abs(y), jnp.abs(y1))
        ratios = np.asarray(estimate / scale)
        where = np.unravel_index(int(np.argmax(ratios)), ratios.shape)
        keep, next_t0, next_t1, _, state, _ = adapt(t0, t1, y, y1, estimate, state)
        attempts.append(
            dict(
                t=t0,
                h=t1 - t0,
                ratio=float(ratios.max()),
                kept=bool(keep),
                entry=[int(i) for i in where],
            )
        )
        if keep:
            y, t0 = y1, float(next_t0)
        t1 = float(next_t1)
    kept = [a for a in attempts if a["kept"]]
    steps = np.array([a["h"] for a in kept[3:]])  # past the first step's ramp
    top = [a for a in attempts if max(a["entry"]) >= system.n - 2]
    # Growth of the deciding ratio between consecutive accepted steps of equal h.
    growth = [
        b["ratio"] / a["ratio"]
        for a, b in zip(kept, kept[1:])
        if abs(a["h"] - b["h"]) < 1e-12 and a["ratio"] > 0
    ]
    return dict(
        rtol=rtol,
        order=order,
        accepted=len(kept),
        rejected=len(attempts) - len(kept),
        step_median=float(np.median(steps)),
        step_quantiles=[float(q) for q in np.quantile(steps, [0.1, 0.5, 0.9])],
        decided_by_top_two_levels=len(top) / len(attempts),
        ratio_growth_at_fixed_step=float(np.median(growth)) if growth else None,
        first_attempts=attempts[:12],
    )


def rounding_at_longer_steps(system, multiples, step, order=160) -> list:
    """The digits a step m times longer than `step` loses to cancellation: the
    Liouvillian with the drive held at its full value, from the state a solve
    reaches at the end of the span, one step of m x `step` with order `order`
    (its series converged far below rounding where the largest term allows)
    against scipy's `expm`."""
    h_const = hierax.TimeOperator(
        [hierax.Constant(1.0), hierax.Constant(system.drive)], [system.h0, system.h1]
    )
    term = hierax.LindbladTerm(h_const, system.jumps)
    rho = hierax.mesolve(
        h_const, system.jumps, system.rho0, np.array([0.0, system.span]), rtol=1e-12
    ).final_state
    l0, l1 = system.liouvillian()
    generator = (l0 + system.drive * l1).toarray()
    zero = jnp.zeros(())
    terms = jax.jit(lambda h, y: term.taylor_terms(zero, h, y, order, None)[0])
    out = []
    for m in multiples:
        h = m * step
        v = np.asarray(terms(jnp.asarray(h), rho))
        exact = (scipy.linalg.expm(h * generator) @ np.asarray(rho).ravel()).reshape(
            system.n, system.n
        )
        largest = float(np.max(np.linalg.norm(v, axis=(1, 2))))
        out.append(
            dict(
                multiple=m,
                step=h,
                error=float(np.linalg.norm(v.sum(0) - exact)),
                largest_term=largest,
                last_term=float(np.linalg.norm(v[-1])),
            )
        )
        print(
            f"  step {m} x {step:.4f}: error {out[-1]['error']:.1e} against expm, "
            f"largest term {largest:.1e} (digits lost ~ {math.log10(largest):.1f}), "
            f"last term {out[-1]['last_term']:.0e}"
        )
    return out


def bound_analysis(system, rtols, orders, repeats) -> dict:
    print("\n== what bounds hierax's step", flush=True)
    eig = largest_eigenvalue(system)
    value = complex(*eig.get("eigenvalue", eig["diagonal_estimate"]))
    angle = float(np.angle(value))
    print(
        f"largest |eigenvalue| of the Liouvillian: {abs(value):.1f} "
        f"({value.real:.1f}{value.imag:+.1f}i); diagonal estimate "
        f"{complex(*eig['diagonal_estimate']):.1f} at entry {eig['diagonal_entry']}"
    )
    frame = eig["frame"]
    scale = frame["largest_phase_rate"] + frame["coupling_row_sum"]
    print(
        f"in the frame of the Liouvillian's diagonal: phase rates up to "
        f"{frame['largest_phase_rate']:.1f} across the couplings, couplings' row sum "
        f"{frame['coupling_row_sum']:.1f}: a scale of {scale:.1f}, "
        f"{abs(value) / scale:.1f}x below |lambda|"
    )
    replays = []
    for rtol in rtols:
        replay = replay_control(system, rtol)
        replays.append(replay)
        x = replay["step_median"] * abs(value)
        print(
            f"replayed control, rtol {rtol:.0e}: {replay['accepted']} steps "
            f"({replay['rejected']} rejected), median step {replay['step_median']:.4f}"
            f" (|lambda| h = {x:.2f}), decided by the top two levels in "
            f"{replay['decided_by_top_two_levels']:.0%} of attempts, the deciding "
            f"ratio x{replay['ratio_growth_at_fixed_step'] or float('nan'):.1f} a step"
            " at a fixed step",
            flush=True,
        )
    boundaries: dict[int, dict[str, float]] = {}
    for order in sorted(set(orders) | {28}):
        r = stability_boundary(order, angle)
        boundaries[order] = dict(
            boundary=r,
            step=r / abs(value),
            predicted_steps=system.span * abs(value) / r,
            products_per_unit=order / r,
            amplification_at_measured_step=float(
                abs(taylor_polynomial(replays[0]["step_median"] * value, order))
            ),
        )
        print(
            f"order {order}: R_K = {r:.2f} along arg(lambda) -> step "
            f"{r / abs(value):.4f}, {system.span * abs(value) / r:.0f} steps; "
            f"K / R_K = {order / r:.2f} orders per unit of |lambda| t"
        )
    # Steps and time against the order, at two tolerances, interleaved.
    by_order = {}
    for rtol in (rtols[0], rtols[-1]):
        calls = {order: method_hierax(system, order=order) for order in orders}
        times = alternating_times(
            {o: (lambda f=f, rtol=rtol: f(rtol)[0]) for o, f in calls.items()},
            repeats,
        )
        for order, f in calls.items():
            _, steps = f(rtol)
            by_order.setdefault(str(order), []).append(
                dict(
                    rtol=rtol, steps=int(steps), seconds=float(np.median(times[order]))
                )
            )
            print(
                f"order {order}, rtol {rtol:.0e}: {int(steps)} steps, "
                f"{np.median(times[order]) * 1e3:.1f} ms",
                flush=True,
            )
    print("rounding at longer steps (constant drive, order 160, against expm):")
    rounding = rounding_at_longer_steps(
        system, (1, 2, 4, 8), boundaries[28]["step"], order=160
    )
    return dict(
        eigenvalue=eig,
        replays=replays,
        boundaries={str(k): v for k, v in boundaries.items()},
        by_order=by_order,
        rounding=rounding,
    )


# --- cost per step against n ---------------------------------------------------------


PRODUCTS = 200


def sparse_diagonals(matrix) -> tuple[tuple[int, ...], np.ndarray]:
    """A sparse square matrix by its nonzero diagonals: the offsets k (column minus
    row) and `values[d, r]` = entry (r, r + k_d), zero outside the matrix."""
    coo = scipy.sparse.coo_matrix(matrix)
    offsets, which = np.unique(coo.col - coo.row, return_inverse=True)
    size = matrix.shape[0]
    values = np.zeros((len(offsets), size))
    values[which, coo.row] = coo.data
    return tuple(int(k) for k in offsets), values


class DiagonalSteps:
    """The Taylor step on vec(rho), the Liouvillian's superoperators held by their
    nonzero diagonals in real arithmetic: the layout the library takes where the
    diagonals are few (`_kernels/density.py`; before issue 52 only for n <= 24),
    written out here for any n from the description there, as a check of its
    price. $v_{j+1} = \\frac{h}{j+1} (C v_j + S \\sum_{i \\le j}
    c_{j-i} v_i)$ with C and S the real embeddings of the constant superoperator
    and of the drive's, and c the drive's series at scale h; `steps` fixed steps of
    order `order` from `rho0` over the span."""

    def __init__(self, system: "Oscillator", order: int = 28):
        l0, l1 = system.liouvillian()

        def embedded(m):
            re, im = scipy.sparse.csr_matrix(m.real), scipy.sparse.csr_matrix(m.imag)
            return scipy.sparse.bmat([[re, -im], [im, re]])

        self.blocks = [sparse_diagonals(embedded(m)) for m in (l0, l1)]
        self.count = sum(len(offsets) for offsets, _ in self.blocks)
        self.system, self.order = system, order

    def run(self, steps: int):
        system, order = self.system, self.order
        size = 2 * system.n * system.n
        blocks = [(k, jnp.asarray(v)) for k, v in self.blocks]
        pad = max(max(abs(o) for o in k) for k, _ in blocks)
        dt = system.span / steps

        def apply(block, x):
            offsets, values = block
            padded = jnp.pad(x, (pad, pad))
            total = jnp.zeros_like(x)
            for d, k in enumerate(offsets):
                total = total + values[d] * padded[pad + k : pad + k + size]
            return total

        def step(t, y):
            # The drive eps0 (1 - e^{-t/tau}) at t + h sigma, as a series in sigma.
            ratios = jnp.concatenate(
                [jnp.zeros(1), -dt / system.rise / jnp.arange(1, order + 1)]
            )
            powers = jnp.cumprod(jnp.where(jnp.arange(order + 1) == 0, 1.0, ratios))
            c = -system.drive * jnp.exp(-t / system.rise) * powers
            c = c.at[0].add(system.drive)
            # Entry i of the slice at 2K - j is c_{j-i} for i <= j, else 0.
            reversed_ = jnp.concatenate([jnp.zeros(order), c[::-1], jnp.zeros(order)])
            v = jnp.zeros((order + 1, size)).at[0].set(y)

            def body(j, v):
                window = jax.lax.dynamic_slice_in_dim(
                    reversed_, 2 * order - j, order + 1
                )
                vj = jax.lax.dynamic_index_in_dim(v, j, keepdims=False)
                out = apply(blocks[0], vj) + apply(blocks[1], window @ v)
                return jax.lax.dynamic_update_index_in_dim(
                    v, out * (dt / (j + 1)), j + 1, 0
                )

            return jnp.sum(jax.lax.fori_loop(0, order, body, v), axis=0)

        @jax.jit
        def solve(rho):
            flat = rho.reshape(-1)
            y = jnp.concatenate([jnp.real(flat), jnp.imag(flat)])
            y = jax.lax.fori_loop(0, steps, lambda k, y: step(k * dt, y), y)
            half = size // 2
            return (y[:half] + 1j * y[half:]).reshape(system.n, system.n)

        return solve


def step_cost(sizes, steps, calls) -> list:
    """At each n, `steps` fixed steps (order 28) of hierax `mesolve` (the library's
    kernel for that n: for this oscillator the vec(rho) one on diagonals at every
    n, since issue 52), of `DiagonalSteps` (that vec(rho) layout at any n), and one
    n x n complex128 product (a chain of `PRODUCTS` in one call); all taking turns. The
    two steps' final states are compared."""
    out = []
    for n in sizes:
        system = Oscillator(n, 1.0)
        h = system.hierax_hamiltonian()
        dt = system.span / steps
        times_ = np.array([0.0, system.span])
        rho0 = jnp.asarray(system.rho0)

        def solve(h=h, system=system, dt=dt, times_=times_):
            return hierax.mesolve(
                h, system.jumps, system.rho0, times_, dt=dt
            ).final_state

        diagonal = DiagonalSteps(system)
        run = diagonal.run(steps)
        a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)) + 0j) / n
        # A chain of products in one call: the cost of a product, not of a call.
        chain = jax.jit(lambda x: jax.lax.fori_loop(0, PRODUCTS, lambda _, y: y @ x, x))
        timed = alternating_times(
            {
                "mesolve": solve,
                "diagonals": lambda run=run, rho0=rho0: run(rho0),
                "product": lambda c=chain, a=a: c(a),
            },
            calls,
        )
        difference = float(np.max(np.abs(np.asarray(solve()) - np.asarray(run(rho0)))))
        row_: dict[str, Any] = dict(
            n=n,
            mesolve=float(np.median(timed["mesolve"])) / steps,
            diagonals=float(np.median(timed["diagonals"])) / steps,
            diagonal_count=diagonal.count,
            difference=difference,
            product=float(np.median(timed["product"])) / PRODUCTS,
        )
        out.append(row_)
        print(
            f"n = {n}: a step: mesolve {row_['mesolve'] * 1e6:.0f} us, vec(rho) on "
            f"{diagonal.count} diagonals {row_['diagonals'] * 1e6:.0f} us "
            f"(final states {difference:.0e} apart); one complex product "
            f"{row_['product'] * 1e6:.2f} us: mesolve = "
            f"{row_['mesolve'] / row_['product']:.0f} products a step",
            flush=True,
        )
    return out


def result_rows(runs, bound, cost) -> list:
    """The headline numbers as the runner's rows: for each `(system, ladders,
    targets)` of `runs`, time and steps at each target error and steps against
    rtol; the stability bound (of the first), cost per step against n."""
    out = []
    for system, ladders, targets in runs:
        case = f"kerr oscillator n = {system.n}, 3 jump operators"
        for method, by_target in targets.items():
            for key, value in by_target.items():
                out.append(row(case, method, "seconds", value["seconds"], error=key))
        for method, points in ladders.items():
            for p in points:
                count = p.get("evaluations", p["steps"])
                metric = "evaluations" if "evaluations" in p else "steps"
                out.append(row(case, method, metric, count, "", rtol=p["rtol"]))
                out.append(row(case, method, "error", p["error"], rtol=p["rtol"]))
    case = f"kerr oscillator n = {runs[0][0].n}, 3 jump operators"
    for replay in bound["replays"]:
        out.append(
            row(case, "hierax", "step", replay["step_median"], "", rtol=replay["rtol"])
        )
    for order, b in bound["boundaries"].items():
        out.append(row(case, "taylor", "stability_step", b["step"], "", order=order))
    for c in cost:
        for method in ("mesolve", "diagonals"):
            out.append(
                row(
                    "kerr oscillator, fixed steps",
                    method,
                    "seconds_per_step",
                    c[method],
                    "s",
                    n=c["n"],
                )
            )
    return out


def ladder_run(system, rtols, repeats) -> tuple:
    """The reference, the methods' ladders and their times at the target errors,
    for one oscillator."""
    clock = Stopwatch()
    reference = system.reference()
    check = hierax.mesolve(
        system.hierax_hamiltonian(),
        system.jumps,
        system.rho0,
        np.array([0.0, system.span]),
        dt=0.002,
    ).final_state
    seconds = clock.seconds
    print(
        f"n = {system.n}, T = {system.span}: reference {seconds:.1f} s; its "
        f"distance to hierax with dt = 0.002: {error(check, reference):.1e}"
    )
    methods = {
        "hierax": method_hierax(system),
        "hierax (default atol)": method_hierax(system, atol_ratio=None),
        "dynamiqs dopri8": method_dynamiqs(system),
        "qutip adams": method_qutip(system),
    }
    ladders = run_ladders(methods, reference, rtols, repeats)
    targets = {name: at_targets(points) for name, points in ladders.items()}
    for target in TARGETS:
        key = f"{target:.0e}"
        at = {name: t[key]["seconds"] for name, t in targets.items()}
        print(
            f"at error {key}: "
            + ", ".join(
                f"{name} {'-' if s is None else f'{s * 1e3:.1f} ms'}"
                for name, s in at.items()
            )
        )
    return system, ladders, targets


def main():
    parser = argparse.ArgumentParser(description="hierax mesolve of an open oscillator")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--n",
        default=None,
        help="levels of the ladders, e.g. 30,50 (the first's step bound is analysed)",
    )
    parser.add_argument(
        "--sizes", default=None, help="levels of the cost per step, e.g. 20,25,30"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="fixed steps of the cost per step"
    )
    ns = parser.parse_args()
    warm_up()
    load = [list(os.getloadavg())]
    print(f"load before: {load[0]}")
    precision = import_dynamiqs()
    if ns.quick:
        levels, span = (20,), 5.0
        rtols, repeats = [1e-4, 1e-7, 1e-10], 2
        orders, sizes = (16, 28), (20, 30)
    else:
        # (The range, 20-50 levels: its two larger ends.)
        levels, span = (30, 50), 10.0
        rtols, repeats = [10.0**-k for k in range(2, 13)], 5
        orders, sizes = (12, 16, 20, 28, 40, 56), (16, 20, 24, 25, 30, 32, 40, 50)
    if ns.n is not None:
        levels = tuple(int(n) for n in ns.n.split(","))
    if ns.sizes is not None:
        sizes = tuple(int(n) for n in ns.sizes.split(","))
    runs = [ladder_run(Oscillator(n, span), rtols, repeats) for n in levels]
    system, ladders, targets = runs[0]
    load.append(list(os.getloadavg()))
    bound = bound_analysis(
        system,
        [rtols[0], rtols[-1]] if ns.quick else [1e-10, 1e-6, 1e-2],
        orders,
        repeats,
    )
    load.append(list(os.getloadavg()))
    steps = ns.steps if ns.steps is not None else 20 if ns.quick else 50
    cost = step_cost(sizes, steps, repeats)
    load.append(list(os.getloadavg()))
    print(f"load after: {load[-1]}")
    emit(result_rows(runs, bound, cost))
    if ns.out:
        with open(ns.out, "w") as file:
            json.dump(
                dict(
                    quick=ns.quick,
                    n=system.n,
                    span=system.span,
                    jax=jax.__version__,
                    precision=precision,
                    ladders=ladders,
                    targets=targets,
                    more=[
                        dict(n=other.n, ladders=lad, targets=tar)
                        for other, lad, tar in runs[1:]
                    ],
                    bound=bound,
                    step_cost=cost,
                    load=load,
                ),
                file,
                indent=1,
                default=float,
            )


if __name__ == "__main__":
    main()
