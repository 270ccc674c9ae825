"""Open systems: the Heisenberg hierarchy under a Lindblad generator, and all time
derivatives of a density matrix (the kernels: `_kernels/lindblad.py` and
`_kernels/density.py`)."""

from typing import Any, ClassVar, cast

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike

from .._core import OrderLike, check_order
from .._kernels.density import density_generator, density_series, generator_sizes
from .._kernels.heisenberg import Levels
from .._kernels.propagator import perturbation_spread, series_errors
from .._operators import (
    AbstractTimeOperator,
    check_jump_operators,
    to_operator,
)
from ._base import (
    AbstractHierarchy,
    MatrixEngine,
    _check_time_scale,
    _complex_dtype,
    _time_scale,
)
from ._heisenberg import observable_levels
from ._time_scale import combined_rate, growth_rate, jump_rate


class LindbladHierarchy(AbstractHierarchy[Array]):
    """The Heisenberg hierarchy of an observable under a Lindblad master equation
    ($\\hbar = 1$):

    $$X_0(t) = X(t), \\qquad X_k(t) = \\mathcal{L}_t^+[X_{k-1}(t)] +
      \\frac{d}{dt} X_{k-1}(t),$$

    $$\\mathcal{L}_t^+[X] = i[H, X] + \\sum_j \\Big(L_j^\\dagger X L_j -
      \\tfrac12 \\{L_j^\\dagger L_j, X\\}\\Big),$$

    the adjoint (Heisenberg-picture) Lindbladian, with $H$ and every $L_j$ possibly
    time-dependent. For a density matrix evolving under the dual equation
    ([`hierax.DensityMatrixDerivatives`][]),
    $\\frac{d^k}{dt^k} \\mathrm{tr}\\big(X_0 \\rho(t)\\big) = \\mathrm{tr}\\big(X_k(t)
    \\rho(t)\\big)$ whenever $X_0$ is constant, and in general $X_k$ is what the
    $k$-th derivative of the observable looks like in the Heisenberg picture of
    the open system. With no jump operators it is [`hierax.HeisenbergHierarchy`][].

    Algorithm: the direct Taylor recursion of
    [`hierax.HeisenbergHierarchy`][], level by level on truncated series, with
    the commutator replaced by the generator's series: the Hamiltonian and
    $N = \\sum_j L_j^\\dagger L_j$ enter as $GY - YR$ with $G = iH - N/2$,
    $R = iH + N/2$ term by term (the Hamiltonian's trace part removed, so an offset
    $H + cI$ costs no digits), and each $L_j^\\dagger Y L_j$ as two products in a
    row, $Q = YL$ then $L^\\dagger Q$. Cost per coefficient update: one matrix
    product per term of $H$ and $N$ together (constant terms merged into one
    matrix; Hermitian $H$ and $X$ with real time functions) or two, plus two per
    term of each jump operator; between $K^2$ updates in all (small $n K$: one
    phase carries every coefficient) and about $0.56 K^2$ (large $n K$: the levels
    are carried in up to eight phases of shrinking width), $K$ when everything is
    constant. Each update also forms the scalar-weighted sums of its time-dependent
    terms and renormalises by powers of two, $O(K n^2)$ work beside the products
    (measured at $n = 32$, $K = 20$, three jump operators: 0.6-1.2 times the
    product count in two runs, the products being faster in a batch than one at a
    time). Memory: a
    few $(K+1) \\times n \\times n$ arrays.

    Called as `hierarchy(t)`, a real time; the error estimate is
    [`hierax.HeisenbergHierarchy`][]'s, with the size of what the dissipator's
    products add up (both products of each sandwich, the first's rounding carried
    through the second) in each level's share.

    !!! example

        ```python
        import jax.numpy as jnp
        import hierax

        sz = jnp.array([[1.0, 0], [0, -1]])
        sm = jnp.array([[0.0, 0], [1, 0]])  # lowers |0> = (1, 0) to |1>
        hierarchy = hierax.LindbladHierarchy(
            0.5 * sz, [jnp.sqrt(0.1) * sm], sz, order=6
        )
        levels = hierarchy(0.0)  # shape (7, 2, 2)
        ```
    """

    hamiltonian: AbstractTimeOperator
    jump_operators: tuple[AbstractTimeOperator, ...]
    observable: AbstractTimeOperator
    order: int = eqx.field(static=True)
    arguments: ClassVar[tuple[str, ...]] = ("t",)
    time_scale: Array | None
    hermitian: bool = eqx.field(static=True)
    engine: MatrixEngine

    def __init__(
        self,
        hamiltonian: Any,
        jump_operators: Any,
        observable: Any,
        order: OrderLike,
        *,
        time_scale: ArrayLike | None = None,
    ):
        """**Arguments:**

        - `hamiltonian`: $H(t)$, in any form [`hierax.HeisenbergHierarchy`][]
            accepts.
        - `jump_operators`: a list (or tuple) of the $L_j(t)$, each in the same
            forms (e.g. `jnp.sqrt(gamma) * sigma_minus`,
            `hierax.Exp(-0.3) * sigma_minus`, a callable); rates go into the
            operators. `[]` for a closed system. As in [`hierax.mesolve`][], one
            operator given alone is one jump operator, and an `(J, n, n)` array
            is J of them.
        - `observable`: $X_0(t)$, in the same forms, of the same size.
        - `order`: the highest level $K$, a non-negative Python int.
        - `time_scale`: optional $s > 0$, the unit of time in which the series
            are carried (see [`hierax.AbstractHierarchy`][]).
        """
        api = "hierax.LindbladHierarchy"
        self.order = check_order(order, api)
        self.time_scale = _check_time_scale(time_scale, api)
        self.engine = MatrixEngine()
        self.hamiltonian = to_operator(hamiltonian, "hamiltonian", api)
        n = self.hamiltonian.size
        self.jump_operators = check_jump_operators(jump_operators, n, api)
        self.observable = to_operator(observable, "observable", api)
        if self.observable.size != n:
            raise ValueError(
                f"`{api}`: `hamiltonian` is {n}x{n} but `observable` is "
                f"{self.observable.size}x{self.observable.size}; they must act on "
                "the same space."
            )
        self.hermitian = (
            self.hamiltonian.is_hermitian() and self.observable.is_hermitian()
        )

    def levels(self, t, state, estimate, checks):
        del state
        api = "hierax.LindbladHierarchy(...)(t)"
        jumps = self.jump_operators
        return observable_levels(self, cast(Array, t), jumps, estimate, api, checks)


class DensityMatrixDerivatives(AbstractHierarchy[Array]):
    """All time derivatives $\\rho^{(k)}(t)$, $k = 0..K$, of a density matrix
    under the Lindblad master equation ($\\hbar = 1$), given $\\rho(t)$:

    $$\\rho' = \\mathcal{L}_t[\\rho] = -i[H, \\rho] + \\sum_j \\Big(L_j \\rho
      L_j^\\dagger - \\tfrac12 \\{L_j^\\dagger L_j, \\rho\\}\\Big),$$

    with $H$ and every $L_j$ possibly time-dependent; the derivatives are total
    derivatives along the flow (for a time-dependent generator,
    $\\rho'' = \\mathcal{L}_t[\\rho'] + \\dot{\\mathcal{L}}_t[\\rho]$, and so on).

    The normalised coefficients follow
    $r_{j+1} = \\frac{1}{j+1} \\sum_{m \\le j} \\mathcal{L}_m[r_{j-m}]$ with
    $r_0 = \\rho(t)$ and $\\mathcal{L}_m$ the Taylor coefficients of the generator,
    one coefficient per step, as [`hierax.PropagatorDerivatives`][] does for
    $U' = -iHU$. Cost per order: two matrix products per term of $H$ and
    $N = \\sum_j L_j^\\dagger L_j$ together (two in all when they are constant),
    and two per term of each jump operator; $K$ orders. A time-dependent term
    also forms a scalar-weighted sum over earlier coefficients, $O(K n^2)$ per
    order, which at $n = 32$, $K = 20$ weighs about as much as the products
    (measured: 1.7-2.1x the product count; [`hierax.mesolve`][] steps with a kernel
    that also keeps diagonal and real matrices apart). Memory: a few
    $(K+1) \\times n \\times n$ arrays. The Hamiltonian's trace part is removed
    (the commutator does not see it), so an offset $H + cI$ costs no digits.

    Called as `derivatives(t, rho)` with $\\rho(t)$ an `(n, n)` matrix (any
    operator works: the equation is linear), or a QuTiP or dynamiqs density
    matrix or ket (a ket $|\\psi\\rangle$ is read as
    $|\\psi\\rangle\\langle\\psi|$); returns $\\rho(t), \\rho'(t), \\ldots,
    \\rho^{(K)}(t)$, shape `(order + 1, n, n)`. The error estimate is
    [`hierax.PropagatorDerivatives`][]'s, with the size of each coefficient of the
    generator's series (Hamiltonian, anticommutator and sandwiches) in place of
    $\\|h_m\\|$.

    !!! example

        ```python
        import jax.numpy as jnp
        import hierax

        sz = jnp.array([[1.0, 0], [0, -1]])
        sm = jnp.array([[0.0, 0], [1, 0]])
        derivatives = hierax.DensityMatrixDerivatives(
            0.5 * sz, [jnp.sqrt(0.1) * sm], order=6
        )
        rho = jnp.array([[0.5, 0.5], [0.5, 0.5]])
        out = derivatives(0.0, rho)  # shape (7, 2, 2): rho, rho', ..., rho^(6)
        ```
    """

    hamiltonian: AbstractTimeOperator
    jump_operators: tuple[AbstractTimeOperator, ...]
    order: int = eqx.field(static=True)
    arguments: ClassVar[tuple[str, ...]] = ("t", "rho")
    time_scale: Array | None
    engine: MatrixEngine

    def __init__(
        self,
        hamiltonian: Any,
        jump_operators: Any,
        order: OrderLike,
        *,
        time_scale: ArrayLike | None = None,
    ):
        """**Arguments:**

        - `hamiltonian`: $H(t)$, in any form [`hierax.HeisenbergHierarchy`][]
            accepts.
        - `jump_operators`: a list (or tuple) of the $L_j(t)$, in the same forms,
            rates included in the operators; `[]` for a closed system. As in
            [`hierax.mesolve`][], one operator given alone is one jump operator,
            and an `(J, n, n)` array is J of them.
        - `order`: the highest derivative $K$, a non-negative Python int.
        - `time_scale`: optional $s > 0$, the unit of time in which the series
            are carried (see [`hierax.AbstractHierarchy`][]).
        """
        api = "hierax.DensityMatrixDerivatives"
        self.order = check_order(order, api)
        self.time_scale = _check_time_scale(time_scale, api)
        self.engine = MatrixEngine()
        self.hamiltonian = to_operator(hamiltonian, "hamiltonian", api)
        self.jump_operators = check_jump_operators(
            jump_operators, self.hamiltonian.size, api
        )

    def levels(self, t, state, estimate, checks):
        t, state = cast(Array, t), cast(Array, state)
        return _density_levels(self, t, state, estimate, checks)


def _density_levels(
    derivatives: DensityMatrixDerivatives,
    t: Array,
    rho: Array,
    estimate: bool,
    checks: list[tuple[Array, str]],
) -> Levels:
    api = "hierax.DensityMatrixDerivatives(...)(t, rho)"
    order = derivatives.order
    hamiltonian = derivatives.hamiltonian
    operators = derivatives.jump_operators

    def probe():
        rates = [growth_rate(hamiltonian.term_series(t, 3, None), None)]
        return combined_rate(
            rates + jump_rate([op.term_series(t, 3, None) for op in operators])
        )

    probe_dtype = _complex_dtype(derivatives, rho)
    scale = _time_scale(derivatives, probe, probe_dtype, api, checks)
    h = hamiltonian.term_series(t, order, scale)
    jumps = [op.term_series(t, order, scale) for op in operators]
    dtype = _complex_dtype(derivatives, h, rho, *jumps)
    rdtype = jnp.finfo(dtype).dtype
    scale = scale.astype(rdtype)
    left, right, jumps = density_generator(h, jumps, scale, dtype)
    series = density_series(left, right, jumps, scale, rho.astype(dtype), order)
    errors = None
    if estimate:
        sizes = generator_sizes(left, right, jumps, scale)
        # The same recursion from a random start: how fast rounding errors grow.
        spread = perturbation_spread(
            lambda start: density_series(left, right, jumps, scale, start, order),
            series[0],
        )
        errors = series_errors(sizes, series, spread)
    exponents = -jnp.arange(order + 1, dtype=rdtype) * jnp.log2(scale)
    return Levels(series, exponents, errors)
