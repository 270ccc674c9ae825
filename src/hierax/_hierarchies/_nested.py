"""Nested commutators $[G, [G, \\ldots [G, X]]]$ of constant operators."""

from typing import Any, ClassVar, cast, overload

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Inexact

from .._core import (
    OrderLike,
    as_square_matrix,
    check_order,
)
from .._data import TermSeries
from .._kernels.heisenberg import (
    Levels,
    heisenberg_levels,
    without_trace,
)
from .._operators import (
    PauliSum,
    as_matrix,
    commutator_recursion,
)
from ._base import (
    AbstractEngine,
    AbstractHierarchy,
    LevelsT,
    MatrixEngine,
    PauliEngine,
)


class NestedCommutators(AbstractHierarchy[LevelsT]):
    """Nested commutators $(\\mathrm{ad}_G)^k X = [G, [G, \\ldots [G, X]]]$ for
    $k = 0..K$ with a constant generator $G$: the Heisenberg hierarchy of a
    time-independent Hamiltonian is the special case $G = iH$.

    Each level is renormalised by a power of two as it is computed, so levels are
    exact whatever the norm of $G$, a level that overflows reads $\\pm\\infty$, and
    an exact zero stays zero. Called with no arguments: `commutators()` gives the
    levels, shape `(order + 1, n, n)`; for Pauli sums $G$ and $X$ (chains beyond
    any matrix), a list of `order + 1` [`hierax.PauliSum`][]s, computed by the
    recursion of [`hierax.PauliHierarchy`][] with $H = -iG$.

    !!! example

        ```python
        import hierax

        h = hierax.PauliSum.ising_chain(40, coupling=1.0, hx=0.7)
        z0 = hierax.PauliSum.from_strings("Z" + "I" * 39)
        levels = hierax.NestedCommutators(1j * h, z0, order=6, capacity=1024)()
        levels[6].count  # strings in (ad_{iH})^6 Z_0
        ```
    """

    generator: Inexact[Array, "n n"] | PauliSum
    operator: Inexact[Array, "n n"] | PauliSum
    order: int = eqx.field(static=True)
    arguments: ClassVar[tuple[str, ...]] = ()
    engine: AbstractEngine

    # For type checkers, as in `HeisenbergHierarchy`.
    @overload
    def __init__(
        self: "NestedCommutators[list[PauliSum]]",
        generator: PauliSum,
        operator: PauliSum,
        order: OrderLike,
        *,
        capacity: int,
    ) -> None: ...

    @overload
    def __init__(
        self: "NestedCommutators[Array]",
        generator: Any,
        operator: Any,
        order: OrderLike,
        *,
        capacity: None = None,
    ) -> None: ...

    def __init__(
        self,
        generator: Any,
        operator: Any,
        order: OrderLike,
        *,
        capacity: int | None = None,
    ):
        """**Arguments:**

        - `generator`: $G$, an `(n, n)` matrix (an array, or a constant QuTiP or
            dynamiqs operator), or a constant [`hierax.PauliSum`][].
        - `operator`: $X$, in the same forms (a [`hierax.PauliSum`][] with a Pauli
            generator).
        - `order`: the highest nesting depth $K$, a non-negative Python int.
        - `capacity`: Pauli sums only: room for strings in every level, as in
            [`hierax.PauliHierarchy`][].
        """
        api = "hierax.NestedCommutators"
        self.order = check_order(order, api)
        recursion = commutator_recursion(generator, operator, self.order, capacity, api)
        if recursion is not None:
            self.engine = PauliEngine(recursion)
            self.generator, self.operator = generator, operator
            return
        self.engine = MatrixEngine()
        generator = as_matrix(generator, "generator", api)
        operator = as_matrix(operator, "operator", api)
        self.generator = as_square_matrix(generator, "generator", api)
        self.operator = as_square_matrix(operator, "operator", api)
        if self.generator.shape != self.operator.shape:
            raise ValueError(
                f"`{api}`: `generator` has shape {tuple(self.generator.shape)} but "
                f"`operator` has shape {tuple(self.operator.shape)}; they must match."
            )

    def levels(self, t, state, estimate, checks):
        del t, state, checks
        return _nested_levels(self, estimate)


def _nested_levels(commutators: NestedCommutators, estimate: bool) -> Levels:
    g, x = cast(Array, commutators.generator), cast(Array, commutators.operator)
    dtype = jnp.result_type(g, x)
    g, x = g.astype(dtype), x.astype(dtype)
    generator = without_trace(TermSeries(jnp.ones((1, 1), dtype), g[None], None))
    return heisenberg_levels(
        generator, x[None], commutators.order, hermitian_levels=False, estimate=estimate
    )
