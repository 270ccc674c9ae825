"""The solve shared by `hierax.sesolve` and `hierax.mesolve`: the options checked,
the Taylor solver on diffrax with its step control, and the result, for any
`AbstractTaylorTerm`."""

import contextlib
import functools
import inspect
import math
import warnings
from collections.abc import Callable
from typing import Any, cast

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jaxtyping import Array, PyTree

from .._core import (
    GENERATOR_NORMS,
    OPTIONS_BUILT,
    Failure,
    at_top_level,
    check_bool,
    check_finite,
    complex_dtype,
    failure,
    flatten_module,
    float_dtype,
    module_jit,
    placement,
    raise_if,
    returned_failure,
    to_jax,
)
from .._data import available_memory
from .._operators import TermNorms, jump_times, term_norms
from ._lockstep import batched_in_lockstep
from ._options import (
    DEFAULT_ATOL,
    DEFAULT_MAX_STEPS,
    DEFAULT_RTOL,
    TaylorOptions,
    check_adjoint,
    check_max_steps,
    check_order,
    positive_value,
)
from ._resolution import callable_tangents
from ._solution import Solution
from ._solver import TaylorSolver, default_order
from ._term import AbstractTaylorTerm, SchrodingerTerm, UnitTimeTerm


# What QuTiP and dynamiqs users pass to their solvers, and what hierax calls it. One
# name per meaning: a foreign name is refused with the hierax spelling, not taken as
# an alias (an alias would be a second name in the docs, in completion and in every
# later error message).
_FOREIGN_NAMES = {
    "H": "`hamiltonian`, the first positional argument",
    "e_ops": "`exp_ops=`",
    "c_ops": "the jump operators, `mesolve`'s second positional argument "
    "(`hierax.mesolve(H, jump_operators, rho0, times)`)",
    "jump_ops": "the jump operators, `mesolve`'s second positional argument "
    "(`hierax.mesolve(H, jump_operators, rho0, times)`)",
    "tlist": "`times`, the third (`sesolve`) or fourth (`mesolve`) positional argument",
    "tsave": "`times`, the third (`sesolve`) or fourth (`mesolve`) positional argument",
    "psi0": "`state`, the second positional argument",
    "rho0": "`rho`, the third positional argument",
    "args": "the parameters inside the operators (e.g. `hierax.Cos(w) * sx`, with "
    "`w` an array: changing it never recompiles; a callable built with "
    "`takes_args=True` takes its `args` by `.with_args(args)`)",
    "method": "`order=` (hierax always steps with the Taylor method)",
    "gradient": "`adjoint=`, a diffrax adjoint (`diffrax.ForwardMode()` for "
    "forward mode)",
    "progress_meter": "`progress=True`",
    "solver": "`order=` (hierax always steps with the Taylor method)",
}


def keywords_checked(api: str) -> Callable[[Callable], Callable]:
    """Refuse a keyword the solver `api` does not take before Python binds the
    arguments: a QuTiP or dynamiqs call (`sesolve(H, psi0=psi, tlist=t)`) would
    otherwise fail first on the missing positional argument, and never reach the
    hint written for its keyword."""

    def decorate(fn: Callable) -> Callable:
        names = frozenset(
            name
            for name, parameter in inspect.signature(fn).parameters.items()
            if parameter.kind is not inspect.Parameter.VAR_KEYWORD
        )

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if not kwargs.keys() <= names:
                unknown = {k: v for k, v in kwargs.items() if k not in names}
                check_no_foreign_keywords(unknown, api)
            return fn(*args, **kwargs)

        return call

    return decorate


def check_no_foreign_keywords(unknown: dict[str, Any], api: str) -> None:
    """Refuse keyword arguments the solver does not take, naming the hierax
    spelling of QuTiP's and dynamiqs' (`e_ops`, `c_ops`, `tlist`, `options`, ...)."""
    if not unknown:
        return
    # A foreign name first: its hint says what the others are called too.
    name = next((k for k in unknown if k in _FOREIGN_NAMES), next(iter(unknown)))
    hint = _FOREIGN_NAMES.get(name)
    if hint is not None:
        raise TypeError(
            f"`{api}`: got `{name}=`, which is QuTiP's or dynamiqs' name; in hierax "
            f"it is {hint} (see the QuTiP / dynamiqs / hierax table in the docs' "
            "'Coming from QuTiP' page)."
        )
    raise TypeError(
        f"`{api}`: got an unexpected keyword argument `{name}=`; the options are "
        "`options` (a `hierax.TaylorOptions`) or its shorthands `rtol`, `atol`, "
        "`order`, `dt`, `max_steps` and `adjoint`; `exp_ops`, `progress` and "
        "`dense`."
    )


def read_state(x: Any, name: str, api: str) -> tuple[Array, bool]:
    """A state as an array, and whether its values were read here. Host data (a
    list, a NumPy array) is checked here (numeric, finite) and placed in its
    complex dtype; a JAX array, concrete or traced, is taken as it is (its dtype
    checked here, its values finite and its complex cast inside the compiled
    solve, without a transfer)."""
    if isinstance(x, jax.Array | Tracer):
        if x.dtype == jnp.bool_ or not jnp.issubdtype(x.dtype, jnp.number):
            raise ValueError(
                f"`{api}`: `{name}` must be a numeric array, got {x.dtype}."
            )
        return x, False
    if x is None:
        raise TypeError(f"`{api}`: `{name}` must be a numeric array, got None.")
    try:
        values = np.asarray(x)
    except (TypeError, ValueError):
        values = None
    if values is None or values.dtype.kind not in "iufc":
        kind = type(x).__name__ if values is None else f"{values.dtype}"
        if hasattr(x, "toarray") and hasattr(x, "tocoo"):
            # `np.asarray` wraps a scipy sparse matrix in an object array.
            raise ValueError(
                f"`{api}`: `{name}` must be a dense array, got a sparse "
                f"{type(x).__name__}; states are dense: pass `{name}.toarray()`."
            )
        raise ValueError(f"`{api}`: `{name}` must be a numeric array, got {kind}.")
    check_finite(values, name, api)
    dtype = complex_dtype(jax.dtypes.canonicalize_dtype(values.dtype))
    if values.dtype.kind in "fc" and np.finfo(values.dtype).max > np.finfo(dtype).max:
        # Narrowed: checked again in the dtype it is solved in (a finite float64
        # 1e39 is inf in complex64, x64 off, and ran to `max_steps` before).
        with np.errstate(over="ignore", invalid="ignore"):
            values = values.astype(np.dtype(dtype))
        check_finite(values, name, api)
    return to_jax(values, dtype), True


def per_precision(assemble: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`assemble(dtype)` (a term with its step's parts, assembled before
    compiling), kept per dtype: a term cached by `TermCache` assembles them once
    per precision, and the same dtype brings back the same object (whose
    flattened form and norms are then kept by identity)."""
    assembled: dict[Any, Any] = {}

    def parts(dtype: Any) -> Any:
        key = jnp.dtype(dtype)
        if key not in assembled:
            assembled[key] = assemble(key)
        return assembled[key]

    return parts


def _max_norm(x: PyTree) -> Array:
    """The largest absolute entry: each amplitude of the state is held to the
    tolerance (diffrax's default, the RMS norm, would let a few entries err more)."""
    return jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)) for leaf in jax.tree.leaves(x)]))


def _plain_key(api: str, shorthands: dict[str, Any]) -> tuple | None:
    """The whole input as a key when every keyword is None or a Python int, float
    or bool (exact types: `1`, `1.0` and `True` differ), else None."""
    if any(type(v) not in (int, float, bool, type(None)) for v in shorthands.values()):
        return None
    # With x64 and the default device, which decide the dtype and the place of the
    # arrays the options hold.
    values = ((k, type(v), v) for k, v in sorted(shorthands.items()))
    return (api, placement(), *values)


def _from_shorthands(api: str, shorthands: dict[str, Any]) -> TaylorOptions:
    """`hierax.TaylorOptions` from the flat keywords (`None`: the default), each
    checked here, naming `api` and the keyword, and then kept as it is."""
    rtol, atol, order, dt, max_steps, adjoint, throw = (
        shorthands.get(name)
        for name in ("rtol", "atol", "order", "dt", "max_steps", "adjoint", "throw")
    )
    return TaylorOptions(
        rtol=positive_value(DEFAULT_RTOL if rtol is None else rtol, "rtol", api),
        atol=positive_value(DEFAULT_ATOL if atol is None else atol, "atol", api),
        order=None if order is None else check_order(order, api),
        dt=None if dt is None else positive_value(dt, "dt", api),
        max_steps=(
            DEFAULT_MAX_STEPS if max_steps is None else check_max_steps(max_steps, api)
        ),
        adjoint=check_adjoint(adjoint, api),
        throw=True if throw is None else check_bool(throw, "throw", api),
    )


def resolve_options(options: Any, api: str, **shorthands: Any) -> TaylorOptions:
    """The solve's `hierax.TaylorOptions`: `options` as given, or built from the
    flat keywords `shorthands` (those left `None` at their defaults), checked with
    errors that name `api` and the keyword. Both at once is refused: one place
    for each setting."""
    given = [name for name, value in shorthands.items() if value is not None]
    if options is None:
        # The same keywords as Python numbers (the usual call) give the same
        # options object (`OPTIONS_BUILT`): a module is immutable, so one serves
        # every call.
        key = _plain_key(api, shorthands)
        hit = None if key is None else OPTIONS_BUILT.get(key)
        if hit is not None:
            return hit
        built = _from_shorthands(api, shorthands)
        return built if key is None else OPTIONS_BUILT.put(key, built)
    if not isinstance(options, TaylorOptions):
        hint = (
            " (QuTiP's options dict: `hierax.TaylorOptions(rtol=..., atol=...)`)"
            if isinstance(options, dict)
            else ""
        )
        raise TypeError(
            f"`{api}`: `options` must be a `hierax.TaylorOptions`, got "
            f"{type(options).__name__}{hint}."
        )
    if given:
        raise TypeError(
            f"`{api}`: got both `options=` and `{given[0]}=`; give each setting "
            f"once: in the options (`hierax.TaylorOptions({given[0]}=...)`) or as "
            "the keyword alone."
        )
    return options


def solve(
    with_known_parts: Callable[[Any], AbstractTaylorTerm],
    state: Array,
    times: Any,
    *,
    options: TaylorOptions,
    exp_ops: Array | None,
    progress: bool,
    dense: bool,
    api: str,
    expectation: Callable[[Array, Array], Array],
    state_name: str,
    state_checked: bool,
    exp_ops_checked: bool = True,
    max_steps_advice: str | None = None,
) -> Solution:
    """The solve shared by `sesolve` and `mesolve`: checks the times (the state's
    shape and the observables are the caller's) and runs the compiled solve with
    `options` (see `resolve_options`).
    `state_checked`: whether the caller read the state's values on the host (NumPy
    input: in its complex dtype, finite); a JAX array is checked (finite) and cast
    inside the program, `state_name` naming it; so are the observables (finite)
    unless `exp_ops_checked`. `expectation(exp_ops, states)`
    gives the expectation values of the caller's kind of state.
    `with_known_parts(dtype)`: the term with the step's parts assembled before
    compiling for the solve's complex dtype (fields of the term, `with_parts`).
    `max_steps_advice`: what the error says after `api` where the steps run out
    (a call built on this solve, such as `floquet`, names its own settings);
    `None` for `sesolve`'s and `mesolve`'s."""
    times, times_checked = _check_times(times, api)
    # The precision of the solve: the state's, widened by the times' as diffrax
    # widens the state (a complex64 state under float64 times is stepped in
    # complex128; its parts and order in complex64 left it 5e-9 off at rtol
    # 1e-12).
    dtype = solve_dtype(state, times)
    term = with_known_parts(dtype)
    rtol, atol, dt = options.rtol, options.atol, options.dt
    # Values held on the host (lists, NumPy arrays) were checked before; JAX
    # arrays, concrete or traced, are inside the program (`_checked`): reading a
    # device array back to the host would cost a round trip on every call. The
    # tolerances and the step are always JAX arrays there (numbers were checked by
    # `positive_value` too, and checking them again costs less than telling them
    # apart: 0.4 us of 114).
    checks = tuple(
        name
        for name, checked in (
            ("rtol", False),
            ("atol", False),
            ("dt", dt is None),
            ("times", times_checked),
            (state_name, state_checked),
            ("exp_ops", exp_ops_checked),
        )
        if not checked
    )
    order = options.order
    if order is None:
        order = default_order(dtype)
    max_steps = options.max_steps
    if dense:
        _check_dense_output(state, order, max_steps, api)
    with _forward_mode_hint(api):
        return _solve(
            term,
            state,
            times,
            rtol,
            atol,
            dt,
            exp_ops,
            # The first step's bound needs them; fixed steps do not.
            _generator_norms(term) if dt is None else None,
            order=order,
            max_steps=max_steps,
            control=(options.safety, options.pcoeff, options.icoeff, options.dcoeff),
            progress=progress,
            dense=dense,
            adjoint=_static_adjoint(options.adjoint),
            resolve_functions=_traced(term),
            api=api,
            expectation=expectation,
            checks=checks,
            throw=options.throw,
            max_steps_advice=max_steps_advice,
        )


def _traced(term: AbstractTaylorTerm) -> bool:
    """Whether a value of the equation is traced (by `jax.grad`, `jax.jvp`,
    `jax.jit`, `jax.vmap`): only then can the solve be differentiated with respect
    to it, and only a derivative needs the steps to resolve the time functions at
    amplitude 1 (`TaylorSolver`'s `resolve_functions`). Concrete values from
    Python skip that check, which costs each solve program about a tenth of its
    compile and nothing at run time. A value a callable reads from its closure
    counts too (`lambda t: p * g(t)` under `jax.grad` in `p`): it can only be
    traced inside a transformation, so a call from Python does not look (tracing
    the callable to look cost an eager solve of a network pulse 0.8 -> 3.5 ms)."""
    if any(isinstance(leaf, Tracer) for leaf in flatten_module(term).leaves):
        return True
    return not at_top_level() and bool(callable_tangents(term, jnp.zeros(())))


def _solve_impl(
    term: AbstractTaylorTerm,
    state: Array,
    times: Array,
    rtol: Array,
    atol: Array,
    dt: Array | None,
    exp_ops: Array | None,
    norms: tuple[TermNorms | None, ...] | None,
    **settings: Any,
) -> Solution:
    """The compiled solve: `_steps` with its static `settings`, a `sesolve` batch
    under `jax.vmap` in lockstep where it can be. The values are checked here,
    before the steps, and whether the steps reached the last time after them,
    once each: under `jax.vmap` the lockstep's rule traces `_steps` a second time,
    and each `eqx.error_if` costs its trace a walk of the Python stack (about 18
    ms; a call from Python collects its checks instead, `_checks`). With
    `throw=False` the checks' first failure is returned in the solution's
    `failure` instead, the states nan where one failed: no host callback."""
    checks, throw = settings.pop("checks"), settings.pop("throw")
    advice = settings.pop("max_steps_advice")
    api, max_steps = settings["api"], settings["max_steps"]
    values = (times, state, exp_ops, rtol, atol, dt)
    given, given_messages, owners, safe = _value_checks(*values, api, checks)
    if throw and given:
        values = raise_if(values, given, given_messages, safe)
    elif not throw:
        values = _own_safe(values, given, owners, safe)
    times, state, exp_ops, rtol, atol, dt = values
    solution = _stepped((term, state, times, rtol, atol, dt, exp_ops, norms), settings)
    solution, failed, messages = _reached(solution, api, max_steps, advice)
    if throw:
        return raise_if(solution, failed, messages)
    found = failure(
        [
            (f.code, f.messages)
            for f in (
                returned_failure(given, given_messages),
                returned_failure(failed, messages),
            )
        ]
    )
    return _with_failure(solution, found)


def _with_failure(solution: Solution, found: Failure) -> Solution:
    """`solution` with `found` as its `failure`, its states, final state and
    expectation values nan where a check failed (a result nobody checks is then
    never a wrong number)."""

    def blank(x: Array | None) -> Array | None:
        return None if x is None else jnp.where(found.succeeded, x, jnp.nan)

    return eqx.tree_at(
        lambda s: (s.states, s.final_state, s.expects, s.failure),
        solution,
        (
            blank(solution.states),
            blank(solution.final_state),
            blank(solution.expects),
            found,
        ),
        is_leaf=lambda x: x is None,
    )


def _stepped(inputs: tuple, settings: dict[str, Any]) -> Solution:
    """`_steps` of the checked `inputs`, in lockstep under `jax.vmap` where it can
    be (and mapped over no elements without a progress meter)."""
    term, state = inputs[:2]
    columns = (
        not settings["dense"] and isinstance(term, SchrodingerTerm) and state.ndim <= 2
    )
    progress = settings["progress"]
    if not (columns or progress):
        return _steps(*inputs, **settings)
    # Under `jax.vmap`, a batch of kets or propagators (`floquet`'s sweeps) that
    # shares its matrices, times and tolerances is stepped in lockstep
    # (`_lockstep`); alone, or differentiated, element by element. A batch of no
    # elements is solved without diffrax's progress meter, whose maximum over
    # the batch has no identity (a raw `ValueError`).
    arrays, static = eqx.partition(inputs, eqx.is_array)
    solve = functools.partial(_steps, **settings)
    quiet = functools.partial(_steps, **{**settings, "progress": False})
    return batched_in_lockstep(
        lambda arrays: solve(*eqx.combine(arrays, static)),
        arrays,
        static,
        solve if columns else None,
        # (`DirectAdjoint` differentiates both ways: through a `custom_jvp`, whose
        # derivative JAX transposes for reverse mode; a `custom_vjp` refused
        # `jax.jvp`.)
        isinstance(
            settings["adjoint"].value, diffrax.ForwardMode | diffrax.DirectAdjoint
        ),
        (lambda arrays: quiet(*eqx.combine(arrays, static))) if progress else None,
    )


def _steps(
    term: AbstractTaylorTerm,
    state: Array,
    times: Array,
    rtol: Array,
    atol: Array,
    dt: Array | None,
    exp_ops: Array | None,
    norms: tuple[TermNorms | None, ...] | None,
    *,
    order: int,
    max_steps: int,
    control: tuple[float, float, float, float],
    progress: bool,
    dense: bool,
    adjoint: "_Static",
    resolve_functions: bool,
    api: str,
    expectation: Callable[[Array, Array], Array],
) -> Solution:
    """The solve of `_solve_impl`, element by element (or a `ColumnsTerm`'s batch
    as the columns of its state), of values `_solve_impl` checked."""
    # JAX arrays given as they are, cast here (no eager operation, no transfer).
    if not jnp.issubdtype(times.dtype, jnp.floating):
        times = times.astype(float_dtype())
    state = state.astype(solve_dtype(state, times))
    # In the times' precision, as diffrax's controller keeps its state.
    rtol, atol = rtol.astype(times.dtype), atol.astype(times.dtype)
    t0, t1 = times[0], times[-1]
    span = t1 - t0
    knots = jump_times(*term.operators)
    # diffrax forms the bound 100 ULPs below t1 op by op: for a traced t1 that is a
    # program of a few thousand scalar operations, about a quarter of a second of
    # compile. On s in [0, 1] (t = t0 + s (t1 - t0), `UnitTimeTerm`) the bounds are
    # constants and it folds away. Knots of sampled pulses keep physical time:
    # there diffrax steps to just after each knot, which a rescaled knot could
    # miss by an ULP.
    unit = knots is None
    # Parts not assembled before compiling: once here, not in every step.
    term = term.with_program_parts(t0, state.dtype)
    controller, dt0 = _step_control(
        term, t0, t1, rtol, atol, dt, norms, knots, order, control
    )
    ends = times.shape[0] == 2
    # The first step is a choice of the control, with no derivative, and past the
    # end where it covers the span: diffrax takes `minimum(t0 + dt0, t1)`, and at a
    # tie JAX splits the derivative between the two (a one-step solve's derivative
    # with respect to t1 came out half the true one).
    covers = dt0 >= span
    if unit:
        solved: diffrax.AbstractTerm = UnitTimeTerm(term, t0, span)
        # (NumPy scalars: constants in the times' dtype.)
        start, end = np.zeros((), times.dtype), np.ones((), times.dtype)
        dt0 = jnp.where(covers, 2, dt0 / span)
        save_times = (times - t0) / span
    else:
        solved, start, end, save_times = term, t0, t1, times
        dt0 = jnp.where(covers, 2 * span, dt0)
    dt0 = jax.lax.stop_gradient(dt0)
    controller, dt0 = _FirstStep(controller, dt0), None
    if ends:
        # Only the ends: the last state saved as it is reached and the first one
        # given, so the program has no loop that evaluates the steps' series at
        # save times and no save at t0 (measured under load: 0.3-0.8 s less
        # compile than `SaveAt(ts=...)`).
        saveat = diffrax.SaveAt(t1=True, dense=dense)
    else:
        saveat = diffrax.SaveAt(ts=save_times, dense=dense)
    with warnings.catch_warnings():
        # diffrax warns on every complex state: its concern is solvers and norms
        # written for real arithmetic. It does not apply here: the Taylor solver's
        # step is exact complex arithmetic, its `y_error` is a modulus (real), and
        # the controller divides it by the state's modulus and takes `_max_norm`:
        # no real-only formula sees a complex number.
        warnings.filterwarnings("ignore", message="Complex dtype support")
        solution = diffrax.diffeqsolve(
            solved,
            # The default adjoint differentiates in reverse mode only.
            _with_norms(
                TaylorSolver(
                    order,
                    adjoint_steps=isinstance(
                        adjoint.value, diffrax.RecursiveCheckpointAdjoint
                    ),
                    resolve_functions=resolve_functions,
                ),
                norms,
            ),
            start,
            end,
            dt0,
            state,
            saveat=saveat,
            stepsize_controller=controller,
            adjoint=adjoint.value,
            max_steps=max_steps,
            progress_meter=(
                diffrax.TextProgressMeter() if progress else diffrax.NoProgressMeter()
            ),
            throw=False,
        )
    states = cast(Array, solution.ys)
    if ends:
        states = jnp.concatenate([state[None].astype(states.dtype), states])
    interpolation = solution.interpolation if dense else None
    if unit and interpolation is not None:
        interpolation = _physical_times(interpolation, t0, t1)
    expects = None if exp_ops is None else expectation(exp_ops, states)
    stats = {
        key: jnp.asarray(solution.stats[key])
        for key in ("num_steps", "num_accepted_steps", "num_rejected_steps")
    }
    stats["max_steps"] = jnp.asarray(max_steps)
    # Whether the steps reached the last time, checked by `_reached` (diffrax's
    # own check, `throw=True`, would cost each trace of the steps a walk of the
    # stack and every program a host callback).
    result = solution.result
    stats[_FAILED] = jnp.where(
        diffrax.is_okay(result),
        0,
        # (A fixed step's controller fails only where its step is far too long.)
        jnp.where(
            result == diffrax.RESULTS.max_steps_reached, 1, 2 if dt is None else 3
        ),
    )
    return Solution(
        times, states, expects, stats, order, interpolation, final_state=states[-1]
    )


def _with_norms(solver: TaylorSolver, norms: Any) -> TaylorSolver:
    """`solver` with the operators' `term_norms` (`None` for fixed steps)."""
    return eqx.tree_at(
        lambda s: s.generator_norms, solver, norms, is_leaf=lambda x: x is None
    )


# The key of `Solution.stats` that carries a failure of the steps from `_steps` to
# `_reached`: 0 where they reached the last time, 1 where they ran out of
# `max_steps`, 2 where diffrax reported another failure, 3 where a fixed step was
# far too long (`_FixedSteps`).
_FAILED = "failed"


def _reached(
    solution: Solution, api: str, max_steps: int, advice: str | None = None
) -> tuple[Solution, list[Array], list[str]]:
    """The solution without `_FAILED`, and the checks (flags and messages) that the
    steps reached the last time (`advice`: the caller's words where they ran out
    of `max_steps`, after `api`)."""
    failed = solution.stats[_FAILED]
    stats = {k: v for k, v in solution.stats.items() if k != _FAILED}
    solution = eqx.tree_at(lambda s: s.stats, solution, stats)
    if advice is None:
        advice = (
            f"the solve took `max_steps` = {max_steps} steps without reaching the "
            "last time. Raise `max_steps`, or loosen `rtol` and `atol` if that "
            "accuracy is enough."
        )
    messages = [
        f"`{api}`: {advice}",
        f"`{api}`: the solve stopped before the last time (diffrax reported "
        "a failed step).",
        f"`{api}`: the fixed step `dt` is far too long: a step's error "
        f"estimate is more than {FIXED_STEP_LIMIT:.0e} times the tolerances "
        "`atol + rtol * |state|` (its series does not converge). Pass a "
        "smaller `dt` (or a higher `order`), or leave `dt` unset for adaptive "
        "steps; or loosen `rtol` and `atol` if that accuracy is enough.",
    ]
    return solution, [failed == 1, failed == 2, failed == 3], messages


def _value_checks(
    times: Array,
    state: Array,
    exp_ops: Array | None,
    rtol: Array,
    atol: Array,
    dt: Array | None,
    api: str,
    checks: tuple,
) -> tuple[list[Array], list[str], list[int], tuple]:
    """The run-time checks (flags and messages) of the values `checks` names (the
    tolerances, `times`, `exp_ops`, the state's name): those that were JAX arrays
    (concrete or traced); values held on the host were checked before compiling.
    With each check, the index of the value it checks in `(times, state, exp_ops,
    rtol, atol, dt)`; and the values to solve in their place where a check fails,
    so that nothing runs on bad values (a short solve of nothing)."""
    failed, messages, owners = [], [], []

    def check(flag: Array, message: str, owner: int) -> None:
        failed.append(flag)
        messages.append(f"`{api}`: {message}")
        owners.append(owner)

    for name in checks:
        if name in ("rtol", "atol", "dt"):
            value = {"rtol": rtol, "atol": atol, "dt": dt}[name]
            owner = {"rtol": 3, "atol": 4, "dt": 5}[name]
            check(
                ~(jnp.isfinite(value) & (value > 0)),
                f"`{name}` must be positive and finite.",
                owner,
            )
        elif name == "times":
            check(
                ~jnp.all(jnp.isfinite(times)),
                "`times` must be finite (no nan or inf).",
                0,
            )
            # `~(diff > 0)`: a nan fails it (`diff <= 0` would let it through).
            check(
                ~jnp.all(jnp.diff(times) > 0), "`times` must be strictly increasing.", 0
            )
        elif name == "exp_ops":
            assert exp_ops is not None
            check(
                ~jnp.all(jnp.isfinite(exp_ops)),
                "`exp_ops` must be finite (no nan or inf).",
                2,
            )
        else:
            check(
                ~jnp.all(jnp.isfinite(state)),
                f"`{name}` must be finite (no nan or inf).",
                1,
            )
    # Where a check fails, a short solve of nothing in its place (zeros from times
    # 0, 1, ... at tolerances and step 1) runs before the call raises.
    safe = (
        jnp.arange(times.shape[0], dtype=times.dtype),
        jnp.zeros_like(state),
        None if exp_ops is None else jnp.zeros_like(exp_ops),
        jnp.ones_like(rtol),
        jnp.ones_like(atol),
        None if dt is None else jnp.ones_like(dt),
    )
    return failed, messages, owners, safe


def _own_safe(
    values: tuple, failed: list[Array], owners: list[int], safe: tuple
) -> tuple:
    """`values` with each one that fails a check of its own replaced by its safe
    value. (Not all of them where any fails, as `raise_if` does: under `jax.vmap`
    a failed state's flag is batched, and the shared times and tolerances it would
    batch could no longer step the batch in lockstep.)"""
    out = list(values)
    for i, value in enumerate(values):
        flags = [f for f, owner in zip(failed, owners) if owner == i]
        if flags:
            bad = functools.reduce(jnp.logical_or, flags)
            out[i] = jnp.where(bad, safe[i], value)
    return tuple(out)


def _step_control(
    term: AbstractTaylorTerm,
    t0: Array,
    t1: Array,
    rtol: Array,
    atol: Array,
    dt: Array | None,
    norms: tuple[TermNorms | None, ...] | None,
    knots: Array | None,
    order: int,
    control: tuple[float, float, float, float],
) -> tuple[diffrax.AbstractStepSizeController, Array]:
    """The step-size control and the first step: adaptive steps (the PID
    controller on the largest entry, clipped at the knots of sampled pulses) from
    a bound on the generator, or fixed steps no longer than `dt` (clipped at the
    knots too), checked against the tolerances (`_FixedSteps`). `control`: the
    controller's safety factor and its P, I and D gains."""
    if dt is not None:
        fixed: diffrax.AbstractStepSizeController = _FixedSteps(rtol, atol)
        if knots is not None:
            # A step across a knot would sum the series of the segment it started
            # in (an error of the jump, and no derivative with respect to the knot).
            fixed = diffrax.ClipStepSizeController(
                _FixedStepsAtKnots(rtol, atol), jump_ts=knots
            )
        return fixed, jnp.minimum(dt, t1 - t0)
    safety, pcoeff, icoeff, dcoeff = control
    controller: diffrax.AbstractStepSizeController = diffrax.PIDController(
        rtol=rtol,
        atol=atol,
        safety=safety,
        pcoeff=pcoeff,
        icoeff=icoeff,
        dcoeff=dcoeff,
        norm=_max_norm,
    )
    if knots is not None:
        # Knots of sampled pulses: no step straddles one, so every step's series
        # is that of one segment.
        controller = diffrax.ClipStepSizeController(controller, jump_ts=knots)
    assert norms is not None  # `solve` passes them for adaptive steps
    return controller, _initial_step(term, t0, t1, rtol, order, safety, norms)


# How far above the tolerances a fixed step's error estimate may be before the solve
# stops: the step is then far too long for its series to converge (the state grows
# without bound: |psi| 1e6 ... 1e35 measured at a few times the step it needs).
FIXED_STEP_LIMIT = 1e3


def _fixed_step_kept(
    rtol: Array, atol: Array, y0: Any, y1_candidate: Any, y_error: Any
) -> tuple[Array, Any]:
    """Whether a fixed step's error estimate is within `FIXED_STEP_LIMIT` times the
    tolerances, elementwise `atol + rtol * |y|`, and diffrax's result for it: past
    that the step is not kept and the solve stops with a failed result (`_steps`
    and `_reached` name it) instead of returning a state of 1e35."""
    assert y_error is not None  # the Taylor solver always estimates it
    size = jnp.maximum(jnp.abs(y0), jnp.abs(y1_candidate))
    scale = atol + rtol * size.astype(rtol.dtype)
    converges = _max_norm(y_error / scale) <= FIXED_STEP_LIMIT  # not nan
    result = diffrax.RESULTS.where(
        converges, diffrax.RESULTS.successful, diffrax.RESULTS.dt_min_reached
    )
    return converges, result


class _FixedSteps(diffrax.AbstractStepSizeController):
    """`diffrax.ConstantStepSize`, each step checked by `_fixed_step_kept`."""

    rtol: Array
    atol: Array

    def wrap(self, direction: Any) -> "_FixedSteps":
        del direction
        return self

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        return diffrax.ConstantStepSize().init(
            terms, t0, t1, y0, dt0, args, func, error_order
        )

    def adapt_step_size(
        self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state
    ):
        keep, next_t0, next_t1, made_jump, state, _ = (
            diffrax.ConstantStepSize().adapt_step_size(
                t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state
            )
        )
        converges, result = _fixed_step_kept(
            self.rtol, self.atol, y0, y1_candidate, y_error
        )
        return (keep & converges, next_t0, next_t1, made_jump, state, result)


class _FixedStepsAtKnots(diffrax.AbstractAdaptiveStepSizeController):
    """`_FixedSteps` for `diffrax.ClipStepSizeController` (which wraps adaptive
    controllers only) at the knots of sampled pulses: `diffrax.ConstantStepSize`'s
    points `t0 + k (t1 - t0) / N`, N = ceil((t1 - t0) / dt0), and a step clipped
    short of its point by a knot is followed by one to that point, so no step is
    longer than `dt0`. (Without knots `_FixedSteps` takes the same steps: this
    one's bookkeeping cost a fixed-step solve of the DRAG pulse 14%.)"""

    rtol: Array
    atol: Array
    # (`diffrax.ClipStepSizeController` reads an adaptive controller's norm.)
    norm: Callable[[Any], Array] = eqx.field(static=True, default=_max_norm)

    def wrap(self, direction: Any) -> "_FixedStepsAtKnots":
        del direction
        return self

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        del terms, y0, args, func, error_order
        # (As `diffrax.ConstantStepSize`: `nextafter` against a span that is a
        # whole number of steps up to rounding.)
        above = jnp.nextafter(jax.lax.stop_gradient(dt0), jnp.inf)
        count = jnp.astype(jnp.ceil((t1 - t0) / above), jnp.int32)
        return t0 + dt0, (jnp.asarray(1, jnp.int32), count, t0, t1)

    def adapt_step_size(
        self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state
    ):
        del args, error_order
        point, count, start, end = controller_state

        def at(k: Array) -> Array:
            fraction = jnp.astype(k, start.dtype) / jnp.astype(count, start.dtype)
            return jnp.where(k == count, end, start + (end - start) * fraction)

        # The step reached its point (to the ULP a clip at a knot there stops
        # short of it): the next one goes to the next point.
        reached = t1 >= jnp.nextafter(jax.lax.stop_gradient(at(point)), -jnp.inf)
        point = point + reached.astype(point.dtype)
        converges, result = _fixed_step_kept(
            self.rtol, self.atol, y0, y1_candidate, y_error
        )
        return (converges, t1, at(point), False, (point, count, start, end), result)


class _FirstStep(diffrax.AbstractStepSizeController):
    """`controller` with its first step `first` given by `init` instead of by
    `diffeqsolve(dt0=...)`, where diffrax would check its sign with an
    `eqx.error_if` (a walk of the Python stack in each trace of the steps, about
    18 ms; the first step here is positive by construction)."""

    controller: diffrax.AbstractStepSizeController
    first: Array

    def wrap(self, direction: Any) -> "_FirstStep":
        return _FirstStep(self.controller.wrap(direction), self.first * direction)

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        del dt0
        first = jnp.asarray(self.first, jnp.result_type(t0))
        return self.controller.init(terms, t0, t1, y0, first, args, func, error_order)

    def adapt_step_size(
        self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state
    ):
        return self.controller.adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state
        )


@contextlib.contextmanager
def _forward_mode_hint(api: str):
    """JAX's error for forward-mode differentiation (`jax.jvp`, `jax.jacfwd`)
    through the default adjoint, with what to pass instead. The default,
    `diffrax.RecursiveCheckpointAdjoint`, is reverse mode only (a `custom_vjp`); a
    forward-mode adjoint would in turn refuse reverse mode, so the user chooses."""
    try:
        yield
    except TypeError as error:
        if "forward-mode autodiff" not in str(error):
            raise
        raise TypeError(
            f"`{api}`: forward-mode differentiation (`jax.jvp`, `jax.jacfwd`) "
            "through a solve needs `adjoint=diffrax.ForwardMode()` (or "
            "`diffrax.DirectAdjoint()`, both ways but slower); the default "
            "adjoint differentiates in reverse mode (`jax.grad`, `jax.jacrev`)."
        ) from None


def _physical_times(
    interpolation: diffrax.DenseInterpolation, t0: Array, t1: Array
) -> diffrax.DenseInterpolation:
    """The dense output of a solve on s in [0, 1] with its steps' bounds in physical
    time (the ends exactly t0 and t1); each step's own series is in units of its
    length, so it holds unchanged."""
    span = t1 - t0

    def physical(s: Array) -> Array:
        return jnp.where(s == 1, t1, t0 + s * span).astype(s.dtype)

    return eqx.tree_at(
        lambda i: (i.ts, i.t0_if_trivial),
        interpolation,
        (
            physical(interpolation.ts),
            physical(jnp.asarray(interpolation.t0_if_trivial)),
        ),
    )


# One compile per structure and static options; times, tolerances and parameter
# values are traced (changing them never retraces).
_solve = module_jit(_solve_impl)


def _initial_step(term, t0, t1, rtol, order, safety, norms) -> Array:
    """A first step from the size of $H(t_0)$: the series of $e^{-iH\\tau}$ has
    terms $(\\|H\\|\\tau)^j / j!$, which fall to `rtol` at order K near
    $\\tau = K\\, \\mathrm{rtol}^{1/K} / (e \\|H\\|)$ (Stirling). The controller
    corrects it from the first step's own series."""
    size = term.generator_bound(t0, norms)
    rtol = rtol.astype(size.dtype)
    h = safety * order * rtol ** (1.0 / order) / (math.e * size)
    span = t1 - t0
    h = jnp.where(size > 0, h, span).astype(span.dtype)
    return jax.lax.stop_gradient(jnp.clip(h, span * 1e-6, span))


def _generator_norms(term: AbstractTaylorTerm) -> tuple[TermNorms | None, ...]:
    """The `term_norms` of the term's operators, computed before compiling (`None`
    where not known), as JAX arrays: kept by the term's identity, so that a repeated
    call neither recomputes nor transfers them."""
    hit = GENERATOR_NORMS.get(term)
    if hit is not None and hit[0] == float_dtype():
        return hit[1]
    norms = tuple(
        None if norm is None else jax.tree.map(to_jax, norm)
        for norm in (term_norms(op) for op in term.operators)
    )
    GENERATOR_NORMS.put(term, (float_dtype(), norms))  # (unless traced)
    return norms


class _Static:
    """A static argument of the compiled solve (a diffrax adjoint) with its hash
    computed once: JAX hashes every static argument on every call, and an Equinox
    module's hash walks its tree (about 10 us; its equality, 14 us, is skipped for
    the same object)."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: Any):
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Static):
            return NotImplemented
        return self.value is other.value or bool(self.value == other.value)


_DEFAULT_ADJOINT = _Static(diffrax.RecursiveCheckpointAdjoint())


def _static_adjoint(adjoint: diffrax.AbstractAdjoint | None) -> _Static:
    """The adjoint as a static argument (the default when `None`)."""
    if adjoint is None:
        return _DEFAULT_ADJOINT
    # (Kept by the adjoint's identity it saved 1.5 us of a 200 us call, 0.7%.)
    return _Static(adjoint)


def _check_dense_output(state: Array, order: int, max_steps: int, api: str) -> None:
    """Dense output keeps every step's series, sized for `max_steps` steps: refuse
    before compiling a solve whose buffer cannot fit in memory."""
    size = math.prod(state.shape)
    need = (
        max_steps * (order + 1) * size * np.dtype(jnp.result_type(state, 1j)).itemsize
    )
    have = available_memory()
    if need > have:
        raise MemoryError(
            f"`{api}`: `dense=True` keeps the series of every step, sized for "
            f"`max_steps`: {max_steps} x {order + 1} terms x {size} entries = "
            f"{need / 2**30:.1f} GiB, more than the {have / 2**30:.1f} GiB "
            "available. Lower `max_steps` to what the solve needs, or save the "
            "states at `times` instead."
        )


def solve_dtype(state: Array, times: Array) -> Any:
    """The complex dtype a solve steps `state` in over `times` (`_check_times`'s):
    the state's widened by the times' (integer times are cast to JAX's default
    float), as diffrax widens its state."""
    floating = jnp.issubdtype(times.dtype, jnp.floating)
    # (Each complex dtype kept per dtype: `jnp.result_type` costs a call 4 us.)
    widths = [
        complex_dtype(state.dtype),
        complex_dtype(times.dtype if floating else float_dtype()),
    ]
    return max(widths, key=lambda d: jnp.dtype(d).itemsize)


def _check_times(times: Any, api: str) -> tuple[Array, bool]:
    """`times` as a real array, and whether its values were checked here (held on
    the host: a list, a tuple, a NumPy array). A JAX array, concrete or traced, is
    checked (finite, strictly increasing) and cast inside the compiled solve: its
    shape and dtype are read here, its values never leave the device."""
    if isinstance(times, jax.Array | Tracer):
        if (
            times.ndim != 1
            or times.shape[0] < 2
            or not (
                jnp.issubdtype(times.dtype, jnp.floating)
                or jnp.issubdtype(times.dtype, jnp.integer)
            )
        ):
            raise ValueError(
                f"`{api}`: `times` must be a real 1-d array of at least two times, "
                f"got {times.dtype} of shape {tuple(times.shape)}."
            )
        return times, False
    if times is None:
        raise TypeError(
            f"`{api}`: `times` must be a real 1-d array (or list) of at least two "
            "times, got None."
        )
    try:
        values = np.asarray(times)
    except (TypeError, ValueError):
        raise ValueError(
            f"`{api}`: `times` must be a real 1-d array (or list) of at least two "
            f"times, got {type(times).__name__}."
        ) from None
    if values.dtype.kind not in "iuf" or values.ndim != 1 or values.shape[0] < 2:
        raise ValueError(
            f"`{api}`: `times` must be a real 1-d array (or list) of at least two "
            f"times, got {type(times).__name__} of {values.dtype} and shape "
            f"{tuple(values.shape)}."
        )
    # Checked in the precision they are solved in (two float64 times may round to
    # one float32 time; 1e39 overflows float32), and placed once.
    floating = values.dtype.kind == "f"
    dtype = jax.dtypes.canonicalize_dtype(values.dtype) if floating else float_dtype()
    with np.errstate(over="ignore"):
        values = values.astype(dtype, copy=False)
    if not np.all(np.isfinite(values)):
        raise ValueError(
            f"`{api}`: `times` must be finite (in {np.dtype(dtype)}), got {values}."
        )
    if not np.all(np.diff(values) > 0):
        raise ValueError(f"`{api}`: `times` must be strictly increasing, got {values}.")
    return to_jax(values), True
