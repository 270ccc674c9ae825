"""Batching with `jax.vmap` and sharding across devices with `jax.sharding`.

A hierarchy is an Equinox module whose parameters (frequencies, amplitudes) and
time are array leaves, so a batch of (time, parameter set) pairs is one `jax.vmap`
over a function that builds the hierarchy and calls it. Here: 10^5 triples
(t, omega, delta) for

    H(t) = cos(omega t) sigma_y + delta sigma_z,   X_0 = sigma_x,   K = 9,

checked against a plain Python loop on a few entries, then the same batch is
sharded along its leading axis over all devices with a `Mesh`, a `NamedSharding`
and a `PartitionSpec`: `jax.jit` runs each device's slice on that device.

On a CPU-only machine, ask XLA for several host devices to see the sharding:

    XLA_FLAGS=--xla_force_host_platform_device_count=4 \
        python examples/batch_and_shard.py

or pass `--host-devices 4` (which sets that flag before JAX starts). `--fast` uses
10^3 entries.
"""

import argparse
import os
import sys
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="10^3 entries, for tests")
    parser.add_argument("--size", type=int, default=None, help="batch size")
    parser.add_argument(
        "--host-devices",
        type=int,
        default=None,
        help="force this many CPU devices (sets XLA_FLAGS before importing JAX)",
    )
    return parser.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.host_devices:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={ARGS.host_devices}"
    )

import jax  # noqa: E402


jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import hierax  # noqa: E402


sx = jnp.array([[0, 1], [1, 0]], dtype=complex)
sy = jnp.array([[0, -1j], [1j, 0]], dtype=complex)
sz = jnp.array([[1, 0], [0, -1]], dtype=complex)
ORDER = 9


def levels(t, omega, delta):
    """X_0..X_K at one time for one parameter set, shape `(ORDER + 1, 2, 2)`."""
    hamiltonian = hierax.Cos(omega) * sy + delta * sz
    return hierax.HeisenbergHierarchy(hamiltonian, sx, order=ORDER)(t)


batched = jax.jit(jax.vmap(levels))


def timed(fn, *args):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - start


def main(args):
    size = args.size or (1_000 if args.fast else 100_000)
    devices = jax.devices()
    size -= size % len(devices)  # the sharded axis splits evenly
    key_t, key_w, key_d = jax.random.split(jax.random.key(0), 3)
    ts = jax.random.uniform(key_t, (size,), minval=0.0, maxval=2.0)
    omegas = jax.random.uniform(key_w, (size,), minval=0.5, maxval=2.0)
    deltas = jax.random.uniform(key_d, (size,), minval=-1.0, maxval=1.0)
    print(
        f"{size} (t, omega, delta) entries, K = {ORDER}, "
        f"{len(devices)} device(s): {devices[0].platform}"
    )

    out, seconds = timed(batched, ts, omegas, deltas)
    print(f"vmap: output {out.shape}, compile + run {seconds:.2f} s")
    _, seconds = timed(batched, ts + 0.1, omegas, deltas)
    print(
        f"vmap: again with new times, {seconds:.3f} s "
        f"({1e6 * seconds / size:.2f} us per entry)"
    )

    checked = [0, 1, size // 2, size - 1]
    loop = jnp.stack([levels(ts[i], omegas[i], deltas[i]) for i in checked])
    # Levels grow like k! omega^k: compare relative to the largest entry.
    scale = float(jnp.max(jnp.abs(loop)))
    loop_error = float(jnp.max(jnp.abs(loop - out[jnp.array(checked)]))) / scale
    print(
        f"Python loop on entries {checked}: max |loop - vmap| / max |loop| = "
        f"{loop_error:.1e}"
    )

    mesh = Mesh(np.array(devices), axis_names=("batch",))
    sharding = NamedSharding(mesh, PartitionSpec("batch"))
    ts_s, omegas_s, deltas_s = jax.device_put((ts, omegas, deltas), sharding)
    sharded, seconds = timed(batched, ts_s, omegas_s, deltas_s)
    print(f"sharded over mesh {dict(mesh.shape)}: compile + run {seconds:.2f} s")
    _, seconds = timed(batched, ts_s, omegas_s, deltas_s)
    print(f"sharded: again, {seconds:.3f} s")
    shards = sharded.addressable_shards
    print(
        f"output sharding: {sharded.sharding.spec}, {len(shards)} shard(s) of "
        f"shape {shards[0].data.shape} on devices "
        f"{sorted(s.device.id for s in shards)}"
    )
    shard_error = float(jnp.max(jnp.abs(sharded - out) / (1 + jnp.abs(out))))
    print(f"max |sharded - vmap| / (1 + |vmap|) = {shard_error:.1e}")

    ok = loop_error < 1e-12 and shard_error < 1e-12 and len(shards) == len(devices)
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(ARGS))
