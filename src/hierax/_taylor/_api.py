"""The public entry point [`hierax.taylor`][]."""

from collections.abc import Callable

import jax.numpy as jnp
from jaxtyping import Array, PyTree, Shaped

from .._core import (
    OrderLike,
    TimeLike,
    as_time_array,
    check_order,
    check_time_finite,
    module_jit,
    typechecked,
)
from ._interpreter import expand, function_name


_API = "hierax.taylor"


def time_series(t: Array, order: int) -> Array:
    """The series of the identity $s \\mapsto t + s$: $(t, 1, 0, \\ldots, 0)$."""
    series = jnp.zeros((order + 1,), t.dtype).at[0].set(t)
    return series.at[1].set(1) if order >= 1 else series


def _taylor_impl(fn: Callable, t: Array, order: int) -> PyTree[Array]:
    t = check_time_finite(t, _API)
    return expand(fn, time_series(t, order), api=_API, fn_name=function_name(fn))


# The one compile policy of the public calls (`eqx.filter_jit` semantics, with a
# fast path when `fn` is a module of arrays); the order is static.
_taylor = module_jit(_taylor_impl, api="hierax.taylor", exact_products=False)


@typechecked
def taylor(
    fn: Callable, t: TimeLike, order: OrderLike
) -> PyTree[Shaped[Array, "order_plus_1 ..."]]:
    """Normalised Taylor coefficients of an arbitrary JAX function of time.

    Returns $f_j = f^{(j)}(t) / j!$ for $j = 0, \\ldots, K$: the coefficients of
    $s \\mapsto f(t + s)$ at $s = 0$. `fn` is traced once to a jaxpr, which is then
    evaluated on truncated Taylor series, each primitive by its own rule: linear
    primitives act on every coefficient, products are Cauchy products, and
    $\\exp$, $\\log$, $\\sin$, $\\cos$, $\\tan$, $\\tanh$, $\\sqrt{\\cdot}$, powers,
    quotients and the like follow the classical Taylor recurrences (Griewank &
    Walther, ch. 13); log-gamma, digamma, polygamma and the scaled Bessel
    functions `i0e` and `i1e` substitute the input series into their own
    coefficients at $t$, in $O(K^3)$ work. Every rule is one fixed-shape loop over
    the coefficient index, so compile time does not grow with $K$ and memory grows
    like $K$ times the size of the largest intermediate.

    `fn` may close over arrays and Equinox modules, return any pytree of arrays, and
    use `jax.jit`, `lax.scan`, `lax.fori_loop`, `lax.while_loop` and `lax.cond`
    whose trip counts and branch indices do not depend on $t$ (they are taken at
    $t$), linear solves, LU, Cholesky and Hermitian eigendecompositions
    (`jnp.linalg.solve`, `inv`, `det`, `slogdet`, `cholesky`, `eigh`,
    `jax.scipy.linalg.expm`, ...), sorting and cumulative reductions, and
    `diffrax.diffeqsolve`. A primitive without a Taylor rule raises
    `NotImplementedError` naming the function you called, your source line and what
    to do; nothing is silently wrong.

    A `jax.custom_jvp` function is expanded through its JVP rule, as nested
    `jax.jvp` does, so `softplus`, `logaddexp`, `log_sigmoid`, `sinc`, `xlogy` and
    the like are exact at their guard points (their primal bodies branch there). A
    `jax.custom_vjp` function defines reverse mode only: its primal computation is
    expanded.

    Non-analytic points are the user's responsibility: `abs`, `sign`, `max`,
    `min`, `clamp`, `floor`, `round`, comparisons, `jnp.where`, `sort` and running
    extrema use the branch selected at $t$ itself (at exact ties `max`, `min` and
    `clamp` follow JAX's derivative), so the coefficients are those of the active
    branch and are meaningless exactly at a kink (for instance $|x|$ at $x = 0$);
    $\\sqrt{x}$ and non-integer powers $x^p$ are singular at $x = 0$ and give
    infinities or NaNs there; $\\log$ at 0 likewise. Eigenvectors are not analytic
    where eigenvalues cross: `eigh` at a repeated eigenvalue raises at run time.
    Integer powers are exact everywhere. With a complex `t`, `fn` must be
    holomorphic: `conj`, `real`, `imag` and `abs` act coefficient by coefficient,
    which is right only for real time. Adaptive ODE solves give the coefficients of
    the discretised solution, as `jax.jvp` does (see the Taylor transform page).

    **Arguments:**

    - `fn`: a callable $t \\mapsto$ pytree of arrays, differentiable in $t$.
    - `t`: the real or complex scalar time at which to expand.
    - `order`: the highest order $K$, a non-negative int, Python's or NumPy's (at
      most 10,000).
      It is static: every new value compiles anew.

    **Returns:**

    A pytree with the structure of `fn(t)`, each leaf of shape `(K + 1, *shape)`
    holding $f_0, \\ldots, f_K$ along its leading axis.

    !!! example

        ```python
        import jax.numpy as jnp
        import hierax

        coefficients = hierax.taylor(jnp.exp, 0.0, order=4)
        # [1, 1, 1/2, 1/6, 1/24]
        ```
    """
    order = check_order(order, _API)
    if not callable(fn):
        raise TypeError(f"`{_API}(fn=...)` must be callable, got {type(fn).__name__}.")
    # The time keeps its precision (a float32 time gives float32 coefficients), as
    # one strongly typed array, so Python and NumPy scalars share a compilation.
    t = as_time_array(t, _API, canonical=False)
    t = jnp.asarray(t, dtype=t.dtype)
    return _taylor(fn, t, order=order)
