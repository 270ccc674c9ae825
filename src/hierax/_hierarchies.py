"""The public hierarchies: Heisenberg derivatives, propagator derivatives and nested
commutators."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Complex, Inexact

from ._algorithms import heisenberg_series, nested_commutators, propagator_series
from ._custom_types import OrderLike, TimeLike, typechecked
from ._jit import module_jit
from ._operators import AbstractTimeOperator, TermSeries, as_operator
from ._series import factorial_scale, unscale_series
from ._validation import (
    as_numeric_array,
    as_square_matrix,
    as_time,
    check_order,
    check_time_finite,
)


def _complex_dtype(module: eqx.Module, *series: Any) -> jnp.dtype:
    """The complex dtype of a computation: from the module's own array leaves (so a
    parameter given as a Python number stays weakly typed and never widens float32
    matrices), the other arguments, and the dense series of callables (whose output
    dtype only a trace reveals)."""
    leaves = [x for x in jax.tree_util.tree_leaves(module) if eqx.is_array(x)]
    dense = [part.dense for part in series if isinstance(part, TermSeries)]
    others = [part for part in series if not isinstance(part, TermSeries)]
    arrays = leaves + [d for d in dense if d is not None] + others
    return jnp.result_type(*arrays, jnp.complex64)


class AbstractHierarchy(eqx.Module):
    """Base class of the hierarchies: a stack of levels $0, \\ldots, K$ of some
    operator recursion, evaluated in one compiled call whose size does not depend on
    the order $K$."""

    order: eqx.AbstractVar[int]


class HeisenbergHierarchy(AbstractHierarchy):
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

    Algorithm, chosen from the structure given: if both $H$ and $X$ are constant,
    $X_k = (i\\,\\mathrm{ad}_H)^k X$ ($K$ commutators). Otherwise propagator
    conjugation: the Taylor series of $V(\\tau) = U(t+\\tau)U(t)^{-1}$ from
    $V' = -iH(t+\\tau)V$, then $Y(\\tau) = V^{-1} X(t+\\tau) V$, whose normalised
    coefficients are $X_k / k!$. With $H = \\sum_a f_a(t) H_a$ this costs $2A$ matrix
    products per order (for $V$ and $V^{-1}$) plus about $K^2/2$ for the last
    product, with at most three $(K+1) \\times n \\times n$ arrays alive at once.
    Calls are compiled once per structure (`eqx.filter_jit` semantics, with a fast
    dispatch path when every leaf is an array): new times or parameter values never
    recompile.

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

    hamiltonian: AbstractTimeOperator
    observable: AbstractTimeOperator
    order: int = eqx.field(static=True)
    time_scale: Array | None

    def __init__(
        self,
        hamiltonian: Any,
        observable: Any,
        order: OrderLike,
        time_scale: ArrayLike | None = None,
    ):
        """**Arguments:**

        - `hamiltonian`: $H(t)$: a [`hierax.TimeOperator`][] (e.g.
            `hierax.Cos(w) * sy + sz`), any [`hierax.AbstractTimeOperator`][], a
            constant `(n, n)` matrix, or a JAX callable `t -> (n, n)`.
        - `observable`: $X_0(t)$, accepted in the same forms, of the same size.
        - `order`: the highest level $K$, a non-negative Python int.
        - `time_scale`: optional $s > 0$ (at most $10^6$). The series are then carried
            in the rescaled time $\\tau = s\\sigma$, coefficient k as
            $X_k s^k / k!$, and rescaled at the end. The result is the same; choose
            $s \\approx K / (e \\rho)$, with $\\rho$ about $2\\|H\\|$ plus the drive
            frequencies, when $X_k / k!$ would otherwise underflow (small $H$ at high
            orders, float32 especially). A traced value: changing it never
            recompiles. Used by propagator conjugation (not by nested commutators,
            which need no rescaling).
        """
        api = "hierax.HeisenbergHierarchy"
        self.order = check_order(order, api)
        self.time_scale = _check_time_scale(time_scale, api)
        self.hamiltonian = as_operator(hamiltonian, "hamiltonian", api)
        self.observable = as_operator(observable, "observable", api)
        if self.hamiltonian.size != self.observable.size:
            raise ValueError(
                f"`{api}`: `hamiltonian` is {self.hamiltonian.size}x"
                f"{self.hamiltonian.size} but `observable` is {self.observable.size}x"
                f"{self.observable.size}; they must act on the same space."
            )

    @property
    def algorithm(self) -> str:
        """`"nested commutators"` or `"propagator conjugation"`: what a call runs."""
        if self.hamiltonian.is_constant and self.observable.is_constant:
            return "nested commutators"
        return "propagator conjugation"

    @typechecked
    def __call__(self, t: TimeLike) -> Complex[Array, "order_plus_1 n n"]:
        """All levels at time `t`.

        **Arguments:**

        - `t`: the time, a real (or complex) scalar.

        **Returns:**

        An array of shape `(order + 1, n, n)`: $X_0(t), X_1(t), \\ldots, X_K(t)$.
        """
        t = as_time(t, "hierax.HeisenbergHierarchy(...)(t)")
        return _heisenberg(self, t, normalised=False)

    @typechecked
    def normalised(self, t: TimeLike) -> Complex[Array, "order_plus_1 n n"]:
        """All levels divided by $k!$, for high orders where $X_k$ itself overflows.

        **Arguments:**

        - `t`: the time, a real (or complex) scalar.

        **Returns:**

        An array of shape `(order + 1, n, n)`: $X_k(t) / k!$ for $k = 0..K$, the
        Taylor coefficients of the Heisenberg-picture observable around `t`.
        """
        t = as_time(t, "hierax.HeisenbergHierarchy(...).normalised(t)")
        return _heisenberg(self, t, normalised=True)


def _check_time_scale(scale: Any, api: str) -> Array | None:
    if scale is None:
        return None
    array = as_numeric_array(scale, "time_scale", api)
    if array.ndim != 0 or jnp.iscomplexobj(array):
        raise ValueError(f"`{api}`: `time_scale` must be a real scalar, got {scale!r}.")
    if not isinstance(array, jax.core.Tracer):
        value = float(array)
        if not (0 < value <= MAX_TIME_SCALE):
            raise ValueError(
                f"`{api}`: `time_scale` must be in (0, {MAX_TIME_SCALE:g}], got "
                f"{value}."
            )
    return array


MAX_TIME_SCALE = 1e6


def _clipped(scale: Array | None) -> Array | None:
    # Traced values skip the check in __init__; keep them in the range the static
    # step counts of `unscale_series` allow.
    return (
        None if scale is None else jnp.clip(scale, 1 / MAX_TIME_SCALE, MAX_TIME_SCALE)
    )


def _times_scale(h: TermSeries, scale: Array) -> TermSeries:
    """`s H(t + s sigma)`: in the time sigma = tau / s, dU/dsigma = -i s H U."""
    dense = None if h.dense is None else h.dense * scale
    return TermSeries(h.coefficients * scale, h.matrices, dense)


def _heisenberg_impl(hierarchy: HeisenbergHierarchy, t: Array, normalised: bool):
    t = check_time_finite(t, "hierax.HeisenbergHierarchy(...)(t)")
    order = hierarchy.order
    if hierarchy.algorithm == "nested commutators":
        h = hierarchy.hamiltonian.taylor_terms(t, 0)
        x = hierarchy.observable.taylor_terms(t, 0)
        dtype = _complex_dtype(hierarchy, h, x, t)
        h = h.full()[0].astype(dtype)
        return nested_commutators(1j * h, x.full()[0].astype(dtype), order, normalised)
    scale = _clipped(hierarchy.time_scale)
    h = hierarchy.hamiltonian.taylor_terms(t, order, scale)
    x = hierarchy.observable.taylor_terms(t, order, scale)
    dtype = _complex_dtype(hierarchy, h, x, t)
    if scale is not None:
        h = _times_scale(h, scale)
    constant = hierarchy.observable.is_constant
    if scale is None:
        return heisenberg_series(h, x, dtype, constant, factorial=not normalised)
    series = heisenberg_series(h, x, dtype, constant)
    return unscale_series(series, scale, MAX_TIME_SCALE, factorial=not normalised)


_heisenberg = module_jit(_heisenberg_impl)


class PropagatorDerivatives(AbstractHierarchy):
    """All time derivatives of a propagator or state, $U^{(k)}(t)$, $k = 0..K$, for
    the Schrödinger equation $U'(t) = -i H(t) U(t)$, given $U(t)$.

    The normalised coefficients follow
    $u_{j+1} = -\\frac{i}{j+1} \\sum_{m \\le j} h_m u_{j-m}$ with $u_0 = U(t)$, and
    $U^{(k)}(t) = k!\\, u_k$. With a [`hierax.TimeOperator`][] Hamiltonian each order
    costs one matrix product per term.
    """

    hamiltonian: AbstractTimeOperator
    order: int = eqx.field(static=True)
    time_scale: Array | None

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
        - `time_scale`: optional $s > 0$, as for [`hierax.HeisenbergHierarchy`][]:
            the series is carried as $U^{(k)} s^k / k!$ and rescaled at the end, for
            orders where $U^{(k)} / k!$ would underflow.
        """
        api = "hierax.PropagatorDerivatives"
        self.order = check_order(order, api)
        self.hamiltonian = as_operator(hamiltonian, "hamiltonian", api)
        self.time_scale = _check_time_scale(time_scale, api)

    @typechecked
    def __call__(
        self, t: TimeLike, state: ArrayLike
    ) -> Complex[Array, "order_plus_1 n *rest"]:
        """All derivatives at `t`.

        **Arguments:**

        - `t`: the time, a scalar.
        - `state`: $U(t)$: a propagator of shape `(n, n)`, a state vector of shape
            `(n,)`, or several states as columns, `(n, m)`.

        **Returns:**

        An array of shape `(order + 1, *state.shape)`: $U(t), U'(t), \\ldots,
        U^{(K)}(t)$.
        """
        api = "hierax.PropagatorDerivatives(...)(t, state)"
        t = as_time(t, api)
        return _propagate(self, t, self._check_state(state, api), normalised=False)

    @typechecked
    def normalised(
        self, t: TimeLike, state: ArrayLike
    ) -> Complex[Array, "order_plus_1 n *rest"]:
        """The derivatives divided by $k!$ (the Taylor coefficients of $U$ around
        `t`), for high orders.

        **Arguments:**

        - `t`: the time, a scalar.
        - `state`: $U(t)$, shape `(n,)`, `(n, n)` or `(n, m)`.

        **Returns:**

        An array of shape `(order + 1, *state.shape)`: $U^{(k)}(t) / k!$.
        """
        api = "hierax.PropagatorDerivatives(...).normalised(t, state)"
        t = as_time(t, api)
        return _propagate(self, t, self._check_state(state, api), normalised=True)

    def _check_state(self, state: Any, api: str) -> Array:
        state = as_numeric_array(state, "state", api)
        n = self.hamiltonian.size
        if state.ndim not in (1, 2) or state.shape[0] != n:
            raise ValueError(
                f"`{api}`: `state` must have shape ({n},) or ({n}, m) to match the "
                f"{n}x{n} `hamiltonian`, got shape {tuple(state.shape)}."
            )
        return state


@module_jit
def _propagate(
    derivatives: PropagatorDerivatives, t: Array, state: Array, normalised: bool
) -> Array:
    t = check_time_finite(t, "hierax.PropagatorDerivatives(...)(t, state)")
    scale = _clipped(derivatives.time_scale)
    h = derivatives.hamiltonian.taylor_terms(t, derivatives.order, scale)
    dtype = _complex_dtype(derivatives, h, state, t)
    if scale is not None:
        h = _times_scale(h, scale)
    series = propagator_series(h, state.astype(dtype), derivatives.order)
    if scale is not None:
        return unscale_series(series, scale, MAX_TIME_SCALE, factorial=not normalised)
    return series if normalised else factorial_scale(series)


class NestedCommutators(AbstractHierarchy):
    """Nested commutators $(\\mathrm{ad}_G)^k X = [G, [G, \\ldots [G, X]]]$ for
    $k = 0..K$ with a constant generator $G$: the Heisenberg hierarchy of a
    time-independent Hamiltonian is the special case $G = iH$.
    """

    generator: Inexact[Array, "n n"]
    operator: Inexact[Array, "n n"]
    order: int = eqx.field(static=True)

    def __init__(self, generator: ArrayLike, operator: ArrayLike, order: OrderLike):
        """**Arguments:**

        - `generator`: $G$, an `(n, n)` matrix.
        - `operator`: $X$, an `(n, n)` matrix.
        - `order`: the highest nesting depth $K$, a non-negative Python int.
        """
        api = "hierax.NestedCommutators"
        self.order = check_order(order, api)
        self.generator = as_square_matrix(generator, "generator", api)
        self.operator = as_square_matrix(operator, "operator", api)
        if self.generator.shape != self.operator.shape:
            raise ValueError(
                f"`{api}`: `generator` has shape {tuple(self.generator.shape)} but "
                f"`operator` has shape {tuple(self.operator.shape)}; they must match."
            )

    @typechecked
    def __call__(self) -> Inexact[Array, "order_plus_1 n n"]:
        """**Returns:**

        An array of shape `(order + 1, n, n)`: $(\\mathrm{ad}_G)^k X$ for
        $k = 0..K$.
        """
        return _nested(self)


@module_jit
def _nested(commutators: NestedCommutators) -> Array:
    dtype = jnp.result_type(commutators.generator, commutators.operator)
    return nested_commutators(
        commutators.generator.astype(dtype),
        commutators.operator.astype(dtype),
        commutators.order,
    )
