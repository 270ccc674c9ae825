"""The system whose memory `bench_hierarchies.py` measures, and the resident-set
measurement itself, which runs as `python benchmarks/memory.py N ORDER` in a
fresh process so that nothing else the benchmark allocated is counted."""

import gc
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import hierax


def random_hermitian(rng: np.random.Generator, n: int) -> np.ndarray:
    """A random complex Hermitian `n x n` matrix (Gaussian entries)."""
    a = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
    return (a + a.conj().T) / 2


def two_term_hierarchy(n: int, order: int) -> hierax.HeisenbergHierarchy:
    """The hierarchy of $H(t) = \\cos(1.3t) A + \\sin(0.7t) B$ with observable $C$,
    all three random Hermitian `n x n` (seed 0), in the current complex dtype."""
    rng = np.random.default_rng(0)
    dtype = jnp.result_type(complex)
    a, b, c = (jnp.asarray(random_hermitian(rng, n), dtype) for _ in range(3))
    return hierax.HeisenbergHierarchy(
        hierax.Cos(1.3) * a + hierax.Sin(0.7) * b, c, order
    )


def proc_status(field: str) -> int:
    """A field of /proc/self/status in bytes (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


def resident_set_growth(n: int, order: int) -> dict[str, int]:
    """Resident-set size before one compiled call of the two-term hierarchy, its peak
    during the call, and the growth between them, in bytes."""
    hierarchy = two_term_hierarchy(n, order)
    t = jnp.asarray(1.0)
    compiled = jax.jit(lambda h, s: h(s)).lower(hierarchy, t).compile()
    gc.collect()
    # Writing 5 resets the peak (VmHWM) to the current resident set (Linux >= 4.0),
    # so the peak below belongs to the call alone, not to compilation.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = proc_status("VmRSS")
    compiled(hierarchy, t).block_until_ready()
    peak = proc_status("VmHWM")
    return {"rss_before": before, "peak": peak, "growth": peak - before}


if __name__ == "__main__":
    jax.config.update("jax_enable_x64", True)
    from device import require_cpu

    require_cpu("memory.py")
    print(json.dumps(resident_set_growth(int(sys.argv[1]), int(sys.argv[2]))))
