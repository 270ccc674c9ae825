"""Arithmetic on truncated, normalised Taylor series.

A series of order K is an array whose leading axis holds the coefficients
$f_j = f^{(j)}(t) / j!$, $j = 0, \\ldots, K$. Everything here has a fixed shape for a
given K and traces to a program whose size does not depend on K.
"""

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array


def real_dtype(dtype) -> jnp.dtype:
    """The real dtype of the same precision as `dtype`."""
    return jnp.finfo(dtype).dtype


def exact_exp2(e: Array, dtype=None) -> Array:
    """$2^e$ for integer-valued `e`, exactly (`jnp.exp2` is not: off by up to 50
    units in the last place on a CPU), built from the bits of the exponent field:
    two normal powers of two whose product is the result, so that it underflows to a
    subnormal or zero, or overflows to inf, exactly where $2^e$ does. No gradient
    (a power of two carried as a scale). `dtype`: the real result dtype (that of `e`
    by default)."""
    dtype = jnp.dtype(dtype if dtype is not None else e.dtype)
    info = np.finfo(dtype)
    bits = {4: jnp.int32, 8: jnp.int64}[dtype.itemsize]
    low, high = float(info.minexp), float(info.maxexp - 1)
    e = lax.stop_gradient(jnp.asarray(e).astype(dtype))

    def power(x):
        biased = (x - low + 1).astype(bits)
        return lax.bitcast_convert_type(biased << info.nmant, dtype)

    first = jnp.clip(e, low, high)
    second = jnp.clip(e - first, low, high)
    return power(first) * power(second)


def binade(v: Array) -> tuple[Array, Array]:
    """`(p, e)`: p = 2^e <= v < 2p, for real normal `v` > 0 (e as a float), read
    off the exponent field of `v` (three bit operations; `log2` and a power of two
    built from it cost about ten times as many operations). No gradient."""
    v = lax.stop_gradient(v)
    info = np.finfo(v.dtype)
    bits = {4: jnp.int32, 8: jnp.int64}[v.dtype.itemsize]
    field = lax.bitcast_convert_type(v, bits) >> info.nmant
    power = lax.bitcast_convert_type(field << info.nmant, v.dtype)
    return power, (field + (info.minexp - 1)).astype(v.dtype)


# ln 2 split for float32 `exp`'s range reduction (Cody and Waite): the leading part
# has trailing zero bits, so that n * hi is exact for every |n| the range needs.
_LN2_HI, _LN2_LO = 0.693145751953125, 1.428606765330187e-06
# The Taylor degree of e^r for |r| <= ln(2) / 2: r^8 / 8! is below 0.1 ulp.
_EXP_DEGREE = 7


def exp(x: Array) -> Array:
    """$e^x$ to about an ulp on every backend. In float32,
    $x = n \\ln 2 + r$ with $|r| \\le \\ln(2)/2$, $e^r$ by its Taylor polynomial,
    times $2^n$ exactly (`exact_exp2`): only additions and products, which every
    backend rounds correctly. XLA's float32 `exp` was off by up to 3.8e-6
    relative on a TPU v5e (about 30 ulp) and 4.6 ulp on the CPU, and a Gaussian
    pulse's series carried that into a solve's error: on the TPU a Rabi sweep of
    pulse areas up to 4 pi reached no error below 2e-5. Overflows to inf and
    underflows to 0 where $e^x$ does; its derivative is the polynomial's (within
    an ulp of $e^x$). In float64 and complex dtypes, `jnp.exp` (within an ulp on
    the CPU; hierax runs no 64-bit on a TPU): the float64 polynomial (degree 13)
    cost a 256-detuning sweep's step 20% on the CPU, for no digit."""
    x = jnp.asarray(x)
    dtype = x.dtype
    if dtype != jnp.float32:  # float64, complex
        return jnp.exp(x)
    info = np.finfo(dtype)
    # (Past these the result is inf or 0 whatever n is; the clip keeps n in the
    # range where n * hi is exact and 2^n is formed exactly.)
    bound = float(info.maxexp + info.nmant + 2) * math.log(2.0)
    clipped = jnp.clip(x, -bound, bound)
    n = lax.stop_gradient(jnp.round(clipped * (1 / math.log(2.0))))
    r = (clipped - n * _LN2_HI) - n * _LN2_LO
    p = jnp.ones_like(r)
    for k in range(_EXP_DEGREE, 0, -1):
        p = 1 + p * r / k
    # 2^n in two halves: p 2^n is finite (or subnormal) where it should be even
    # where 2^n alone is not (p < 1 near the largest finite value).
    half = jnp.floor(n / 2)
    value = (p * exact_exp2(half, dtype)) * exact_exp2(n - half, dtype)
    return jnp.where(jnp.isnan(x), x, value)


def power_series(x: Array, order: int) -> Array:
    """$x^j / j!$ for $j = 0..K$ (x a scalar), as a cumulative product (no
    factorial is formed, so nothing overflows before the true value does)."""
    return _power_series(jnp.asarray(x), order)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _power_series(x: Array, order: int) -> Array:
    steps = x / jnp.arange(1, order + 1, dtype=real_dtype(jnp.result_type(x, 1.0)))
    return jnp.concatenate([jnp.ones((1,), steps.dtype), jnp.cumprod(steps)])


@_power_series.defjvp
def _power_series_jvp(order: int, primals: tuple, tangents: tuple) -> tuple:
    # d/dx x^j / j! = x^(j-1) / (j-1)!: the series itself, shifted by one. (The
    # derivative of the cumulative product is a log-depth scan of several times
    # its operations: 31 of the 253 kernels of a driven qubit's solve gradient.)
    (x,), (dx,) = primals, tangents
    series = _power_series(x, order)
    shifted = jnp.concatenate([jnp.zeros((1,), series.dtype), series[:-1]])
    return series, shifted * dx.astype(series.dtype)


def two_product(a: Array, b: Array) -> tuple[Array, Array]:
    """`(p, e)` with `p = fl(a * b)` and `a * b = p + e` exactly (Dekker's
    error-free product, by splitting each factor into two halves whose products are
    exact). Used where a product feeds a periodic function at large arguments."""
    p = a * b
    dtype = p.dtype
    bits = jnp.finfo(dtype).nmant + 1
    splitter = jnp.asarray(2.0 ** ((bits + 1) // 2) + 1, dtype)

    def split(x):
        x = jnp.asarray(x, dtype)
        c = splitter * x
        high = c - (c - x)
        return high, x - high

    a_high, a_low = split(a)
    b_high, b_low = split(b)
    e = ((a_high * b_high - p) + a_high * b_low + a_low * b_high) + a_low * b_low
    # Where the split overflows (|x| near the largest float) keep the plain product.
    return p, jnp.where(jnp.isfinite(e), e, jnp.zeros_like(e))


def _times_real(x: Array, factor: Array) -> Array:
    """`x * factor` for a real factor, part by part for complex `x`: a complex product
    would form `inf * 0 = nan` in the other part once one part overflows."""
    if jnp.iscomplexobj(x):
        return lax.complex(x.real * factor, x.imag * factor)
    return x * factor


# Steps in which `times_exp` applies a factor e^E beyond the float range: each
# step's exponent is at most 0.99 of the largest finite exponent, so the factors
# themselves never overflow, and four steps reach every representable result from
# every representable input.
_EXP_STEPS = 4


def times_exp(x: Array, exponent: Array) -> Array:
    """`x * exp(exponent)` (exponent real, broadcast along the leading axis of `x`)
    without forming an overflowing or underflowing factor: a factor in the finite
    range is applied at once (one `exp` and one rounding: within an ulp or so of
    `x * exp(exponent)`), one beyond it in a few equal steps, each clipped to the
    finite range. The product is inf or 0 only where the true value is, exact
    zeros stay zero (never `0 * inf = nan`), complex `x` is scaled part by part
    (never `inf * 0 = nan` in the other part), and the derivative with respect to
    `x` is the factor itself even where `x` is exactly zero."""
    rdtype = real_dtype(x.dtype)
    exponent = jnp.asarray(exponent).astype(rdtype)
    exponent = exponent.reshape(exponent.shape + (1,) * (x.ndim - exponent.ndim))
    limit = 0.99 * math.log(float(np.finfo(rdtype).max))
    # In range, the whole factor and then three exact products by 1: the same
    # single `exp` as equal steps, without their four roundings (3 ulp, not 1).
    inside = jnp.abs(exponent) <= limit
    first = exp(
        jnp.clip(jnp.where(inside, exponent, exponent / _EXP_STEPS), -limit, limit)
    )
    x = _times_real(x, first)
    step = jnp.where(inside, jnp.ones((), rdtype), first)
    for _ in range(_EXP_STEPS - 1):
        x = _times_real(x, step)
    return x


def frobenius(x: Array, axes: tuple[int, ...] | None = None) -> Array:
    """The Frobenius norm of `x` over `axes` (all by default)."""
    return jnp.sqrt(jnp.sum(jnp.abs(x) ** 2, axis=axes))


def lower_toeplitz(c: Array) -> Array:
    """The lower-triangular Toeplitz matrix `T[k, m] = c[k - m]` (zero above the
    diagonal) of a scalar series: `T @ a` is the Cauchy product of `c` and `a`.
    O(K^2) scalars, cheap for scalar series."""
    order = c.shape[0] - 1
    # NumPy: the index and the mask are constants of the program, not computed in it.
    k = np.arange(order + 1)
    diff = k[:, None] - k[None, :]
    return jnp.where(diff >= 0, c[np.clip(diff, 0, order)], 0)


def scalar_cauchy_product(a: Array, b: Array) -> Array:
    """Coefficients of the product of two scalar series: $c_k = \\sum_m a_m b_{k-m}$."""
    return lower_toeplitz(b) @ a


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


class TermSeries(NamedTuple):
    r"""The series of an operator $H(t+s\sigma) = \sum_a f_a(t+s\sigma) H_a +
    D(t+s\sigma)$, kept in parts so that the kernels can use the term structure.

    - `coefficients`: `(A, K+1)`, the Taylor coefficients of each $f_a$.
    - `matrices`: `(A, n, n)`, the constant matrices $H_a$.
    - `dense`: `(K+1, n, n)` or `None`, the series of a part without term structure.
    - `constant`: static flags, one per term, true where $f_a$ is constant by
        structure (its coefficients above order 0 vanish): the kernels merge those
        terms into one matrix. Empty means unknown (every term time-dependent).
    - `sparse`: terms whose matrices are sparse, or `None`: an opaque part with an
        `astype` (`_sparse.SparseTerms`; this layer knows no sparse format). Only
        the kernels that act on states see them
        (`AbstractTimeOperator.sparse_series`); the others get a series in which
        they were made dense (`_sparse.densified`).
    - `column_scales`: `(A, m)`, real, or `None`: a batch of series, one per column
        of the state (a batch of solves stepped together, `hierax.sesolve` under
        `jax.vmap`): term a's series in column b is `coefficients[a]` (or
        `coefficients[a, :, b]` where they are `(A, K+1, m)`) times
        `column_scales[a, b]`. Only the kernels that act on states see them.
    """

    coefficients: Array
    matrices: Array
    dense: Array | None
    constant: tuple[bool, ...] = ()
    sparse: Any = None
    column_scales: Array | None = None

    def constant_flags(self) -> tuple[bool, ...]:
        count = self.coefficients.shape[0]
        return self.constant if len(self.constant) == count else (False,) * count

    @property
    def dtype(self) -> jnp.dtype:
        return result_dtype(self)

    def astype(self, dtype) -> "TermSeries":
        return TermSeries(
            self.coefficients.astype(dtype),
            self.matrices.astype(dtype),
            None if self.dense is None else self.dense.astype(dtype),
            self.constant,
            None if self.sparse is None else self.sparse.astype(dtype),
        )

    def full(self) -> Array:
        """The series of the whole operator, `(K+1, n, n)`, of a series without a
        sparse part (`_sparse.densified` makes one)."""
        if self.sparse is not None:
            raise ValueError("A series with sparse terms: densify it first.")
        dtype = self.dtype
        out = jnp.einsum(
            "ak,anm->knm", self.coefficients.astype(dtype), self.matrices.astype(dtype)
        )
        if self.dense is not None:
            out = out + self.dense.astype(dtype)
        return out


def result_dtype(*parts) -> jnp.dtype:
    """The common dtype of arrays and `TermSeries` (`None` parts and the static
    flags are skipped)."""
    leaves = [
        x
        for x in jax.tree_util.tree_leaves(parts)
        if x is not None and not isinstance(x, bool)
    ]
    return jnp.result_type(*leaves)


__all__ = [
    "TermSeries",
    "exact_exp2",
    "frobenius",
    "lower_toeplitz",
    "power_series",
    "real_dtype",
    "result_dtype",
    "reversed_window",
    "scalar_cauchy_product",
    "times_exp",
    "two_product",
]
