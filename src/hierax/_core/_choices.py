"""The structure choices that depend on the backend a program runs on, each beside
the measurement on that backend that chose it.

A choice here changes how a result is computed (which products, in which layout),
never what it is: the same call on two backends computes the same numbers up to
rounding. One implementation of each recursion serves every backend; a backend
chooses parameters only.

The backend is the one a call with no committed arrays runs on: JAX's default
device (`jax_default_device`, e.g. inside `with jax.default_device(...)`), else
the default backend. What is built from these choices before compiling (a solver's
term) is kept per backend (`_cache.TermCache`), so a program built for one backend
is never reused on another.
"""

from typing import NamedTuple

import jax


class BackendChoices(NamedTuple):
    """`sparse_density`: the largest share of nonzero entries with which a known
    dense matrix of a state's step is applied by its nonzeros (a gather) rather
    than by a dense product; `dense_up_to`: the size n up to which known matrices
    are applied dense whatever their nonzeros. The costs of an order of the
    Lindblad step (`mesolve`), in ns: `diagonal_entry` per entry of its
    superoperators' diagonals (count x n^2 of them, the diagonal layout: the first
    while they take at most `diagonal_cache` bytes in x64, real and imaginary
    parts, the second past it), and per
    n x n product of the structured kernel `product` + `product_entry` n^3
    (`product_entry`: complex products below `REAL_DENSITY_SIZE`, real halves from
    there). `host_checks`: a call from Python returns the code of its failed
    check, read and raised on the host, instead of raising from a host callback
    in the program (`_checks`). `unroll_scalar_series`: a time function's scalar
    recurrence over the orders (a `Gaussian`'s Hermite terms) is unrolled into
    straight-line code instead of a loop. `merge_networks`: the merge of Pauli
    strings sorts them by a sorting network (`_operators._pauli._sorting`) and
    counts by products with a triangular matrix (`_operators._pauli._counting`)
    instead of XLA's sort and cumulative sum, sums equal strings by running sums
    within their runs instead of a segment sum (a scatter-add), and `lanczos`
    finds the strings two sorted sums share by merging them
    (`_operators._pauli._merging`) instead of binary searches (gathers).
    `order_unroll`: the factor by which
    the loops over a Schrodinger step's orders (`_kernels.propagator`) are
    unrolled. `pauli_size_step`: the ratio of one working size of a Pauli
    recursion's step (`lanczos`, `moments`) to the next smaller one (capacity /
    step^k, one compiled branch each; `_operators._pauli._growth`).
    `period_block_bytes`: the bytes of the series that one block of a batch of
    one-period solves keeps (`floquet` under `jax.vmap`: the blocks run one after
    another, each in lockstep; `_periodic._floquet`)."""

    sparse_density: float
    dense_up_to: int
    diagonal_entry: tuple[float, float]  # (in cache, past it)
    diagonal_cache: int
    product: float
    product_entry: tuple[float, float]  # (real halves, complex)
    host_checks: bool
    unroll_scalar_series: bool
    merge_networks: bool
    order_unroll: int
    pauli_size_step: int
    period_block_bytes: int

    def applies_sparse(self, n: int) -> float | None:
        """The share of nonzeros at or below which a known n x n matrix is applied
        by its nonzeros, or `None` where every known matrix is applied dense."""
        return None if n <= self.dense_up_to else self.sparse_density

    def diagonals_pay(self, count: int, products: int, n: int, complex_: bool) -> bool:
        """Whether an order on `count` diagonals of n^2 entries costs no more than
        `products` n x n products."""
        entries = count * n * n
        diagonal = self.diagonal_entry[16 * entries > self.diagonal_cache]
        entry = self.product_entry[complex_]
        return diagonal * entries <= products * (self.product + entry * n**3)


# The CPU.
# - Sparse: a dense product reads all n^2 entries for every order; a sparse one
#   reads the nonzeros with a gather. Measured (`sesolve` of one ket, x64, 2 cores,
#   a constant and a driven term): n = 256 at 1-10% 6.4-2.5x faster sparse, at
#   18-27% 1.6-2.4x; n = 1024 at 1-10% 8.6-3.6x (complex 13-3.2x at 2-19%), at 28%
#   0.6-0.9x; the driven 8-site XXZ chain 23 -> 2.9 ms, 10 sites 253 -> 10 ms.
# - The Lindblad step's layout (n > `VECTORISED_SIZE`): an order costs about
#   count x n^2 ns on diagonals (0.23-0.54 ns an entry of the count x 2n^2 read,
#   the window sums of the time-dependent rows included), and about 1500 + 0.4 n^3
#   ns (complex) or 1500 + 0.2 n^3 ns (real halves) per product of the structured
#   kernel. Measured (x64, one step of order 28, 2 shared cores, load 1-3),
#   structured against diagonals:
#   - the driven Kerr oscillator (3 jump operators, 13 diagonals, 8 products):
#     n = 12 342 / 52 us, 20 1581 / 133, 25 1385 / 223, 32 1232 / 305, 50 5026 /
#     979;
#   - every kind of banded term (`_every_kind` of the tests, 84-87 diagonals, 26-36
#     products): n = 10 2258 / 298 us, 16 3171 / 684, 24 10419 / 2461, 32 35744 /
#     27020, 48 87702 / 40581;
#   - a random Hamiltonian of bandwidth 4 and a drive, 2 jump operators (60
#     diagonals, 6 products): n = 10 251 / 103 us, 24 1057 / 443, 32 1275 / 972,
#     48 3782 / 3977 (the rule: diagonals up to n = 24 and from 48; at 32 it keeps
#     the products, 1.3x slower).
#   The Kerr oscillator's adaptive mesolve at n = 30 (`bench_open_systems.py
#   --quick --n 30`, two runs each) went from 220-268 ms to 26.5-28.9 ms.
#   Past the caches the diagonals cost more: the open XXZ chain (`systems.open_xxz`,
#   6 jumps, x64, mesolve at rtol 1e-8, 377 orders) at n = 64 with 97 diagonals
#   (6.4 MB) 893 us an order (2.25 ns an entry) against 483 us for 16 structured
#   products (337 against 182 ms in all); at n = 32 with 80 diagonals (1.3 MB)
#   0.62 ns an entry, diagonals 17.6 against 25.1 ms. The bound of 2 MiB lies
#   between.
# - Checks: a host callback costs a call nothing measurable (0.040 against 0.039
#   ms), and a read of a failure code would make every call wait for its result
#   (JAX dispatches calls asynchronously): the callbacks stay.
# - A `Gaussian`'s Hermite recurrence unrolled (x64, K = 28, a qubit under a
#   Gaussian pulse, two runs each): one solve 0.135-0.141 -> 0.26-0.34 ms, 256
#   detunings in lockstep 1.41-1.43 -> 1.58-2.18 ms, a first call 0.92-0.98 ->
#   1.18-1.27 s (XLA's CPU runtime runs each scalar operation as a step of its
#   own): the loop stays.
# - The merge of Pauli strings (x32, 147456 candidates of 12 qubits, 2 cores): a
#   bitonic network 154 ms against XLA's sort's 36-40 ms, its compile 0.15 s
#   against 0.03 s; XLA's cumulative sums compile in 0.2 s: XLA's sort and sums
#   stay.
# - The working sizes of a Pauli recursion's step, capacity / 4^k: 30 Lanczos
#   steps of the chaotic Ising chain at capacity 2^16, whose Krylov operators fill
#   it only after ~25 steps, took 35 s at full size alone.
# - `lanczos`' overlaps of its Krylov rows with each new operator by merging
#   (`_operators._pauli._merging`, a network of elementwise stages) rather than
#   binary searches (a gather per halving): at issue 51's size (above, after the
#   merge's rows and running sums, the same code on every backend) later calls
#   1.76 -> 0.71 s, first call 10.5 -> 9.0 s; at 12 qubits (capacity 4096) 0.07 s
#   a call (`results/tpu-v5e/lanczos-merged-*-20261207.json`). On the CPU
#   (12 qubits, this 2-core machine, loaded) merging was 2-3x slower: lookups stay.
# - The blocks of a `floquet` sweep: each order's window sum reads every earlier
#   coefficient of every lane, and a block whose series outgrow the caches waits
#   on memory (1000 drives of a 10-level transmon, order 16: 27 MB of series, read
#   16 times a step). With the lanes in lockstep (x64, 1000 amplitudes of a
#   driven transmon at rtol 1e-10, two runs each), blocks of 2 / 8 / 32 / 128 MiB:
#   n = 4 16.8-17.1 / 19.0-19.1 / 18.5-19.9 / 18.4-18.9 ms, n = 6 39.6-40.0 /
#   36.2-42.3 / 36.5-37.4 / 36.3-36.6 ms, n = 10 134.8-136.5 / 123.8-124.6 /
#   179.6-189.0 / 183.2-184.5 ms.
CPU = BackendChoices(
    sparse_density=0.1,
    dense_up_to=0,
    diagonal_entry=(1.0, 2.25),
    diagonal_cache=2 << 20,
    product=1500.0,
    product_entry=(0.2, 0.4),
    host_checks=False,
    unroll_scalar_series=False,
    merge_networks=False,
    order_unroll=1,
    pauli_size_step=4,
    period_block_bytes=2 << 20,
)

# A TPU (v5e), measured 2026-12-06 (complex64, highest precision).
# - Sparse: a gather is slow there and a dense product nearly free at these sizes.
#   A loop of 1000 dependent products (two float32 columns, 12 nonzeros a row):
#   dense / gather per product n = 256 1.8 / 7.9 us, n = 1024 11.6 / 27 us,
#   n = 4096 100 / 105 us. The driven XXZ chain at rtol 1e-6, sparse -> dense:
#   8 sites 24.5 -> 4.2 ms, 10 sites 78 -> 8.1 ms, the same steps. Past n = 4096
#   a dense product grows as n^2 and the gather as n: the CPU's rule.
# - The Lindblad step's layout: an order on diagonals took about 0.14 ns an entry
#   (55 us for 97 diagonals at n = 64), a structured product about 0.7-1.4 us
#   whatever n up to 64 (a kernel's fixed latency). mesolve at rtol 1e-4,
#   diagonals / structured: the open 6-site XXZ chain (n = 64, 6 jumps,
#   `systems.open_xxz`) 15.0 / 5.5 ms, the Kerr oscillator at n = 30 (3 jumps)
#   14.4 / 28.9 ms; the rule below picks the faster of each.
# - Checks: a program that holds any host callback costs about 1.9 ms more a call,
#   whether it runs or not (a small program 0.54 ms, with one `eqx.error_if` 2.47
#   ms, its flag returned and read on the host instead 1.10 ms), and JAX's
#   persistent compilation cache never finds it (a `lanczos` program compiles in
#   13-16 s in every process; without callbacks 0.26 s from the cache).
# - A `Gaussian`'s Hermite recurrence (K = 16) unrolled: each iteration of a loop
#   is a kernel at the chip's latency, the unrolled recurrence one fusion. In a
#   `jax.jit` with `throw=False` at final error 1e-5, 256 detunings of a qubit
#   under a Gaussian pulse 1.17 -> 0.95 ms and 256 amplitudes 1.27 -> 0.93 ms
#   (1.85x -> 2.34x and 2.78x -> 3.79x diffrax Dopri8 at `throw=False`), first
#   calls the same (`results/tpu-v5e/devices-gaussian-{scan,unrolled}-20261206.json`).
# - The merge of Pauli strings (`lanczos`, 12 qubits, 30 steps, capacity 4096,
#   complex64): XLA compiles a sort of 16384 / 147456 candidates in 2.8-4.2 /
#   13.8-17.0 s (the bitonic network: 0.15 / 0.55-0.57 s; runs 0.6-0.8 / 0.8-0.9
#   ms against 0.9-1.0 / 2.2-2.3 ms) and a cumulative sum of 147456 flags in
#   4.7-5.3 s (the products: part of a merge that compiles in 1.0-1.5 s whatever
#   its size). `lanczos`' first call 26.9 -> 10.1 s, its XLA compile 23.0 -> 6.9 s,
#   later calls 1.64-1.66 s either way (`results/tpu-v5e/lanczos-*-20261207.json`).
# - The loops over a Schrodinger step's orders unrolled (`lax.fori_loop`'s
#   `unroll`; each iteration is a few kernels at the chip's latency). In a
#   `jax.jit` with `throw=False` at rtol 1e-5, complex64, medians of 7, unrolled by
#   1 / 2 (two runs) / 4 / 8: 64 states of the 8-site chain 1.63 / 1.47-1.48 /
#   1.41 / 1.49 ms, the 8-site chain 1.39 / 1.25-1.30 / 1.14 / 1.14 ms, 10 sites
#   5.44 / 5.02-5.14 / 4.26 / 3.86 ms, 256 detunings of a qubit 1.04 / 0.93-0.97 /
#   0.91 / 0.88 ms; first calls the same within 0.1 s but at 8 (+0.1-0.5 s)
#   (`results/tpu-v5e/order-unroll-20261207.json`).
# - The working sizes of a Pauli recursion's step (`lanczos` of Z_0 under the
#   30-site Ising chain, 30 steps, capacity 2^14, complex64): XLA compiles each
#   size's branches (the merge, the overlaps) in 2-4 s. Compiled ahead of time in
#   one process, compile / later call: sizes capacity / 4^k (256 ... 16384) 14.5 /
#   9.73 s, the top two 8.1 / 9.4 s, capacity / 16^k (1024, 16384) 6.8 / 8.9 s,
#   the capacity alone 5.7 / 16.2 s (the later variants partly warm). From Python
#   in a fresh process, capacity / 4^k -> 16^k: the first call 25.98 -> 19.5-19.9
#   s (XLA's compile 10.05 s), later calls 9.71 -> 9.06 s (`results/tpu-v5e/`:
#   `lanczos-variants-30-`, `lanczos-issue-size-{sizes16,parts}-20261207.json`).
# - The blocks of a `floquet` sweep (1024 amplitudes of an 8-level H, complex64,
#   rtol 1e-6, lanes in lockstep, `throw=False`): blocks of 2 MiB (5 blocks, run
#   one after another) 1.97 ms on the device, 16 and 128 MiB (one block) 1.36 ms
#   (a call from Python 2.65 -> 2.06-2.09 ms): the chip's memory holds a sweep's
#   series, and each block's steps are kernels at its latency
#   (`results/tpu-v5e/floquet-blocks-20261207.json`).
TPU = BackendChoices(
    sparse_density=0.1,
    dense_up_to=4096,
    diagonal_entry=(0.14, 0.14),
    diagonal_cache=0,
    product=1000.0,
    product_entry=(0.002, 0.002),
    host_checks=True,
    unroll_scalar_series=True,
    merge_networks=True,
    order_unroll=4,
    pauli_size_step=16,
    period_block_bytes=64 << 20,
)

# GPUs: not measured yet; the CPU's choices.
_BY_PLATFORM = {"cpu": CPU, "tpu": TPU}


def default_platform() -> str:
    """The platform of the device a call with no committed arrays runs on."""
    device = jax.config.jax_default_device  # pyright: ignore[reportAttributeAccessIssue]
    if isinstance(device, str):
        return device
    if device is not None:
        return device.platform
    return jax.default_backend()


def backend_choices(platform: str | None = None) -> BackendChoices:
    """The choices for `platform` (default: `default_platform()`)."""
    return _BY_PLATFORM.get(platform or default_platform(), CPU)
