"""Fixed-shape kernels on coefficient arrays: Cauchy products and the classical
Taylor recurrences.

Every array here has a leading axis of length $K+1$ holding normalised coefficients.
Each kernel is one `lax.fori_loop` over the coefficient index whose body has the same
shape for every index (a masked, reversed window of a series stands in for the
variable-length sums), so the traced program does not depend on $K$, and memory stays
$O(K \\cdot \\text{size})$.

The recurrences follow Griewank & Walther, "Evaluating Derivatives" (2nd ed., SIAM
2008), chapter 13. They all rest on the identity for the derivative of a composite,
$v' = g(u)\\,u'$, whose coefficient $j - 1$ reads
$$v_j = \\frac{1}{j} \\sum_{m=1}^{j} m\\, u_m\\, g_{j-m}.$$
"""

from collections.abc import Callable

import jax
import jax.lax as lax
import jax.numpy as jnp

from ._core import real_dtype


def _column(values, ndim: int):
    """Reshape a vector over the order axis to broadcast against an `ndim` array."""
    return values.reshape(values.shape + (1,) * (ndim - 1))


def order_weights(x, dtype=None):
    """The coefficient index $m = 0, \\ldots, K$, shaped to broadcast against `x`."""
    dtype = real_dtype(x.dtype if dtype is None else dtype)
    return _column(jnp.arange(x.shape[0], dtype=dtype), x.ndim)


def reversed_window(x, j):
    """`out[m] = x[j - m]` for $m \\le j$ and zero beyond, with the shape of `x`."""
    order = x.shape[0] - 1
    m = jnp.arange(order + 1)
    window = jnp.take(x, jnp.clip(j - m, 0, order), axis=0)
    return jnp.where(_column(m <= j, x.ndim), window, jnp.zeros_like(window))


def derivative(x):
    """The series of $x'$: coefficients $(j + 1)\\, x_{j+1}$, the last one zero (it
    would need one more order)."""
    scale = order_weights(x)[1:]
    return jnp.concatenate([x[1:] * scale, jnp.zeros_like(x[:1])], axis=0)


def antiderivative(d, value):
    """The series $v$ with $v_0 = $ `value` and $v' = d$: $v_j = d_{j-1} / j$."""
    j = order_weights(d)[1:]
    return jnp.concatenate([jnp.asarray(value, d.dtype)[None], d[:-1] / j], axis=0)


def cauchy(a, b, product: Callable = jnp.multiply):
    """All coefficients $c_k = \\sum_{m \\le k} a_m \\cdot b_{k-m}$, $k \\le K$, of a
    bilinear `product` (elementwise by default) of two series.

    `product` is applied to a batch: `product(a[idx], b[idx'])` maps two stacks of
    coefficients to the stack of their products. Coefficients $p$ and $K - p$ need
    $K + 2$ products together, so each step of the loop computes them as one batch:
    about $K^2/2$ products in all, with $O(K \\cdot \\text{size})$ memory.
    """
    order = a.shape[0] - 1
    out_struct = jax.eval_shape(product, a[:1], b[:1])
    out = jnp.zeros((order + 1,) + out_struct.shape[1:], out_struct.dtype)
    idx = jnp.arange(order + 2)
    mask_shape = (order + 2,) + (1,) * (out.ndim - 1)

    def body(p, out):
        k1, k2 = p, order - p
        first = idx <= k1
        m = jnp.clip(jnp.where(first, idx, idx - k1 - 1), 0, order)
        r = jnp.clip(jnp.where(first, k1 - idx, k2 + k1 + 1 - idx), 0, order)
        products = product(a[m], b[r])
        first = first.reshape(mask_shape)
        zero = jnp.zeros_like(products)
        low = jnp.sum(jnp.where(first, products, zero), axis=0)
        high = jnp.sum(jnp.where(first, zero, products), axis=0)
        # When k1 == k2 both sums are the whole coefficient, and writing it twice is
        # harmless.
        return out.at[k2].set(high).at[k1].set(low)

    return lax.fori_loop(0, order // 2 + 1, body, out)


def compose(u, g):
    """$v_j = \\frac{1}{j}\\sum_{m=1}^j m\\,u_m\\,g_{j-m}$ for $j \\ge 1$, i.e. the
    coefficients above order 0 of $v$ with $v' = g\\,u'$, for a known series $g$
    (the $v_0$ entry of the result is zero)."""
    return antiderivative(cauchy(derivative(u), g), jnp.zeros(u.shape[1:], u.dtype))


def exp(u, value):
    """$e = \\exp(u)$, with $e_0 = $ `value`: $e' = e\\,u'$."""
    mu = order_weights(u) * u
    e = jnp.zeros_like(mu).at[0].set(value)

    def body(j, e):
        return e.at[j].set(jnp.sum(mu * reversed_window(e, j), axis=0) / j)

    return lax.fori_loop(1, u.shape[0], body, e)


def log(u, value):
    """$l = \\log(u)$, with $l_0 = $ `value`: from $u' = u\\,l'$,
    $l_j = (u_j - \\frac{1}{j}\\sum_{m=1}^{j-1} m\\,l_m u_{j-m}) / u_0$."""
    w = order_weights(u)
    l = jnp.zeros_like(u).at[0].set(value)

    def body(j, l):
        s = jnp.sum(w * l * reversed_window(u, j), axis=0) / j
        return l.at[j].set((u[j] - s) / u[0])

    return lax.fori_loop(1, u.shape[0], body, l)


def divide(u, v):
    """$c = u / v$: from $u = c\\,v$, $c_j = (u_j - \\sum_{m<j} c_m v_{j-m}) / v_0$."""
    c = jnp.zeros(jnp.broadcast_shapes(u.shape, v.shape), jnp.result_type(u, v))
    c = c.at[0].set(u[0] / v[0])

    def body(j, c):
        return c.at[j].set((u[j] - jnp.sum(c * reversed_window(v, j), axis=0)) / v[0])

    return lax.fori_loop(1, c.shape[0], body, c)


def sqrt(u, value):
    """$r = \\sqrt{u}$, with $r_0 = $ `value`: from $r^2 = u$,
    $r_j = (u_j - \\sum_{m=1}^{j-1} r_m r_{j-m}) / (2 r_0)$."""
    r = jnp.zeros_like(u).at[0].set(value)

    def body(j, r):
        s = jnp.sum(r * reversed_window(r, j), axis=0)
        return r.at[j].set((u[j] - s) / (2 * r[0]))

    return lax.fori_loop(1, u.shape[0], body, r)


def power(u, p, value):
    """$y = u^p$ for a constant exponent $p$, with $y_0 = $ `value`: from
    $u\\,y' = p\\,y\\,u'$, $y_j = \\frac{1}{j u_0}\\sum_{m=1}^{j} ((p+1)m - j)\\,u_m
    y_{j-m}$. Needs $u_0 \\neq 0$."""
    w = order_weights(u)
    p = jnp.asarray(p, u.dtype)
    y = jnp.zeros_like(u).at[0].set(value)

    def body(j, y):
        coefficient = (p + 1) * w - j
        s = jnp.sum(coefficient * u * reversed_window(y, j), axis=0)
        return y.at[j].set(s / (j * u[0]))

    return lax.fori_loop(1, u.shape[0], body, y)


def sin_cos(u, sin_value, cos_value, hyperbolic: bool = False):
    """$s = \\sin u$ and $c = \\cos u$ together ($\\sinh$/$\\cosh$ when `hyperbolic`):
    $s' = c\\,u'$, $c' = \\mp s\\,u'$."""
    mu = order_weights(u) * u
    sign = 1 if hyperbolic else -1
    s = jnp.zeros_like(mu).at[0].set(sin_value)
    c = jnp.zeros_like(mu).at[0].set(cos_value)

    def body(j, sc):
        s, c = sc
        sj = jnp.sum(mu * reversed_window(c, j), axis=0) / j
        cj = sign * jnp.sum(mu * reversed_window(s, j), axis=0) / j
        return s.at[j].set(sj), c.at[j].set(cj)

    return lax.fori_loop(1, u.shape[0], body, (s, c))


def tan(u, value, hyperbolic: bool = False):
    """$y = \\tan u$ ($\\tanh$ when `hyperbolic`): $y' = w\\,u'$ with
    $w = 1 \\pm y^2$, both built one coefficient at a time."""
    mu = order_weights(u) * u
    sign = -1 if hyperbolic else 1
    y = jnp.zeros_like(mu).at[0].set(value)
    w = jnp.zeros_like(mu).at[0].set(1 + sign * value * value)

    def body(j, yw):
        y, w = yw
        y = y.at[j].set(jnp.sum(mu * reversed_window(w, j), axis=0) / j)
        w = w.at[j].set(sign * jnp.sum(y * reversed_window(y, j), axis=0))
        return y, w

    return lax.fori_loop(1, u.shape[0], body, (y, w))[0]


def logistic(u, value):
    """$y = 1 / (1 + e^{-u})$: $y' = w\\,u'$ with $w = y - y^2$."""
    mu = order_weights(u) * u
    y = jnp.zeros_like(mu).at[0].set(value)
    w = jnp.zeros_like(mu).at[0].set(value - value * value)

    def body(j, yw):
        y, w = yw
        y = y.at[j].set(jnp.sum(mu * reversed_window(w, j), axis=0) / j)
        w = w.at[j].set(y[j] - jnp.sum(y * reversed_window(y, j), axis=0))
        return y, w

    return lax.fori_loop(1, u.shape[0], body, (y, w))[0]


def integer_power(u, n: int):
    """$u^n$ for a Python int $n \\ge 1$ by repeated squaring: $O(\\log n)$ Cauchy
    products, exact also where $u_0 = 0$."""
    result = None
    base = u
    while True:
        if n & 1:
            result = base if result is None else cauchy(result, base)
        n >>= 1
        if not n:
            return result
        base = cauchy(base, base)
