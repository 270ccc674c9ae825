"""Arithmetic on truncated, normalised Taylor series.

A series of order K is an array whose leading axis holds the coefficients
$f_j = f^{(j)}(t) / j!$, $j = 0, \\ldots, K$. Everything here has a fixed shape for a
given K and traces to a program whose size does not depend on K.
"""

import jax.lax as lax
import jax.numpy as jnp
from jaxtyping import Array, Inexact


def real_dtype(dtype) -> jnp.dtype:
    """The real dtype of the same precision as `dtype`."""
    return jnp.finfo(dtype).dtype


def power_series(x: Array, order: int) -> Array:
    """$x^j / j!$ for $j = 0..K$, as a cumulative product (no factorial is formed,
    so nothing overflows before the true value does)."""
    x = jnp.asarray(x)
    steps = x / jnp.arange(1, order + 1, dtype=real_dtype(jnp.result_type(x, 1.0)))
    return jnp.concatenate([jnp.ones((1,), steps.dtype), jnp.cumprod(steps)])


def scalar_cauchy_product(a: Array, b: Array) -> Array:
    """Coefficients of the product of two scalar series: $c_k = \\sum_m a_m b_{k-m}$.

    One matrix-vector product with the lower-triangular Toeplitz matrix of `b`
    (O(K^2) scalars, cheap: these are scalar series).
    """
    order = a.shape[0] - 1
    k = jnp.arange(order + 1)
    diff = k[:, None] - k[None, :]
    toeplitz = jnp.where(diff >= 0, b[jnp.clip(diff, 0, order)], 0)
    return toeplitz @ a


def factorial_scale(coefficients: Array, power: int = 1) -> Array:
    """Multiply coefficient j by $(j!)^{power}$ (`power` is 1 or -1) along the leading
    axis.

    While $j!$ is finite it is formed exactly as a running product of integers (so
    $X_0$ and $X_1$ are untouched and small orders are exact to rounding); past that
    (j > 170 in float64, j > 34 in float32) it is applied as two half-steps
    $\\exp(\\tfrac12 \\log\\Gamma(j+1))$, so nothing overflows before the true value
    does.
    """
    order = coefficients.shape[0] - 1
    rdtype = real_dtype(coefficients.dtype)
    j = jnp.arange(1, order + 2, dtype=rdtype)  # j + 1
    exact = jnp.cumprod(jnp.concatenate([jnp.ones((1,), rdtype), j[:-1]]))
    finite = jnp.isfinite(exact)
    half = jnp.exp(0.5 * lax.lgamma(j))
    exact = jnp.where(finite, exact, 1)
    half = jnp.where(finite, 1, half)
    if power == -1:
        exact, half = 1 / exact, 1 / half
    shape = (order + 1,) + (1,) * (coefficients.ndim - 1)
    return (
        (coefficients * exact.reshape(shape))
        * half.reshape(shape)
        * half.reshape(shape)
    )


def shift_series(x: Array) -> Array:
    """The series of the derivative: $(j+1) x_{j+1}$, with the last coefficient zero
    (it would need one more order to be known)."""
    order = x.shape[0] - 1
    rdtype = real_dtype(x.dtype)
    scale = jnp.arange(1, order + 1, dtype=rdtype).reshape(
        (order,) + (1,) * (x.ndim - 1)
    )
    return jnp.concatenate([x[1:] * scale, jnp.zeros_like(x[:1])])


def reversed_window(series: Array, j: Array) -> Array:
    """Entry i of the result is `series[j - i]` for i <= j and zero for i > j.

    This lines up the coefficients that meet in the j-th coefficient of a Cauchy
    product with a fixed shape, whatever j is.
    """
    order = series.shape[0] - 1
    i = jnp.arange(order + 1)
    window = jnp.take(series, jnp.clip(j - i, 0, order), axis=0)
    mask = (i <= j).reshape((order + 1,) + (1,) * (series.ndim - 1))
    return jnp.where(mask, window, jnp.zeros_like(window))


def triangular_cauchy_product(
    left: Inexact[Array, "K1 n m"], right: Inexact[Array, "K1 m *rest"]
) -> Array:
    """All coefficients of the product of two matrix series, truncated at order K.

    Coefficient k needs k+1 products. Rows k and K-k together need K+2, so they are
    computed as one batch of K+2 products: about K^2/2 products in all, half of what
    a fixed-width product per row would cost, in O(K n^2) memory.
    """
    order = left.shape[0] - 1
    idx = jnp.arange(order + 2)
    out_shape = (order + 1, left.shape[1]) + right.shape[2:]
    out = jnp.zeros(out_shape, jnp.result_type(left, right))

    def body(p, out):
        k1, k2 = p, order - p
        first = idx <= k1
        m = jnp.clip(jnp.where(first, idx, idx - k1 - 1), 0, order)
        r = jnp.clip(jnp.where(first, k1 - idx, k2 - (idx - k1 - 1)), 0, order)
        spec = "iab,ib->ia" if right.ndim == 2 else "iab,ibc->iac"
        products = jnp.einsum(spec, left[m], right[r])
        # The two segment sums as one small contraction with a 0/1 mask.
        segments = jnp.stack([first, ~first]).astype(products.dtype)
        sums = jnp.tensordot(segments, products, axes=(1, 0))
        # When k1 == k2 both sums are the whole coefficient; writing twice is harmless.
        return out.at[k2].set(sums[1]).at[k1].set(sums[0])

    return lax.fori_loop(0, order // 2 + 1, body, out)


def dagger(x: Array) -> Array:
    """Conjugate transpose of the last two axes."""
    return jnp.conj(jnp.swapaxes(x, -1, -2))


__all__ = [
    "dagger",
    "factorial_scale",
    "power_series",
    "real_dtype",
    "reversed_window",
    "scalar_cauchy_product",
    "shift_series",
    "triangular_cauchy_product",
]
