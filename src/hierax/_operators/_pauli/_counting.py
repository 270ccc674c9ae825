"""Running counts of flags (`jnp.cumsum` of booleans) by products with a triangular
matrix of ones, where a backend chooses it (`BackendChoices.merge_networks`): XLA's
TPU compiler spends 0.7 s on a cumulative sum of 9216 entries and 4.7 s on one of
147456 (a reduce-window as long as the array), a few such sums a merge.

The flags, in blocks of $B = 128$, times the upper triangular matrix of ones give
the counts within each block; the blocks' totals, counted the same way, give each
block's offset. Every value is an integer below $2^{24}$, so every product and sum
is exact in float32 (the products at `Precision.HIGHEST`: a TPU's default rounds
the operands to bfloat16, whose integers are exact only up to 256).
"""

import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int


_BLOCK = 128
# Past this many entries a count may not be exact in float32.
_EXACT = 1 << 24


def _running_sums(x: Float[Array, " m"]) -> Float[Array, " m"]:
    """The running sums of integers whose total is below 2^24, exactly."""
    m = x.shape[0]
    rows = -(-m // _BLOCK)
    blocks = jnp.concatenate([x, jnp.zeros(rows * _BLOCK - m, x.dtype)])
    ones = jnp.asarray(np.triu(np.ones((_BLOCK, _BLOCK), np.float32)))
    within = jnp.dot(
        blocks.reshape(rows, _BLOCK), ones, precision=lax.Precision.HIGHEST
    )
    if rows > 1:
        totals = within[:, -1]
        within = within + (_running_sums(totals) - totals)[:, None]
    return within.reshape(-1)[:m]


def running_count(flags: Bool[Array, " m"], by_products: bool) -> Int[Array, " m"]:
    """`jnp.cumsum(flags, dtype=jnp.int32)`: by products with a triangular matrix
    (see the module) if `by_products` and the count is exact that way."""
    if not by_products or flags.shape[0] >= _EXACT:
        return jnp.cumsum(flags, dtype=jnp.int32)
    return _running_sums(flags.astype(jnp.float32)).astype(jnp.int32)
