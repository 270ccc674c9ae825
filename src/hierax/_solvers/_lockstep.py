"""A batch of Schrodinger solves stepped together: what `hierax.sesolve` does under
`jax.vmap` when the batch shares its matrices, times and tolerances.

Mapped element by element, every element takes its own steps, so each computes its
time functions' series and their Cauchy products with its state at its own times,
and a step of the batch runs dozens of small kernels per order whose dispatch, not
their arithmetic, sets the cost. Stepped together, the elements are the columns of
one state: one step size for all (the smallest any element needs: the step's error
is the largest over the batch), time functions evaluated once where they do not
depend on the batched parameters, and each order one product of the shared
matrices with every column. Measured on 2 CPU cores (x64, 256 detunings of a qubit
under a Gaussian pulse, rtol 1e-6): 7.5 ms element by element, 3.1 ms as a
block-diagonal system in lockstep.

The batching rule is JAX's public one (`jax.custom_batching.custom_vmap`). Its
derivatives are those of the solve element by element: reverse mode through a
`jax.custom_vjp` (the default adjoint), forward mode through a `jax.custom_jvp`
(`diffrax.ForwardMode`), so a gradient of a batch is the batch of the elements'
gradients.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jax.custom_derivatives import SymbolicZero
from jaxtyping import Array, PyTree

from .._data import TermSeries
from .._kernels.propagator import REAL_STATE_SIZE
from .._operators import bind_args, jump_times, operator_bound, time_operators
from .._time import AbstractTimeFunction, Constant
from ._remainder import may_hide_a_peak, remainder_size
from ._resolution import equation_truncation, has_linear_amplitude
from ._solution import Solution
from ._term import (
    AbstractTaylorTerm,
    SchrodingerTerm,
    real_and_other_series,
    schrodinger_terms,
)


class ColumnsTerm(AbstractTaylorTerm):
    """The Schrodinger equation of a batch of Hamiltonians that share their
    matrices, for a state whose columns are the batch's elements: `term`'s
    Hamiltonian has a leading batch axis on the leaves that `axes` marks (0; `None`
    for shared leaves), and each column steps with its own element's time
    functions. An element whose state is a matrix (a propagator) owns `repeat`
    adjacent columns."""

    term: SchrodingerTerm
    axes: Any = eqx.field(static=True)
    repeat: int = eqx.field(static=True, default=1)

    def _columns(self, x: Array) -> Array:
        """A row over the elements (last axis) as a row over the columns."""
        return x if self.repeat == 1 else jnp.repeat(x, self.repeat, axis=-1)

    @property
    def operators(self):
        return self.term.operators

    def _series(
        self, hamiltonian, t, order, scale, use_real
    ) -> tuple[TermSeries | None, TermSeries | None]:
        """The step's `(real, other)` term series (`real_and_other_series`) of the
        batch: coefficients `(A, K+1, m)`, each constant row's its column's, each
        time-dependent row element 0's with every swept amplitude 1, and those
        amplitudes as the rows' `column_scales` (where any is swept)."""

        # Each column's values of its constant rows: order 0 (a constant row's
        # series vanishes above it; the time-dependent rows' whole series per
        # column would be computed for nothing).
        def values(h):
            parts = real_and_other_series(h, t, 0, scale, use_real)
            return tuple(None if p is None else p.coefficients for p in parts)

        columns = jax.vmap(values, in_axes=(self.axes,))(hamiltonian)
        element = _element(hamiltonian, self.axes)
        real, other = real_and_other_series(
            _on_functions(_unit_amplitude, self.axes, element),
            t,
            order,
            scale,
            use_real,
        )
        scales: tuple[Array | None, ...] = (None, None)
        if any(_is_swept(a, f) for a, f in _function_pairs(self.axes, element)):

            def amplitudes(h):
                view = _on_functions(_amplitude_as_constant, self.axes, h)
                parts = real_and_other_series(view, t, 0, scale, use_real)
                return tuple(None if p is None else p.coefficients[:, 0] for p in parts)

            found = jax.vmap(amplitudes, in_axes=(self.axes,))(hamiltonian)
            scales = tuple(None if a is None else a.T for a in found)

        def per_column(part: TermSeries | None, c: Array | None, s: Array | None):
            if part is None or c is None:
                return None
            fixed = np.asarray(part.constant_flags(), bool)[:, None, None]
            own = self._columns(jnp.moveaxis(c, 0, -1))
            shape = part.coefficients.shape + (own.shape[-1],)
            shared = jnp.broadcast_to(part.coefficients[..., None], shape)
            own = jnp.pad(own, ((0, 0), (0, order), (0, 0)))
            return part._replace(
                coefficients=jnp.where(fixed, own, shared),
                column_scales=None if s is None else self._columns(s),
            )

        return (
            per_column(real, columns[0], scales[0]),
            per_column(other, columns[1], scales[1]),
        )

    def taylor_terms(self, t, step, y0, order, args, adjoint=False):
        del adjoint  # stepped forward only: derivatives go element by element
        hamiltonian = bind_args(self.term.hamiltonian, args)
        v = schrodinger_terms(
            hamiltonian, t, step, y0, order, self.term.parts, series_of=self._series
        )
        # One shift per column (batched offsets): a row over the columns.
        shift = self.term.energy_shift
        if jnp.ndim(shift):
            shift = self._columns(shift.reshape(1, -1))
        return v, (-1j * step * shift).astype(v.dtype)

    def with_program_parts(self, t, dtype):
        return ColumnsTerm(
            self.term.with_program_parts(t, dtype), self.axes, repeat=self.repeat
        )

    def function_truncation(self, t, step, order, args):
        def one(hamiltonian):
            share = equation_truncation(hamiltonian, args, t, step, order)
            return jnp.zeros(()) if share is None else share

        hamiltonian = self.term.hamiltonian
        pairs = _function_pairs(self.axes, hamiltonian)
        if all(_same_at_unit_amplitude(a, f) for a, f in pairs):
            # The columns' functions differ in their amplitudes at most: one share
            # for all, element 0's, whose series the step has (XLA computes it
            # once; per column it cost the first call about 0.3 s of compile).
            return one(_element(hamiltonian, self.axes))
        # Per column: each element's own functions, a row over the columns.
        shares = jax.vmap(one, in_axes=(self.axes,))(hamiltonian)
        return self._columns(shares.reshape(1, -1))

    def generator_remainder(self, t, step, order, args, norms):
        hamiltonian = bind_args(self.term.hamiltonian, args)
        if not may_hide_a_peak(hamiltonian):
            return None
        known = None if norms is None else norms[0]

        def one(h):
            found = remainder_size(h, t, step, order, known)
            assert found is not None  # (`may_hide_a_peak` above)
            return found

        # Per column, each element's own functions: a row over the columns.
        found = jax.vmap(one, in_axes=(self.axes,))(hamiltonian)
        return self._columns(found.reshape(1, -1))

    def generator_bound(self, t, norms):
        bound = lambda h: operator_bound(h, t, norms[0])  # noqa: E731
        return jnp.max(jax.vmap(bound, in_axes=(self.axes,))(self.term.hamiltonian))

    def vf(self, t, y, args):
        def one(term, column):
            return term.vf(t, column, args)

        axes = eqx.tree_at(
            lambda s: (s.hamiltonian, s.energy_shift),
            _none_like(self.term),
            replace=(self.axes, 0 if jnp.ndim(self.term.energy_shift) else None),
            is_leaf=lambda x: x is None,
        )
        if self.repeat == 1:
            return jax.vmap(one, in_axes=(axes, -1), out_axes=-1)(self.term, y)
        # Each element's matrix: its `repeat` adjacent columns.
        lanes = y.reshape(y.shape[:-1] + (-1, self.repeat))
        out = jax.vmap(one, in_axes=(axes, -2), out_axes=-2)(self.term, lanes)
        return out.reshape(y.shape)


def _batched_outputs(
    plain: Callable[[PyTree], Any], arrays: PyTree, flags: PyTree, size: int
) -> PyTree:
    """Which outputs of `plain(arrays)` `jax.vmap` batches, given which inputs
    it batches (`flags`): read off JAX's own batching of the traced program (not
    run) by an identity whose batching rule records what it is given."""
    seen: list = []

    @jax.custom_batching.custom_vmap
    def probe(x):
        return x

    @probe.def_vmap
    def record(axis_size, in_batched, x):
        del axis_size
        seen.append(in_batched[0])
        return x, in_batched[0]

    jax.eval_shape(
        jax.vmap(lambda a: probe(plain(a)), in_axes=(_axes(flags),), axis_size=size),
        arrays,
    )
    return seen[0]


def _lockstep_batched(out: Solution) -> PyTree:
    """`_batched_outputs` for a batch that `_in_lockstep` steps, read off the
    solution's structure instead of JAX's batching of the whole traced solve (a
    third of a sweep's first trace, 0.3 s): every output but the times (a
    lockstep batch shares them) and `max_steps` (a constant) depends on a batched
    Hamiltonian or state, the numbers of steps through the batched step control.
    `tests/test_lockstep.py` checks it against `_batched_outputs`."""
    flags = jax.tree.map(lambda _: True, out)
    return eqx.tree_at(
        lambda s: (s.times, s.stats["max_steps"]), flags, replace=(False, False)
    )


def _element(tree: PyTree, axes: PyTree) -> PyTree:
    """The first element of a batch: index 0 of the batched leaves."""
    return jax.tree.map(
        lambda a, x: x if a is None else x[0], axes, tree, is_leaf=lambda a: a is None
    )


def _none_like(tree: PyTree) -> PyTree:
    return jax.tree.map(lambda _: None, tree)


def _axes(flags: PyTree) -> PyTree:
    return jax.tree.map(lambda b: 0 if b else None, flags)


def _differs_in_scales_only(hamiltonian: Any, flags: Any, size: int) -> bool:
    """Whether a batch of Hamiltonians (`flags`: which of its leaves are batched)
    shares its matrices and its time-dependent functions, differing only in
    constant coefficients (detunings, couplings) and in the real amplitudes of
    time functions (`_is_swept`; complex ones for a state of `size` from
    `REAL_STATE_SIZE`, whose step takes complex scales): then each order's window
    of the Cauchy product serves every column (`series_loop`), scaled per column.
    Dense term matrices only (sparse ones are gathered per column)."""
    ops, op_flags = time_operators(hamiltonian), time_operators(flags)
    if ops is None or op_flags is None:
        return False
    for op, op_flag in zip(ops, op_flags, strict=True):
        if op.is_sparse or any(jax.tree.leaves(op_flag.term_matrices)):
            return False
        for function, batched in zip(op.functions, op_flag.functions, strict=True):
            if not any(jax.tree.leaves(batched)) or function.is_constant:
                continue
            if not _is_swept(_axes(batched), function, size >= REAL_STATE_SIZE):
                return False
    return True


def _is_swept(axes: Any, function: Any, complex_ok: bool = True) -> bool:
    """Whether a time-dependent function is batched (`axes`: 0 or `None` per
    leaf) in its amplitude alone (a real one unless `complex_ok`: the small
    state's real step scales real and imaginary parts alike): its series is then
    the amplitude times the series at amplitude 1 (a kind whose `_scaled` folds a
    factor into its amplitude is linear in it)."""
    if not has_linear_amplitude(function):
        return False
    amplitude = function.amplitude
    if function.is_constant or axes.amplitude is None:
        return False
    if jnp.iscomplexobj(amplitude) and not complex_ok:
        return False
    batched = jax.tree.leaves(axes, is_leaf=lambda a: a is None)
    return sum(a is not None for a in batched) == 1  # the amplitude alone


def _same_at_unit_amplitude(axes: Any, function: Any) -> bool:
    """Whether a function is the same for every column at amplitude 1 (or not read
    by the check, a constant): nothing of it batched, or its (linear) amplitude
    alone."""
    if function.is_constant or _is_swept(axes, function):
        return True
    return all(a is None for a in jax.tree.leaves(axes, is_leaf=lambda a: a is None))


def _unit_amplitude(axes: Any, function: Any) -> Any:
    """A swept function at amplitude 1 (others as they are)."""
    if not _is_swept(axes, function):
        return function
    return eqx.tree_at(
        lambda f: f.amplitude, function, jnp.ones_like(function.amplitude)
    )


def _amplitude_as_constant(axes: Any, function: Any) -> Any:
    """A swept function's amplitude as a constant function, any other function as
    the constant 1: the per-column scale of its row."""
    if not _is_swept(axes, function):
        return Constant(1.0)
    return Constant(function.amplitude)


def _is_axes_or_function(a: Any) -> bool:
    return a is None or isinstance(a, AbstractTimeFunction)


def _on_functions(fn: Callable[[Any, Any], Any], axes: Any, tree: Any) -> Any:
    """`tree` with each time function f replaced by `fn(its axes, f)`."""
    return jax.tree.map(
        lambda a, x: fn(a, x) if isinstance(a, AbstractTimeFunction) else x,
        axes,
        tree,
        is_leaf=_is_axes_or_function,
    )


def _function_pairs(axes: Any, tree: Any) -> list[tuple[Any, Any]]:
    """`(its axes, f)` for each time function f of `tree`."""
    pairs: list[tuple[Any, Any]] = []
    _on_functions(lambda a, f: pairs.append((a, f)) or f, axes, tree)
    return pairs


def batched_in_lockstep(
    single: Callable[[PyTree], Solution],
    arrays: PyTree,
    static: PyTree,
    solve_columns: Callable[..., Solution] | None,
    forward: bool,
    empty: Callable[[PyTree], Solution] | None = None,
) -> Solution:
    """`single(arrays)` (one solve, its inputs `eqx.combine(arrays, static)`: the
    term, state, times, rtol, atol, dt, observables and norms), stepped in
    lockstep when mapped by `jax.vmap` (see the module's docstring) where the batch
    allows it, element by element otherwise. `solve_columns(term, state, times,
    rtol, atol, dt, exp_ops, norms)` solves a `ColumnsTerm` (`None`: never in
    lockstep). `forward`: the solve's adjoint is forward mode. `empty`: the same
    solve to map over a batch of no elements instead of `single`, where
    `single` cannot be mapped over none (diffrax's progress meter takes a
    maximum over the batch, which has no identity)."""

    # Traced once: the batching rule's fallback and the derivatives run this
    # program, not `single` traced again (a second trace of the whole solve under
    # `jax.grad` or `jax.jvp`).
    leaves, tree = jax.tree.flatten(arrays)
    closed, shapes = jax.make_jaxpr(
        lambda *leaves: single(jax.tree.unflatten(tree, leaves)), return_shape=True
    )(*leaves)
    program = jax.extend.core.jaxpr_as_fun(closed)
    out_tree = jax.tree.structure(shapes)

    def plain(arrays: PyTree) -> Solution:
        return jax.tree.unflatten(out_tree, program(*jax.tree.leaves(arrays)))

    if any(isinstance(c, Tracer) for c in closed.consts):
        # Values of an enclosing trace inside the solve (a callable closing over a
        # traced parameter): they may be batched, and a batching rule's inputs
        # must be explicit. Mapped, such a solve goes element by element.
        return plain(arrays)

    def rule(axis_size: int, in_batched: Any, arrays: PyTree) -> Any:
        (flags,) = in_batched
        # Which outputs `jax.vmap` of the solve batches: the rule batches the
        # same, as the derivatives (the solve mapped) will. (A batch of no
        # elements has no columns to step.)
        out = None
        if solve_columns is not None and axis_size:
            out = _in_lockstep(arrays, flags, static, solve_columns, axis_size)
        if out is not None:
            batched = _lockstep_batched(out)
            # (Shared outputs, the times and `max_steps`, unbatched.)
            out = jax.tree.map(lambda x, b: x if b else x[0], out, batched)
        else:
            batched = _batched_outputs(plain, arrays, flags, axis_size)
            out_axes = jax.tree.map(lambda b: 0 if b else None, batched)
            run = empty if empty is not None and axis_size == 0 else plain
            out = jax.vmap(
                run, in_axes=(_axes(flags),), out_axes=out_axes, axis_size=axis_size
            )(arrays)
        return out, batched

    @jax.custom_batching.custom_vmap
    def mapped(arrays):
        return plain(arrays)

    mapped.def_vmap(rule)

    # Differentiated, the batch goes element by element, and only with respect to
    # the inputs that are (symbolic zeros: derivatives with respect to the times or
    # the matrices, say, would cost loops of their own).
    if forward:

        @jax.custom_jvp
        def call(arrays):
            return mapped(arrays)

        def derivative(primals, tangents):
            (values,), (given,) = primals, tangents
            leaves, tree = jax.tree.flatten(values)
            moved = [
                not isinstance(t, SymbolicZero)
                for t in jax.tree.leaves(
                    given, is_leaf=lambda t: isinstance(t, SymbolicZero)
                )
            ]
            chosen = [t for t, m in zip(jax.tree.leaves(given), moved) if m]
            of_moved = _of_chosen(plain, leaves, tree, moved)
            return jax.jvp(
                of_moved, tuple(v for v, m in zip(leaves, moved) if m), tuple(chosen)
            )

        call.defjvp(derivative, symbolic_zeros=True)
        return call(arrays)

    @jax.custom_vjp
    def call_(arrays):
        return mapped(arrays)

    held: dict[str, Any] = {}

    def forward_pass(arrays):
        primals, tree = jax.tree.flatten(arrays)
        values = [p.value for p in primals]
        held["moved"], held["tree"] = [p.perturbed for p in primals], tree
        of_moved = _of_chosen(plain, values, tree, held["moved"])
        return jax.vjp(of_moved, *[v for v, m in zip(values, held["moved"]) if m])

    def backward_pass(pullback, cotangent):
        cotangent = jax.tree.map(
            lambda c: _zeros(c) if isinstance(c, SymbolicZero) else c,
            cotangent,
            is_leaf=lambda c: isinstance(c, SymbolicZero),
        )
        given = iter(pullback(cotangent))
        leaves = [next(given) if m else None for m in held["moved"]]
        return (jax.tree.unflatten(held["tree"], leaves),)

    call_.defvjp(forward_pass, backward_pass, symbolic_zeros=True)
    return call_(arrays)


def _of_chosen(
    fn: Callable[[PyTree], Any], values: list, tree: Any, chosen: list[bool]
) -> Callable[..., Any]:
    """`fn` of the leaves marked `chosen` alone, the others held at `values`."""

    def of_chosen(*leaves: Any) -> Any:
        given = iter(leaves)
        full = [next(given) if c else v for v, c in zip(values, chosen)]
        return fn(jax.tree.unflatten(tree, full))

    return of_chosen


def _zeros(zero: "SymbolicZero") -> Array:
    """The array of a symbolic zero cotangent (`float0` for an integer primal)."""
    aval = zero.aval
    return jnp.zeros(aval.shape, aval.dtype)  # pyright: ignore[reportAttributeAccessIssue]


def _in_lockstep(
    arrays: PyTree,
    flags: PyTree,
    static: PyTree,
    solve_columns: Callable[..., Solution],
    size: int,
) -> Solution | None:
    """The batch's solution stepped in lockstep, or `None` where it cannot be: the
    batch shares its times, tolerances, step and observables, each state is a
    vector or a matrix (a propagator: its columns then adjacent columns of the
    batch's state) or shared, and the Hamiltonians are one, or differ only in
    constant coefficients, drive amplitudes and energy shifts (dense terms, no
    sampled pulses: their knots bound the steps). (Dense output is never stepped
    here: one interpolation per element.)"""
    term, state, times, rtol, atol, dt, exp_ops, norms = eqx.combine(arrays, static)
    (
        term_flags,
        state_flag,
        *rest_flags,
    ) = flags
    if any(jax.tree.leaves(rest_flags)) or not isinstance(term, SchrodingerTerm):
        return None
    matrix = state.ndim - bool(state_flag) == 2
    if matrix and exp_ops is not None:
        return None
    # A shared Hamiltonian steps the batch as the columns of one state as it is
    # (any structure: sparse terms, sampled pulses).
    shared = not any(jax.tree.leaves(term_flags))
    if not shared:
        rest = eqx.tree_at(
            lambda s: (s.hamiltonian, s.energy_shift), term_flags, replace=(None, None)
        )
        if any(jax.tree.leaves(rest)) or jump_times(term.hamiltonian) is not None:
            return None
        levels = state.shape[-2] if matrix else state.shape[-1]
        if not _differs_in_scales_only(
            term.hamiltonian, term_flags.hamiltonian, levels
        ):
            return None
    # Element b's column j is the batch's column b * repeat + j.
    repeat = state.shape[-1] if matrix else 1
    lanes = state if state_flag else jnp.broadcast_to(state, (size,) + state.shape)
    lanes = lanes.reshape(size, -1, repeat)
    columns = jnp.moveaxis(lanes, 0, 1).reshape(lanes.shape[1], size * repeat)
    axes = None if shared else _axes(term_flags.hamiltonian)
    stepped = term if shared else ColumnsTerm(term, axes, repeat=repeat)
    solution = solve_columns(stepped, columns, times, rtol, atol, dt, exp_ops, norms)
    batch = lambda x: jnp.broadcast_to(x, (size,) + jnp.shape(x))  # noqa: E731

    def elements(x: Array) -> Array:
        """The batch's columns (last axis) as its elements (first axis)."""
        x = jnp.moveaxis(x.reshape(x.shape[:-1] + (size, repeat)), -2, 0)
        return x if matrix else x[..., 0]

    return Solution(
        batch(solution.times),
        elements(solution.states),
        None if solution.expects is None else elements(solution.expects),
        {k: batch(v) for k, v in solution.stats.items()},
        solution.order,
        None,
        final_state=elements(solution.final_state),
    )
