"""The linear-algebra, sorting and cumulative functions of `t` that
`bench_taylor.py --check` differentiates against nested `jax.jvp` (the test suite
checks the same kinds at low order in `tests/test_taylor_rules.py`)."""

import jax
import jax.lax as lax
import jax.numpy as jnp


A = jnp.array([[2.0, 0.3, -0.4], [0.1, 1.5, 0.2], [-0.3, 0.6, 3.0]])
B = jnp.array([[0.5, -0.2, 0.1], [0.3, 0.4, -0.6], [0.2, 0.1, 0.3]])
D = jnp.diag(jnp.array([1.0, 2.0, 3.0]))
V = jnp.array([0.3, -1.2, 0.5, 2.0, 0.7])


def matrix(t):
    return A + jnp.sin(t) * B + t**2 * D


def hermitian(t):
    return A + A.T + jnp.sin(t) * (B + B.T) + t**2 * D


def spd(t):
    m = A + jnp.sin(t) * B
    return m @ m.T + jnp.eye(3)


LINALG = {
    "solve": lambda t: jnp.linalg.solve(matrix(t), jnp.cos(t) * jnp.arange(1.0, 4.0)),
    "solve_constant_matrix": lambda t: jnp.linalg.solve(A, jnp.cos(t) * B),
    "solve_batched": lambda t: jnp.linalg.solve(
        jnp.stack([matrix(t), spd(t)]), jnp.ones((2, 3, 1)) * t
    ),
    "inv": lambda t: jnp.linalg.inv(matrix(t)),
    "det_slogdet": lambda t: (
        jnp.linalg.det(matrix(t)),
        jnp.linalg.slogdet(matrix(t))[1],
    ),
    "lu": lambda t: jax.scipy.linalg.lu_factor(matrix(t))[0],
    "triangular_solve": lambda t: (
        jax.scipy.linalg.solve_triangular(matrix(t), jnp.cos(t) * B, lower=True),
        jax.scipy.linalg.solve_triangular(
            matrix(t), jnp.cos(t) * B, trans=1, unit_diagonal=True
        ),
    ),
    "cholesky": lambda t: jnp.linalg.cholesky(spd(t)),
    # Eigenvectors up to sign: their outer products are gauge-free.
    "eigh": lambda t: (lambda w, v: (w, jnp.einsum("ik,jk->kij", v, v)))(
        *jnp.linalg.eigh(hermitian(t))
    ),
    "eigh_complex": lambda t: (lambda w, v: (w, v @ D @ v.conj().T))(
        *jnp.linalg.eigh(hermitian(t) + 1j * jnp.sin(t) * (B - B.T))
    ),
    "sort_argsort": lambda t: (
        jnp.sort(jnp.sin(t * V + V)),
        jnp.exp(t * V)[jnp.argsort(jnp.cos(t + V))],
    ),
    "cumsum_cumprod": lambda t: (
        jnp.cumsum(jnp.exp(t * V)),
        jnp.cumprod(jnp.sin(t * V + 1)),
        lax.cumprod(jnp.sin(t * V + 1), reverse=True),
    ),
    "cummax_cummin": lambda t: (
        lax.cummax(jnp.sin(t * V + V)),
        lax.cummin(jnp.sin(t * V + V), reverse=True),
    ),
    "cumlogsumexp": lambda t: lax.cumlogsumexp(jnp.sin(t * V)),
}
