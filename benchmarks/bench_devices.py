"""`hierax.sesolve` against a hand-written diffrax Dopri8 on JAX's default device
(a GPU where JAX sees one), from small to large states, one state and a batch.

    .venv/bin/python benchmarks/bench_devices.py [--sites 4,6,8,10] [--batch 64]
        [--precision x64|x32] [--out results.json]

Run it once with the GPU visible and once with `JAX_PLATFORMS=cpu` on the same
machine to read the device's ratio; nothing in hierax depends on the device.

- Systems: the driven XXZ chain of `systems.py` at each number of sites (n = 2^L,
  dense matrices), over T = 3.
- hierax: `sesolve` at rtol 1e-8, atol 1e-10 (default order), from Python and
  inside a user's `jax.jit`; diffrax Dopri8 as in `bench_systems.py` (the complex
  state split into real pairs, `PIDController` at the same tolerances).
- Batch: `jax.vmap` of each over `--batch` initial states (random, normalised)
  at the smallest chain.
- Each time is the median of at least 3 calls after a first call, which compiles
  (its time is reported apart). The two methods' final states are compared with
  each other (relative norm of the difference).
"""

import argparse
import json
import os
import sys
import time

import jax


def _precision() -> str:
    for i, arg in enumerate(sys.argv):
        if arg.startswith("--precision"):
            return arg.split("=", 1)[1] if "=" in arg else sys.argv[i + 1]
    return "x64"


jax.config.update("jax_enable_x64", _precision() == "x64")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from bench_systems import diffrax_final, median_time, relative_error  # noqa: E402
from systems import xxz  # noqa: E402
from timing import timed  # noqa: E402

import hierax  # noqa: E402


RTOL, ATOL = 1e-8, 1e-10
SPAN = 3.0


def _hierax(system, rtol, atol):
    hamiltonian = system.hamiltonian()
    times = jnp.asarray(system.times)

    def solve(psi):
        return hierax.sesolve(
            hamiltonian, psi, times, rtol=rtol, atol=atol, max_steps=10**6
        ).final_state

    return solve


def _dopri8(system, rtol, atol):
    """Dopri8 as in `bench_systems.py`, as a function of the initial ket (so that it
    can be mapped over states)."""
    final = diffrax_final(system)
    return lambda psi: final(psi, rtol, atol)


def _first_and_median(fn, *args) -> tuple[float, float, np.ndarray]:
    first, out = timed(fn, *args)
    return first, median_time(fn, *args), out


def bench_size(sites: int, rtol: float, atol: float) -> dict:
    system = xxz(span=SPAN, sites=sites)
    dtype = jnp.complex128 if jax.config.read("jax_enable_x64") else jnp.complex64
    psi = jnp.asarray(system.state, dtype)
    ours = _hierax(system, rtol, atol)
    in_jit = jax.jit(ours)
    theirs = jax.jit(_dopri8(system, rtol, atol))
    row: dict = {"sites": sites, "n": system.size}
    for name, fn in (("hierax", ours), ("hierax_in_jit", in_jit), ("dopri8", theirs)):
        first, median, out = _first_and_median(fn, psi)
        row[name] = {"first": first, "median": median}
        row[name + "_state"] = out
    row["difference"] = relative_error(row.pop("hierax_state"), row["dopri8_state"])
    row["difference_in_jit"] = relative_error(
        row.pop("hierax_in_jit_state"), row.pop("dopri8_state")
    )
    row["ratio"] = row["dopri8"]["median"] / row["hierax"]["median"]
    row["ratio_in_jit"] = row["dopri8"]["median"] / row["hierax_in_jit"]["median"]
    return row


def bench_batch(sites: int, batch: int, rtol: float, atol: float) -> dict:
    system = xxz(span=SPAN, sites=sites)
    dtype = jnp.complex128 if jax.config.read("jax_enable_x64") else jnp.complex64
    rng = np.random.default_rng(0)
    states = rng.normal(size=(batch, system.size)) + 1j * rng.normal(
        size=(batch, system.size)
    )
    states = jnp.asarray(states / np.linalg.norm(states, axis=1, keepdims=True), dtype)
    ours = jax.jit(jax.vmap(_hierax(system, rtol, atol)))
    theirs = jax.jit(jax.vmap(_dopri8(system, rtol, atol)))
    row: dict = {"sites": sites, "n": system.size, "batch": batch}
    outs = {}
    for name, fn in (("hierax", ours), ("dopri8", theirs)):
        first, median, outs[name] = _first_and_median(fn, states)
        row[name] = {"first": first, "median": median}
    row["difference"] = relative_error(outs["hierax"], outs["dopri8"])
    row["ratio"] = row["dopri8"]["median"] / row["hierax"]["median"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description="sesolve against Dopri8 on the default device"
    )
    parser.add_argument("--sites", default="4,6,8,10")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--precision", choices=("x64", "x32"), default="x64")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rtol, atol = (RTOL, ATOL) if args.precision == "x64" else (1e-5, 1e-7)
    device = jax.devices()[0]
    print(
        f"device: {device.device_kind} ({device.platform}), {args.precision}, "
        f"rtol {rtol:g}, atol {atol:g}, load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    print(
        f"{'sites':>5} {'n':>5} | {'hierax':>9} {'in jit':>9} {'Dopri8':>9} | "
        f"{'ratio':>6} {'in jit':>6} | {'first (s)':>9} {'Dopri8':>7} | difference"
    )
    rows = []
    for sites in (int(s) for s in args.sites.split(",")):
        start = time.perf_counter()
        row = bench_size(sites, rtol, atol)
        rows.append(row)
        print(
            f"{sites:5d} {row['n']:5d} | {row['hierax']['median'] * 1e3:7.2f}ms "
            f"{row['hierax_in_jit']['median'] * 1e3:7.2f}ms "
            f"{row['dopri8']['median'] * 1e3:7.2f}ms | {row['ratio']:6.2f} "
            f"{row['ratio_in_jit']:6.2f} | {row['hierax']['first']:9.2f} "
            f"{row['dopri8']['first']:7.2f} | {row['difference']:.1e} "
            f"({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    sites = int(args.sites.split(",")[0])
    batch = bench_batch(sites, args.batch, rtol, atol)
    print(
        f"vmap over {args.batch} states, {sites} sites: hierax "
        f"{batch['hierax']['median'] * 1e3:.2f} ms, Dopri8 "
        f"{batch['dopri8']['median'] * 1e3:.2f} ms, ratio {batch['ratio']:.2f}, "
        f"difference {batch['difference']:.1e}",
        flush=True,
    )
    if args.out:
        record = {
            "device": device.device_kind,
            "platform": device.platform,
            "precision": args.precision,
            "rows": rows,
            "batch": batch,
        }
        with open(args.out, "w", encoding="utf-8") as file:
            json.dump(record, file, indent=1)


if __name__ == "__main__":
    main()
