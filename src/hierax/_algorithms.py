"""The three algorithms behind the hierarchies, on normalised series.

All loops over orders are `lax.fori_loop`s over fixed-shape `(K+1, ...)` arrays, so
the traced program has the same size for every order K, and memory stays
O(K n^2).
"""

import jax.lax as lax
import jax.numpy as jnp
from jaxtyping import Array

from ._operators import TermSeries
from ._series import reversed_window, triangular_cauchy_product


def _term_product_coefficient(terms: TermSeries, series: Array, j: Array) -> Array:
    """Coefficient j of the product $H \\cdot S$ of an operator series H and a series S.

    With term structure $h_m = \\sum_a c_{a,m} H_a$:
    $\\sum_m h_m s_{j-m} = \\sum_a H_a (\\sum_m c_{a,m} s_{j-m})$, so the inner sums are
    scalar-weighted sums of matrices and only A matrix products are needed. A dense
    part costs one product with inner dimension (K+1) n.
    """
    out = jnp.zeros(series.shape[1:], series.dtype)
    # Contract (term or order axis, matrix inner axis) in one product.
    if terms.coefficients.shape[0] > 0:
        inner = jnp.tensordot(_shifted(terms.coefficients, j), series, axes=(1, 0))
        out = out + jnp.tensordot(terms.matrices, inner, axes=((0, 2), (0, 1)))
    if terms.dense is not None:
        window = reversed_window(terms.dense, j)  # window[i] = h_{j-i}, 0 for i > j
        out = out + jnp.tensordot(window, series, axes=((0, 2), (0, 1)))
    return out


def _shifted(coefficients: Array, j: Array) -> Array:
    """`out[a, i] = coefficients[a, j - i]` for i <= j, else 0: the scalar weights of
    $\\sum_i c_{a,j-i} s_i$. Shifting the (A, K+1) scalars, rather than the (K+1, n, n)
    matrix series, keeps each step's memory traffic to one read of the series."""
    return reversed_window(coefficients.T, j).T


def _cast(terms: TermSeries, dtype) -> TermSeries:
    return TermSeries(
        terms.coefficients.astype(dtype),
        terms.matrices.astype(dtype),
        None if terms.dense is None else terms.dense.astype(dtype),
    )


def propagator_series(terms: TermSeries, initial: Array, order: int) -> Array:
    """Normalised series of the propagator $U(t+\\tau)$, $U' = -i H U$, $U(t)$ =
    `initial`: $u_{j+1} = -\\frac{i}{j+1} \\sum_{m \\le j} h_m u_{j-m}$.

    **Returns:** shape `(order + 1, *initial.shape)`.
    """
    dtype = initial.dtype
    terms = _cast(terms, dtype)
    u = jnp.zeros((order + 1,) + initial.shape, dtype).at[0].set(initial)

    def body(j, u):
        scale = (-1j / (j + 1)).astype(dtype)
        return u.at[j + 1].set(scale * _term_product_coefficient(terms, u, j))

    return lax.fori_loop(0, order, body, u)


def propagator_and_inverse_series(terms: TermSeries, order: int, dtype) -> tuple:
    """Series of $V(\\tau) = U(t+\\tau)U(t)^{-1}$ and of the transpose of its inverse,
    $W^T$ with $W = V^{-1}$, in one loop.

    $W$ obeys $W' = i W H$, $W(0) = 1$, so its transpose obeys
    $(W^T)' = i H^T W^T$, a left multiplication like $V' = -iHV$, so both run the
    same kernel in the same loop.

    **Returns:** `(v, w_transposed)`, each of shape `(order + 1, n, n)`.
    """
    terms = _cast(terms, dtype)
    n = terms.matrices.shape[-1]
    # H^T as a series in its own right: the same coefficients, transposed parts.
    transposed = TermSeries(
        terms.coefficients,
        jnp.swapaxes(terms.matrices, -1, -2),
        None if terms.dense is None else jnp.swapaxes(terms.dense, -1, -2),
    )
    start = jnp.zeros((order + 1, n, n), dtype).at[0].set(jnp.eye(n, dtype=dtype))

    # v and w^T are separate carries (no (K+1, 2, n, n) array to split afterwards).
    def body(j, carry):
        v, wt = carry
        scale = (1j / (j + 1)).astype(dtype)
        v = v.at[j + 1].set(-scale * _term_product_coefficient(terms, v, j))
        wt = wt.at[j + 1].set(scale * _term_product_coefficient(transposed, wt, j))
        return v, wt

    return lax.fori_loop(0, order, body, (start, start))


def product_series_in_place(terms: TermSeries, series: Array) -> Array:
    """All coefficients of the product $X(t+\\tau)\\, S(\\tau)$, truncated at K,
    written over `series` (callers pass a series they no longer need).

    Coefficient j needs $s_0..s_j$ only, so going from j = K down to 0 each slot is
    overwritten after its last use: no second (K+1, n, n) array.
    """
    dtype = series.dtype
    terms = _cast(terms, dtype)
    order = series.shape[0] - 1

    def body(i, series):
        j = order - i
        return series.at[j].set(_term_product_coefficient(terms, series, j))

    return lax.fori_loop(0, order + 1, body, series)


def heisenberg_series(
    hamiltonian: TermSeries,
    observable: TermSeries,
    dtype,
    observable_is_constant: bool = False,
    factorial: bool = False,
) -> Array:
    """Series $y_k = X_k / k!$ of the Heisenberg hierarchy by propagator conjugation
    (or $X_k$ itself with `factorial=True`).

    With $V(\\tau) = U(t+\\tau) U(t)^{-1}$ ($V' = -iHV$, $V(0) = 1$), the conjugated
    observable $Y(\\tau) = V(\\tau)^{-1} X_0(t+\\tau) V(\\tau)$ satisfies
    $Y' = V^{-1} (i[H, X_0] + X_0') V$, so by induction $Y^{(k)}(0) = X_k(t)$. For a
    Hermitian H, $V^{-1} = V^\\dagger$; the series of $V^{-1}$ is computed from its
    own equation $W' = i W H$ instead, so the result is exact for any H.

    Cost: 2A products per order for the two propagators, B per order for
    $X_0 V$, and about $K^2/2$ for the final Cauchy product. Memory: three
    (K+1, n, n) arrays at any time, the output included.
    """
    order = hamiltonian.coefficients.shape[1] - 1
    v, v_inverse_t = propagator_and_inverse_series(hamiltonian, order, dtype)
    if observable_is_constant:
        # X_0 V, one order at a time into V's own buffer.
        x0 = observable.full()[0].astype(dtype)
        w = lax.fori_loop(0, order + 1, lambda j, v: v.at[j].set(x0 @ v[j]), v)
    else:
        w = product_series_in_place(observable, v)
    return triangular_cauchy_product(
        v_inverse_t, w, left_transposed=True, factorial=factorial
    )


def nested_commutators(
    generator: Array, operator: Array, order: int, normalised: bool = False
) -> Array:
    """$(\\mathrm{ad}_G)^k X = [G, [G, \\ldots, X]]$ for $k = 0..K$, shape
    `(order + 1, n, n)`: K commutators, the floor for a constant generator.

    The recursion carries $z_k = (\\mathrm{ad}_G)^k X / c_k$, which stays within
    $\\|X\\|$ in size: with `normalised`, $c_k = k!$ (dividing by k at each step);
    otherwise $c_k = g^k$ with $g = 2\\|G\\|_F \\ge \\|\\mathrm{ad}_G\\|$, and $g^k$ is
    applied at the end as a running product, part by part. So a level that overflows
    reads $\\pm\\infty$, never the $\\infty - \\infty = $ nan that later commutators of
    an overflowed level would give.
    """
    rdtype = jnp.finfo(operator.dtype).dtype
    # Any g > 0 gives the same result; it only keeps z_k in range, so it carries no
    # gradient (and the norm's nan gradient at G = 0 never appears).
    g = lax.stop_gradient(2 * jnp.linalg.norm(generator).astype(rdtype))
    g = jnp.where(g > 0, g, jnp.ones((), rdtype))
    ks = jnp.arange(1, order + 1, dtype=rdtype)
    divisors = ks if normalised else jnp.broadcast_to(g, ks.shape)

    def step(z, divisor):
        z = (generator @ z - z @ generator) / divisor
        return z, z

    _, rest = lax.scan(step, operator, divisors)
    levels = jnp.concatenate([operator[None], rest])
    if normalised:
        return levels
    powers = jnp.cumprod(jnp.concatenate([jnp.ones((1,), rdtype), divisors]))
    powers = powers.reshape(order + 1, 1, 1)
    # Exact zeros stay zero where g^k overflows (0 * inf would be nan).
    scale = lambda part: jnp.where(part == 0, 0, part * powers)
    if jnp.iscomplexobj(levels):
        return lax.complex(scale(levels.real), scale(levels.imag))
    return scale(levels)
