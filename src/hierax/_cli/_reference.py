"""The seed problem and its reference implementations.

The project began with a question (see the docs' "seed problem" page): the
Heisenberg hierarchy of $H(t) = \\cos(t)\\,\\sigma_y$, $X_0 = \\sigma_x$,

$$X_k(t) = i\\,[H(t), X_{k-1}(t)] + \\frac{d}{dt} X_{k-1}(t),$$

computed by a recursive jitted function whose compile time grows like $3^k$, and an
answer that compiled fast but differentiated a constant. This module holds our own
versions of both, written the way the question and the answer wrote them, so that
the command line and the benchmarks can run them beside [`hierax.HeisenbergHierarchy`][]
in one process. Nothing here is public API; nothing here sets JAX configuration.
"""

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, ArrayLike


def complex_dtype() -> jnp.dtype:
    """complex128 when x64 is enabled, complex64 otherwise (decided at call time)."""
    return jnp.result_type(complex)


def pauli_x() -> Array:
    """$\\sigma_x$ in the current complex dtype."""
    return jnp.asarray([[0, 1], [1, 0]], dtype=complex_dtype())


def pauli_y() -> Array:
    """$\\sigma_y$ in the current complex dtype."""
    return jnp.asarray([[0, -1j], [1j, 0]], dtype=complex_dtype())


def seed_hamiltonian(t: Array) -> Array:
    """$H(t) = \\cos(t)\\,\\sigma_y$, as a plain JAX function of `t`."""
    return jnp.cos(t) * pauli_y()


def _dagger(a: Array) -> Array:
    return jnp.swapaxes(a, -1, -2).conj()


def commutator_herm(a: Array, b: Array) -> Array:
    """`a @ b - (a @ b)^dagger`, which is `[a, b]` when `a` and `b` are Hermitian.

    The question used this form (one product instead of two); it is kept so that the
    reference recursion does exactly the arithmetic the question did.
    """
    ab = a @ b
    return ab - _dagger(ab)


def make_naive_recursion() -> Callable[[Array, int], Array]:
    """The question's recursion: a jitted `level(t, k)` with `k` static, whose time
    derivative is nested `jax.jacfwd(..., holomorphic=True)` of the level below.

    `t` must be a complex scalar (holomorphic differentiation). Each call of this
    factory returns a fresh function with an empty compilation cache, so a caller can
    time "compile level k" honestly: calling `level(t, 0), level(t, 1), ...` in turn
    reproduces the question's sequential measurement, where each level re-traces the
    whole tree of nested `jacfwd`s below it (about $3^k$ operations).
    """

    @partial(jax.jit, static_argnames="k")
    def level(t: Array, k: int) -> Array:
        if k == 0:
            return pauli_x()
        below = lambda s: level(s, k - 1)
        return 1j * commutator_herm(seed_hamiltonian(t), below(t)) + jax.jacfwd(
            below, holomorphic=True
        )(t)

    return level


def make_offered_scan(order: int) -> Callable[[Array], Array]:
    """The answer the question received: a `lax.scan` over levels whose derivative
    term is `jax.jacfwd(lambda t: X_km1, holomorphic=True)(t)`.

    That lambda ignores its argument, so its derivative is identically zero and the
    $\\frac{d}{dt}X_{k-1}$ term is dropped: levels 0 and 1 happen to be right (since
    $X_0$ is constant) and every level from 2 on is wrong. Returned jitted, mapping a
    complex `t` to the `(order + 1, 2, 2)` stack it produces.
    """

    @jax.jit
    def offered(t: Array) -> Array:
        def step(x_km1, _):
            x_k = 1j * commutator_herm(seed_hamiltonian(t), x_km1) + jax.jacfwd(
                lambda s: x_km1, holomorphic=True
            )(t)
            return x_k, x_k

        x0 = pauli_x()
        _, rest = lax.scan(step, x0, None, length=order)
        return jnp.concatenate([x0[None], rest])

    return offered


def relative_difference(a: ArrayLike, b: ArrayLike) -> float:
    """`max|a - b| / max|b|` (max-abs norm; 0 when both are zero)."""
    a = np.asarray(a)
    b = np.asarray(b)
    scale = float(np.max(np.abs(b)))
    diff = float(np.max(np.abs(a - b)))
    if scale == 0.0:
        return diff
    return diff / scale


def default_tolerance(x64: bool) -> float:
    """The agreement the demo demands between hierax and the naive recursion.

    In double precision both are exact up to rounding (1e-12 relative leaves room for
    the sums of up to $2^9$ terms at level 9). In single precision the naive
    recursion's own rounding dominates; 1e-4 relative is what it reaches at level 9.
    """
    return 1e-12 if x64 else 1e-4
