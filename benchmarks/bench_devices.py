"""hierax on whatever device JAX sees (CPU, GPU or TPU): its accuracy in complex64
against x64 references, and its speed against diffrax and dynamiqs at matched error.

    python benchmarks/bench_devices.py [--precision x32|x64] [--matmul highest|default]
        [--sections accuracy,chains,open_chain,batch,sweep,floquet,lanczos]
        [--sites 8,10] [--levels 6,10]
        [--batch 64] [--quick] [--reference ref.npz] [--out results.json]

Nothing is configured at import: `--precision` (default x32) sets `jax_enable_x64`
before any computation, and `--matmul` runs everything (the peers too) inside
`hierax.matmul_precision(...)`, which is also JAX's `default_matmul_precision`
(hierax's own default is "highest"). With x64 on a TPU hierax refuses every call
with a `ValueError` (XLA's TPU compiler aborts the process on complex128): the run
records the message and runs nothing else (the peers would abort the process).

References: a subprocess of this script with `JAX_PLATFORMS=cpu` and x64 (it never
touches an accelerator, which one process holds at a time) computes every
reference in complex128 and saves them to `--reference` (default: a temporary
file); an existing file is reused for the keys it has, so a second column (e.g.
`JAX_PLATFORMS=cpu` after the TPU) computes nothing again.

Sections:

- `accuracy`: at the run's precision, hierax's default settings, against the
  x64 CPU reference: (a) `HeisenbergHierarchy` of H = H0 + cos(1.3 t) H1 (random
  32-level Hermitian, each of spectral norm 1) with a random Hermitian observable
  (norm 1), order 20, at t = 0.7: the relative error of each level (Frobenius norm
  of the difference over the reference's) and the largest over levels; (b)
  `PropagatorDerivatives` of the same H, order 20, applied to a random unitary;
  (c) the seed, `HeisenbergHierarchy(hierax.Cos() * sy, sx, 30)(1.0)`; (d) the
  driven XXZ chain of `systems.py` at 10 sites (`--quick`: 6), T = 3, `sesolve`
  at rtol 1e-6, atol 1e-8: the final state's relative error against diffrax
  Dopri8 at rtol 1e-12, atol 1e-14 (x64, sparse generators). Target: 2e-5 for
  each level and for the final state; the table says which are met.
- `chains`: the XXZ chain at each of `--sites` (n = 2^L, dense matrices), T = 3:
  hierax `sesolve` from Python and inside a user's `jax.jit` (the tolerance an
  argument), diffrax Dopri8 on the real and imaginary parts (`peers.py`) and
  dynamiqs `sesolve` (Dopri8), each over a ladder of rtol (x32: 1e-4 ... 1e-7;
  x64: 1e-6 ... 1e-10; atol = rtol / 100). Each point: the median of 5 calls,
  each until its result is ready on the device, after a first one (which
  compiles, and brings the result to the host for its final error against the
  reference). The compiled calls and the peers take their tolerances as device
  scalars made once (a transfer per call is a fraction of a millisecond on a
  TPU); hierax from Python takes Python floats, as a user passes them.
  Each method's time at a common final error (x32: 1e-5, x64: 1e-8) is
  interpolated log-log between the ladder points around the last crossing
  (`timing.time_at`); the ratio best peer / hierax, and the first-call times.
- `open_chain`: `mesolve` of the XXZ chain of `chains` at 6 sites (`--quick`: 4),
  open: each site decays, jump operators sqrt(0.1) sigma^-_k (n = 64, vec(rho) of
  4096 entries), from the Neel state, T = 3: hierax from Python and inside a user's
  `jax.jit`, and dynamiqs `mesolve` (Dopri8), on the same ladder of rtol, against
  dynamiqs Dopri8 in x64 on the CPU at rtol 1e-12, atol 1e-14 (diffrax has no
  `mesolve`; a hand-written Dopri8 on the 4096 x 4096 Liouvillian is not a fair
  peer). Time at the common final error and the ratio, as for `chains`.
- `batch`: `jax.vmap` over `--batch` random initial states (`--quick`: 8) of the
  smallest chain: hierax from Python and inside a user's `jax.jit`, diffrax Dopri8
  under the same `vmap`, dynamiqs (it batches the states itself), on the ladder of
  rtol, against diffrax Dopri8 in x64 on the CPU at 1e-12 (sparse generators); the
  error is the largest 2-norm distance of an element to its reference. Time at the
  common final error and the ratio, as for `chains`.
- `sweep`: the qubit sweeps of `sweeps.py` (256 detunings, `--quick`: 32, of a
  qubit under a Gaussian pi pulse, and 256 amplitudes of that pulse, each a
  traced parameter of the Hamiltonian) under `jax.vmap`: hierax from Python and
  inside a user's `jax.jit`, diffrax Dopri8 under the same `vmap`, on the ladder
  of rtol, against scipy's DOP853 on the whole batch in float64 (rtol 1e-13);
  errors and times as for `batch`.
- `floquet`: `jax.vmap` of `hierax.floquet`'s quasienergies over `--batch`
  amplitudes A in [0, 1] of H = H0 + A cos(2 t) H1 (random 8-level Hermitian),
  rtol 1e-6 (x64: 1e-10), by default and with `throw=False` (no host
  callback): the time per sweep and the largest quasienergy error
  against the propagator of diffrax Dopri8 at 1e-12 (x64, CPU); dynamiqs'
  `floquet` as the peer where it runs (it has no eigensolver on a TPU: the error
  is reported).
- `floquet_transmon` (only when named in `--sections`): issue 51's Floquet rows,
  the same calls over `--batch` amplitudes A in [0, 0.05] (the issue: 1000) of a
  transmon of each of `--levels` levels (frequency 1, anharmonicity -0.3)
  driven through a + a^dagger at frequency 0.9, against diffrax Dopri8's
  propagators at 1e-12 (x64, CPU).
- `lanczos`: `hierax.lanczos` of Z_0 under the Ising chain
  (`PauliSum.ising_chain(12, 1, 1.05, 0.5)`), 30 steps, capacity 4096 (`--quick`:
  8 qubits, 10 steps, capacity 256; `--lanczos issue`: issue 51's 30 qubits,
  capacity 2^14): first call and median of 3, and the largest
  difference of the coefficients b to the x64 CPU run; the first call's parts
  (trace and lower, XLA's compile) ahead of time, and XLA's compile of one sort of
  1024, 16384 and 147456 uint32 keys (the merge of the candidates sorts them).

Every section is labelled with the device (`device_kind`, platform), the
precision, the matmul choice and the load average (`os.getloadavg()`) at its start
and end.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from peers import diffrax_final, dynamiqs_final, real_embedding
from rows import emit, row
from sweeps import QubitSweep, RabiSweep
from systems import System, open_xxz, xxz
from timing import (
    Stopwatch,
    compile_phases,
    first_and_median,
    median_time,
    time_at,
    timed,
)

import hierax


warnings.filterwarnings("ignore", message=".*[Cc]omplex.*")
warnings.filterwarnings("ignore", message=".*[Ee]xplicitly requested dtype.*")

SECTIONS = (
    "accuracy",
    "chains",
    "open_chain",
    "batch",
    "sweep",
    "floquet",
    "lanczos",
)
# Run only when named in `--sections` (their x64 references take minutes).
OPTIONAL_SECTIONS = ("floquet_transmon",)
SPAN = 3.0
LADDERS = {"x32": (1e-4, 1e-5, 1e-6, 1e-7), "x64": (1e-6, 1e-7, 1e-8, 1e-9, 1e-10)}
TARGETS = {"x32": 1e-5, "x64": 1e-8}
FLOQUET_TOLS = {"x32": 1e-6, "x64": 1e-10}
ACCURACY_TARGET = 2e-5
ACCURACY_T = 0.7
REFERENCE_TOLS = (1e-12, 1e-14)
REPEATS = 5
# The calls with `throw=False` (hierax's and diffrax's: no host callback in the
# program; on a TPU any callback costs a call about 2 ms), compared with each other.
QUIET = "throw=False"
QUIET_OURS, QUIET_PEER = f"hierax in jit, {QUIET}", f"diffrax Dopri8, {QUIET}"
# Other series orders for hierax's `throw=False` call in jit (`--orders`), beside
# the default: never a peer.
ORDERS: list[int] = []


def at_orders(call: Callable) -> dict[str, Callable]:
    """`call(tol, order)` as one method per order of `ORDERS`."""
    return {f"{QUIET_OURS}, order {k}": (lambda tol, k=k: call(tol, k)) for k in ORDERS}


FLOQUET_OMEGA = 2.0
TRANSMON_OMEGA = 0.9  # issue 51's Floquet rows: a driven transmon, A in [0, 0.05]
SX = np.array([[0, 1], [1, 0]], complex)
SY = np.array([[0, -1j], [1j, 0]])


# --- the problems, the same in this process and in the reference's ---------------


def _cdtype() -> Any:
    return np.complex128 if jax.config.read("jax_enable_x64") else np.complex64


def _hermitian(rng: np.random.Generator, n: int) -> np.ndarray:
    a = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
    h = a + a.conj().T
    return h / np.linalg.norm(h, 2)


def accuracy_problem() -> tuple[Any, np.ndarray, np.ndarray]:
    """H = H0 + cos(1.3 t) H1, the observable and the unitary, at the precision."""
    rng = np.random.default_rng(49)
    h0, h1, x = (_hermitian(rng, 32) for _ in range(3))
    u, _ = np.linalg.qr(rng.normal(size=(32, 32)) + 1j * rng.normal(size=(32, 32)))
    c = _cdtype()
    hamiltonian = hierax.Cos(1.3) * h1.astype(c) + h0.astype(c)
    return hamiltonian, x.astype(c), u.astype(c)


def heisenberg_levels() -> np.ndarray:
    hamiltonian, x, _ = accuracy_problem()
    return np.asarray(hierax.HeisenbergHierarchy(hamiltonian, x, 20)(ACCURACY_T))


def propagator_levels() -> np.ndarray:
    hamiltonian, _, u = accuracy_problem()
    return np.asarray(hierax.PropagatorDerivatives(hamiltonian, 20)(ACCURACY_T, u))


def seed_levels() -> np.ndarray:
    c = _cdtype()
    hierarchy = hierax.HeisenbergHierarchy(
        hierax.Cos() * SY.astype(c), SX.astype(c), 30
    )
    return np.asarray(hierarchy(1.0))


def chain(sites: int) -> System:
    return xxz(span=SPAN, sites=sites)


def open_chain(sites: int) -> System:
    return open_xxz(span=SPAN, sites=sites)


def open_reference(sites: int) -> np.ndarray:
    system = open_chain(sites)
    final = jax.jit(dynamiqs_final(system, "dopri8", "double"))
    return np.asarray(final(jnp.asarray(system.state), *REFERENCE_TOLS))


def hamiltonian_of(system: System) -> Any:
    c = _cdtype()
    return system.hamiltonian(matrix=lambda m: np.asarray(m, c))


def chain_reference(sites: int) -> np.ndarray:
    system = chain(sites)
    final = jax.jit(diffrax_final(system, sparse=True))
    return np.asarray(final(jnp.asarray(system.state), *REFERENCE_TOLS))


def floquet_problem() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(8)
    h0, h1 = (_hermitian(rng, 8) for _ in range(2))
    c = _cdtype()
    return h0.astype(c), h1.astype(c)


def floquet_amplitudes(count: int) -> np.ndarray:
    return np.linspace(0.0, 1.0, count)


def floquet_reference(count: int) -> np.ndarray:
    """The quasienergies (-angle of the eigenvalues of U(T), over T) from the
    one-period propagator of diffrax Dopri8 at 1e-12, for each amplitude."""
    h0, h1 = floquet_problem()
    return quasienergy_reference(h0, h1, FLOQUET_OMEGA, floquet_amplitudes(count))


def transmon_problem(levels: int) -> tuple[np.ndarray, np.ndarray]:
    """A transmon (frequency 1, anharmonicity -0.3) and its drive a + a^dagger."""
    a = np.diag(np.sqrt(np.arange(1.0, levels)), 1)
    number = a.T @ a
    h0 = number - 0.15 * number @ (number - np.eye(levels))
    c = _cdtype()
    return h0.astype(c), (a + a.T).astype(c)


def transmon_amplitudes(count: int) -> np.ndarray:
    return np.linspace(0.0, 0.05, count)


def transmon_reference(levels: int, count: int) -> np.ndarray:
    h0, h1 = transmon_problem(levels)
    return quasienergy_reference(h0, h1, TRANSMON_OMEGA, transmon_amplitudes(count))


def quasienergy_reference(
    h0: np.ndarray, h1: np.ndarray, omega: float, amplitudes: np.ndarray
) -> np.ndarray:
    """The quasienergies of H0 + A cos(omega t) H1 for each amplitude A: -angle of
    the eigenvalues of diffrax Dopri8's one-period propagator at 1e-12, over T."""
    import diffrax

    n = h0.shape[0]
    g0 = jnp.asarray(real_embedding(-1j * h0))
    g1 = jnp.asarray(real_embedding(-1j * h1))
    period = 2 * np.pi / omega

    def propagator(amplitude):
        def field(t, y, args):
            return g0 @ y + amplitude * jnp.cos(omega * t) * (g1 @ y)

        eye = np.eye(n)
        y0 = jnp.asarray(np.concatenate([eye, np.zeros_like(eye)]))
        y = diffrax.diffeqsolve(
            diffrax.ODETerm(field),
            diffrax.Dopri8(),
            0.0,
            period,
            None,
            y0,
            stepsize_controller=diffrax.PIDController(
                rtol=REFERENCE_TOLS[0], atol=REFERENCE_TOLS[1]
            ),
            max_steps=10**6,
        ).ys[-1]  # pyright: ignore[reportOptionalSubscript]
        return y[:n] + 1j * y[n:]

    u = np.asarray(jax.jit(jax.vmap(propagator))(jnp.asarray(amplitudes)))
    return -np.angle(np.linalg.eigvals(u)) / period


def floquet_error(
    energies: np.ndarray, reference: np.ndarray, omega: float = FLOQUET_OMEGA
) -> float:
    """The largest distance, modulo the drive frequency, from each reference
    quasienergy to the nearest computed one, over all amplitudes."""
    d = reference[:, :, None] - np.asarray(energies)[:, None, :]
    d = np.abs((d + omega / 2) % omega - omega / 2)
    return float(d.min(axis=2).max())


# `--lanczos`'s sizes (qubits, steps, capacity); "issue": issue 51's.
LANCZOS_SIZES = {
    "quick": (8, 10, 256),
    "full": (12, 30, 4096),
    "issue": (30, 30, 1 << 14),
}


def lanczos_size(args) -> str:
    return "quick" if args.quick else args.lanczos


def lanczos_problem(size: str) -> tuple[Any, Any, int, int, int]:
    qubits, steps, capacity = LANCZOS_SIZES[size]
    h = hierax.PauliSum.ising_chain(qubits, 1.0, 1.05, 0.5)
    o = hierax.PauliSum.from_strings(["Z" + "I" * (qubits - 1)], [1.0])
    return h, o, qubits, steps, capacity


def lanczos_b(size: str) -> np.ndarray:
    h, o, _, steps, capacity = lanczos_problem(size)
    return np.asarray(hierax.lanczos(h, o, steps, capacity=capacity).b)


# --- the references: a CPU subprocess in x64 ----------------------------------------


def reference_keys(args) -> list[str]:
    sections = args.sections.split(",")
    keys = []
    if "accuracy" in sections:
        keys += ["heisenberg", "propagator", "seed", f"chain_{_accuracy_sites(args)}"]
    if "chains" in sections:
        keys += [f"chain_{s}" for s in _sites(args)]
    if "open_chain" in sections:
        keys.append(f"open_{_open_sites(args)}")
    if "batch" in sections:
        keys.append(f"batch_{min(_sites(args))}_{_batch(args)}")
    if "floquet" in sections:
        keys.append(f"floquet_{_batch(args)}")
    if "floquet_transmon" in sections:
        keys += [f"transmon_{n}_{_batch(args)}" for n in _levels(args)]
    if "lanczos" in sections:
        keys.append(f"lanczos_{lanczos_size(args)}")
    return list(dict.fromkeys(keys))


def compute_reference(key: str) -> np.ndarray:
    name, _, arg = key.partition("_")
    if name == "heisenberg":
        return heisenberg_levels()
    if name == "propagator":
        return propagator_levels()
    if name == "seed":
        return seed_levels()
    if name == "chain":
        return chain_reference(int(arg))
    if name == "floquet":
        return floquet_reference(int(arg))
    if name == "transmon":
        levels, count = arg.split("_")
        return transmon_reference(int(levels), int(count))
    if name == "open":
        return open_reference(int(arg))
    if name == "batch":
        sites, count = arg.split("_")
        return batch_reference(int(sites), int(count))
    return lanczos_b(arg)


def reference_child(path: str, keys: list[str]) -> None:
    """Run with JAX_PLATFORMS=cpu: every reference in x64, saved to `path`."""
    jax.config.update("jax_enable_x64", True)
    assert jax.default_backend() == "cpu", jax.default_backend()
    out = {}
    for key in keys:
        watch = Stopwatch()
        out[key] = compute_reference(key)
        print(f"  reference {key}: {watch.seconds:.1f} s", flush=True)
    np.savez(path, allow_pickle=False, **out)


def references(args) -> dict[str, np.ndarray]:
    """The references this run needs: those in `--reference` if it exists, the
    others computed by a CPU subprocess (and added to the file)."""
    path = args.reference or os.path.join(tempfile.mkdtemp(), "reference.npz")
    have: dict[str, np.ndarray] = {}
    if os.path.exists(path):
        with np.load(path) as f:
            have = {k: f[k] for k in f.files}
    missing = [k for k in reference_keys(args) if k not in have]
    if missing:
        print(f"references (x64, CPU subprocess): {', '.join(missing)}", flush=True)
        watch = Stopwatch()
        scratch = path + ".new.npz"
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        command = [sys.executable, __file__, "--reference-child", scratch]
        command += ["--reference-keys", ",".join(missing)]
        subprocess.run(command, env=env, check=True)
        with np.load(scratch) as f:
            have.update({k: f[k] for k in f.files})
        os.remove(scratch)
        np.savez(path, allow_pickle=False, **have)
        print(f"references: {watch.seconds:.1f} s, in {path}", flush=True)
    return have


# --- measurement ---------------------------------------------------------------------


def context(args) -> dict:
    device = jax.devices()[0]
    return dict(
        device=device.device_kind,
        platform=device.platform,
        precision=args.precision,
        matmul=args.matmul,
        load=list(os.getloadavg()),
    )


def _label(ctx: dict) -> str:
    load = " ".join(f"{x:.2f}" for x in ctx["load"])
    return (
        f"{ctx['device']} ({ctx['platform']}), {ctx['precision']}, matmul "
        f"{ctx['matmul']}, load {load}"
    )


def relative_error(state, reference) -> float:
    state = np.asarray(state).reshape(reference.shape)
    return float(np.linalg.norm(state - reference) / np.linalg.norm(reference))


def level_errors(levels: np.ndarray, reference: np.ndarray) -> list[float]:
    """Each level's relative error (Frobenius norms; absolute where the reference
    level is zero)."""
    out = []
    for got, ref in zip(np.asarray(levels), reference):
        norm = np.linalg.norm(ref)
        out.append(float(np.linalg.norm(got - ref) / (norm if norm > 0 else 1.0)))
    return out


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _sites(args) -> list[int]:
    return [int(s) for s in args.sites.split(",") if s]


def _batch(args) -> int:
    return 8 if args.quick and args.batch == 64 else args.batch


def _levels(args) -> list[int]:
    return [int(n) for n in args.levels.split(",")]


def _sweep_count(args) -> int:
    return 32 if args.quick else 256


def _open_sites(args) -> int:
    return 4 if args.quick else 6


def _accuracy_sites(args) -> int:
    return 6 if args.quick else 10


# --- the sections ---------------------------------------------------------------------


def section_accuracy(args, refs) -> dict:
    rows = []
    for name, fn, key in (
        ("HeisenbergHierarchy, n = 32, order 20", heisenberg_levels, "heisenberg"),
        ("PropagatorDerivatives, n = 32, order 20", propagator_levels, "propagator"),
        ("seed, order 30", seed_levels, "seed"),
    ):
        watch = Stopwatch()
        errors = level_errors(fn(), refs[key])
        rows.append(
            dict(name=name, errors=errors, max=max(errors), seconds=watch.seconds)
        )
    sites = _accuracy_sites(args)
    system = chain(sites)
    psi = jnp.asarray(system.state, _cdtype())
    watch = Stopwatch()
    final = hierax.sesolve(
        hamiltonian_of(system),
        psi,
        jnp.asarray(system.times),
        rtol=1e-6,
        atol=1e-8,
        max_steps=10**6,
    ).final_state
    error = relative_error(final, refs[f"chain_{sites}"])
    rows.append(
        dict(
            name=f"sesolve XXZ {sites} sites, rtol 1e-6",
            errors=[error],
            max=error,
            seconds=watch.seconds,
        )
    )
    print(f"| problem | max relative error | target {ACCURACY_TARGET:g} | per level |")
    print("|---|---:|---|---|")
    for r in rows:
        r["met"] = r["max"] <= ACCURACY_TARGET
        levels = " ".join(f"{e:.0e}" for e in r["errors"])
        print(
            f"| {r['name']} | {r['max']:.2e} | {'met' if r['met'] else 'NOT met'} "
            f"| {levels} |"
        )
    return dict(rows=rows)


def chain_methods(system: System, precision: str) -> dict[str, Callable]:
    """Each method as solve(tol) -> final state, from the chain's initial state."""
    return final_methods(system, precision, jnp.asarray(system.state, _cdtype()))


def final_methods(
    system: System, precision: str, start: Any, batched: bool = False
) -> dict[str, Callable]:
    """Each method as solve(tol) -> the final state from `start`, or with `batched`
    the final states of its rows under `jax.vmap` (dynamiqs batches them itself)."""
    hamiltonian = hamiltonian_of(system)
    times = jnp.asarray(system.times)
    rdtype = np.float64 if precision == "x64" else np.float32

    def ours(kets, rtol, throw=True, order=None):
        def one(psi):
            return hierax.sesolve(
                hamiltonian,
                psi,
                times,
                rtol=rtol,
                atol=rtol * 1e-2,
                max_steps=10**6,
                throw=throw,
                order=order,
            ).final_state

        return jax.vmap(one)(kets) if batched else one(kets)

    def mapped(final):
        return jax.vmap(final, (0, None, None)) if batched else final

    in_jit = jax.jit(ours, static_argnums=(2, 3))
    dopri8 = jax.jit(mapped(diffrax_final(system)))
    quiet = jax.jit(mapped(diffrax_final(system, throw=False)))
    methods = {
        "hierax": lambda tol: ours(start, tol),
        "hierax in jit": lambda tol: in_jit(start, on_device(tol, rdtype)),
        "diffrax Dopri8": lambda tol: dopri8(
            start, on_device(tol, rdtype), on_device(tol * 1e-2, rdtype)
        ),
        QUIET_OURS: lambda tol: in_jit(start, on_device(tol, rdtype), False),
        QUIET_PEER: lambda tol: quiet(
            start, on_device(tol, rdtype), on_device(tol * 1e-2, rdtype)
        ),
        **at_orders(lambda tol, k: in_jit(start, on_device(tol, rdtype), False, k)),
    }
    return with_dynamiqs(methods, system, precision, start)


def with_dynamiqs(
    methods: dict[str, Callable], system: System, precision: str, start: Any
) -> dict[str, Callable]:
    """`methods` with dynamiqs' solve (Dopri8) from `start`, where installed."""
    try:
        dynamiqs = dynamiqs_final(system, "dopri8", _dq_precision(precision))
        methods["dynamiqs Dopri8"] = lambda tol: dynamiqs(start, tol, tol * 1e-2)
    except ImportError as e:
        print(f"dynamiqs not installed ({e})")
    return methods


def _dq_precision(precision: str) -> str:
    return "double" if precision == "x64" else "single"


def on_device(value: float, dtype: Any) -> Any:
    """`value` as a device scalar of `dtype`, made once: the compiled calls and the
    peers then take their tolerances without a transfer per call (on the TPU each
    host-to-device transfer of a scalar is a fraction of a millisecond, as large
    as a small solve)."""
    key = (float(value), np.dtype(dtype).name)
    if key not in _ON_DEVICE:
        _ON_DEVICE[key] = jax.block_until_ready(jnp.asarray(value, dtype))
    return _ON_DEVICE[key]


_ON_DEVICE: dict[tuple[float, str], Any] = {}


def run_ladder(
    solve: Callable, reference: np.ndarray, tols, slow: float, error_of: Callable
) -> list:
    """Each rtol's final error and time: the first call's (compile, one solve and
    the result's transfer to the host, for its error) and the median of `REPEATS`
    more until the result is ready on the device (the transfer is the same for
    every method: not the solver's)."""
    points = []
    for tol in tols:
        first, out = timed(solve, tol)
        median = median_time(solve, (tol,), REPEATS, warm=False)
        error = error_of(out, reference)
        points.append(dict(tol=tol, error=error, seconds=median, first=first))
        if median > slow:
            break
    return points


def compare_at_error(
    row: dict,
    methods: dict[str, Callable],
    reference: np.ndarray,
    args,
    label: str,
    error_of: Callable = relative_error,
) -> dict:
    """`row` with each method's ladder of (rtol, final error `error_of(out,
    reference)`, time), its time at the common final error (`time_at`) and the best
    peer's ratio to hierax's."""
    target = TARGETS[args.precision]
    row.update(ladders={}, errors={})
    for name, solve in methods.items():
        try:
            slow = 5.0 if args.quick else 30.0
            points = run_ladder(
                solve, reference, LADDERS[args.precision], slow, error_of
            )
        except Exception as e:  # a peer that fails on this device
            row["errors"][name] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"  {label}, {name}: failed ({row['errors'][name]})")
            continue
        row["ladders"][name] = points
        text = ", ".join(
            "({tol:.0e}, {error:.1e}, {seconds:.2e} s)".format(**p) for p in points
        )
        print(f"  {label}, {name}: (rtol, error, s) {text}", flush=True)
    row["at"] = {n: time_at(p, target) for n, p in row["ladders"].items()}
    # Like against like: the default calls (every program raises its failed
    # checks, by host callbacks inside a jit) against the peers' defaults, and
    # hierax's `throw=False` against the peers' (no callback on either side).
    for quiet, key, ours_names in (
        (False, "best_peer", ("hierax", "hierax in jit")),
        (True, "best_quiet_peer", (QUIET_OURS,)),
    ):
        peers = [
            (entry[0], name)
            for name, entry in row["at"].items()
            if not name.startswith("hierax")
            and entry is not None
            and name.endswith(QUIET) == quiet
        ]
        row[key] = min(peers) if peers else None
        for ours in ours_names:
            base = row["at"].get(ours)
            row[f"ratio {ours}"] = row[key][0] / base[0] if base and row[key] else None
    return row


def print_table(rows: list[dict], target: float, keys: tuple[str, ...]) -> None:
    """The rows' times at the common error as a Markdown table, led by `keys`."""
    print(f"\ntime at final error {target:g} (first call: compile + one solve)")
    names = list(dict.fromkeys(n for r in rows for n in r["ladders"]))
    print(
        f"| {' | '.join(keys)} | "
        + " | ".join(names)
        + " | best peer / hierax (in jit; throw=False against throw=False) |"
    )
    print("|" + "---:|" * (len(keys) + len(names) + 1))
    for r in rows:
        cells = []
        for name in names:
            entry, points = r["at"].get(name), r["ladders"].get(name)
            if not points:
                cells.append("failed")
                continue
            at = (
                "not reached"
                if entry is None
                else ("<= " if entry[1] else "") + _ms(entry[0])
            )
            cells.append(f"{at} (first {_ms(points[0]['first'])})")
        ratio = r["ratio hierax"]
        ratio_jit = r["ratio hierax in jit"]
        ratio_text = (
            "-"
            if ratio is None
            else f"{ratio:.2f} ({ratio_jit:.2f})"
            if ratio_jit is not None
            else f"{ratio:.2f}"
        )
        quiet = r.get(f"ratio {QUIET_OURS}")
        if quiet is not None:
            ratio_text += f"; {QUIET}: {quiet:.2f}"
        lead = " | ".join(str(r[k]) for k in keys)
        print(f"| {lead} | " + " | ".join(cells) + f" | {ratio_text} |")


def ladder_section(rows: list[dict], args, keys: tuple[str, ...]) -> dict:
    """The section's record, its table printed."""
    target = TARGETS[args.precision]
    print_table(rows, target, keys)
    return dict(target=target, tols=list(LADDERS[args.precision]), rows=rows)


def section_chains(args, refs) -> dict:
    rows = []
    for sites in _sites(args):
        jax.clear_caches()
        system = chain(sites)
        methods = chain_methods(system, args.precision)
        row = dict(sites=sites, n=system.size)
        reference = refs[f"chain_{sites}"]
        rows.append(compare_at_error(row, methods, reference, args, f"{sites} sites"))
    return ladder_section(rows, args, ("sites", "n"))


def open_chain_methods(system: System, precision: str) -> dict[str, Callable]:
    """Each method as solve(tol) -> final density matrix of the open chain."""
    c = _cdtype()
    hamiltonian = hamiltonian_of(system)
    jumps = [np.asarray(j, c) for j in system.jumps]
    times = jnp.asarray(system.times)
    rho = jnp.asarray(system.state, c)
    rdtype = np.float64 if precision == "x64" else np.float32

    def solve(start, rtol):
        return hierax.mesolve(
            hamiltonian,
            jumps,
            start,
            times,
            rtol=rtol,
            atol=rtol * 1e-2,
            max_steps=10**6,
        ).final_state

    in_jit = jax.jit(solve)
    methods = {
        "hierax": lambda tol: solve(rho, tol),
        "hierax in jit": lambda tol: in_jit(rho, on_device(tol, rdtype)),
    }
    return with_dynamiqs(methods, system, precision, rho)


def section_open_chain(args, refs) -> dict:
    sites = _open_sites(args)
    system = open_chain(sites)
    methods = open_chain_methods(system, args.precision)
    row = dict(sites=sites, n=system.size, jumps=len(system.jumps))
    reference = refs[f"open_{sites}"]
    row = compare_at_error(row, methods, reference, args, f"open, {sites} sites")
    return ladder_section([row], args, ("sites", "n", "jumps"))


def batch_states(system: System, count: int) -> np.ndarray:
    """`count` random kets of the chain (fixed seed), normalised, as rows."""
    rng = np.random.default_rng(0)
    states = rng.normal(size=(count, system.size)) + 1j * rng.normal(
        size=(count, system.size)
    )
    return (states / np.linalg.norm(states, axis=1, keepdims=True)).astype(_cdtype())


def batch_reference(sites: int, count: int) -> np.ndarray:
    system = chain(sites)
    final = jax.jit(jax.vmap(diffrax_final(system, sparse=True), (0, None, None)))
    return np.asarray(final(jnp.asarray(batch_states(system, count)), *REFERENCE_TOLS))


def batch_error(states, reference) -> float:
    """The largest 2-norm distance of an element's final state to its reference
    (every element a unit vector)."""
    states = np.asarray(states).reshape(reference.shape)
    return float(np.max(np.linalg.norm(states - reference, axis=-1)))


def section_batch(args, refs) -> dict:
    sites, count = min(_sites(args)), _batch(args)
    system = chain(sites)
    states = jnp.asarray(batch_states(system, count))
    methods = final_methods(system, args.precision, states, batched=True)
    row = dict(sites=sites, n=system.size, batch=count)
    reference = refs[f"batch_{sites}_{count}"]
    label = f"vmap over {count} states, {sites} sites"
    row = compare_at_error(row, methods, reference, args, label, batch_error)
    return ladder_section([row], args, ("sites", "n", "batch"))


def sweep_methods(sweep: QubitSweep, precision: str) -> dict[str, Callable]:
    """Each method as solve(tol) -> the sweep's final states, under `jax.vmap`."""
    rdtype = np.float64 if precision == "x64" else np.float32
    params = jnp.asarray(sweep.params, rdtype)

    def ours(params, rtol, throw=True, order=None):
        return jax.vmap(lambda p: sweep.hierax_one(rtol, order, throw)(p)[0])(params)

    def theirs(params, rtol, throw=True):
        return jax.vmap(lambda p: sweep.diffrax_one(rtol, throw)(p)[0])(params)

    in_jit = jax.jit(ours, static_argnums=(2, 3))
    dopri8 = jax.jit(theirs, static_argnums=2)
    return {
        "hierax": lambda tol: ours(params, tol),
        "hierax in jit": lambda tol: in_jit(params, on_device(tol, rdtype)),
        "diffrax Dopri8": lambda tol: dopri8(params, on_device(tol, rdtype)),
        QUIET_OURS: lambda tol: in_jit(params, on_device(tol, rdtype), False),
        QUIET_PEER: lambda tol: dopri8(params, on_device(tol, rdtype), False),
        **at_orders(lambda tol, k: in_jit(params, on_device(tol, rdtype), False, k)),
    }


def section_sweep(args, refs) -> dict:
    del refs  # scipy's DOP853 in float64, whatever JAX's precision
    rows = []
    for kind in (QubitSweep, RabiSweep):
        sweep = kind(_sweep_count(args))
        methods = sweep_methods(sweep, args.precision)
        row = dict(sweep=sweep.name, elements=len(sweep.params), n=2)
        label = f"vmap over {len(sweep.params)} elements ({sweep.name})"
        row = compare_at_error(
            row, methods, sweep.reference(), args, label, batch_error
        )
        rows.append(row)
    return ladder_section(rows, args, ("sweep", "elements", "n"))


def section_floquet(args, refs) -> dict:
    count = _batch(args)
    h0, h1 = floquet_problem()
    amplitudes = floquet_amplitudes(count)
    row = floquet_row(args, h0, h1, FLOQUET_OMEGA, amplitudes, refs[f"floquet_{count}"])
    return dict(levels=8, amplitudes=count, **row)


def section_floquet_transmon(args, refs) -> dict:
    """Issue 51's Floquet rows: `--batch` amplitudes of a driven transmon of each
    of `--levels` levels."""
    count = _batch(args)
    rows = {}
    for levels in _levels(args):
        print(f"  transmon, {levels} levels", flush=True)
        h0, h1 = transmon_problem(levels)
        reference = refs[f"transmon_{levels}_{count}"]
        amplitudes = transmon_amplitudes(count)
        rows[str(levels)] = floquet_row(
            args, h0, h1, TRANSMON_OMEGA, amplitudes, reference
        )
    return dict(amplitudes=count, levels=rows)


def floquet_row(args, h0, h1, omega, amplitudes, reference) -> dict:
    """`jax.vmap` of the quasienergies of H0 + A cos(omega t) H1 over the
    amplitudes, in a `jax.jit`: hierax (by default and with `throw=False`) and
    dynamiqs' `floquet` where it runs; each one's time and largest error."""
    amplitudes = jnp.asarray(amplitudes, np.real(h0).dtype)
    period = 2 * np.pi / omega
    tol = FLOQUET_TOLS[args.precision]
    count = len(amplitudes)

    def ours(amplitude, throw=True):
        h = hierax.Cos(omega, 0.0, amplitude) * h1 + h0
        basis = hierax.floquet(h, period, rtol=tol, atol=tol * 1e-2, throw=throw)
        return basis.quasienergies

    calls: dict[str, Callable] = {
        "hierax": jax.jit(jax.vmap(ours)),
        # No host callback in the program (a failure would come back in
        # `basis.failure`, the quasienergies nan).
        "hierax throw=False": jax.jit(jax.vmap(lambda a: ours(a, throw=False))),
    }
    try:
        import dynamiqs as dq
        import dynamiqs.method as dq_method

        dq.set_precision(_dq_precision(args.precision))  # pyright: ignore[reportArgumentType]

        def theirs(amplitude):
            h = dq.constant(jnp.asarray(h0)) + dq.modulated(
                lambda t: amplitude * jnp.cos(omega * t), jnp.asarray(h1)
            )
            method = dq_method.Dopri8(rtol=tol, atol=tol * 1e-2, max_steps=10**6)
            return dq.floquet(
                h, period, jnp.array([0.0]), method=method, progress_meter=False
            ).quasienergies

        calls["dynamiqs floquet"] = jax.jit(jax.vmap(theirs))
    except ImportError as e:
        print(f"dynamiqs not installed ({e})")
    row: dict = dict(rtol=tol)
    for name, fn in calls.items():
        try:
            first, median, out = first_and_median(fn, (amplitudes,), REPEATS)
        except Exception as e:
            row[name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
            print(f"  {name}: failed ({row[name]['error']})")
            continue
        error = floquet_error(out, reference, omega)
        row[name] = dict(first=first, median=median, error=error)
        print(
            f"  {name}: {count} amplitudes in {_ms(median)} (first {_ms(first)}), "
            f"largest quasienergy error {error:.1e}",
            flush=True,
        )
    return row


def section_lanczos(args, refs) -> dict:
    h, o, qubits, steps, capacity = lanczos_problem(lanczos_size(args))
    reference = refs[f"lanczos_{lanczos_size(args)}"]

    def b():
        return hierax.lanczos(h, o, steps, capacity=capacity).b

    first, median, out = first_and_median(b, (), REPEATS)
    difference = float(np.max(np.abs(out - reference)))
    print(
        f"  {qubits} qubits, {steps} steps, "
        f"capacity {capacity}: first {_ms(first)}, then {_ms(median)}; largest "
        f"difference of b to x64 {difference:.1e}",
        flush=True,
    )
    # The first call's parts, compiled ahead of time afresh (the whole result).
    jax.clear_caches()
    whole = jax.jit(lambda: hierax.lanczos(h, o, steps, capacity=capacity))
    lower, build, _ = compile_phases(whole, ())
    print(f"  ahead of time: trace and lower {_ms(lower)}, compile {_ms(build)}")
    # XLA's compile of one sort (the candidates' merge sorts them), by size.
    sorts = {}
    for size in (1 << 10, 1 << 14, 147456):
        jax.clear_caches()
        keys = jnp.zeros(size, jnp.uint32)
        sorts[size] = compile_phases(jax.jit(jnp.sort), (keys,))[1]
    print(
        "  compile of one sort of uint32: "
        + ", ".join(f"{size} keys {_ms(t)}" for size, t in sorts.items())
    )
    return dict(
        qubits=qubits,
        steps=steps,
        capacity=capacity,
        first=first,
        median=median,
        difference=difference,
        trace_lower=lower,
        compile=build,
        sort_compile={str(k): v for k, v in sorts.items()},
    )


RUNNERS = {
    "accuracy": section_accuracy,
    "chains": section_chains,
    "open_chain": section_open_chain,
    "batch": section_batch,
    "sweep": section_sweep,
    "floquet": section_floquet,
    "floquet_transmon": section_floquet_transmon,
    "lanczos": section_lanczos,
}


def result_rows(record: dict) -> list[dict]:
    """The sections as result rows, each with the run's precision and matmul
    choice: the accuracy's largest error, the chains' time at the common error
    and first call per method, the batch's, Floquet's and Lanczos' times."""
    out = []
    setting = dict(
        precision=record["args"]["precision"], matmul=record["args"]["matmul"]
    )
    if record.get("refused"):
        return [row("every section", "hierax", "refused", record["refused"], **setting)]
    sections = record["sections"]
    for r in sections.get("accuracy", {}).get("rows", []):
        out.append(row(r["name"], "hierax", "error", r["max"], **setting))
    cases = {
        "chains": lambda r, t: f"XXZ chain, {r['sites']} sites, error {t:g}",
        "open_chain": lambda r, t: (
            f"open XXZ chain, {r['sites']} sites, {r['jumps']} jumps, error {t:g}"
        ),
        "batch": lambda r, t: (
            f"vmap over {r['batch']} states, {r['sites']} sites, error {t:g}"
        ),
        "sweep": lambda r, t: (
            f"vmap over {r['elements']} {r['sweep']} elements, error {t:g}"
        ),
    }
    for key, case_of in cases.items():
        section = sections.get(key)
        for r in section["rows"] if section else ():
            case = case_of(r, section["target"])
            for name, points in r["ladders"].items():
                entry = r["at"].get(name)
                seconds = entry[0] if entry else None
                out.append(row(case, name, "seconds", seconds, **setting))
                first = points[0]["first"] if points else None
                out.append(row(case, name, "first_call_seconds", first, **setting))
    floquet_rows = []
    if sections.get("floquet"):
        floquet_rows.append(("floquet sweep", sections["floquet"]))
    transmon = sections.get("floquet_transmon")
    for levels, r in (transmon or {}).get("levels", {}).items():
        label = f"floquet sweep, transmon n = {levels}, {transmon['amplitudes']}"
        floquet_rows.append((label, r))
    for label, floquet in floquet_rows:
        for name, r in floquet.items():
            if isinstance(r, dict) and "median" in r:
                out.append(row(label, name, "seconds", r["median"], **setting))
                out.append(
                    row(label, name, "first_call_seconds", r["first"], **setting)
                )
                if "error" in r:
                    out.append(row(label, name, "error", r["error"], **setting))
    lanczos = sections.get("lanczos")
    if lanczos:
        case = f"lanczos, {lanczos['qubits']} qubits, {lanczos['steps']} steps"
        out.append(row(case, "hierax", "seconds", lanczos["median"], **setting))
        out.append(
            row(case, "hierax", "first_call_seconds", lanczos["first"], **setting)
        )
        out.append(row(case, "hierax", "error", lanczos["difference"], **setting))
        if "compile" in lanczos:
            compile_ = lanczos["compile"]
            out.append(row(case, "hierax", "compile_seconds", compile_, **setting))
    return out


def refusal() -> str | None:
    """hierax's refusal of this configuration (x64 on a TPU), or None."""
    try:
        hierax.HeisenbergHierarchy(hierax.Cos() * SY, SX, 2)(1.0)
    except ValueError as e:
        return str(e)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--precision", choices=("x32", "x64"), default="x32")
    parser.add_argument("--matmul", choices=("highest", "default"), default="highest")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--sites", default="8,10")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--levels", default="6,10", help="floquet_transmon's")
    parser.add_argument(
        "--lanczos",
        choices=("full", "issue"),
        default="full",
        help="lanczos' size: 12 qubits, capacity 4096; issue: 30, 2^14",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (CPU smoke)")
    parser.add_argument("--reference", default=None, help="the references' .npz")
    parser.add_argument("--out", default=None, help="write the results as JSON")
    parser.add_argument(
        "--orders", default="", help="other orders for hierax's throw=False call"
    )
    parser.add_argument("--reference-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--reference-keys", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reference_child:
        reference_child(args.reference_child, args.reference_keys.split(","))
        return
    ORDERS.extend(int(k) for k in args.orders.split(",") if k)
    unknown = set(args.sections.split(",")) - set(SECTIONS + OPTIONAL_SECTIONS)
    if unknown:
        known = SECTIONS + OPTIONAL_SECTIONS
        parser.error(f"unknown sections {sorted(unknown)}; choose from {known}")
    jax.config.update("jax_enable_x64", args.precision == "x64")
    watch = Stopwatch()
    record: dict = dict(
        args=vars(args),
        jax=jax.__version__,
        hierax=hierax.__version__,
        date=time.strftime("%Y-%m-%d %H:%M"),
        context=context(args),
        sections={},
    )
    print(f"# bench_devices: {_label(record['context'])}", flush=True)
    with hierax.matmul_precision(args.matmul):
        record["refused"] = refusal()
        if record["refused"]:
            # The peers have no such guard: XLA would abort this process.
            print(f"hierax refuses this configuration:\n  {record['refused']}")
            print("nothing else is run (the peers would abort the process)")
        else:
            refs = references(args)
            for name in args.sections.split(","):
                # Every section compiles afresh (its first calls are compiles).
                jax.clear_caches()
                ctx = context(args)
                print(f"\n## {name}: {_label(ctx)}", flush=True)
                section = Stopwatch()
                result = RUNNERS[name](args, refs)
                result["context"] = ctx
                result["load_after"] = list(os.getloadavg())
                result["seconds"] = section.seconds
                record["sections"][name] = result
                print(f"({result['seconds']:.0f} s)", flush=True)
    record["seconds"] = watch.seconds
    emit(result_rows(record))
    record["load_after"] = list(os.getloadavg())
    print(f"\n{record['seconds']:.0f} s in all; load after {record['load_after']}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as file:
            json.dump(record, file, indent=1, default=float)


if __name__ == "__main__":
    main()
