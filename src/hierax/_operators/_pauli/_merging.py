"""The inner products $(O_k|A) = \\sum_s \\overline{O_k[s]} A[s]$ of each row of a
stack of Pauli sums with one sum $A$, all sorted by string (as `compress` leaves
them), by merging: each row and $A$ merged into one sorted list by a bitonic
merging network (`_sorting.network`), where a string of both stands in two
adjacent places.

A sorted list followed by a reversed one is bitonic, and the last $\\log_2 2Q$
stages of the sorting network ($k = 2Q$: every block ascending) sort it. Each entry
is keyed by (padding flag, x words, z words, list): a padding slot (past a sum's
count) sorts last and matches nothing, and the list (0 for the row, 1 for $A$)
puts a row's string just before the same string of $A$. Only padding slots can
tie, and they carry zeros.

On a TPU this replaces a binary search of every row for each of $A$'s strings
(`compress.lookup`: a gather per halving), whose gathers are slow there (31 rows of
16384 strings: 68 ms a step); the merge is a few elementwise operations over the
rows per stage (`BackendChoices.merge_networks`).
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Inexact, Int, UInt32

from ._sorting import network


def _listed(
    x: UInt32[Array, "m words"],
    z: UInt32[Array, "m words"],
    c: Inexact[Array, " m"],
    count: Int[Array, ""],
    size: int,
    tag: int,
) -> tuple[list[Array], list[Array]]:
    """`(keys, payload)` of one sorted sum padded to `size` entries: padding flag,
    x and z words, the list's tag; the coefficients (complex ones as their real
    and imaginary parts)."""
    m = x.shape[0]
    pad = size - m
    padding = (jnp.arange(size) >= count).astype(jnp.uint32)
    words = [jnp.pad(x[:, w], (0, pad)) for w in range(x.shape[1])]
    words += [jnp.pad(z[:, w], (0, pad)) for w in range(z.shape[1])]
    keys = [padding, *words, jnp.full(size, tag, jnp.uint32)]
    c = jnp.pad(c, (0, pad))
    payload = [jnp.real(c), jnp.imag(c)] if jnp.iscomplexobj(c) else [c]
    return keys, payload


def _merged_inner(
    x: UInt32[Array, "m words"],
    z: UInt32[Array, "m words"],
    c: Inexact[Array, " m"],
    count: Int[Array, ""],
    ax: UInt32[Array, "m words"],
    az: UInt32[Array, "m words"],
    ac: Inexact[Array, " m"],
    a_count: Int[Array, ""],
) -> Inexact[Array, ""]:
    """$(O|A)$ of two sorted sums of one length, by merging (see the module)."""
    size = 1 << max(0, int(x.shape[0] - 1).bit_length())
    keys, payload = _listed(x, z, c, count, size, 0)
    a_keys, a_payload = _listed(ax, az, ac, a_count, size, 1)
    rows = [
        jnp.concatenate([r, a[::-1]])
        for r, a in zip(keys + payload, a_keys + a_payload)
    ]
    stages = [(2 * size, size >> b) for b in range(size.bit_length())]
    rows = network(rows, len(keys), stages)
    keys, payload = rows[: len(keys)], rows[len(keys) :]
    # A row's string followed by the same string of A (list 0, then 1).
    same = (keys[0][:-1] == 0) & (keys[-1][:-1] == 0) & (keys[-1][1:] == 1)
    for k in keys[1:-1]:
        same = same & (k[:-1] == k[1:])
    dtype = jnp.result_type(c.dtype, ac.dtype)
    if len(payload) == 1:
        (r,) = payload
        return jnp.sum(jnp.where(same, r[:-1] * r[1:], 0)).astype(dtype)
    re, im = payload
    # conj(r) a = (r.re a.re + r.im a.im) + i (r.re a.im - r.im a.re)
    real = jnp.where(same, re[:-1] * re[1:] + im[:-1] * im[1:], 0)
    imag = jnp.where(same, re[:-1] * im[1:] - im[:-1] * re[1:], 0)
    return jax.lax.complex(jnp.sum(real), jnp.sum(imag)).astype(dtype)


def merged_overlaps(
    x: UInt32[Array, "rows m words"],
    z: UInt32[Array, "rows m words"],
    c: Inexact[Array, "rows m"],
    count: Int[Array, " rows"],
    ax: UInt32[Array, "m words"],
    az: UInt32[Array, "m words"],
    ac: Inexact[Array, " m"],
    a_count: Int[Array, ""],
) -> Inexact[Array, " rows"]:
    """$(O_k|A)$ for each row $k$ of the stack `(x, z, c, count)` (see the
    module)."""
    inner = jax.vmap(_merged_inner, in_axes=(0, 0, 0, 0, None, None, None, None))
    return inner(x, z, c, count, ax, az, ac, a_count)
