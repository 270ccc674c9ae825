"""The public hierarchies: Heisenberg derivatives, propagator derivatives and nested
commutators."""

import abc
import functools
from typing import Any, ClassVar, Generic, TypeVar, cast, overload

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Inexact

from .._core import (
    OrderLike,
    TimeLike,
    as_numeric_array,
    as_square_matrix,
    as_time,
    check_order,
    is_traced,
    module_jit,
    run_checked,
    run_if,
    typechecked,
)
from .._data import TermSeries
from .._kernels.heisenberg import (
    Levels,
    finish_errors,
    finish_levels,
    heisenberg_levels,
    scaled_generator,
    without_trace,
)
from .._kernels.lindblad import (
    cast_series,
    lindblad_levels,
    number_series,
    scaled_series,
    two_sided,
)
from .._kernels.propagator import propagator_errors, state_series
from .._operators import (
    AbstractTimeOperator,
    PauliHierarchy,
    PauliSum,
    PauliTimeSum,
    as_matrix,
    as_state,
    check_chain,
    to_operator,
)
from ._time_scale import combined_rate, default_time_scale, growth_rate, jump_rate


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


def _call_checks(
    module: "AbstractHierarchy", t: Array | None, state: Array | None, api: str
) -> list[tuple[Array, str]]:
    """The checks of a call's values, as (predicate of failure, message) pairs for
    `_raise_if`: a finite time, finite parameters and matrices, a finite state."""
    checks = []
    if t is not None:
        checks.append((~jnp.isfinite(t), f"`{api}`: `t` must be finite."))
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
    if state is not None:
        name = cast(tuple[str, ...], module.arguments)[1]
        checks.append(
            (
                ~jnp.all(jnp.isfinite(state)),
                f"`{api}`: `{name}` must be finite (it holds a nan or inf).",
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


# What a hierarchy's call gives: an array of levels, or, for Pauli sums, a list of
# `PauliSum` levels.
LevelsT = TypeVar("LevelsT", Array, list[PauliSum])


class AbstractEngine(eqx.Module):
    """How a hierarchy computes its levels, chosen when the hierarchy is built from
    the structure of its operators: `MatrixEngine` for matrices (dense, sparse,
    callables), `PauliEngine` for Pauli sums. A hierarchy holds its engine in the
    field `engine`, and the public methods of `AbstractHierarchy` check their
    arguments and call it, whatever the kind of operators.

    The one method is `__call__`, not a named one: a method looked up on an
    Equinox module builds a bound-method module, tens of microseconds on every
    call of the hierarchy."""

    @abc.abstractmethod
    def __call__(
        self,
        hierarchy: "AbstractHierarchy",
        arguments: tuple[Array, ...],
        *,
        normalised: bool,
        errors: bool,
    ) -> Any:
        """The levels of `hierarchy` at its checked `arguments` (`()`, `(t,)` or
        `(t, state)`), divided by $k!$ when `normalised`; with `errors`, each
        level's estimated relative rounding error instead (shape `(order + 1,)`)."""


class MatrixEngine(AbstractEngine):
    """Matrices: the hierarchy's own `levels` on the matrix kernels, in one compiled
    call with the checks of the call's values (`_evaluate`)."""

    def __call__(self, hierarchy, arguments, *, normalised, errors):
        return run_checked(
            _evaluate, hierarchy, *arguments, normalised=normalised, errors=errors
        )


class PauliEngine(AbstractEngine):
    """Pauli sums: the recursion of [`hierax.PauliHierarchy`][], levels as lists of
    [`hierax.PauliSum`][]s. It has no error estimate: the levels are exact up to
    rounding while the strings fit the capacity."""

    recursion: PauliHierarchy

    def __call__(self, hierarchy, arguments, *, normalised, errors):
        if errors:
            raise TypeError(
                f"`hierax.{type(hierarchy).__name__}(...).error_estimate`: not "
                "available for Pauli sums; their levels are exact up to rounding "
                "while the strings fit the capacity, and each level's `dropped` "
                "reports the weight truncation removed."
            )
        # Read from the class: from the module, a method is a bound-method module.
        levels = PauliHierarchy.normalised if normalised else PauliHierarchy.__call__
        return levels(self.recursion, *arguments)


def _refuse_mixed(api: str, pauli: str, name: str, value: Any) -> TypeError:
    return TypeError(
        f"`{api}`: `{pauli}` is a Pauli sum, so `{name}` must be one too "
        f"(a `hierax.PauliSum`), got {type(value).__name__}; for matrices "
        "give both as matrices (`PauliSum.todense()`)."
    )


@functools.singledispatch
def _pauli_engine(
    hamiltonian: Any,
    observable: Any,
    order: int,
    capacity: int | None,
    api: str,
    names: tuple[str, str],
) -> PauliEngine | None:
    """The engine the structure of `hamiltonian` (or `-i` times a generator) asks
    for beside `observable`, when it is not a matrix: Pauli sums (registered below)
    run their own recursion. Anything else answers None, and the hierarchy converts
    it to a matrix operator and runs a `MatrixEngine`; a Pauli `observable` beside
    it, or a `capacity`, is refused here."""
    del order
    if isinstance(observable, (PauliSum, PauliTimeSum)):
        raise _refuse_mixed(api, names[1], names[0], hamiltonian)
    if capacity is not None:
        raise TypeError(
            f"`{api}`: `capacity` is the room for strings of Pauli sums; "
            "matrices take none (leave it out)."
        )
    return None


@_pauli_engine.register(PauliSum)
@_pauli_engine.register(PauliTimeSum)
def _(hamiltonian, observable, order, capacity, api, names):
    if not isinstance(observable, (PauliSum, PauliTimeSum)):
        raise _refuse_mixed(api, names[0], names[1], observable)
    if isinstance(observable, PauliTimeSum):
        raise TypeError(
            f"`{api}`: `{names[1]}` must be a constant `hierax.PauliSum`, got a "
            "time-dependent `hierax.PauliTimeSum`."
        )
    check_chain(hamiltonian, observable, api, names)
    return PauliEngine(PauliHierarchy(hamiltonian, observable, order, capacity))


@functools.singledispatch
def _commutator_engine(
    generator: Any, operator: Any, order: int, capacity: int | None, api: str
) -> PauliEngine | None:
    """`_pauli_engine` for nested commutators $[G, \\cdot]$: with $H = -iG$ for a
    Pauli generator, which must be constant."""
    return _pauli_engine(
        generator, operator, order, capacity, api, ("generator", "operator")
    )


@_commutator_engine.register
def _(generator: PauliSum, operator, order, capacity, api):
    # i [H, X] = [G, X] with H = -i G.
    return _pauli_engine(
        generator * -1j, operator, order, capacity, api, ("generator", "operator")
    )


@_commutator_engine.register
def _(generator: PauliTimeSum, operator, order, capacity, api):
    del operator, order, capacity
    raise TypeError(
        f"`{api}`: `generator` must be constant (a `hierax.PauliSum`), got a "
        "time-dependent `hierax.PauliTimeSum`; its hierarchy is "
        "`hierax.HeisenbergHierarchy`."
    )


class AbstractHierarchy(eqx.Module, Generic[LevelsT]):
    """Base class of the hierarchies: a stack of levels $0, \\ldots, K$ of some
    operator recursion, evaluated in one compiled call whose size does not depend on
    the order $K$.

    A hierarchy is called with the arguments its class names in `arguments`: a time
    `t` (most), a time and a state (the derivatives of a propagator, state or
    density matrix), or nothing (nested commutators of constant matrices).
    `__call__` gives the levels, `normalised` the levels divided by $k!$ (for high
    orders, where the levels themselves overflow), `error_estimate` an estimate of
    each level's relative rounding error. Subclasses implement one method,
    `levels`, which runs inside the compiled call; the checks of the arguments
    (before compiling) and of the values (inside the compiled program, at once) are
    the base's. Hierarchies of Pauli sums ([`hierax.HeisenbergHierarchy`][],
    [`hierax.NestedCommutators`][]) run the recursion of
    [`hierax.PauliHierarchy`][] instead: the structure of the operators chooses,
    when the hierarchy is built, what its public methods run.

    Time scale: the hierarchies of matrices carry their series in a unit of time
    $s > 0$ (coefficient k as $X_k s^k / k!$), rescaled at the end. The result
    does not depend on it; it only keeps the carried numbers in floating-point
    range. By default it is chosen at each call from a cheap estimate of how fast
    the series grow (the norms of the Hamiltonian's parts and its drive
    frequencies) and rounded to a power of two, so physical units (energies of
    $10^{10}$ rad/s, times in seconds) work as they are. An explicit `time_scale`
    is used as given within a factor 16 of the automatic one and clipped to that
    window outside it (where float32 would lose levels to underflow or overflow).
    It is a traced value: changing it never recompiles.
    """

    order: eqx.AbstractVar[int]
    arguments: eqx.AbstractClassVar[tuple[str, ...]]
    engine: eqx.AbstractVar[AbstractEngine]

    @abc.abstractmethod
    def levels(
        self,
        t: Array | None,
        state: Array | None,
        estimate: bool,
        checks: list[tuple[Array, str]],
    ) -> Levels:
        """The carried levels at `t` (and `state`), inside the compiled call, with
        the rounding-error estimate when `estimate`. Value checks of its own go on
        `checks` as (predicate of failure, message) pairs."""

    @typechecked
    def __call__(self, t: TimeLike | None = None, state: Any = None) -> LevelsT:
        """All levels.

        **Arguments:**

        - `t`: the time, a real (or complex) scalar (not for
            [`hierax.NestedCommutators`][]).
        - `state`: the state the derivatives start from, for the hierarchies that
            take one ([`hierax.PropagatorDerivatives`][]: a propagator `(n, n)`, a
            state `(n,)` or states as columns `(n, m)`;
            [`hierax.DensityMatrixDerivatives`][]: a density matrix `(n, n)`).

        **Returns:**

        An array of shape `(order + 1, n, n)` (or `(order + 1, *state.shape)`):
        levels $0, 1, \\ldots, K$. A level whose true value overflows reads
        $\\pm\\infty$ (never nan). For Pauli sums
        ([`hierax.HeisenbergHierarchy`][], [`hierax.NestedCommutators`][]): a
        list of `order + 1` [`hierax.PauliSum`][]s.
        """
        arguments = _checked_arguments(self, "", t, state)
        return self.engine(self, arguments, normalised=False, errors=False)

    @typechecked
    def normalised(self, t: TimeLike | None = None, state: Any = None) -> LevelsT:
        """All levels divided by $k!$: the Taylor coefficients of the quantity the
        hierarchy differentiates, for high orders where the levels themselves
        overflow.

        **Arguments:** as `__call__`.

        **Returns:**

        What `__call__` returns, with level $k$ divided by $k!$.
        """
        arguments = _checked_arguments(self, ".normalised", t, state)
        return self.engine(self, arguments, normalised=True, errors=False)

    @typechecked
    def error_estimate(
        self, t: TimeLike | None = None, state: Any = None
    ) -> Float[Array, " order_plus_1"]:
        """An estimate of each level's relative rounding error, computed alongside
        the levels (about the cost of one more call); see each hierarchy for what
        it models. It holds for the levels and their normalised values alike.

        **Arguments:** as `__call__`.

        **Returns:**

        An array of shape `(order + 1,)`, real, in the hierarchy's precision.
        """
        arguments = _checked_arguments(self, ".error_estimate", t, state)
        return self.engine(self, arguments, normalised=False, errors=True)


def _checked_arguments(
    hierarchy: AbstractHierarchy, method: str, t: Any, state: Any
) -> tuple[Any, ...]:
    """The call's arguments, checked: `()`, `(t,)` or `(t, state)` (no `None`
    passes into the compiled call: JAX's fast dispatch takes arrays only). A
    function, not a method: looking a method up on an Equinox module builds a
    bound-method module, which cost 80 us a call (more than the seed's levels)."""
    names: tuple[str, ...] = hierarchy.arguments
    api = f"hierax.{type(hierarchy).__name__}(...){method}({', '.join(names)})"
    second = names[1] if len(names) > 1 else "state"
    given = [name for name, x in (("t", t), (second, state)) if x is not None]
    if given != list(names):
        takes = " and ".join(f"`{n}`" for n in names) or "no arguments"
        got = " and ".join(f"`{n}`" for n in given) or "none"
        raise TypeError(f"`{api}`: takes {takes}, got {got}.")
    if t is None:
        return ()
    # JAX arrays' values are checked by the compiled call (`_call_checks`), not read
    # back here.
    checked_t = as_time(t, api, in_program=True)
    if state is None:
        return (checked_t,)
    kind = second
    state = as_state(state, kind, api, density=kind == "rho")
    state = as_numeric_array(state, kind, api, finite=True, in_program=True)
    # The hierarchies that take a state have a Hamiltonian.
    n = cast(Any, hierarchy).hamiltonian.size
    return checked_t, _STATE_CHECKS[kind](state, n, api)


def _check_state(state: Array, n: int, api: str) -> Array:
    if state.ndim not in (1, 2) or state.shape[0] != n:
        raise ValueError(
            f"`{api}`: `state` must have shape ({n},) or ({n}, m) to match the "
            f"{n}x{n} `hamiltonian`, got shape {tuple(state.shape)}."
        )
    return state


def _check_rho(rho: Array, n: int, api: str) -> Array:
    if rho.ndim != 2 or rho.shape != (n, n):
        raise ValueError(
            f"`{api}`: `rho` must be a square matrix of shape ({n}, {n}) to match "
            f"the {n}x{n} `hamiltonian`, got shape {tuple(rho.shape)}."
        )
    return rho


# How the second argument of a call is checked, by the name the class gives it.
_STATE_CHECKS = {"state": _check_state, "rho": _check_rho}


def _evaluate_impl(
    hierarchy: AbstractHierarchy, *arguments: Array, normalised: bool, errors: bool
) -> Array:
    """The compiled call of every hierarchy: the checks of the call's values (a
    finite time, finite parameters and matrices, a finite state, and what the
    hierarchy's own `levels` adds) raised at once, on what the call returns, and
    the work in a branch of its own that runs only for a finite time (see
    `run_if`). `arguments`: `()`, `(t,)` or `(t, state)`."""
    t = arguments[0] if arguments else None
    state = arguments[1] if len(arguments) > 1 else None
    names = hierarchy.arguments
    api = f"hierax.{type(hierarchy).__name__}(...)({', '.join(names)})"
    checks = _call_checks(hierarchy, t, state, api)
    found: list[tuple[Array, str]] = []

    def compute():
        found.clear()
        levels = hierarchy.levels(t, state, errors, found)
        values = levels.values
        return (
            values.real,
            values.imag if jnp.iscomplexobj(values) else None,
            levels.exponents,
            levels.errors,
            [p for p, _ in found],
        )

    ok = jnp.asarray(True) if t is None else jnp.isfinite(t)
    re, im, exponents, estimates, failed = run_if(ok, compute)
    checks += [(p, message) for p, (_, message) in zip(failed, found, strict=True)]
    values = re if im is None else lax.complex(re, im)
    values, estimates = _raise_if((values, estimates), checks)
    levels = Levels(values, exponents, estimates)
    if errors:
        return finish_errors(levels, False)
    return finish_levels(levels, normalised)


# One compile per structure and flags; times, states and parameter values are
# traced (changing them never retraces).
_evaluate = module_jit(_evaluate_impl)


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
    checks: list[tuple[Array, str]],
) -> Array:
    """The unit of time of a call: automatic from the growth estimate `rate()`, or
    the module's explicit one (checked when traced), kept within a factor
    `_WINDOW` of the automatic choice, outside which the carried numbers would leave
    floating-point range (zeros or infinities in float32). Within the window it is
    used exactly as given. The check of an explicit value goes on `checks` (for
    `_raise_if`)."""
    rdtype = jnp.finfo(dtype).dtype
    automatic = default_time_scale(rate(), module.order, dtype)
    if module.time_scale is None:
        return automatic
    scale = module.time_scale.astype(rdtype)
    bad = ~(jnp.isfinite(scale) & (scale > 0))
    checks.append((bad, f"`{api}`: `time_scale` must be positive and finite."))
    return jnp.clip(scale, automatic / _WINDOW, automatic * _WINDOW)


_WINDOW = 16.0


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
        pauli = _pauli_engine(hamiltonian, observable, self.order, capacity, api, names)
        if pauli is not None:
            if time_scale is not None:
                raise TypeError(
                    f"`{api}`: `time_scale` is for matrices; Pauli sums carry each "
                    "level's scale as a power of two (leave it out)."
                )
            self.engine = pauli
            self.hamiltonian, self.observable = pauli.recursion.hamiltonian, observable
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
    log space.
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
    probe = lambda: growth_rate(hamiltonian.sparse_series(t, 3, None), None)  # noqa: E731
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
    series = state_series(None, h, jnp.ones((order + 1,), rdtype), state, order)
    errors = propagator_errors(h, series) if estimate else None
    # Coefficient k is s^k U^(k) / k!; carried as one level each, exponent -k log2 s.
    exponents = -jnp.arange(order + 1, dtype=rdtype) * jnp.log2(scale)
    return Levels(series, exponents, errors)


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
        pauli = _commutator_engine(generator, operator, self.order, capacity, api)
        if pauli is not None:
            self.engine = pauli
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
