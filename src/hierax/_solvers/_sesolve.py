"""`hierax.sesolve`: the Schrödinger equation, solved with the Taylor method on
diffrax."""

import math
import warnings
from collections.abc import Sequence
from typing import Any, cast

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, PyTree

from .._arrays import to_jax
from .._custom_types import typechecked
from .._interop import as_matrices, as_state
from .._jit import module_jit
from .._sparse import available_memory
from ._density import DensityParts, known_density_parts
from ._solution import Solution
from ._solver import (
    TaylorSolver,
    check_taylor_order,
    order_for_tolerance,
)
from ._term import (
    LindbladTerm,
    SchrodingerTerm,
    TermNorms,
    UnitTimeTerm,
    jump_times,
    operator_bound,
    term_norms,
    uniform_products,
)


_API = "hierax.sesolve"
# Adjoints that differentiate through the solver's own steps; a backsolve adjoint
# would integrate an adjoint equation that is not a Schrödinger equation.
_ADJOINTS = (
    diffrax.RecursiveCheckpointAdjoint,
    diffrax.DirectAdjoint,
    diffrax.ForwardMode,
)
# The step-size control. The estimate goes as (|H| h)^K, so at high order a small
# rise of |H(t)| between steps (a pulse, h(t) = 1 + 0.5 sin 2t) multiplies it many
# times over and the plain integral controller rejected about one step in five on
# the driven Ising chain; the proportional and derivative parts follow the trend.
# Measured (Ising chain, K = 26, error 1e-10): 525 steps instead of 567, rejections
# 110 -> 60; the transmon is unchanged within 3%.
_SAFETY = 0.9
_PCOEFF, _ICOEFF, _DCOEFF = 0.3, 0.6, 0.1


def _max_norm(x: PyTree) -> Array:
    """The largest absolute entry: each amplitude of the state is held to the
    tolerance (diffrax's default, the RMS norm, would let a few entries err more)."""
    return jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)) for leaf in jax.tree.leaves(x)]))


@typechecked
def sesolve(
    hamiltonian: Any,
    state: Any,
    times: ArrayLike,
    *,
    rtol: float | int = 1e-8,
    atol: float | int = 1e-10,
    order: int | None = None,
    dt: float | int | None = None,
    exp_ops: Sequence[Any] | ArrayLike | None = None,
    progress: bool = False,
    dense: bool = False,
    max_steps: int = 100_000,
    adjoint: diffrax.AbstractAdjoint | None = None,
) -> Solution:
    """Solve the Schrödinger equation $\\dot\\psi = -i H(t)\\,\\psi$ with the Taylor
    method: each step sums the exact series of the state to order $K$, and the step
    size comes from the size of the series' last two terms.

    Built on `diffrax.diffeqsolve` with [`hierax.TaylorSolver`][] and
    [`hierax.SchrodingerTerm`][], so it composes with `jax.jit`, `jax.grad`
    (through the steps: reverse mode by default, forward mode with
    `adjoint=diffrax.ForwardMode()`) and `jax.vmap`. Changing `times`, the state
    or the values of the Hamiltonian's parameters never recompiles.

    **Arguments:**

    - `hamiltonian`: $H(t)$, an `(n, n)` matrix, a callable `t -> (n, n)`, or an
        operator such as `hierax.Cos(w) * sx + sz`.
    - `state`: the initial state: a vector `(n,)`, several vectors as columns
        `(n, m)`, or a propagator `(n, n)` (a square state is a propagator, never
        a density matrix: use `mesolve` for those); QuTiP and dynamiqs kets too.
    - `times`: the times at which to save the state, strictly increasing, shape
        `(T,)` with T >= 2; the solve runs from `times[0]` to `times[-1]`.
    - `rtol`, `atol`: tolerances on each step's truncation error, elementwise
        `atol + rtol * |psi|` as in diffrax and QuTiP. For unitary dynamics the
        final error is typically below `rtol` (see the how-to on tolerances).
    - `order`: the order K of the series; by default chosen from the tolerance.
    - `dt`: a fixed step: the span is cut into equal steps no longer than `dt`, and
        `rtol`, `atol` only choose the order.
    - `exp_ops`: observables whose expectation values to return, a sequence of
        `(n, n)` matrices or an `(E, n, n)` array. Not for a propagator.
    - `progress`: print diffrax's text progress meter while solving.
    - `dense`: keep every step's series, for [`hierax.Solution.evaluate`][]. This
        stores `max_steps * (K + 1)` copies of the state: lower `max_steps` for big
        states.
    - `max_steps`: the most steps the solve may take; it fails past that.
    - `adjoint`: how to differentiate, `diffrax.RecursiveCheckpointAdjoint()` (the
        default), `diffrax.DirectAdjoint()` or `diffrax.ForwardMode()`.

    **Returns:**

    A [`hierax.Solution`][]: `times`, `states` of shape `(T, *state.shape)`,
    `expects` of shape `(E, T)` (or `(E, T, m)` for m states), `stats`.

    !!! example

        ```python
        sx = jnp.array([[0, 1], [1, 0]])
        sz = jnp.array([[1, 0], [0, -1]])
        hamiltonian = 0.5 * sz + hierax.Cos(1.0) * sx
        solution = hierax.sesolve(
            hamiltonian, jnp.array([1.0, 0.0]), jnp.linspace(0, 10, 101),
            exp_ops=[sz],
        )
        solution.expects[0]                      # <sigma_z>(t), shape (101,)
        ```
    """
    term = SchrodingerTerm(hamiltonian)
    # Sparse matrices with all entries equal, read as one value by the products.
    term = eqx.tree_at(
        lambda t: t.hamiltonian, term, uniform_products(term.hamiltonian)
    )
    n = term.size
    state = _check_state(as_state(state, "state", _API), n)
    dtype = jnp.result_type(state, 1j)
    exp_ops = _check_exp_ops(as_matrices(exp_ops, "exp_ops", _API), state, n, _API)
    return solve(
        term,
        state.astype(dtype),
        times,
        rtol=rtol,
        atol=atol,
        order=order,
        dt=dt,
        exp_ops=exp_ops,
        progress=progress,
        dense=dense,
        max_steps=max_steps,
        adjoint=adjoint,
        api=_API,
    )


def solve(
    term: SchrodingerTerm | LindbladTerm,
    state: Array,
    times: Any,
    *,
    rtol: Any,
    atol: Any,
    order: int | None,
    dt: Any,
    exp_ops: Array | None,
    progress: bool,
    dense: bool,
    max_steps: Any,
    adjoint: diffrax.AbstractAdjoint | None,
    api: str,
) -> Solution:
    """The solve shared by `sesolve` and `mesolve`: checks the options (the state,
    already checked and in its complex dtype, and the observables are the caller's)
    and runs the compiled solve."""
    times, checked = _check_times(times, api)
    rtol = _check_positive(rtol, "rtol", api)
    atol = _check_positive(atol, "atol", api)
    if order is None:
        order = order_for_tolerance(rtol, state.dtype)
    else:
        order = check_taylor_order(order, api)
    if dt is not None:
        dt = _check_positive(dt, "dt", api)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"`{api}`: `max_steps` must be an int >= 1, got {max_steps}.")
    if dense:
        _check_dense_output(state, order, max_steps, api)
    if adjoint is None:
        adjoint = diffrax.RecursiveCheckpointAdjoint()
    if not isinstance(adjoint, _ADJOINTS):
        raise ValueError(
            f"`{api}`: `adjoint` must be one of "
            f"{', '.join('diffrax.' + a.__name__ + '()' for a in _ADJOINTS)}, got "
            f"{type(adjoint).__name__}: the Taylor solver differentiates through its "
            "own steps."
        )
    return _solve(
        term,
        state,
        times,
        # Known numbers placed without an eager JAX operation (each kind of which
        # compiles a small program on a process's first solve).
        to_jax(rtol),
        to_jax(atol),
        None if dt is None else to_jax(dt),
        exp_ops,
        # The first step's bound needs them; fixed steps do not.
        _generator_norms(term) if dt is None else None,
        # The Lindblad step's constant parts, assembled before compiling.
        known_density_parts(term, state.dtype)
        if isinstance(term, LindbladTerm)
        else None,
        order=order,
        max_steps=max_steps,
        progress=progress,
        dense=dense,
        adjoint=adjoint,
        api=api,
        check_times=not checked,
    )


def _solve_impl(
    term: SchrodingerTerm | LindbladTerm,
    state: Array,
    times: Array,
    rtol: Array,
    atol: Array,
    dt: Array | None,
    exp_ops: Array | None,
    norms: tuple[TermNorms | None, ...] | None,
    parts: DensityParts | None,
    *,
    order: int,
    max_steps: int,
    progress: bool,
    dense: bool,
    adjoint: diffrax.AbstractAdjoint,
    api: str,
    check_times: bool = True,
) -> Solution:
    if check_times:  # known times were checked before compiling
        times = eqx.error_if(
            times,
            jnp.any(jnp.diff(times) <= 0),
            f"`{api}`: `times` must be strictly increasing.",
        )
    t0, t1 = times[0], times[-1]
    span = t1 - t0
    knots = jump_times(term.hamiltonian, *getattr(term, "jump_operators", ()))
    # diffrax forms the bound 100 ULPs below t1 op by op: for a traced t1 that is a
    # program of a few thousand scalar operations, about a quarter of a second of
    # compile. On s in [0, 1] (t = t0 + s (t1 - t0), `UnitTimeTerm`) the bounds are
    # constants and it folds away. Knots of sampled pulses keep physical time:
    # there diffrax steps to just after each knot, which a rescaled knot could
    # miss by an ULP.
    unit = knots is None
    if dt is None:
        controller: diffrax.AbstractStepSizeController = diffrax.PIDController(
            rtol=rtol,
            atol=atol,
            safety=_SAFETY,
            pcoeff=_PCOEFF,
            icoeff=_ICOEFF,
            dcoeff=_DCOEFF,
            norm=_max_norm,
        )
        if knots is not None:
            # Knots of sampled pulses: no step straddles one, so every step's
            # series is that of one segment.
            controller = diffrax.ClipStepSizeController(controller, jump_ts=knots)
        assert norms is not None  # `solve` passes them for adaptive steps
        dt0 = _initial_step(term, t0, t1, rtol, order, norms)
    else:
        controller = diffrax.ConstantStepSize()
        dt0 = jnp.minimum(dt, span)
    ends = times.shape[0] == 2
    if unit:
        solved: diffrax.AbstractTerm = UnitTimeTerm(term, t0, span)
        start, end, dt0 = 0.0, 1.0, dt0 / span
        save_times = (times - t0) / span
    else:
        solved, start, end, save_times = term, t0, t1, times
    if ends:
        # Only the ends: the last state saved as it is reached and the first one
        # given, so the program has no loop that evaluates the steps' series at
        # save times and no save at t0 (measured under load: 0.3-0.8 s less
        # compile than `SaveAt(ts=...)`).
        saveat = diffrax.SaveAt(t1=True, dense=dense)
    else:
        saveat = diffrax.SaveAt(ts=save_times, dense=dense)
    with warnings.catch_warnings():
        # diffrax warns on every complex state; complex states are what we solve.
        warnings.filterwarnings("ignore", message="Complex dtype support")
        solution = diffrax.diffeqsolve(
            solved,
            TaylorSolver(order),
            start,
            end,
            dt0,
            state,
            saveat=saveat,
            stepsize_controller=controller,
            args=parts,
            adjoint=adjoint,
            max_steps=max_steps,
            progress_meter=(
                diffrax.TextProgressMeter() if progress else diffrax.NoProgressMeter()
            ),
        )
    states = cast(Array, solution.ys)
    if ends:
        states = jnp.concatenate([state[None].astype(states.dtype), states])
    interpolation = solution.interpolation if dense else None
    if unit and interpolation is not None:
        interpolation = _physical_times(interpolation, t0, t1)
    expects = None
    if exp_ops is not None and isinstance(term, LindbladTerm):
        # tr(E rho)
        expects = jnp.einsum("enm,tmn->et", exp_ops.astype(states.dtype), states)
    elif exp_ops is not None:
        expects = jnp.einsum(
            "tn...,enm,tm...->et...",
            states.conj(),
            exp_ops.astype(states.dtype),
            states,
        )
    stats = {
        key: jnp.asarray(solution.stats[key])
        for key in ("num_steps", "num_accepted_steps", "num_rejected_steps")
    }
    stats["max_steps"] = jnp.asarray(max_steps)
    return Solution(times, states, expects, stats, order, interpolation)


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


def _initial_step(term, t0, t1, rtol, order, norms) -> Array:
    """A first step from the size of $H(t_0)$: the series of $e^{-iH\\tau}$ has
    terms $(\\|H\\|\\tau)^j / j!$, which fall to `rtol` at order K near
    $\\tau = K\\, \\mathrm{rtol}^{1/K} / (e \\|H\\|)$ (Stirling). The controller
    corrects it from the first step's own series."""
    size = _generator_size(term, t0, norms)
    rtol = rtol.astype(size.dtype)
    h = _SAFETY * order * rtol ** (1.0 / order) / (math.e * size)
    span = t1 - t0
    h = jnp.where(size > 0, h, span).astype(span.dtype)
    return jax.lax.stop_gradient(jnp.clip(h, span * 1e-6, span))


def _generator_norms(
    term: SchrodingerTerm | LindbladTerm,
) -> tuple[TermNorms | None, ...]:
    """The `term_norms` of the Hamiltonian and of each jump operator, computed
    before compiling (`None` where not known)."""
    operators = (term.hamiltonian, *getattr(term, "jump_operators", ()))
    return tuple(term_norms(op) for op in operators)


def _generator_size(
    term: SchrodingerTerm | LindbladTerm,
    t: Array,
    norms: tuple[TermNorms | None, ...],
) -> Array:
    """A bound on the generator's size at `t`: the inf-norm of H (>= |H|_2 for
    Hermitian H); for a Lindblad generator $2\\|H\\| + 2\\sum_j \\|L_j\\|^2$.
    `norms` from `_generator_norms`."""
    jumps = getattr(term, "jump_operators", ())
    size = operator_bound(term.hamiltonian, t, norms[0])
    if isinstance(term, LindbladTerm):
        size = 2 * size
        for op, op_norms in zip(jumps, norms[1:]):
            size = size + 2 * operator_bound(op, t, op_norms) ** 2
    return size


def _check_state(state: Any, n: int) -> Array:
    state = jnp.asarray(state)
    if not (
        jnp.issubdtype(state.dtype, jnp.number) and state.dtype != jnp.bool_
    ) or state.ndim not in (1, 2):
        raise ValueError(
            f"`{_API}`: `state` must be a numeric array of shape ({n},), ({n}, m) or "
            f"({n}, {n}), got {state.dtype} of shape {tuple(state.shape)}."
        )
    if state.shape[0] != n:
        raise ValueError(
            f"`{_API}`: `state` has shape {tuple(state.shape)} but the `hamiltonian` "
            f"is {n}x{n}; the state's first axis must have size {n}."
        )
    return state


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


def _check_times(times: Any, api: str) -> tuple[Array, bool]:
    """`times` as a real array, and whether it was checked here (known values);
    traced times are checked inside the compiled solve."""
    times = jnp.asarray(times)
    if jnp.iscomplexobj(times) or times.ndim != 1 or times.shape[0] < 2:
        raise ValueError(
            f"`{api}`: `times` must be a real 1-d array of at least two times, got "
            f"{times.dtype} of shape {tuple(times.shape)}."
        )
    if not jnp.issubdtype(times.dtype, jnp.floating):
        times = times.astype(jnp.result_type(float))
    try:
        concrete = np.asarray(times, dtype=float)
    except jax.errors.TracerArrayConversionError:
        return times, False  # traced: checked at run time, inside `_solve`
    if np.any(np.diff(concrete) <= 0):
        raise ValueError(
            f"`{api}`: `times` must be strictly increasing, got {concrete}."
        )
    return times, True


def _check_positive(x: Any, name: str, api: str) -> float:
    try:
        value = float(x)
    except (TypeError, jax.errors.ConcretizationTypeError):
        raise TypeError(
            f"`{api}`: `{name}` must be a concrete positive number, got {x!r}."
        ) from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"`{api}`: `{name}` must be positive and finite, got {x}.")
    return value


def _check_exp_ops(exp_ops: Any, state: Array | None, n: int, api: str) -> Array | None:
    """The observables as an `(E, n, n)` array; `state` None for a density matrix."""
    if exp_ops is None:
        return None
    if state is not None and state.ndim == 2 and state.shape[1] == n:
        raise ValueError(
            f"`{api}`: `exp_ops` needs a state vector `(n,)` or states as columns "
            f"`(n, m)`; a square `state` of shape {tuple(state.shape)} is a "
            "propagator, which has no expectation values."
        )
    checked = []
    for i, op in enumerate(exp_ops):
        op = jnp.asarray(op)
        if op.shape != (n, n):
            raise ValueError(
                f"`{api}`: `exp_ops[{i}]` has shape {tuple(op.shape)} but the "
                f"`hamiltonian` is {n}x{n}; each observable must be ({n}, {n})."
            )
        checked.append(op)
    if not checked:
        return None
    return jnp.stack(checked)
