"""The Heisenberg hierarchy of an observable under a time-dependent Hamiltonian."""

from typing import Any, ClassVar, cast, overload

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike

from .._core import (
    OrderLike,
    check_order,
)
from .._data import TermSeries
from .._kernels.heisenberg import (
    Levels,
    scaled_generator,
)
from .._kernels.lindblad import (
    cast_series,
    lindblad_levels,
    number_series,
    scaled_series,
    two_sided,
)
from .._operators import (
    AbstractTimeOperator,
    PauliSum,
    PauliTimeSum,
    pauli_recursion,
    to_operator,
)
from ._base import (
    AbstractEngine,
    AbstractHierarchy,
    LevelsT,
    MatrixEngine,
    PauliEngine,
    _check_time_scale,
    _complex_dtype,
    _hermitian_matrices,
    _time_scale,
)
from ._time_scale import combined_rate, growth_rate, jump_rate


class HeisenbergHierarchy(AbstractHierarchy[LevelsT]):
    """The Heisenberg hierarchy of an observable under a time-dependent Hamiltonian
    ($\\hbar = 1$):

    $$X_0(t) = X(t), \\qquad
      X_k(t) = i\\,[H(t), X_{k-1}(t)] + \\frac{d}{dt} X_{k-1}(t).$$

    In the Heisenberg picture, with $U' = -iHU$, $X_k$ is the $k$-th time
    derivative seen from the frame of $U$:
    $U^\\dagger X_k U = \\frac{d^k}{dt^k}\\big(U^\\dagger X_0 U\\big)$. All levels
    $k \\le K$ are computed exactly (no finite differences, no nested autodiff) in one
    compiled call.

    The Hamiltonian is expected to be Hermitian, as physics requires; the algorithm
    does not rely on it and the result is exact for any square $H$. The observable
    may depend on time and need not be Hermitian.

    Algorithm: the direct Taylor recursion of the commutator, each level carried as
    its truncated series in time, with $H = \\sum_a f_a(t) H_a$ entering term by
    term and its trace part removed. It is stable: a constant offset $cI$ changes
    nothing, a spectator that commutes with the observable costs no digits, and
    lab-frame energies cost only the rounding of the inputs themselves (see the
    precision how-to). Cost: about $0.56 K^2$ coefficient updates of one matrix
    product per term (Hermitian $H$ and $X$, real time functions) or two; when $H$
    and $X$ are both constant, $K$ commutators. Memory: a few
    $(K+1) \\times n \\times n$ arrays. Calls are compiled once per structure: new
    times or parameter values never recompile.

    Error estimate ([`hierax.AbstractHierarchy.error_estimate`][]): level k's
    estimate is that of level k-1 plus the rounding committed at level k: the unit
    roundoff $\\epsilon/2$ times the size of what its matrix products and
    derivative add up against the size of the level itself, plus two roundings of
    its own (so a level that is small against its parts is charged for the
    cancellation), plus the rounding of the final factor $k!/s^k$ applied in log
    space; it bounds $\\|X_k - \\tilde X_k\\|_F / \\|X_k\\|_F$. It does not model
    amplification of earlier rounding by parts of $H$ that commute with the exact
    levels but not with the rounding errors (a far-detuned spectator written in a
    basis that mixes it with the rest); there the rounding of the input matrices
    themselves limits every method. A level that is exactly zero because
    everything it is computed from is zero gets 0; a level that cancels to exactly
    zero gets inf; for a level that overflows, the estimate describes the value
    before the overflow.

    !!! example

        ```python
        import jax.numpy as jnp
        import hierax

        sx = jnp.array([[0, 1], [1, 0]])
        sy = jnp.array([[0, -1j], [1j, 0]])
        hierarchy = hierax.HeisenbergHierarchy(hierax.Cos() * sy, sx, order=9)
        levels = hierarchy(1.0)  # shape (10, 2, 2): X_0, ..., X_9 at t = 1
        ```
    """

    hamiltonian: AbstractTimeOperator | PauliTimeSum
    observable: AbstractTimeOperator | PauliSum
    order: int = eqx.field(static=True)
    arguments: ClassVar[tuple[str, ...]] = ("t",)
    time_scale: Array | None
    hermitian: bool = eqx.field(static=True)
    engine: AbstractEngine

    # For type checkers: Pauli sums with a capacity give lists of Pauli sums (an
    # argument a checker cannot see the type of selects the matrix overload).
    @overload
    def __init__(
        self: "HeisenbergHierarchy[list[PauliSum]]",
        hamiltonian: PauliSum | PauliTimeSum,
        observable: PauliSum,
        order: OrderLike,
        time_scale: None = None,
        *,
        capacity: int,
    ) -> None: ...

    @overload
    def __init__(
        self: "HeisenbergHierarchy[Array]",
        hamiltonian: Any,
        observable: Any,
        order: OrderLike,
        time_scale: ArrayLike | None = None,
        *,
        capacity: None = None,
    ) -> None: ...

    def __init__(
        self,
        hamiltonian: Any,
        observable: Any,
        order: OrderLike,
        time_scale: ArrayLike | None = None,
        *,
        capacity: int | None = None,
    ):
        """**Arguments:**

        - `hamiltonian`: $H(t)$: a [`hierax.TimeOperator`][] (e.g.
            `hierax.Cos(w) * sy + sz`), any [`hierax.AbstractTimeOperator`][], a
            constant `(n, n)` matrix, or a JAX callable `t -> (n, n)`; or, for
            chains beyond any matrix, a [`hierax.PauliSum`][] or a
            [`hierax.PauliTimeSum`][] (`hierax.Cos(w) * hx + hzz`).
        - `observable`: $X_0(t)$, accepted in the same forms, of the same size (a
            constant [`hierax.PauliSum`][] with a Pauli Hamiltonian).
        - `order`: the highest level $K$, a non-negative Python int.
        - `time_scale`: optional $s > 0$, the unit of time in which the series
            are carried (see [`hierax.AbstractHierarchy`][]); matrices only.
        - `capacity`: Pauli sums only: room for strings in every level, as in
            [`hierax.PauliHierarchy`][] (which this runs; the levels are then a
            list of [`hierax.PauliSum`][]s).
        """
        api = "hierax.HeisenbergHierarchy"
        self.order = check_order(order, api)
        names = ("hamiltonian", "observable")
        recursion = pauli_recursion(
            hamiltonian, observable, self.order, capacity, api, names
        )
        if recursion is not None:
            if time_scale is not None:
                raise TypeError(
                    f"`{api}`: `time_scale` is for matrices; Pauli sums carry each "
                    "level's scale as a power of two (leave it out)."
                )
            self.engine = PauliEngine(recursion)
            self.hamiltonian, self.observable = recursion.hamiltonian, observable
            self.time_scale, self.hermitian = None, False
            return
        self.engine = MatrixEngine()
        self.time_scale = _check_time_scale(time_scale, api)
        self.hamiltonian = to_operator(hamiltonian, "hamiltonian", api)
        self.observable = to_operator(observable, "observable", api)
        if self.hamiltonian.size != self.observable.size:
            raise ValueError(
                f"`{api}`: `hamiltonian` is {self.hamiltonian.size}x"
                f"{self.hamiltonian.size} but `observable` is {self.observable.size}x"
                f"{self.observable.size}; they must act on the same space."
            )
        self.hermitian = (
            self.hamiltonian.is_hermitian() and self.observable.is_hermitian()
        )

    def levels(self, t, state, estimate, checks):
        del state
        api = "hierax.HeisenbergHierarchy(...)(t)"
        return observable_levels(self, cast(Array, t), (), estimate, api, checks)


def observable_levels(
    hierarchy: Any,
    t: Array,
    jump_operators: tuple[AbstractTimeOperator, ...],
    estimate: bool,
    api: str,
    checks: list[tuple[Array, str]],
) -> Levels:
    """The carried levels of an observable's hierarchy at `t`: under the Heisenberg
    generator $i[H, \\cdot]$ without `jump_operators`, under the adjoint
    Lindbladian with them (`hierarchy` has a `hamiltonian`, an `observable`, an
    `order`, a `time_scale` and the `hermitian` flag)."""
    order = hierarchy.order
    hamiltonian, observable = hierarchy.hamiltonian, hierarchy.observable
    constant = (
        hamiltonian.is_constant
        and observable.is_constant
        and all(op.is_constant for op in jump_operators)
    )
    width = 0 if constant else order

    def probe():
        h, x = hamiltonian.term_series(t, 3, None), observable.term_series(t, 3, None)
        jumps = [op.term_series(t, 3, None) for op in jump_operators]
        return combined_rate([growth_rate(h, x), *jump_rate(jumps)])

    probe_dtype = _complex_dtype(hierarchy)
    scale = (
        jnp.ones((), jnp.finfo(probe_dtype).dtype)
        if constant
        else _time_scale(hierarchy, probe, probe_dtype, api, checks)
    )
    time_scale = None if constant else scale
    h = hamiltonian.term_series(t, width, time_scale)
    x = observable.term_series(t, width, time_scale)
    jumps = [op.term_series(t, width, time_scale) for op in jump_operators]
    dtype = _complex_dtype(hierarchy, h, x, *jumps)
    scale = scale.astype(jnp.finfo(dtype).dtype)
    jumps = [cast_series(jump, dtype) for jump in jumps]
    hermitian = (
        hierarchy.hermitian
        and h.dense is None
        and x.dense is None
        and not jnp.iscomplexobj(h.coefficients)
        and not jnp.iscomplexobj(x.coefficients)
    )
    generator = scaled_generator(h, scale, dtype)
    right: TermSeries | None = None
    if jumps:
        number = scaled_series(number_series(jumps, dtype), scale)
        generator, right = two_sided(generator, number, -1.0)
    series = x.full().astype(dtype)
    if hermitian:
        # The flag was set from the matrices at construction; refuse matrices that
        # were swapped for non-Hermitian ones since (e.g. by `eqx.tree_at`).
        ok = _hermitian_matrices(h) & _hermitian_matrices(x)
        checks.append(
            (
                ~ok,
                f"`{api}`: the hierarchy was built for Hermitian matrices and they "
                "have been replaced by non-Hermitian ones; build a new "
                f"{type(hierarchy).__name__}.",
            )
        )
    levels = lindblad_levels(
        generator, right, jumps, scale, series, order, hermitian, estimate
    )
    if constant:
        return levels
    k = jnp.arange(order + 1, dtype=levels.exponents.dtype)
    exponents = levels.exponents - k * jnp.log2(scale.astype(k.dtype))
    return Levels(levels.values, exponents, levels.errors)
