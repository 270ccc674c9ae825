"""The seed problem's naive recursion, the peer the hierarchy benchmarks time
hierax against: $X_k = i[H(t), X_{k-1}] + \\frac{d}{dt}X_{k-1}$ for
$H(t) = \\cos(t)\\,\\sigma_y$, $X_0 = \\sigma_x$, written the way the question wrote
it (a recursive jitted function with nested `jax.jacfwd`, whose compile time grows
like $3^k$). `hierax seed` keeps its own copy; the benchmarks import no private
hierax module."""

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
from jax import Array


def complex_dtype() -> jnp.dtype:
    """complex128 when x64 is enabled, complex64 otherwise (decided at call time)."""
    return jnp.result_type(complex)


def pauli_x() -> Array:
    return jnp.asarray([[0, 1], [1, 0]], dtype=complex_dtype())


def pauli_y() -> Array:
    return jnp.asarray([[0, -1j], [1j, 0]], dtype=complex_dtype())


def make_naive_recursion() -> Callable[[Array, int], Array]:
    """The question's recursion: a jitted `level(t, k)` with `k` static, whose time
    derivative is nested `jax.jacfwd(..., holomorphic=True)` of the level below;
    `t` a complex scalar. Each call returns a fresh function with nothing compiled,
    so that "compile level k" is timed honestly."""

    @partial(jax.jit, static_argnames="k")
    def level(t: Array, k: int) -> Array:
        if k == 0:
            return pauli_x()
        below = lambda s: level(s, k - 1)
        # The question's commutator: a b - (a b)^dagger, [a, b] for Hermitian a, b.
        ab = jnp.cos(t) * pauli_y() @ below(t)
        return 1j * (ab - ab.conj().T) + jax.jacfwd(below, holomorphic=True)(t)

    return level
