"""The public hierarchies: Heisenberg derivatives, propagator derivatives and nested
commutators."""

from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Complex, Float, Inexact

from ._algorithms import (
    Levels,
    finish_errors,
    finish_levels,
    heisenberg_levels,
    propagator_errors,
    propagator_series,
    without_trace,
)
from ._custom_types import OrderLike, TimeLike, typechecked
from ._interop import as_matrix, as_state
from ._jit import module_jit, run_if
from ._operators import (
    AbstractTimeOperator,
    OperatorSum,
    ScaledOperator,
    TimeOperator,
    to_operator,
)
from ._series import TermSeries
from ._time_scale import default_time_scale, growth_rate
from ._validation import (
    as_numeric_array,
    as_square_matrix,
    as_time,
    check_order,
    check_time_finite,
    is_traced,
)


def _complex_dtype(module: eqx.Module, *series: Any) -> jnp.dtype:
    """The complex dtype of a computation: from the module's own array leaves (so a
    parameter given as a Python number stays weakly typed and never widens float32
    matrices), the states, and the dense series of callables (whose output dtype
    only a trace reveals). The time never widens it."""
    leaves = [x for x in jax.tree_util.tree_leaves(module) if eqx.is_array(x)]
    dense = [part.dense for part in series if isinstance(part, TermSeries)]
    others = [part for part in series if not isinstance(part, TermSeries)]
    arrays = leaves + [d for d in dense if d is not None] + others
    return jnp.result_type(*arrays, jnp.complex64)


def _is_hermitian(operator: AbstractTimeOperator) -> bool:
    """Whether every constant matrix of `operator` is known here to be exactly
    Hermitian (concrete values; callables and traced matrices are not known). With
    real time functions, which the compiled call checks from their dtype, the
    operator is then Hermitian at every time."""
    if isinstance(operator, TimeOperator):
        m = operator.matrices
        if isinstance(m, tuple):
            return all(matrix.is_hermitian() for matrix in m)
        if is_traced(m):
            return False
        m = np.asarray(m)
        return bool(np.array_equal(m, np.conj(np.swapaxes(m, -1, -2))))
    if isinstance(operator, OperatorSum):
        return all(_is_hermitian(op) for op in operator.operators)
    if isinstance(operator, ScaledOperator):
        return _is_hermitian(operator.operator)
    return False


def _checked_time(module: eqx.Module, t: Array, api: str) -> Array:
    """Inside the compiled call: an error at run time, naming the call, if `t` or any
    parameter or matrix of the module is not finite (values a user's jit or vmap
    hides from the eager checks)."""
    t = check_time_finite(t, api)
    leaves = [
        x
        for x in jax.tree_util.tree_leaves(module)
        if eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    if not leaves:
        return t
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
    return eqx.error_if(
        t,
        ~finite,
        f"`{api}`: every parameter and matrix must be finite (a nan or inf reached "
        "the compiled call).",
    )


def _call_checks(module: eqx.Module, t: Array, api: str) -> list[tuple[Array, str]]:
    """What `_checked_time` checks, as (predicate, message) pairs for `_raise_if`."""
    checks = [(~jnp.isfinite(t), f"`{api}`: `t` must be finite.")]
    leaves = [
        x
        for x in jax.tree_util.tree_leaves(module)
        if eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    if leaves:
        # One reduction over every entry (not one per leaf).
        finite = jnp.all(jnp.concatenate([jnp.isfinite(x).ravel() for x in leaves]))
        checks.append(
            (
                ~finite,
                f"`{api}`: every parameter and matrix must be finite (a nan or inf "
                "reached the compiled call).",
            )
        )
    return checks


def _raise_if(x: Any, checks: list[tuple[Array, str]]) -> Any:
    """`x`, with a run-time error carrying the message of the first failed check: all
    checks of a call in one `eqx.branched_error_if` (one branch in the compiled
    program instead of one per check)."""
    failed = [jnp.asarray(p).reshape(()) for p, _ in checks]
    # The first failed check, 0 where none failed (under vmap, equinox reports the
    # largest index in the batch: one that failed).
    index = jnp.asarray(0)
    for i in reversed(range(len(checks))):
        index = jnp.where(failed[i], i, index)
    any_failed = failed[0]
    for p in failed[1:]:
        any_failed = any_failed | p
    return eqx.branched_error_if(x, any_failed, index, [m for _, m in checks])


def _hermitian_matrices(terms: TermSeries) -> Array:
    """Inside the compiled call: whether the term matrices are exactly Hermitian."""
    m = terms.matrices
    return jnp.all(m == jnp.conj(jnp.swapaxes(m, -1, -2)))


class AbstractHierarchy(eqx.Module):
    """Base class of the hierarchies: a stack of levels $0, \\ldots, K$ of some
    operator recursion, evaluated in one compiled call whose size does not depend on
    the order $K$."""

    order: eqx.AbstractVar[int]


_TIME_SCALE_DOC = """`time_scale`: optional $s > 0$: the unit of time in which the
            series are carried (coefficient k as $X_k s^k / k!$), rescaled at the
            end. The result does not depend on it; it only keeps the carried
            numbers in floating-point range. By default it is chosen at each call
            from a cheap estimate of how fast the series grow (the norms of the
            Hamiltonian's parts and its drive frequencies) and rounded to a power
            of two, so physical units (energies of $10^{10}$ rad/s, times in
            seconds) work as they are. An explicit value is used as given within a
            factor 16 of the automatic one and clipped to that window outside it
            (where float32 would lose levels to underflow or overflow). A traced
            value: changing it never recompiles."""


def _check_time_scale(scale: Any, api: str) -> Array | None:
    if scale is None:
        return None
    array = as_numeric_array(scale, "time_scale", api)
    if array.ndim != 0 or jnp.iscomplexobj(array):
        raise ValueError(f"`{api}`: `time_scale` must be a real scalar, got {scale!r}.")
    if not is_traced(array):
        value = float(array)
        if not (0 < value < float("inf")):
            raise ValueError(
                f"`{api}`: `time_scale` must be positive and finite, got {value}."
            )
    return array


def _time_scale(
    module: Any,
    rate: Any,
    dtype: Any,
    api: str,
    checks: list[tuple[Array, str]] | None = None,
) -> Array:
    """The unit of time of a call: automatic from the growth estimate `rate()`, or
    the module's explicit one (checked when traced), kept within a factor
    `_WINDOW` of the automatic choice, outside which the carried numbers would leave
    floating-point range (zeros or infinities in float32). Within the window it is
    used exactly as given. With `checks`, the check of an explicit value is appended
    there (for `_raise_if`) instead of raised here."""
    rdtype = jnp.finfo(dtype).dtype
    automatic = default_time_scale(rate(), module.order, dtype)
    if module.time_scale is None:
        return automatic
    scale = module.time_scale.astype(rdtype)
    bad = ~(jnp.isfinite(scale) & (scale > 0))
    message = f"`{api}`: `time_scale` must be positive and finite."
    if checks is None:
        scale = eqx.error_if(scale, bad, message)
    else:
        checks.append((bad, message))
    return jnp.clip(scale, automatic / _WINDOW, automatic * _WINDOW)


_WINDOW = 16.0


def _scaled_generator(h: TermSeries, scale: Array, dtype: Any) -> TermSeries:
    """The series of $G(\\sigma) = i s H(t + s\\sigma)$, shifted by a multiple of
    the identity (see `without_trace`): $s$ goes into the scalar coefficients (kept
    real where they are), $i$ into the matrices."""
    rdtype = jnp.finfo(dtype).dtype
    complex_coefficients = jnp.iscomplexobj(h.coefficients)
    coefficients = h.coefficients.astype(dtype if complex_coefficients else rdtype)
    h = without_trace(
        TermSeries(
            coefficients,
            h.matrices.astype(dtype),
            None if h.dense is None else h.dense.astype(dtype),
            h.constant,
        )
    )
    dense = None if h.dense is None else 1j * scale * h.dense
    return TermSeries(h.coefficients * scale, 1j * h.matrices, dense, h.constant)


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
    hermitian: bool = eqx.field(static=True)

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
        - TIME_SCALE
        """
        api = "hierax.HeisenbergHierarchy"
        self.order = check_order(order, api)
        self.time_scale = _check_time_scale(time_scale, api)
        self.hamiltonian = to_operator(hamiltonian, "hamiltonian", api)
        self.observable = to_operator(observable, "observable", api)
        if self.hamiltonian.size != self.observable.size:
            raise ValueError(
                f"`{api}`: `hamiltonian` is {self.hamiltonian.size}x"
                f"{self.hamiltonian.size} but `observable` is {self.observable.size}x"
                f"{self.observable.size}; they must act on the same space."
            )
        self.hermitian = _is_hermitian(self.hamiltonian) and _is_hermitian(
            self.observable
        )

    @typechecked
    def __call__(self, t: TimeLike) -> Complex[Array, "order_plus_1 n n"]:
        """All levels at time `t`.

        **Arguments:**

        - `t`: the time, a real (or complex) scalar.

        **Returns:**

        An array of shape `(order + 1, n, n)`: $X_0(t), X_1(t), \\ldots, X_K(t)$.
        A level whose true value overflows reads $\\pm\\infty$ (never nan).
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

    @typechecked
    def error_estimate(self, t: TimeLike) -> Float[Array, " order_plus_1"]:
        """An estimate of each level's relative rounding error at `t`, computed
        alongside the levels (about the cost of one more call).

        Level k's estimate is that of level k-1 plus the rounding committed at
        level k: the unit roundoff $\\epsilon/2$ times the size of what its matrix
        products and derivative add up against the size of the level itself, plus
        two roundings of its own (so a level
        that is small against its parts is charged for the cancellation), plus the
        rounding of the final factor $k!/s^k$ applied in log space. It holds for
        the relative error $\\|X_k - \\tilde X_k\\|_F / \\|X_k\\|_F$ of the
        levels and of their normalised values alike.

        What it does not model: amplification of earlier rounding by parts of $H$
        that commute with the exact levels but not with the rounding errors (a
        far-detuned spectator written in a basis that mixes it with the rest);
        there the rounding of the input matrices themselves limits every method.
        A level that is exactly zero because everything it is computed from is
        zero gets 0; a level that cancels to exactly zero gets inf. For a level
        that overflows (reads inf), the estimate describes the value before the
        overflow.

        **Arguments:**

        - `t`: the time, a real (or complex) scalar.

        **Returns:**

        An array of shape `(order + 1,)`, real, in the hierarchy's precision.
        """
        t = as_time(t, "hierax.HeisenbergHierarchy(...).error_estimate(t)")
        return _heisenberg_errors(self, t)


HeisenbergHierarchy.__init__.__doc__ = (
    HeisenbergHierarchy.__init__.__doc__ or ""
).replace("TIME_SCALE", _TIME_SCALE_DOC)


def _heisenberg_levels(
    hierarchy: HeisenbergHierarchy, t: Array, estimate: bool = False
) -> Levels:
    api = "hierax.HeisenbergHierarchy(...)(t)"
    checks = _call_checks(hierarchy, t, api)
    found: list[tuple[Array, str]] = []  # checks the computation itself adds

    def compute():
        found.clear()
        levels = _heisenberg_compute(hierarchy, t, estimate, api, found)
        return (
            levels.values.real,
            levels.values.imag,
            levels.exponents,
            levels.errors,
            [p for p, _ in found],
        )

    # The work runs only for a finite t (the call raises otherwise), in a branch of
    # its own (see `run_if`).
    re, im, exponents, errors, failed = run_if(jnp.isfinite(t), compute)
    checks += [(p, message) for p, (_, message) in zip(failed, found, strict=True)]
    # Every check at once, on what the call returns (so none is optimised away).
    values, errors = _raise_if((lax.complex(re, im), errors), checks)
    return Levels(values, exponents, errors)


def _heisenberg_compute(
    hierarchy: HeisenbergHierarchy,
    t: Array,
    estimate: bool,
    api: str,
    checks: list[tuple[Array, str]],
) -> Levels:
    order = hierarchy.order
    hamiltonian, observable = hierarchy.hamiltonian, hierarchy.observable
    constant = hamiltonian.is_constant and observable.is_constant
    width = 0 if constant else order
    probe = lambda: growth_rate(  # noqa: E731
        hamiltonian.term_series(t, 3, None), observable.term_series(t, 3, None)
    )
    probe_dtype = _complex_dtype(hierarchy)
    scale = (
        jnp.ones((), jnp.finfo(probe_dtype).dtype)
        if constant
        else _time_scale(hierarchy, probe, probe_dtype, api, checks)
    )
    h = hamiltonian.term_series(t, width, None if constant else scale)
    x = observable.term_series(t, width, None if constant else scale)
    dtype = _complex_dtype(hierarchy, h, x)
    hermitian = (
        hierarchy.hermitian
        and h.dense is None
        and x.dense is None
        and not jnp.iscomplexobj(h.coefficients)
        and not jnp.iscomplexobj(x.coefficients)
    )
    generator = _scaled_generator(h, scale.astype(jnp.finfo(dtype).dtype), dtype)
    series = x.full().astype(dtype)
    if hermitian:
        # The flag was set from the matrices at construction; refuse matrices that
        # were swapped for non-Hermitian ones since (e.g. by `eqx.tree_at`).
        common = jnp.result_type(h.matrices, x.matrices)
        m = jnp.concatenate([h.matrices.astype(common), x.matrices.astype(common)])
        ok = jnp.all(m == jnp.conj(jnp.swapaxes(m, -1, -2)))
        checks.append(
            (
                ~ok,
                f"`{api}`: the hierarchy was built for Hermitian matrices and they "
                "have been replaced by non-Hermitian ones; build a new "
                "HeisenbergHierarchy.",
            )
        )
    levels = heisenberg_levels(generator, series, order, hermitian, estimate)
    if constant:
        return levels
    k = jnp.arange(order + 1, dtype=levels.exponents.dtype)
    exponents = levels.exponents - k * jnp.log2(scale.astype(k.dtype))
    return Levels(levels.values, exponents, levels.errors)


def _heisenberg_impl(hierarchy: HeisenbergHierarchy, t: Array, normalised: bool):
    return finish_levels(_heisenberg_levels(hierarchy, t), normalised)


def _heisenberg_errors_impl(hierarchy: HeisenbergHierarchy, t: Array):
    return finish_errors(_heisenberg_levels(hierarchy, t, estimate=True), False)


_heisenberg = module_jit(_heisenberg_impl)
_heisenberg_errors = module_jit(_heisenberg_errors_impl)


class PropagatorDerivatives(AbstractHierarchy):
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
        - TIME_SCALE
        """
        api = "hierax.PropagatorDerivatives"
        self.order = check_order(order, api)
        self.hamiltonian = to_operator(hamiltonian, "hamiltonian", api)
        self.time_scale = _check_time_scale(time_scale, api)

    @typechecked
    def __call__(
        self, t: TimeLike, state: Any
    ) -> Complex[Array, "order_plus_1 n *rest"]:
        """All derivatives at `t`.

        **Arguments:**

        - `t`: the time, a scalar.
        - `state`: $U(t)$: a propagator of shape `(n, n)` (never a density
            matrix, see above), a state vector of shape `(n,)`, or several states
            as columns, `(n, m)`.

        **Returns:**

        An array of shape `(order + 1, *state.shape)`: $U(t), U'(t), \\ldots,
        U^{(K)}(t)$.
        """
        api = "hierax.PropagatorDerivatives(...)(t, state)"
        t = as_time(t, api)
        return _propagator(self, t, self._check_state(state, api), normalised=False)

    @typechecked
    def normalised(
        self, t: TimeLike, state: Any
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
        return _propagator(self, t, self._check_state(state, api), normalised=True)

    @typechecked
    def error_estimate(self, t: TimeLike, state: Any) -> Float[Array, " order_plus_1"]:
        """An estimate of the relative rounding error of each derivative
        $U^{(k)}(t)$ (and of $U^{(k)}/k!$), computed alongside: coefficient k is a
        sum of products $h_m u_{k-1-m}$, each carrying the estimate of its $u$ plus
        its own rounding ($\\sqrt{n}\\,\\epsilon$), weighed by its size against the
        result's; plus the rounding of the final factor applied in log space.

        **Arguments:**

        - `t`: the time, a scalar.
        - `state`: $U(t)$, shape `(n,)`, `(n, n)` or `(n, m)`.

        **Returns:**

        An array of shape `(order + 1,)`, real.
        """
        api = "hierax.PropagatorDerivatives(...).error_estimate(t, state)"
        t = as_time(t, api)
        return _propagator_errors(self, t, self._check_state(state, api))

    def _check_state(self, state: Any, api: str) -> Array:
        state = as_state(state, "state", api)
        state = as_numeric_array(state, "state", api, finite=True)
        n = self.hamiltonian.size
        if state.ndim not in (1, 2) or state.shape[0] != n:
            raise ValueError(
                f"`{api}`: `state` must have shape ({n},) or ({n}, m) to match the "
                f"{n}x{n} `hamiltonian`, got shape {tuple(state.shape)}."
            )
        return state


PropagatorDerivatives.__init__.__doc__ = (
    PropagatorDerivatives.__init__.__doc__ or ""
).replace("TIME_SCALE", _TIME_SCALE_DOC)


def _propagator_levels(
    derivatives: PropagatorDerivatives, t: Array, state: Array, estimate: bool
) -> Levels:
    api = "hierax.PropagatorDerivatives(...)(t, state)"
    t = _checked_time(derivatives, t, api)
    state = eqx.error_if(
        state, ~jnp.all(jnp.isfinite(state)), f"`{api}`: `state` must be finite."
    )
    order = derivatives.order
    hamiltonian = derivatives.hamiltonian
    # States keep sparse terms sparse (one sparse product per term and order).
    probe = lambda: growth_rate(hamiltonian.sparse_series(t, 3, None), None)  # noqa: E731
    probe_dtype = _complex_dtype(derivatives, state)
    scale = _time_scale(derivatives, probe, probe_dtype, api)
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
    series = propagator_series(h, state.astype(dtype), order)
    errors = propagator_errors(h, series) if estimate else None
    # Coefficient k is s^k U^(k) / k!; carried as one level each, exponent -k log2 s.
    exponents = -jnp.arange(order + 1, dtype=rdtype) * jnp.log2(scale)
    return Levels(series, exponents, errors)


def _propagator_impl(
    derivatives: PropagatorDerivatives, t: Array, state: Array, normalised: bool
) -> Array:
    return finish_levels(_propagator_levels(derivatives, t, state, False), normalised)


def _propagator_errors_impl(
    derivatives: PropagatorDerivatives, t: Array, state: Array
) -> Array:
    return finish_errors(_propagator_levels(derivatives, t, state, True), False)


_propagator_errors = module_jit(_propagator_errors_impl)
_propagator = module_jit(_propagator_impl)


class NestedCommutators(AbstractHierarchy):
    """Nested commutators $(\\mathrm{ad}_G)^k X = [G, [G, \\ldots [G, X]]]$ for
    $k = 0..K$ with a constant generator $G$: the Heisenberg hierarchy of a
    time-independent Hamiltonian is the special case $G = iH$.

    Each level is renormalised by a power of two as it is computed, so levels are
    exact whatever the norm of $G$, a level that overflows reads $\\pm\\infty$, and
    an exact zero stays zero.
    """

    generator: Inexact[Array, "n n"]
    operator: Inexact[Array, "n n"]
    order: int = eqx.field(static=True)

    def __init__(self, generator: Any, operator: Any, order: OrderLike):
        """**Arguments:**

        - `generator`: $G$, an `(n, n)` matrix (an array, or a constant QuTiP or
            dynamiqs operator).
        - `operator`: $X$, an `(n, n)` matrix, in the same forms.
        - `order`: the highest nesting depth $K$, a non-negative Python int.
        """
        api = "hierax.NestedCommutators"
        self.order = check_order(order, api)
        generator = as_matrix(generator, "generator", api)
        operator = as_matrix(operator, "operator", api)
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


def _nested_impl(commutators: NestedCommutators) -> Array:
    api = "hierax.NestedCommutators"
    dtype = jnp.result_type(commutators.generator, commutators.operator)
    g, x = commutators.generator.astype(dtype), commutators.operator.astype(dtype)
    ok = jnp.all(jnp.isfinite(g)) & jnp.all(jnp.isfinite(x))
    x = eqx.error_if(x, ~ok, f"`{api}`: `generator` and `operator` must be finite.")
    generator = without_trace(TermSeries(jnp.ones((1, 1), dtype), g[None], None))
    levels = heisenberg_levels(generator, x[None], commutators.order, hermitian=False)
    return finish_levels(levels, normalised=False)


_nested = module_jit(_nested_impl)
