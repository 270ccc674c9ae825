"""[`hierax.Recursion`][]: the levels of any recursion that applies a JAX function to a
quantity and its time derivative, by Taylor-mode propagation."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, PyTree, Shaped, jaxtyped

from .._core import (
    TimeLike,
    as_numeric_array,
    as_time,
    check_order,
    check_time_finite,
    module_jit,
)
from .._taylor import derivative, expand, function_name, time_series


_API = "hierax.Recursion"


def _shape_dtype(tree: Any) -> Any:
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), tree
    )


class Recursion(eqx.Module):
    """The levels $X_0(t), \\ldots, X_K(t)$ of the recursion

    $$
    X_0 = \\text{initial}(t), \\qquad
    X_k = \\text{step}\\big(t, X_{k-1}, \\tfrac{d}{dt} X_{k-1}\\big),
    $$

    for any JAX function `step`, linear or not, on arrays or pytrees of any shape.

    Nested differentiation would cost $O(2^K)$ or grow the program with $K$; here
    each level is carried as its truncated Taylor series in time around $t$, and
    level $k$ is the series of `step` applied to the series of $t$, of $X_{k-1}$
    and of its derivative (the coefficients shifted down: $(j+1)\\,x_{j+1}$), pushed
    through `step` by [`hierax.taylor`][]'s transform. Each level loses one
    coefficient, so with $K + 1$ coefficients the value $X_k(t)$ is exact for every
    $k \\le K$. The levels run in one `lax.fori_loop`: `step` is traced once, and
    compile time depends neither on $K$ nor on the number of levels.

    !!! example

        ```python
        import jax.numpy as jnp
        import hierax

        sigma_x = jnp.array([[0, 1], [1, 0]], complex)
        sigma_y = jnp.array([[0, -1j], [1j, 0]])

        def step(t, x, dx):
            a = jnp.cos(t) * sigma_y @ x
            return 1j * (a - a.conj().T) + dx

        levels = hierax.Recursion(step, sigma_x, order=9)(1.0)  # (10, 2, 2)
        ```
    """

    step: Callable
    initial: Any
    order: int = eqx.field(static=True)

    def __init__(self, step: Callable, initial: Any, order: int):
        """**Arguments:**

        - `step`: a callable `step(t, x, dx) -> x_next`, where `x` and `dx` have
          the structure, shapes and dtypes of $X_0$ (a pytree of arrays) and so
          must its result. Any JAX function of its arguments; it may close over
          arrays, or be an Equinox module whose array fields are differentiable.
        - `initial`: $X_0$, either a callable `initial(t)` or a constant array or
          pytree of arrays.
        - `order`: the last level $K$, a non-negative Python int (at most 10,000).
        """
        if not callable(step):
            raise TypeError(
                f"`{_API}(step=...)` must be callable as step(t, x, dx), got "
                f"{type(step).__name__}."
            )
        self.order = check_order(order, _API)
        self.step = step
        if not callable(initial):
            leaves = jax.tree_util.tree_leaves(initial)
            if not leaves:
                raise ValueError(
                    f"`{_API}(initial=...)` must be a callable of t or arrays, got "
                    f"{initial!r}."
                )
            initial = jax.tree_util.tree_map(
                lambda leaf: as_numeric_array(leaf, "initial", _API), initial
            )
        self.initial = initial

    @jaxtyped(typechecker=beartype)
    def __call__(self, t: TimeLike) -> PyTree[Shaped[Array, "order_plus_1 ..."]]:
        """**Arguments:**

        - `t`: the real (or complex, for a holomorphic `step`) scalar time.

        **Returns:**

        All levels $X_0(t), \\ldots, X_K(t)$, with the structure of $X_0$ and each
        leaf stacked on a leading axis of length $K + 1$.
        """
        return _levels(self, as_time(t, _API))

    def _levels(self, t: Array) -> PyTree[Array]:
        order = self.order
        t = check_time_finite(t, _API)
        ts = time_series(t, order)
        if callable(self.initial):
            x = expand(self.initial, ts, api=_API, fn_name=function_name(self.initial))
            if not jax.tree_util.tree_leaves(x):
                raise ValueError(
                    f"`{_API}`: `initial(t)` must return an array or a pytree of "
                    f"arrays, got {jax.eval_shape(self.initial, t)!r}."
                )
        else:
            x = jax.tree_util.tree_map(
                lambda a: jnp.zeros((order + 1,) + a.shape, a.dtype).at[0].set(a),
                self.initial,
            )
        x = self._promote(t, x)
        stack = jax.tree_util.tree_map(lambda s: s, x)
        if order == 0:
            return stack
        dtypes = jax.tree_util.tree_map(lambda s: s.dtype, x)
        step_name = function_name(self.step)

        def level(k: Array, carry: tuple[Any, Any]) -> tuple[Any, Any]:
            x, stack = carry
            dx = jax.tree_util.tree_map(derivative, x)
            new = expand(self.step, ts, x, dx, api=_API, fn_name=step_name)
            new = jax.tree_util.tree_map(lambda s, d: s.astype(d), new, dtypes)
            stack = jax.tree_util.tree_map(
                lambda s, n: lax.dynamic_update_index_in_dim(s, n[0], k, 0), stack, new
            )
            return new, stack

        # The stack's row 0 already holds X_0 (x's coefficient 0); rows above are
        # overwritten level by level.
        return lax.fori_loop(1, order + 1, level, (x, stack))[1]

    def _promote(self, t: Array, x: Any) -> Any:
        """Check what `step` returns against $X_0$, and widen $X_0$'s dtypes to what
        `step` produces (a real $X_0$ becomes complex under $i[H, X]$)."""
        primal = jax.tree_util.tree_map(lambda s: s[0], x)
        for _ in range(2):
            expected = _shape_dtype(primal)
            got = jax.eval_shape(self.step, t, primal, primal)
            got_tree = jax.tree_util.tree_structure(got)
            want_tree = jax.tree_util.tree_structure(expected)
            shapes_ok = got_tree == want_tree and all(
                getattr(g, "shape", None) == w.shape
                for g, w in zip(
                    jax.tree_util.tree_leaves(got),
                    jax.tree_util.tree_leaves(expected),
                    strict=True,
                )
            )
            if not shapes_ok:
                raise ValueError(
                    f"`{_API}`: `step(t, x, dx)` must return the structure and shapes "
                    f"of X_0, {_describe(expected)}; got {_describe(got)}."
                )
            widened = jax.tree_util.tree_map(
                lambda g, w: jnp.promote_types(g.dtype, w.dtype), got, expected
            )
            if all(
                a == b.dtype
                for a, b in zip(
                    jax.tree_util.tree_leaves(widened),
                    jax.tree_util.tree_leaves(expected),
                    strict=True,
                )
            ):
                return x
            x = jax.tree_util.tree_map(lambda s, d: s.astype(d), x, widened)
            primal = jax.tree_util.tree_map(lambda s: s[0], x)
        return x


def _describe(tree: Any) -> str:
    shapes = jax.tree_util.tree_map(
        lambda a: f"{getattr(a, 'dtype', type(a).__name__)}{list(jnp.shape(a))}", tree
    )
    return str(shapes)


# One compile policy for every public call (see `_jit.module_jit`).
_levels = module_jit(Recursion._levels)
