"""A permutation that sorts rows of 32-bit keys lexicographically, by a bitonic
sorting network run as one loop over its stages: a program of a few dozen
operations whatever the length, where XLA's TPU compiler spends 3-11 s on a
`lax.sort` of 16 thousand to a million entries (`BackendChoices.merge_networks`).

Batcher's bitonic network on $P = 2^p$ entries has $p(p + 1) / 2$ stages. Stage
$(k, j)$ ($k = 2, 4, \\dots, P$; $j = k/2, k/4, \\dots, 1$) compares each entry $i$
with its partner $i \\oplus j$ and keeps the smaller of the pair at the lower index
where $i \\,\\&\\, k = 0$ (an ascending block), the larger where not. The partner
of every entry is one of two rotations of the array by $j$ (a dynamic slice, no
gather), so the stage is a few elementwise operations, and $(k, j)$ are loop values.

The entries' indices are the last key, so no two entries compare equal: the result
is the one permutation that sorts the keys with ties in index order (that of a
stable sort). Padding up to $P$ takes the largest keys and indices past the
entries, so it sorts last. The stages themselves (`network`) also merge two sorted
lists (`_merging`).
"""

import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, UInt32


def _rotated(a: Array, shift: Array) -> Array:
    """`a[(i - shift) mod P]` for each i (`jnp.roll` by a traced shift)."""
    size = a.shape[0]
    doubled = jnp.concatenate([a, a])
    return lax.dynamic_slice_in_dim(doubled, (size - shift) % size, size)


def network(rows: list[Array], keys: int, stages: list[tuple[int, int]]) -> list[Array]:
    """`rows` (of one length P, a power of two) after the compare-exchange
    stages `(k, j)` of a bitonic network (see the module), ordered by their first
    `keys` rows lexicographically; the others go along. Entries whose keys are
    all equal must be interchangeable: of such a pair both places take one."""
    size = rows[0].shape[0]
    ks = jnp.asarray([k for k, _ in stages], jnp.uint32)
    js = jnp.asarray([j for _, j in stages], jnp.uint32)
    index = lax.iota(jnp.uint32, size)

    def stage(s, rows):
        k, j = ks[s], js[s]
        upper = (index & j) != 0
        partner = [
            jnp.where(
                upper,
                _rotated(r, j.astype(jnp.int32)),
                _rotated(r, -j.astype(jnp.int32)),
            )
            for r in rows
        ]
        ascending = (index & k) == 0
        # Keep the smaller of the pair where the entry is the lower one of an
        # ascending block or the upper one of a descending block.
        keep_smaller = upper != ascending
        smaller = lexicographic_less(rows[:keys], partner[:keys])
        own = smaller == keep_smaller
        return [jnp.where(own, r, q) for r, q in zip(rows, partner)]

    return lax.fori_loop(0, len(stages), stage, rows)


def lexicographic_less(a: list[Array], b: list[Array]) -> Array:
    """`a < b` lexicographically, elementwise, the first key most significant."""
    result = jnp.zeros(a[0].shape, bool)
    for x, y in zip(reversed(a), reversed(b)):
        result = (x < y) | ((x == y) & result)
    return result


def network_order(keys: list[UInt32[Array, " m"]]) -> Int[Array, " m"]:
    """The permutation that sorts the rows `(keys[0][i], keys[1][i], ...)`
    lexicographically, ties in index order: `lax.sort((*keys, iota), num_keys=
    len(keys) + 1)`'s, by a bitonic network (see the module)."""
    m = keys[0].shape[0]
    p = max(1, int(m - 1).bit_length())
    size = 1 << p
    top = np.uint32(0xFFFFFFFF)
    padded = [jnp.concatenate([k, jnp.full(size - m, top, k.dtype)]) for k in keys]
    padded.append(lax.iota(jnp.uint32, size))
    # The stages' (k, j), in order.
    stages = [(1 << a, 1 << b) for a in range(1, p + 1) for b in range(a - 1, -1, -1)]
    rows = network(padded, len(padded), stages)
    return rows[-1][:m].astype(jnp.int32)
