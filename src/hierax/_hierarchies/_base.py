"""The base of the hierarchies: `AbstractHierarchy` (checks of a call's arguments,
then its engine), the two engines (the matrix kernels in one compiled call, or the
recursion of Pauli sums), the compiled evaluation with its value checks, and the
time scale."""

import abc
from typing import Any, Generic, TypeVar, cast

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._core import (
    TimeLike,
    as_numeric_array,
    as_time,
    is_traced,
    module_jit,
    raise_if,
    run_checked,
    run_if,
    typechecked,
)
from .._data import TermSeries
from .._kernels.heisenberg import (
    Levels,
    finish_errors,
    finish_levels,
)
from .._operators import (
    PauliHierarchy,
    PauliSum,
    as_state,
)
from ._time_scale import default_time_scale


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
    """`x`, with an error carrying the message of the first failed check: all
    checks of a call in one (`raise_if`)."""
    return raise_if(x, [p for p, _ in checks], [m for _, m in checks])


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
    the series grow (the spectral norms of the Hamiltonian's parts and its drive
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
