"""A list of (string, coefficient) pairs merged into a fixed-capacity Pauli sum.

Every operation on Pauli sums produces candidates (a product gives one string per
pair of terms) and ends here: candidates sorted by string, equal strings summed
(running sums within each run of equal strings, `_run_sums`), exact zeros (or
those below a threshold) dropped, and, when more remain than the capacity holds,
the largest kept by magnitude (|c|, never |c|^2, which underflows), their removed
weight sum |c|^2 reported. All of it has fixed shapes (a sort, one gather of the
sorted rows, running counts, one scatter of the kept ones), so it compiles once
per capacity and runs on any backend; the strings of the result are in sorted
order, padding (the identity with coefficient zero) after them.

The sort is most of the cost. XLA's CPU sort of one integer array is ~6x faster
than a sort of several arrays by a comparator (16M entries: 1.0 s against 6 s with
an index carried along), so with x64 the permutation comes from single-key sorts of
`digit << b | position` (b bits of position), least significant digit first: each
pass is a stable sort by its digit, and a string of 2N <= 64 - b bits takes one
pass (two for N = 30 and 2^25 candidates). Without x64 (no 64-bit integers) a
comparator sort over the 32-bit words is used. On a TPU, where XLA compiles a sort
of this size in seconds, a sorting network (`_sorting`) gives the same permutation
and products with a triangular matrix the same running counts (`_counting`).
"""

from functools import partial
from typing import Any

import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Inexact, Int, UInt32

from ..._core import backend_choices
from ._counting import running_count
from ._sorting import lexicographic_less, network_order
from ._strings import WORD


def _limbs(
    x: UInt32[Array, "m words"], z: UInt32[Array, "m words"], n_qubits: int
) -> list[tuple[Array, int]]:
    """The sort key of each string as 32-bit limbs, most significant first, with the
    number of bits each uses."""
    widths = [min(WORD, n_qubits - WORD * w) for w in range(x.shape[1])]
    return [(x[:, w], widths[w]) for w in range(x.shape[1])] + [
        (z[:, w], widths[w]) for w in range(z.shape[1])
    ]


def _x64() -> bool:
    return bool(jax.config.read("jax_enable_x64"))


def sort_order(
    x: UInt32[Array, "m words"],
    z: UInt32[Array, "m words"],
    n_qubits: int,
    network: bool | None = None,
) -> Int[Array, " m"]:
    """A permutation that sorts the strings (x words, then z words), ties in index
    order. `network`: by a sorting network (`_sorting`) instead of XLA's sort;
    default: the backend's choice (`BackendChoices.merge_networks`)."""
    m = x.shape[0]
    limbs = _limbs(x, z, n_qubits)
    if network is None:
        network = backend_choices().merge_networks
    if network:
        return network_order([limb for limb, _ in limbs])
    position_bits = max(1, int(m - 1).bit_length())
    digit_bits = 64 - position_bits
    if not _x64() or digit_bits < WORD:
        keys = [limb for limb, _ in limbs]
        *_, order = lax.sort(
            (*keys, lax.iota(jnp.int32, m)), num_keys=len(keys), is_stable=True
        )
        return order
    # Adjacent limbs joined into digits of at most `digit_bits` bits, least
    # significant digit sorted first.
    digits: list[tuple[Array, int]] = []
    for limb, width in reversed(limbs):
        limb = limb.astype(jnp.uint64)
        if digits and digits[-1][1] + width <= digit_bits:
            low, low_width = digits[-1]
            digits[-1] = ((limb << np.uint64(low_width)) | low, low_width + width)
        else:
            digits.append((limb, width))
    order = lax.iota(jnp.int32, m)
    position = lax.iota(jnp.uint64, m)
    mask = np.uint64((1 << position_bits) - 1)
    for i, (digit, _) in enumerate(digits):
        current = digit if i == 0 else digit[order]
        packed = jnp.sort((current << np.uint64(position_bits)) | position)
        step = (packed & mask).astype(jnp.int32)
        order = step if i == 0 else order[step]
    return order


def _real_view(c: Inexact[Array, " m *series"]) -> Array:
    """`c` as real numbers, `(m, k)` (a complex entry as its real and imaginary
    parts, adjacent)."""
    m = c.shape[0]
    if jnp.iscomplexobj(c):
        c = jnp.stack([jnp.real(c), jnp.imag(c)], axis=-1)
    return c.reshape(m, -1)


def _from_real_view(r: Array, like: Array) -> Array:
    """The inverse of `_real_view` for entries of `like`'s dtype and series."""
    shape = (r.shape[0], *like.shape[1:])
    if jnp.iscomplexobj(like):
        r = r.reshape(*shape, 2)
        return lax.complex(r[..., 0], r[..., 1]).astype(like.dtype)
    return r.reshape(shape)


def _to_words(r: Array) -> UInt32[Array, "m k"]:
    """Real `(m, k)` numbers as their bits, in 32-bit words."""
    words = lax.bitcast_convert_type(r, jnp.uint32)
    return words.reshape(r.shape[0], -1)


def _from_words(words: UInt32[Array, "m k"], dtype) -> Array:
    """The inverse of `_to_words` for real `dtype`."""
    ratio = np.dtype(dtype).itemsize // 4
    if ratio > 1:
        words = words.reshape(words.shape[0], -1, ratio)
    return lax.bitcast_convert_type(words, dtype)


def _segment_sums(values: Array, segment: Int[Array, " m"]) -> Array:
    """Each run's sum (as `_run_sums`), at every entry of the run, by XLA's
    segment sum (a scatter-add) and a gather."""
    m = values.shape[0]
    return jax.ops.segment_sum(values, segment, m, indices_are_sorted=True)[segment]


@jax.custom_jvp
def _run_sums(values: Array, segment: Int[Array, " m"]) -> Array:
    """The sum of `values` (rows) over each run of equal `segment` (which does not
    decrease), at the run's last entry (elsewhere: partial sums, which no caller
    reads). By doubling: at distance d = 1, 2, 4, ... each entry adds the partial
    sum d entries back if that lies in its run, for as long as some run is longer
    than d. A segment sum (XLA's scatter-add) of 1.47M complex64 candidates took
    126 ms on a TPU; a sum of the rows (pairwise, not in sequence) rounds no
    worse. Derivatives (a linear map) go through a segment sum, which JAX can
    transpose, where the loop's length depends on the values."""
    m = values.shape[0]

    def back(a: Array, d: Array, fill) -> Array:  # a[i - d], `fill` for i < d
        padded = jnp.concatenate([jnp.full_like(a, fill), a])
        return lax.dynamic_slice_in_dim(padded, m - d, m)

    def longer(d):
        return (d < m) & jnp.any(back(segment, d, -1) == segment)

    def double(state):
        v, d, _ = state
        same = back(segment, d, -1) == segment
        v = v + jnp.where(same[:, None], back(v, d, 0), 0)
        return v, 2 * d, longer(2 * d)

    one = jnp.ones((), jnp.int32)
    v, _, _ = lax.while_loop(lambda s: s[2], double, (values, one, longer(one)))
    return v


@_run_sums.defjvp
def _run_sums_jvp(primals, tangents):
    values, segment = primals
    return _run_sums(values, segment), _segment_sums(tangents[0], segment)


@jax.custom_jvp
def _sorted_rows(strings: UInt32[Array, "m s"], real: Array, order: Array):
    """`(strings[order], real[order])` as one gather of 32-bit rows (a TPU gathers
    complex entries about ten times slower); derivatives by a gather of `real`."""
    s = strings.shape[1]
    rows = jnp.concatenate([strings, _to_words(real)], axis=1)[order]
    return rows[:, :s], _from_words(rows[:, s:], real.dtype)


@_sorted_rows.defjvp
def _sorted_rows_jvp(primals, tangents) -> tuple[Any, Any]:
    strings, real, order = primals
    out = _sorted_rows(strings, real, order)
    return out, (np.zeros(out[0].shape, jax.dtypes.float0), tangents[1][order])


@partial(jax.custom_jvp, nondiff_argnums=(3,))
def _placed(strings: UInt32[Array, "m s"], real: Array, slot: Array, capacity: int):
    """Row i of `(strings, real)` in slot `slot[i]` of `capacity` zero slots (past
    them: dropped), as one scatter of 32-bit rows; derivatives by a scatter of
    `real`."""
    s = strings.shape[1]
    rows = jnp.concatenate([strings, _to_words(real)], axis=1)
    out = jnp.zeros((capacity, rows.shape[1]), jnp.uint32)
    out = out.at[slot].set(rows, mode="drop")
    return out[:, :s], _from_words(out[:, s:], real.dtype)


@_placed.defjvp
def _placed_jvp(capacity, primals, tangents) -> tuple[Any, Any]:
    strings, real, slot = primals
    out = _placed(strings, real, slot, capacity)
    # Kept rows have slots of their own (the rest fall past the capacity), so
    # an add places them as a set does, and JAX can transpose it.
    t = jnp.zeros((capacity, real.shape[1]), real.dtype)
    t = t.at[slot].add(tangents[1], mode="drop")
    return out, (np.zeros(out[0].shape, jax.dtypes.float0), t)


def _kth_largest(weights: Array, k: int) -> Array:
    """The k-th largest of non-negative `weights` (k >= 1), without a sort: IEEE
    floats of one sign order as their bit patterns, and the answer is the largest
    pattern t with at least k patterns >= t, found bit by bit from the top (one
    count over the weights per bit). A sort of the patterns did the same: on the
    CPU 5.7 against 0.9 ms for 147456 weights, and on a TPU each program holding
    one took 6-10 s to compile."""
    bits = {4: jnp.uint32, 8: jnp.uint64}[weights.dtype.itemsize]
    width = 8 * weights.dtype.itemsize
    patterns = lax.bitcast_convert_type(weights, bits)

    def take_bit(i, answer):
        trial = answer | (jnp.ones((), bits) << (width - 1 - i).astype(bits))
        return jnp.where(jnp.sum(patterns >= trial) >= k, trial, answer)

    answer = lax.fori_loop(0, width, take_bit, jnp.zeros((), bits))
    return lax.bitcast_convert_type(answer, weights.dtype)


def magnitude(c: Inexact[Array, " m *series"]) -> Array:
    """$\\sqrt{\\sum |c|^2}$ per candidate (over a series, where there is one),
    scaled by the largest entry so that it neither underflows nor overflows where
    $|c|^2$ would (a coefficient of 1e-25 squares to zero in float32)."""
    if c.ndim == 1:
        return jnp.abs(c)
    a = jnp.abs(c.reshape(c.shape[0], -1))
    top = jnp.max(a, axis=1)
    scale = jnp.where((top > 0) & jnp.isfinite(top), top, 1)
    rest = jnp.sqrt(jnp.sum((a / scale[:, None]) ** 2, axis=1))
    return jnp.where((top > 0) & jnp.isfinite(top), top * rest, top)


def compress(
    x: UInt32[Array, "m words"],
    z: UInt32[Array, "m words"],
    c: Inexact[Array, " m *series"],
    n_qubits: int,
    capacity: int,
    threshold: float | Array = 0.0,
) -> tuple[Array, Array, Array, Array, Array]:
    """`(x, z, c, count, dropped)`: the candidates merged by string into `capacity`
    slots, sorted by string, exact zeros and those with |c| <= `threshold` removed
    and, past the capacity, the smallest; `dropped` is the weight sum |c|^2 of what
    the capacity removed, per entry of a series (shape `c.shape[1:]`); what the
    threshold removes is not counted: it is asked for.

    A string whose coefficient is nan is kept (ranked first): a nan never vanishes
    into a finite result. A removed weight too small to square in the working
    precision reads the smallest normal number, never zero (zero means exact).
    Candidates from padding slots must come in as exact zeros (`jnp.where`, not a
    product with a masked value: inf * 0 is nan)."""
    m, w = x.shape
    networks = backend_choices().merge_networks
    # The candidates sorted by string; where the backend merges by networks (a
    # TPU), with their coefficients as one gather of 32-bit rows: there a gather
    # or scatter of complex entries costs about ten of such rows (1.47M
    # candidates: a scatter of complex64 119 ms, of rows 8 ms). On the 2-core CPU
    # (x64) separate gathers and scatters were faster: `PauliSum.commutator` of
    # the 30-site Ising chain and 2^14 strings into 2^20 slots 0.19-0.20 s
    # against 0.23-0.24 s.
    real = _real_view(c)
    order = sort_order(x, z, n_qubits, networks)
    strings = jnp.concatenate([x, z], axis=1)
    if networks:
        strings, real = _sorted_rows(strings, real, order)
    else:
        strings, real = strings[order], real[order]
    changed = jnp.any(strings[1:] != strings[:-1], axis=1)
    # Each candidate's run of equal strings (0, 0, 1, 2, 2, ...).
    segment = jnp.concatenate(
        [jnp.zeros(1, jnp.int32), running_count(changed, networks)]
    )
    # The sum of each run lands on its last candidate.
    last = jnp.concatenate([changed, jnp.ones(1, bool)])
    # (On a CPU XLA's segment sum is faster: lanczos at 30 qubits, capacity
    # 2^14, x64, 3.0-3.1 s a call against 3.5-3.8 s by doubling.)
    if networks:
        sums_real = _run_sums(real, segment)
    else:
        sums_real = _segment_sums(real, segment)
    sums = _from_real_view(sums_real, c)
    # Ranked by magnitude (a series' by its norm), nan first.
    size = magnitude(sums)
    size = jnp.where(jnp.isnan(size), jnp.inf, size)
    nonzero = jnp.any((sums != 0).reshape(m, -1), axis=1)
    keep = last & nonzero & ~(size <= threshold)
    n_keep = jnp.sum(keep)
    weights = jnp.real(sums * jnp.conj(sums))
    if m > capacity:
        # Over capacity: keep the `capacity` largest; of sizes equal to the last one
        # kept, the first in string order.
        def largest(keep):
            kth = _kth_largest(jnp.where(keep, size, 0), capacity)
            above = keep & (size > kth)
            tied = keep & (size == kth)
            room = capacity - jnp.sum(above)
            return above | (tied & (running_count(tied, networks) <= room))

        kept = lax.cond(n_keep > capacity, largest, lambda keep: keep, keep)
        removed = keep & ~kept
        mask = removed.reshape((m,) + (1,) * (c.ndim - 1))
        dropped = jnp.sum(jnp.where(mask, weights, 0), axis=0)
        lost = jnp.any(mask & (sums != 0), axis=0)
        tiny = jnp.finfo(weights.dtype).tiny
        dropped = jnp.where(lost & (dropped == 0), tiny, dropped)
        keep = kept
    else:
        dropped = jnp.zeros(c.shape[1:], weights.dtype)
    slot = jnp.where(keep, running_count(keep, networks) - 1, capacity)
    if networks:
        out, out_c = _placed(strings, sums_real, slot, capacity)
    else:
        out = jnp.zeros((capacity, 2 * w), x.dtype).at[slot].set(strings, mode="drop")
        out_c = jnp.zeros((capacity, sums_real.shape[1]), sums_real.dtype)
        out_c = out_c.at[slot].set(sums_real, mode="drop")
    out_c = _from_real_view(out_c, c)
    count = jnp.minimum(jnp.sum(keep), capacity).astype(jnp.int32)
    return out[:, :w], out[:, w : 2 * w], out_c, count, dropped


def lookup(
    x: UInt32[Array, "m words"],
    z: UInt32[Array, "m words"],
    c: Inexact[Array, " m"],
    count: Int[Array, ""],
    qx: UInt32[Array, "q words"],
    qz: UInt32[Array, "q words"],
) -> Inexact[Array, " q"]:
    """The coefficients of the query strings in a merged sum (its first `count`
    strings sorted, as `compress` leaves them; zero where absent): a binary search
    over the words, most significant first, in ceil(log2(m + 1)) gathers, each of
    a string's words together (one gather of rows, not one per word)."""
    keys = jnp.concatenate([x, z], axis=1)
    query = jnp.concatenate([qx, qz], axis=1)
    words = keys.shape[1]

    def less(i):  # keys[i] < query, lexicographically
        row = keys[i]
        return lexicographic_less(
            [row[:, w] for w in range(words)], [query[:, w] for w in range(words)]
        )

    def halve(_, bounds):
        lo, hi = bounds
        mid = (lo + hi) // 2
        below = less(jnp.minimum(mid, x.shape[0] - 1)) & (lo < hi)
        return jnp.where(below, mid + 1, lo), jnp.where(below | (lo >= hi), hi, mid)

    q = qx.shape[0]
    lo = jnp.zeros(q, jnp.int32)
    hi = jnp.broadcast_to(count.astype(jnp.int32), (q,))
    lo, _ = lax.fori_loop(0, int(x.shape[0]).bit_length(), halve, (lo, hi))
    i = jnp.minimum(lo, x.shape[0] - 1)
    found = (lo < count) & jnp.all(keys[i] == query, axis=1)
    return jnp.where(found, c[i], 0)
