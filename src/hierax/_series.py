"""Arithmetic on truncated, normalised Taylor series.

A series of order K is an array whose leading axis holds the coefficients
$f_j = f^{(j)}(t) / j!$, $j = 0, \\ldots, K$. Everything here has a fixed shape for a
given K and traces to a program whose size does not depend on K.
"""

import math
from typing import NamedTuple

import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
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


# Steps in which `times_exp` applies a factor e^E: each step's exponent is at most
# 0.99 of the largest finite exponent, so the factors themselves never overflow, and
# four steps reach every representable result from every representable input.
_EXP_STEPS = 4


def times_exp(x: Array, exponent: Array) -> Array:
    """`x * exp(exponent)` (exponent real, broadcast along the leading axis of `x`)
    without forming an overflowing or underflowing factor: applied in a few equal
    steps, each clipped to the finite range. The product is inf or 0 only where the
    true value is, exact zeros stay zero (never `0 * inf = nan`), and no mask is
    used, so the derivative with respect to `x` is the factor itself even where `x`
    is exactly zero."""
    rdtype = real_dtype(x.dtype)
    exponent = jnp.asarray(exponent).astype(rdtype)
    exponent = exponent.reshape(exponent.shape + (1,) * (x.ndim - exponent.ndim))
    limit = 0.99 * math.log(float(np.finfo(rdtype).max))
    step = jnp.exp(jnp.clip(exponent / _EXP_STEPS, -limit, limit))
    for _ in range(_EXP_STEPS):
        x = _times_real(x, step)
    return x


def times_powers(series: Array, scale: Array | None) -> Array:
    """`series[j] * scale**j` (the series of $s \\mapsto f(t + \\text{scale}\\,s)$
    from that of $f$); `None` means 1. The power is formed only where the
    coefficient is non-zero, so zero coefficients stay zero even where it overflows.
    """
    if scale is None:
        return series
    j = jnp.arange(series.shape[0]).reshape((-1,) + (1,) * (series.ndim - 1))
    rdtype = real_dtype(jnp.result_type(series, scale))
    powers = jnp.exp(j.astype(rdtype) * jnp.log(jnp.abs(scale)).astype(rdtype))
    return jnp.where(series == 0, 0, series * powers)


def unscale_series(
    series: Array, scale: Array, max_scale: float, factorial: bool = False
) -> Array:
    """Row k times $\\text{scale}^{-k}$ (and times $k!$ with `factorial`), for series
    carried in a rescaled time.

    The factor is applied as a fixed number R of equal steps
    $\\exp\\big((\\log k! - k \\log s) / R\\big)$, R static (from K, the dtype and the
    largest allowed scale), so nothing overflows or underflows before the true value
    does, and exact zeros stay zero. The price is the rounding of the exponent:
    about $\\epsilon \\cdot |\\log k! - k \\log s|$ relative.
    """
    order = series.shape[0] - 1
    rdtype = real_dtype(series.dtype)
    log_max = math.log(float(np.finfo(rdtype).max))
    j = np.arange(1, order + 1, dtype=np.float64)
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(j))])
    bound = order * math.log(max_scale) + (log_factorial[-1] if factorial else 0.0)
    repeats = max(1, math.ceil(bound / (0.5 * log_max)))
    k = jnp.arange(order + 1, dtype=rdtype)
    exponent = -k * jnp.log(scale).astype(rdtype)
    if factorial:
        exponent = exponent + jnp.asarray(log_factorial, rdtype)
    step = jnp.exp(exponent / repeats).reshape((-1,) + (1,) * (series.ndim - 1))
    return lax.fori_loop(0, repeats, lambda _, x: _times_real(x, step), series)


def lower_toeplitz(c: Array) -> Array:
    """The lower-triangular Toeplitz matrix `T[k, m] = c[k - m]` (zero above the
    diagonal) of a scalar series: `T @ a` is the Cauchy product of `c` and `a`.
    O(K^2) scalars, cheap for scalar series."""
    order = c.shape[0] - 1
    k = jnp.arange(order + 1)
    diff = k[:, None] - k[None, :]
    return jnp.where(diff >= 0, c[jnp.clip(diff, 0, order)], 0)


def scalar_cauchy_product(a: Array, b: Array) -> Array:
    """Coefficients of the product of two scalar series: $c_k = \\sum_m a_m b_{k-m}$."""
    return lower_toeplitz(b) @ a


class FactorialFactors(NamedTuple):
    """$(j!)^{power}$ = `exact[j] * part[j] ** repeats`, applied by `apply`.

    While $j!$ is finite it is formed exactly as a running product of integers (so
    small orders are exact to rounding) and `part` is 1. Past that (j > 170 in
    float64, j > 34 in float32) `exact` is 1 and `part` is
    $\\exp(\\log\\Gamma(j+1) / \\text{repeats})$, with `repeats` (static, from K and
    the dtype) large enough that each step fits: multiplying step by step,
    nothing overflows or underflows before the true value does, and exact zeros stay
    zero.
    """

    exact: Array
    part: Array
    repeats: int

    def apply(self, x: Array, j: Array | None = None) -> Array:
        """`x` times $(j!)^{power}$: row j of `x` if `j` is None, else all of `x`."""
        if j is None:
            shape = (x.shape[0],) + (1,) * (x.ndim - 1)
            exact, part = self.exact.reshape(shape), self.part.reshape(shape)
        else:
            exact, part = self.exact[j], self.part[j]
        x = _times_real(x, exact)
        if self.repeats <= 4:
            for _ in range(self.repeats):
                x = _times_real(x, part)
            return x
        return lax.fori_loop(0, self.repeats, lambda _, y: _times_real(y, part), x)


def factorial_factors(order: int, dtype, power: int = 1) -> FactorialFactors:
    """The factors of $(j!)^{power}$, $j = 0..K$, for `power` 1 or -1.

    K and the dtype are static, so the factors are constants computed here once, in
    float64 from exact integers: nothing is added to the traced program but two
    constant arrays.
    """
    rdtype = real_dtype(dtype)
    largest = float(np.finfo(rdtype).max)
    log_max = math.log(largest)
    repeats = max(2, math.ceil(math.lgamma(order + 1) / (0.9 * log_max)))
    j = np.arange(1, order + 1, dtype=np.float64)
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(j))])
    finite = log_factorial < log_max - 1
    with np.errstate(over="ignore"):
        running = np.concatenate([[1.0], np.cumprod(j)])  # exact while < 2^53
    exact = np.where(finite, running, 1.0)
    part = np.where(finite, 1.0, np.exp(log_factorial / repeats))
    if power == -1:
        exact, part = 1 / exact, 1 / part
    return FactorialFactors(
        jnp.asarray(exact, rdtype), jnp.asarray(part, rdtype), repeats
    )


def factorial_scale(coefficients: Array, power: int = 1) -> Array:
    """Multiply coefficient j by $(j!)^{power}$ (`power` is 1 or -1) along the leading
    axis, without overflow before the true value (see `FactorialFactors`)."""
    order = coefficients.shape[0] - 1
    return factorial_factors(order, coefficients.dtype, power).apply(coefficients)


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


# Above this many elements in one batch of K+2 products, the products are accumulated
# one at a time instead, so that temporaries stay O(n^2) rather than O(K n^2).
_BATCH_ELEMENTS = 2**16


def triangular_cauchy_product(
    left: Inexact[Array, "K1 n n"],
    right: Inexact[Array, "K1 n n"],
    left_transposed: bool = False,
    factorial: bool = False,
) -> Array:
    """All coefficients of the product of two matrix series, truncated at order K:
    $c_k = \\sum_{m \\le k} a_m b_{k-m}$, written over the inputs' own buffers.

    Coefficient k needs k+1 products. Rows k and K-k together need K+2, so each
    iteration p computes rows p and K-p from K+2 products: about K^2/2 products in
    all, half of what a fixed-width product per row would cost. Small matrices run
    the K+2 products as one batch; large ones accumulate them one at a time.

    Memory: after iteration p no later one reads $a_{K-p}$ or $b_{K-p}$, so row K-p
    is stored in slot K-p of `right` and row p in slot K-p of `left`; a last pass
    moves rows 0..K/2 into `right` (and applies the factorials), and `right` becomes
    the result. The only O(K n^2)
    arrays are the two inputs (callers hand over series they no longer need).

    With `left_transposed`, `left` holds $a_m^T$ (saves a transpose of the series).
    With `factorial`, row k is multiplied by $k!$ as it is written (derivatives
    instead of normalised coefficients).
    """
    order = left.shape[0] - 1
    idx = jnp.arange(order + 2)
    dtype = jnp.result_type(left, right)
    left, right = left.astype(dtype), right.astype(dtype)
    a_spec = "ba" if left_transposed else "ab"
    large = (order + 2) * left[0].size > _BATCH_ELEMENTS
    factors = factorial_factors(order, dtype) if factorial else None

    def indices(p):
        k1, k2 = p, order - p
        first = idx <= k1
        m = jnp.clip(jnp.where(first, idx, idx - k1 - 1), 0, order)
        r = jnp.clip(jnp.where(first, k1 - idx, k2 - (idx - k1 - 1)), 0, order)
        return k1, k2, first, m, r

    def batched_sums(left, right, p):
        k1, k2, first, m, r = indices(p)
        products = jnp.einsum(f"i{a_spec},ibc->iac", left[m], right[r])
        # The two segment sums as one small contraction with a 0/1 mask.
        segments = jnp.stack([first, ~first]).astype(dtype)
        sums = jnp.tensordot(segments, products, axes=(1, 0))
        return sums[0], sums[1]

    def sequential_sums(left, right, p):
        k1, k2, first, m, r = indices(p)

        def add(i, sums):
            product = jnp.einsum(f"{a_spec},bc->ac", left[m[i]], right[r[i]])
            is_first = first[i]
            return (
                sums[0] + jnp.where(is_first, product, 0),
                sums[1] + jnp.where(is_first, 0, product),
            )

        zero = jnp.zeros(left.shape[1:], dtype)
        return lax.fori_loop(0, order + 2, add, (zero, zero))

    sums = sequential_sums if large else batched_sums

    def body(p, buffers):
        left, right = buffers
        s1, s2 = sums(left, right, p)
        # When k1 == k2 both sums are the whole coefficient; storing twice is fine.
        return left.at[order - p].set(s1), right.at[order - p].set(s2)

    left, right = lax.fori_loop(0, order // 2 + 1, body, (left, right))

    def gather(k, out):
        row = jnp.where(k <= order // 2, left[order - k], out[k])
        return out.at[k].set(row if factors is None else factors.apply(row, k))

    return lax.fori_loop(0, order + 1, gather, right)


class TermSeries(NamedTuple):
    r"""The series of an operator $H(t+s\sigma) = \sum_a f_a(t+s\sigma) H_a +
    D(t+s\sigma)$, kept in parts so that the kernels can use the term structure.

    - `coefficients`: `(A, K+1)`, the Taylor coefficients of each $f_a$.
    - `matrices`: `(A, n, n)`, the constant matrices $H_a$.
    - `dense`: `(K+1, n, n)` or `None`, the series of a part without term structure.
    - `constant`: static flags, one per term, true where $f_a$ is constant by
        structure (its coefficients above order 0 vanish): the kernels merge those
        terms into one matrix. Empty means unknown (every term time-dependent).
    """

    coefficients: Array
    matrices: Array
    dense: Array | None
    constant: tuple[bool, ...] = ()

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
        )

    def full(self) -> Array:
        """The series of the whole operator, `(K+1, n, n)`."""
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
    "result_dtype",
    "times_exp",
    "two_product",
    "FactorialFactors",
    "factorial_factors",
    "factorial_scale",
    "lower_toeplitz",
    "power_series",
    "real_dtype",
    "reversed_window",
    "scalar_cauchy_product",
    "times_powers",
    "unscale_series",
    "triangular_cauchy_product",
]
