"""The derivatives of a propagator, a state or states under $U' = -iH(t)U$."""

from typing import Any, ClassVar, cast

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
)
from .._kernels.propagator import (
    perturbation_spread,
    propagator_errors,
    state_series,
)
from .._operators import (
    AbstractTimeOperator,
    to_operator,
)
from ._base import (
    AbstractHierarchy,
    MatrixEngine,
    _check_time_scale,
    _complex_dtype,
    _time_scale,
)
from ._time_scale import growth_rate


class PropagatorDerivatives(AbstractHierarchy[Array]):
    """All time derivatives of a propagator or state, $U^{(k)}(t)$, $k = 0..K$, for
    the Schrödinger equation $U'(t) = -i H(t) U(t)$, given $U(t)$.

    The normalised coefficients follow
    $u_{j+1} = -\\frac{i}{j+1} \\sum_{m \\le j} h_m u_{j-m}$ with $u_0 = U(t)$, and
    $U^{(k)}(t) = k!\\, u_k$. With a [`hierax.TimeOperator`][] Hamiltonian each order
    costs one matrix product per term. Each coefficient is a sum whose largest term
    has the size of the result, so the recursion loses no digits to offsets or
    spectators.

    A square state `(n, n)` is always read as a propagator (or as $n$ kets side by
    side), never as a density matrix: $\\rho' = -i[H, \\rho]$ is a different
    equation, which [`hierax.DensityMatrixDerivatives`][] solves (with no jump
    operators for a closed system). States may also be QuTiP or dynamiqs kets and
    operators (a ket `(n, 1)` is read as `(n,)`).

    Called as `derivatives(t, state)` with $U(t)$: a propagator of shape `(n, n)`,
    a state vector `(n,)`, or several states as columns `(n, m)`; returns
    $U(t), U'(t), \\ldots, U^{(K)}(t)$, shape `(order + 1, *state.shape)`. Error
    estimate: coefficient k is a sum of products $h_m u_{k-1-m}$, each carrying the
    estimate of its $u$ plus its own rounding ($\\sqrt{n}\\,\\epsilon$), weighed by
    its size against the result's; plus the rounding of the final factor applied in
    log space. The estimates carried from earlier coefficients grow per order as a
    perturbation does, measured by the same recursion from a random start (so
    the estimate costs about two more calls), where that is below the bound
    $\\|h_0\\|$; underflow is carried at the bound.
    """

    hamiltonian: AbstractTimeOperator
    order: int = eqx.field(static=True)
    arguments: ClassVar[tuple[str, ...]] = ("t", "state")
    time_scale: Array | None
    engine: MatrixEngine

    def __init__(
        self,
        hamiltonian: Any,
        order: OrderLike,
        time_scale: ArrayLike | None = None,
    ):
        """**Arguments:**

        - `hamiltonian`: $H(t)$, in any form [`hierax.HeisenbergHierarchy`][]
            accepts.
        - `order`: the highest derivative $K$, a non-negative Python int.
        - `time_scale`: optional $s > 0$, the unit of time in which the series
            are carried (see [`hierax.AbstractHierarchy`][]).
        """
        api = "hierax.PropagatorDerivatives"
        self.order = check_order(order, api)
        self.hamiltonian = to_operator(hamiltonian, "hamiltonian", api)
        self.time_scale = _check_time_scale(time_scale, api)
        self.engine = MatrixEngine()

    def levels(self, t, state, estimate, checks):
        t, state = cast(Array, t), cast(Array, state)
        return _propagator_levels(self, t, state, estimate, checks)


def _propagator_levels(
    derivatives: PropagatorDerivatives,
    t: Array,
    state: Array,
    estimate: bool,
    checks: list[tuple[Array, str]],
) -> Levels:
    api = "hierax.PropagatorDerivatives(...)(t, state)"
    order = derivatives.order
    hamiltonian = derivatives.hamiltonian
    # States keep sparse terms sparse (one sparse product per term and order).
    probe = lambda: growth_rate(  # noqa: E731
        hamiltonian.sparse_series(t, 3, None), None, commutator=False
    )
    probe_dtype = _complex_dtype(derivatives, state)
    scale = _time_scale(derivatives, probe, probe_dtype, api, checks)
    h = hamiltonian.sparse_series(t, order, scale)
    dtype = _complex_dtype(derivatives, h, state)
    rdtype = jnp.finfo(dtype).dtype
    scale = scale.astype(rdtype)
    h = h.astype(dtype)
    dense = None if h.dense is None else h.dense * scale
    sparse = h.sparse
    if sparse is not None:
        sparse = sparse._replace(coefficients=sparse.coefficients * scale)
    h = TermSeries(h.coefficients * scale, h.matrices, dense, h.constant, sparse)
    # The time scale is already in the series: a factor of one per order.
    factor = jnp.ones((order + 1,), rdtype)
    series = state_series(None, h, factor, state, order)
    errors = None
    if estimate:
        # The same recursion from a random start: how fast rounding errors grow.
        spread = perturbation_spread(
            lambda start: state_series(None, h, factor, start, order), series[0]
        )
        errors = propagator_errors(h, series, spread)
    # Coefficient k is s^k U^(k) / k!; carried as one level each, exponent -k log2 s.
    exponents = -jnp.arange(order + 1, dtype=rdtype) * jnp.log2(scale)
    return Levels(series, exponents, errors)
