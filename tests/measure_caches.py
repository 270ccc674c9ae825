"""What each process-global cache saves on the eager call it serves.

    .venv/bin/python tests/measure_caches.py [--calls 300] [--only NAME,...]

A white-box measurement beside `test_caches.py` (it switches the library's caches
off, which no public call can, so it lives with the tests rather than with the
benchmarks, which use the public API only; pytest does not collect it).

Every cache of `hierax._core._cache` (the registry) in turn: the calls it serves
run from Python with the cache as it is and with it disabled (every look-up a miss,
nothing kept), taking turns in one process, so that the machine's load moves both
alike (x64; a warm-up compiles both). Printed: the medians with and without, the
saving, and the saving as a share of the call without the cache; the load before
and after. The registry's comments quote these numbers.
"""

import argparse
import os
import statistics
import time
import warnings

import jax


jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import hierax  # noqa: E402
from hierax._core import _cache  # noqa: E402


warnings.filterwarnings("ignore", message="Complex dtype support")


def _off_patches(cache):
    """Attributes that make `cache` miss every look-up and keep nothing."""
    if isinstance(cache, _cache.TermCache):
        build = lambda ops, b: b(tuple(_cache.by_value(x) for x in ops))  # noqa: E731
        return [(cache, "get", build)]
    if type(cache).__name__.endswith("ArraysSeen"):
        return [(cache, "get", lambda key: False), (cache, "put", lambda key: None)]
    if isinstance(cache, _cache.KeyedCache):
        return [(cache, "get", lambda key: None), (cache, "put", lambda k, v: v)]
    return [(cache, "get", lambda obj: None), (cache, "put", lambda obj, v: None)]


class _Off:
    def __init__(self, patches):
        self.patches = patches

    def __enter__(self):
        self.saved = [(o, n, o.__dict__.get(n)) for o, n, _ in self.patches]
        for o, n, r in self.patches:
            setattr(o, n, r)

    def __exit__(self, *exc):
        for o, n, v in self.saved:
            if v is None:
                delattr(o, n)
            else:
                setattr(o, n, v)


def _calls():
    sz, sx = np.diag([1.0, -1.0]), np.array([[0.0, 1.0], [1.0, 0.0]])
    sy = np.array([[0, -1j], [1j, 0]])
    # bench_overhead.py's small solves.
    qubit = 0.5 * jnp.asarray(sz) + hierax.Cos(1.0) * (0.2 * jnp.asarray(sx))
    psi, times = jnp.array([1.0, 0.0j]), jnp.array([0.0, 0.01])
    n = 4
    a = jnp.asarray(np.diag(np.sqrt(np.arange(1, n)), 1).astype(complex))
    oscillator = 2 * np.pi * 0.2 * (a.T @ a) + hierax.Cos(1.3) * (0.1 * (a + a.T))
    jumps = [np.sqrt(0.05) * a, np.sqrt(0.02) * (a.T @ a)]
    numpy_jumps = [np.asarray(j) for j in jumps]
    rho = jnp.zeros((n, n), complex).at[1, 1].set(1)
    seed = hierax.HeisenbergHierarchy(hierax.Cos() * sy, sx, 9)
    cos = hierax.Cos(1.0)
    adjoint = diffrax.DirectAdjoint()
    stacked = jnp.stack(jumps)
    # Hermitian only as a whole (complex functions): checked at a few times.
    sp = np.array([[0.0, 1.0], [0.0, 0.0]])
    drive = 0.5 * sz + hierax.Exp(2j) * (0.3 * sp) + hierax.Exp(-2j) * (0.3 * sp.T)
    return {
        "sesolve": lambda: hierax.sesolve(qubit, psi, times).final_state,
        "mesolve": lambda: hierax.mesolve(oscillator, jumps, rho, times).final_state,
        "hierarchy": lambda: seed(1.0),
        "cos": lambda: cos(0.3),
        "sesolve rebuilt": lambda: (
            hierax.sesolve(
                0.5 * sz + hierax.Cos(1.0) * (0.2 * sx), psi, times
            ).final_state
        ),
        "sesolve numpy H": lambda: (
            hierax.sesolve(0.5 * sz + 0.2 * sx, psi, times).final_state
        ),
        "mesolve numpy L": lambda: (
            hierax.mesolve(oscillator, numpy_jumps, rho, times).final_state
        ),
        "sesolve adjoint": lambda: (
            hierax.sesolve(qubit, psi, times, adjoint=adjoint).final_state
        ),
        "mesolve stacked": lambda: (
            hierax.mesolve(oscillator, stacked, rho, times).final_state
        ),
        "floquet": lambda: hierax.floquet(drive, 2 * np.pi / 2.0).quasienergies,
    }


SERVES = {
    "FLATTENED": ["sesolve", "mesolve", "hierarchy", "cos"],
    "MODULE_SIGNATURES": ["sesolve", "mesolve", "hierarchy", "cos"],
    "PLACED_CONSTANTS": ["sesolve rebuilt"],
    "COMPLEX_DTYPES": ["sesolve", "mesolve"],
    "FLOAT_DTYPES": ["sesolve", "mesolve"],
    "BACKENDS_PRESENT": ["sesolve", "hierarchy"],
    "NUMPY_BY_VALUE": ["sesolve numpy H", "mesolve numpy L"],
    "SESOLVE_TERMS": ["sesolve"],
    "MESOLVE_TERMS": ["mesolve"],
    "MESOLVE_STACKED_TERMS": ["mesolve stacked"],
    "OPTIONS_BUILT": ["sesolve", "mesolve"],
    "GENERATOR_NORMS": ["sesolve", "mesolve"],
    "VERIFIED_PERIODS": ["floquet"],
    # Without it every call compiles (seconds): measured by hand, not taking turns.
    "PERIOD_SOLVERS": [],
}


def alternate(fn, off, calls):
    times = {True: [], False: []}
    for _ in range(3):
        jax.block_until_ready(fn())
        with off:
            jax.block_until_ready(fn())
    for k in range(calls):
        for disabled in (k % 2 == 0, k % 2 != 0):
            if disabled:
                with off:
                    start = time.perf_counter()
                    jax.block_until_ready(fn())
                    times[True].append(time.perf_counter() - start)
            else:
                start = time.perf_counter()
                jax.block_until_ready(fn())
                times[False].append(time.perf_counter() - start)
    return statistics.median(times[False]), statistics.median(times[True])


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    assert set(SERVES) == set(_cache.CACHES), set(SERVES) ^ set(_cache.CACHES)
    print(f"load before: {os.getloadavg()}", flush=True)
    calls = _calls()
    for name, served in SERVES.items():
        if only and name not in only:
            continue
        cache = _cache.CACHES[name]
        off = _Off(_off_patches(cache))
        for call in served:
            slow = call == "floquet"
            count = args.calls // 3 if slow else args.calls
            with_, without = alternate(calls[call], off, count)
            print(
                f"{name:22s} {call:16s} with {with_ * 1e6:8.1f} us, without "
                f"{without * 1e6:8.1f} us: saves {(without - with_) * 1e6:7.1f} us "
                f"({(without - with_) / without:6.1%})",
                flush=True,
            )
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
