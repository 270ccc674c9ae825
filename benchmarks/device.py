"""The CPU-only rule of the benchmark scripts that force 64-bit mode."""

import sys

import jax


def require_cpu(script: str) -> None:
    """Exit (status 0) with one line unless JAX computes on the CPU: `script` turns
    64-bit mode on for its references, which a TPU cannot compile (XLA aborts the
    process) and which a GPU runs at a fraction of its float32 speed."""
    if jax.default_backend() != "cpu":
        print(
            f"{script} is CPU-only (x64 references); on an accelerator run "
            "bench_devices.py, or set JAX_PLATFORMS=cpu"
        )
        sys.exit(0)
