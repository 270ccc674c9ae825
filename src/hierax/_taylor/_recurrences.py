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

import math
from collections.abc import Callable

import jax
import jax.lax as lax
import jax.numpy as jnp

from .._data import real_dtype


def _column(values, ndim: int):
    """Reshape a vector over the order axis to broadcast against an `ndim` array."""
    return values.reshape(values.shape + (1,) * (ndim - 1))


def order_weights(x, dtype=None):
    """The coefficient index $m = 0, \\ldots, K$, shaped to broadcast against `x`."""
    dtype = real_dtype(x.dtype if dtype is None else dtype)
    return _column(jnp.arange(x.shape[0], dtype=dtype), x.ndim)


# Inside the loops a series is kept reversed and padded with zeros,
# `r = (x_K, ..., x_1, x_0, 0, ..., 0)` of length 2(K+1). Then the window
# `w_m = x_{j-m}` ($m \le j$, zero beyond) that meets a fixed series in coefficient $j$
# of a Cauchy product is one contiguous slice, `r[K-j : 2K+1-j]`, and coefficient $j$
# is written at `r[K-j]`: loop bodies stay a handful of operations.


def reversed_padded(x):
    return jnp.concatenate([x[::-1], jnp.zeros_like(x)], axis=0)


def window(r, j):
    """`w[m] = x[j - m]` for $m \\le j$, zero beyond, from `r = reversed_padded(x)`."""
    n = r.shape[0] // 2
    return lax.dynamic_slice_in_dim(r, n - 1 - j, n, axis=0)


def _put(r, value, j):
    n = r.shape[0] // 2
    return lax.dynamic_update_index_in_dim(r, value.astype(r.dtype), n - 1 - j, 0)


def _get(r, j):
    n = r.shape[0] // 2
    return lax.dynamic_index_in_dim(r, n - 1 - j, 0, keepdims=False)


def _unreversed(r):
    n = r.shape[0] // 2
    return r[:n][::-1]


def _start(value, like):
    """A reversed, padded series holding only its coefficient 0."""
    n = like.shape[0]
    r = jnp.zeros((2 * n,) + like.shape[1:], like.dtype)
    return r.at[n - 1].set(value)


def _inverse(j, like):
    """$1/j$ as a real scalar of `like`'s precision (a real factor keeps complex
    arithmetic to multiplications)."""
    return 1 / j.astype(real_dtype(like.dtype))


def derivative(x):
    """The series of $x'$: coefficients $(j + 1)\\, x_{j+1}$, the last one zero (it
    would need one more order)."""
    scale = order_weights(x)[1:]
    return jnp.concatenate([x[1:] * scale, jnp.zeros_like(x[:1])], axis=0)


def antiderivative(d, value):
    """The series $v$ with $v_0 = $ `value` and $v' = d$: $v_j = d_{j-1} / j$."""
    j = order_weights(d)[1:]
    return jnp.concatenate([jnp.asarray(value, d.dtype)[None], d[:-1] / j], axis=0)


def _sum_product(a, w):
    return jnp.sum(a * w, axis=0)


def cauchy(a, b, combine: Callable = _sum_product):
    """All coefficients $c_k = \\sum_{m \\le k} a_m \\cdot b_{k-m}$, $k \\le K$, of a
    bilinear product of two series.

    `combine(a, w)` must return $\\sum_m a_m \\cdot w_m$ for a window `w` of `b`
    (by default the elementwise product summed over the order axis; for a matrix
    product, one `dot_general` that also contracts the order axis).
    """
    n = a.shape[0]
    rb = reversed_padded(b)
    out_struct = jax.eval_shape(combine, a, b)
    out = jnp.zeros((n,) + out_struct.shape, out_struct.dtype)

    def body(k, out):
        return lax.dynamic_update_index_in_dim(out, combine(a, window(rb, k)), k, 0)

    return lax.fori_loop(0, n, body, out)


def compose(u, g):
    """$v_j = \\frac{1}{j}\\sum_{m=1}^j m\\,u_m\\,g_{j-m}$ for $j \\ge 1$, i.e. the
    coefficients above order 0 of $v$ with $v' = g\\,u'$, for a known series $g$
    (the $v_0$ entry of the result is zero)."""
    return antiderivative(cauchy(derivative(u), g), jnp.zeros(u.shape[1:], u.dtype))


def exp(u, value):
    """$e = \\exp(u)$, with $e_0 = $ `value`: $e' = e\\,u'$."""
    mu = order_weights(u) * u

    def body(j, e):
        return _put(e, jnp.sum(mu * window(e, j), axis=0) * _inverse(j, u), j)

    return _unreversed(lax.fori_loop(1, u.shape[0], body, _start(value, mu)))


def log(u, value):
    """$l = \\log(u)$, with $l_0 = $ `value`: from $u' = u\\,l'$,
    $l_j = (u_j - \\frac{1}{j}\\sum_{m=1}^{j-1} m\\,l_m u_{j-m}) / u_0$.

    Here the sum runs over a window of the known series $u$ against the partial
    series $m\\,l_m$, kept in natural order (its entries from $j$ on are still 0).
    """
    w = order_weights(u)
    ru = reversed_padded(u)
    ml = jnp.zeros_like(u)
    inverse_u0 = 1 / u[0]

    def body(j, ml):
        s = jnp.sum(ml * window(ru, j), axis=0) * _inverse(j, u)
        lj = (u[j] - s) * inverse_u0
        return lax.dynamic_update_index_in_dim(ml, (j * lj).astype(ml.dtype), j, 0)

    ml = lax.fori_loop(1, u.shape[0], body, ml)
    safe = jnp.where(w > 0, w, jnp.ones_like(w))
    return (ml / safe).at[0].set(value)


def divide(u, v):
    """$c = u / v$: from $u = c\\,v$, $c_j = (u_j - \\sum_{m<j} c_m v_{j-m}) / v_0$."""
    shape = jnp.broadcast_shapes(u.shape, v.shape)
    dtype = jnp.result_type(u, v)
    u, v = jnp.broadcast_to(u, shape).astype(dtype), jnp.broadcast_to(v, shape)
    rv = reversed_padded(v.astype(dtype))
    inverse_v0 = 1 / v[0]
    c = jnp.zeros(shape, dtype).at[0].set(u[0] * inverse_v0)

    def body(j, c):
        s = jnp.sum(c * window(rv, j), axis=0)
        return lax.dynamic_update_index_in_dim(c, (u[j] - s) * inverse_v0, j, 0)

    return lax.fori_loop(1, shape[0], body, c)


def sqrt(u, value):
    """$r = \\sqrt{u}$, with $r_0 = $ `value`: from $r^2 = u$,
    $r_j = (u_j - \\sum_{m=1}^{j-1} r_m r_{j-m}) / (2 r_0)$."""
    # r is kept twice: reversed for the window, natural for the other factor.
    n = u.shape[0]
    r = jnp.zeros_like(u).at[0].set(value)
    inverse_two_r0 = 1 / (2 * value)

    def body(j, rr):
        r, rev = rr
        s = jnp.sum(r * window(rev, j), axis=0)
        rj = (u[j] - s) * inverse_two_r0
        return lax.dynamic_update_index_in_dim(r, rj, j, 0), _put(rev, rj, j)

    r, _ = lax.fori_loop(1, n, body, (r, _start(value, u)))
    return r


def power(u, p, value):
    """$y = u^p$ for a constant exponent $p$, with $y_0 = $ `value`: from
    $u\\,y' = p\\,y\\,u'$, $y_j = \\frac{1}{j u_0}\\sum_{m=1}^{j} ((p+1)m - j)\\,u_m
    y_{j-m}$. Needs $u_0 \\neq 0$."""
    w = order_weights(u)
    p = jnp.broadcast_to(jnp.asarray(p, u.dtype), u.shape[1:])[None]
    pu = (p + 1) * w * u
    inverse_u0 = 1 / u[0]

    def body(j, y):
        s = jnp.sum((pu - j * u) * window(y, j), axis=0)
        return _put(y, s * (_inverse(j, u) * inverse_u0), j)

    return _unreversed(lax.fori_loop(1, u.shape[0], body, _start(value, u)))


def sin_cos(u, sin_value, cos_value, hyperbolic: bool = False):
    """$s = \\sin u$ and $c = \\cos u$ together ($\\sinh$/$\\cosh$ when `hyperbolic`):
    $s' = c\\,u'$, $c' = \\mp s\\,u'$."""
    mu = order_weights(u) * u
    sign = 1 if hyperbolic else -1

    def body(j, sc):
        s, c = sc
        inverse_j = _inverse(j, u)
        sj = jnp.sum(mu * window(c, j), axis=0) * inverse_j
        cj = jnp.sum(mu * window(s, j), axis=0) * (sign * inverse_j)
        return _put(s, sj, j), _put(c, cj, j)

    s, c = lax.fori_loop(
        1, u.shape[0], body, (_start(sin_value, mu), _start(cos_value, mu))
    )
    return _unreversed(s), _unreversed(c)


def tan(u, value, hyperbolic: bool = False, slope=None):
    """$y = \\tan u$ ($\\tanh$ when `hyperbolic`): $y' = w\\,u'$ with
    $w = 1 \\pm y^2$, both built one coefficient at a time. `slope`, if given, is
    $w_0$ computed without cancellation ($1 - \\tanh^2$ is 0 once $\\tanh$ rounds
    to 1, from $|u_0| \\approx 19$ in float64)."""
    mu = order_weights(u) * u
    sign = -1 if hyperbolic else 1

    def body(j, yw):
        y, w, rev = yw
        yj = jnp.sum(mu * window(w, j), axis=0) * _inverse(j, u)
        y = lax.dynamic_update_index_in_dim(y, yj, j, 0)
        rev = _put(rev, yj, j)
        w = _put(w, sign * jnp.sum(y * window(rev, j), axis=0), j)
        return y, w, rev

    y = jnp.zeros_like(mu).at[0].set(value)
    w = _start(1 + sign * value * value if slope is None else slope, mu)
    return lax.fori_loop(1, u.shape[0], body, (y, w, _start(value, mu)))[0]


def logistic(u, value, slope=None):
    """$y = 1 / (1 + e^{-u})$: $y' = w\\,u'$ with $w = y - y^2$; `slope` as in
    `tan`."""
    mu = order_weights(u) * u

    def body(j, yw):
        y, w, rev = yw
        yj = jnp.sum(mu * window(w, j), axis=0) * _inverse(j, u)
        y = lax.dynamic_update_index_in_dim(y, yj, j, 0)
        rev = _put(rev, yj, j)
        w = _put(w, yj - jnp.sum(y * window(rev, j), axis=0), j)
        return y, w, rev

    y = jnp.zeros_like(mu).at[0].set(value)
    w = _start(value - value * value if slope is None else slope, mu)
    return lax.fori_loop(1, u.shape[0], body, (y, w, _start(value, mu)))[0]


def erf_inv(u, value):
    """$y = \\operatorname{erf}^{-1}(u)$: $y' = g\\,u'$ with
    $g = \\frac{\\sqrt{\\pi}}{2} e^{q}$, $q = y^2$, all three built together."""
    mu = order_weights(u) * u
    w = order_weights(u)

    def body(j, state):
        y, rev, q, g = state
        yj = jnp.sum(mu * window(g, j), axis=0) * _inverse(j, u)
        y = lax.dynamic_update_index_in_dim(y, yj, j, 0)
        rev = _put(rev, yj, j)
        q = lax.dynamic_update_index_in_dim(
            q, jnp.sum(y * window(rev, j), axis=0), j, 0
        )
        g = _put(g, jnp.sum(w * q * window(g, j), axis=0) * _inverse(j, u), j)
        return y, rev, q, g

    y = jnp.zeros_like(mu).at[0].set(value)
    q = jnp.zeros_like(mu).at[0].set(value * value)
    g = _start(0.5 * math.sqrt(math.pi) * jnp.exp(value * value), mu)
    return lax.fori_loop(1, u.shape[0], body, (y, _start(value, mu), q, g))[0]


def integer_power(u, n: int):
    """$u^n$ for a Python int $n \\ge 1$ by repeated squaring: $O(\\log n)$ Cauchy
    products, exact also where $u_0 = 0$."""
    if n < 1:
        raise ValueError(f"integer_power needs n >= 1, got {n}.")
    while not n & 1:  # u^(2m) = (u^2)^m
        u = cauchy(u, u)
        n >>= 1
    result = u  # the lowest set bit of n
    n >>= 1
    while n:
        u = cauchy(u, u)
        if n & 1:
            result = cauchy(result, u)
        n >>= 1
    return result


def substitute(c, u):
    """$f(u)$ for an $f$ whose Taylor coefficients at $u_0$ are `c` (of `u`'s shape):
    Horner's rule $c_0 + d\\,(c_1 + d\\,(c_2 + \\cdots))$ with $d = u - u_0$, $K$
    Cauchy products, $O(K^3)$ work (for functions that satisfy no short ODE)."""
    n = u.shape[0]
    d = u.at[0].set(0)

    def body(i, h):
        c_k = lax.dynamic_index_in_dim(c, n - 2 - i, 0, keepdims=False)
        return cauchy(d, h).at[0].add(c_k)  # coefficient 0 of d * h is 0

    return lax.fori_loop(0, n - 1, body, jnp.zeros_like(u).at[0].set(c[n - 1]))
