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


def _term_product_coefficient(
    terms: TermSeries, series: Array, j: Array, side: str = "left"
) -> Array:
    """Coefficient j of the product $H \\cdot S$ (`side="left"`) or $S \\cdot H$
    (`side="right"`) of an operator series H and a series S.

    With term structure $h_m = \\sum_a c_{a,m} H_a$:
    $\\sum_m h_m s_{j-m} = \\sum_a H_a (\\sum_m c_{a,m} s_{j-m})$, so the inner sums are
    scalar-weighted sums of matrices and only A matrix products are needed. A dense
    part costs one product with inner dimension (K+1) n.
    """
    window = reversed_window(series, j)  # window[i] = s_{j-i}, zero for i > j
    out = jnp.zeros(series.shape[1:], series.dtype)
    # Contract (term or order axis, matrix inner axis) in one product.
    if side == "left":
        product = lambda ops, xs: jnp.tensordot(ops, xs, axes=((0, 2), (0, 1)))
    else:
        product = lambda ops, xs: jnp.tensordot(xs, ops, axes=((0, 2), (0, 1)))
    if terms.coefficients.shape[0] > 0:
        inner = jnp.tensordot(terms.coefficients, window, axes=(1, 0))
        out = out + product(terms.matrices, inner)
    if terms.dense is not None:
        out = out + product(terms.dense, window)
    return out


def _cast(terms: TermSeries, dtype) -> TermSeries:
    return TermSeries(
        terms.coefficients.astype(dtype),
        terms.matrices.astype(dtype),
        None if terms.dense is None else terms.dense.astype(dtype),
    )


def propagator_series(
    terms: TermSeries, initial: Array, order: int, with_inverse: bool = False
) -> Array | tuple[Array, Array]:
    """Normalised series of the propagator $U(t+\\tau)$, $U' = -i H U$, $U(t)$ =
    `initial`: $u_{j+1} = -\\frac{i}{j+1} \\sum_{m \\le j} h_m u_{j-m}$.

    With `with_inverse=True` (and `initial` the identity), also the series of
    $W = U^{-1}$, in the same loop, from its own equation $W' = i W H$:
    $w_{j+1} = \\frac{i}{j+1} \\sum_{m \\le j} w_{j-m} h_m$.

    **Returns:** shape `(order + 1, *initial.shape)`, or a pair of them.
    """
    dtype = initial.dtype
    terms = _cast(terms, dtype)
    u = jnp.zeros((order + 1,) + initial.shape, dtype).at[0].set(initial)

    def body(j, carry):
        u, w = carry
        scale = (1j / (j + 1)).astype(dtype)
        u = u.at[j + 1].set(-scale * _term_product_coefficient(terms, u, j, "left"))
        if w is not None:
            w = w.at[j + 1].set(scale * _term_product_coefficient(terms, w, j, "right"))
        return u, w

    u, w = lax.fori_loop(0, order, body, (u, u if with_inverse else None))
    return (u, w) if with_inverse else u


def product_series(terms: TermSeries, series: Array) -> Array:
    """All coefficients of the product $X(t+\\tau)\\, S(\\tau)$, truncated at K."""
    dtype = series.dtype
    terms = _cast(terms, dtype)
    order = series.shape[0] - 1
    out = jnp.zeros_like(series)

    def body(j, out):
        return out.at[j].set(_term_product_coefficient(terms, series, j))

    return lax.fori_loop(0, order + 1, body, out)


def heisenberg_series(
    hamiltonian: TermSeries,
    observable: TermSeries,
    dtype,
    observable_is_constant: bool = False,
) -> Array:
    """Normalised series $y_k = X_k / k!$ of the Heisenberg hierarchy by propagator
    conjugation.

    With $V(\\tau) = U(t+\\tau) U(t)^{-1}$ ($V' = -iHV$, $V(0) = 1$), the conjugated
    observable $Y(\\tau) = V(\\tau)^{-1} X_0(t+\\tau) V(\\tau)$ satisfies
    $Y' = V^{-1} (i[H, X_0] + X_0') V$, so by induction $Y^{(k)}(0) = X_k(t)$. For a
    Hermitian H, $V^{-1} = V^\\dagger$; the series of $V^{-1}$ is computed from its
    own equation $W' = i W H$ instead, so the result is exact for any H.

    Cost: 2A products per order for the two propagators, B per order for
    $X_0 V$, and about $K^2/2$ for the final Cauchy product.
    """
    order = hamiltonian.coefficients.shape[1] - 1
    n = hamiltonian.matrices.shape[-1]
    identity = jnp.eye(n, dtype=dtype)
    v, v_inverse = propagator_series(hamiltonian, identity, order, with_inverse=True)
    if observable_is_constant:
        # X_0 V for all orders at once: one batched product, no loop.
        w = observable.full()[0].astype(dtype) @ v
    else:
        w = product_series(observable, v)
    return triangular_cauchy_product(v_inverse, w)


def nested_commutators(generator: Array, operator: Array, order: int) -> Array:
    """$(\\mathrm{ad}_G)^k X = [G, [G, \\ldots, X]]$ for $k = 0..K$, shape
    `(order + 1, n, n)`: K commutators, the floor for a constant generator."""

    def step(x, _):
        x = generator @ x - x @ generator
        return x, x

    _, rest = lax.scan(step, operator, None, length=order)
    return jnp.concatenate([operator[None], rest])
