"""The Lindblad term's step: its operators read into the inputs of the density
kernels (`_kernels/density.py`): each term's time-function series, and the
step-independent parts, assembled in NumPy before compiling when the operators are
known (`known_density_parts`; each kernel of assembly left out of the compiled step
is 4-8 ms less compile on a CPU) and in the step itself, in JAX, when they are
traced (a gradient with respect to a matrix, a user's own diffrax solve)."""

from collections.abc import Sequence
from typing import Any, cast

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._core import to_jax
from .._data import TermSeries, real_dtype
from .._kernels.density import (
    DensityParts,
    Term,
    VectorisedParts,
    cast_parts,
    density_generator,
    density_parts,
    density_series,
    structured_density_terms,
    vectorised_density_terms,
)
from .._kernels.propagator import step_signs
from .._operators import AbstractTimeOperator, TimeOperator, known_value, time_operators


def _time_operators(operator: AbstractTimeOperator) -> tuple[TimeOperator, ...] | None:
    """The `TimeOperator`s of an operator whose terms all have dense or diagonal
    matrices; `None` for any other (a callable, a general sparse matrix), which the
    generic kernel handles."""
    ops = time_operators(operator)
    if ops is None:
        return None
    if not all(op.term_matrices.is_dense_or_diagonal() for op in ops):
        return None
    return ops


def operator_series(
    operator: AbstractTimeOperator,
    t: Array,
    order: int,
    scale: Array,
    signs: Array,
) -> list[Array] | None:
    """The series at scale $h$ of each term's time function (in the order of
    `operator_terms`; `scale` $= |h|$, `signs` from `step_signs`); `None` for an
    operator the structured kernels do not take."""
    ops = _time_operators(operator)
    if ops is None:
        return None
    out: list[Array] = []
    for op in ops:
        for function in op.functions:
            c = function.series(t, order, scale)
            out.append(c * signs.astype(c.dtype))
    return out


def constant_terms(operator: AbstractTimeOperator) -> tuple[bool, ...] | None:
    """Which terms are constant in time (by their time function's structure), in
    the order of `operator_series`; `None` for an operator the structured
    kernels do not take."""
    ops = _time_operators(operator)
    if ops is None:
        return None
    return tuple(f.is_constant for op in ops for f in op.functions)


def operator_terms(
    operator: AbstractTimeOperator, series: list[Array] | None = None
) -> list[Term] | None:
    """The terms of an operator of `TimeOperator`s with dense or diagonal matrices.
    Without `series`: in NumPy, for known (not traced, not placed on a device)
    matrices and constant terms that are known `Constant`s, else `None`. With the
    step's `series` (`operator_series`): in JAX, the values of constant terms from
    their series."""
    ops = _time_operators(operator)
    if ops is None:
        return None
    terms = []
    index = 0
    for op in ops:
        if series is None and op.term_matrices.is_placed():
            return None
        # In NumPy when known (no step's series: `operator_terms` before compiling).
        xp = np if series is None else jnp
        matrices, diagonal = op.term_matrices.density_matrices(xp)
        for function, matrix in zip(op.functions, matrices):
            value = None
            constant = function.is_constant
            if constant and series is None:
                value = known_value(function)
                # A constant whose value is traced (a rate or a coupling under
                # `jax.grad`, `a * L` inside a user's jit) is stepped as a
                # time-dependent term: its matrix is known, its value comes from
                # its series in each step (`density_step_terms` computes the
                # series of every term).
                constant = value is not None
                value = None if value is None else np.reshape(value, (1,))
            elif constant and series is not None:
                value = series[index][:1]
            terms.append(Term(value, matrix, diagonal, constant))
            index += 1
    return terms


def known_density_parts(
    hamiltonian: AbstractTimeOperator,
    jump_operators: Sequence[AbstractTimeOperator],
    dtype: Any,
) -> DensityParts | None:
    """`density_parts` in NumPy (float64) before compiling, placed as JAX arrays
    of the state's precision; `None` when the operators are traced or not of the
    structured kernels' kind."""
    terms = operator_terms(hamiltonian)
    jumps = [operator_terms(op) for op in jump_operators]
    if terms is None or any(j is None for j in jumps):
        return None
    widened = [
        [
            t._replace(matrix=np.asarray(t.matrix, np.result_type(t.matrix, float)))
            for t in ts
        ]
        for ts in [terms, *[j for j in jumps if j is not None]]
    ]
    parts = density_parts(widened[0], widened[1:], hamiltonian.size, np)
    return cast_parts(parts, dtype, lambda x, d: to_jax(np.asarray(x, d)))


def traced_density_parts(
    operators: Sequence[AbstractTimeOperator],
    hamiltonian: list[Array],
    jumps: list[list[Array]],
    dtype: Any,
) -> DensityParts:
    """`density_parts` inside the step, in JAX, from the step's series of every
    term of the `operators` (H first; `operator_series`)."""
    terms = [
        operator_terms(op, series)
        for op, series in zip(operators, (hamiltonian, *jumps))
    ]
    assert all(t is not None for t in terms)  # the step's series came from them
    known = cast(list[list[Term]], terms)
    parts = density_parts(known[0], known[1:], operators[0].size, jnp)
    return cast_parts(parts, dtype, lambda x, d: x.astype(d))


def program_density_parts(
    hamiltonian: AbstractTimeOperator,
    jump_operators: Sequence[AbstractTimeOperator],
    t: Array,
    dtype: Any,
) -> DensityParts | None:
    """`density_parts` in JAX, once per solve inside its program, for operators
    whose parts could not be assembled before compiling (matrices or constants
    traced: built inside a user's `jax.jit`, or differentiated): the steps then
    take them as they take known parts, instead of assembling them in every step
    (XLA does not hoist that work out of diffrax's loop: the open transmon pair
    with `jnp` matrices inside a jit, 15 ms against 4.7 ms from NumPy ones).
    Only the values of constant terms are read, from their series at `t`; `None`
    for operators the structured kernels do not take."""
    one = jnp.ones((), real_dtype(dtype))
    signs = step_signs(one, 0)
    series = [
        operator_series(op, t, 0, one, signs) for op in (hamiltonian, *jump_operators)
    ]
    if any(s is None for s in series):
        return None
    known = cast(list[list[Array]], series)
    return traced_density_parts(
        (hamiltonian, *jump_operators), known[0], known[1:], dtype
    )


def density_step_terms(
    hamiltonian: AbstractTimeOperator,
    jump_operators: tuple[AbstractTimeOperator, ...],
    t: Array,
    step: Array,
    rho: Array,
    order: int,
    parts: DensityParts | None = None,
    adjoint: bool = False,
) -> Array:
    """The terms $v_j = \\rho^{(j)}(t)\\, h^j / j!$, $j = 0..K$, of the Lindblad
    equation with $\\rho(t) = $ `rho`, for a step $h$ of either sign: shape
    `(order + 1, n, n)`. Operators of `TimeOperator`s with dense or diagonal
    matrices go to the structured kernels, with `parts` (`known_density_parts`) or,
    without, parts assembled here; the rest to `generic_density_terms`. The state's
    dtype sets the precision. `adjoint`: see `series_loop` (the vectorised
    kernel's loop)."""
    dtype = jnp.result_type(rho, 1j)
    size = jnp.abs(step)
    scale = jnp.where(size > 0, size, 1)
    signs = step_signs(step, order)  # once for every operator
    # Every term's series: parts assembled before compiling take only those of
    # the terms they hold as time-dependent (constants whose values were traced
    # among them, see `operator_terms`), and the rest is never computed (a series
    # the kernels do not read is left out of the program).
    h = operator_series(hamiltonian, t, order, scale, signs)
    jumps = [operator_series(op, t, order, scale, signs) for op in jump_operators]
    if h is not None and all(j is not None for j in jumps):
        jumps = [j for j in jumps if j is not None]
        if parts is None:
            operators = (hamiltonian, *jump_operators)
            parts = traced_density_parts(operators, h, jumps, dtype)
        rho = rho.astype(dtype)
        # On vec(rho) (small systems, or superoperators with few diagonals at any
        # size): one product per order beats a dozen n x n ones.
        if isinstance(parts, VectorisedParts):
            flags = tuple(
                cast(tuple[bool, ...], constant_terms(op))
                for op in (hamiltonian, *jump_operators)
            )
            return vectorised_density_terms(
                parts, h, jumps, step, rho, order, adjoint, flags
            )
        return structured_density_terms(parts, h, jumps, step, rho, order)
    return generic_density_terms(hamiltonian, jump_operators, t, step, rho, order)


def generic_density_terms(
    hamiltonian: AbstractTimeOperator,
    jump_operators: tuple[AbstractTimeOperator, ...],
    t: Array,
    step: Array,
    rho: Array,
    order: int,
) -> Array:
    """`density_step_terms` for any operators (callables, general sparse
    matrices): the series of `density_series` at the scale $h$ itself."""
    dtype = jnp.result_type(rho, 1j)
    size = jnp.abs(step)
    scale = jnp.where(size > 0, size, 1)
    h = _signed(hamiltonian.term_series(t, order, scale), step)
    jumps = [_signed(op.term_series(t, order, scale), step) for op in jump_operators]
    step = step.astype(jnp.finfo(dtype).dtype)
    left, right, jumps = density_generator(h, jumps, step, dtype)
    return density_series(left, right, jumps, step, rho.astype(dtype), order)


def _signed(series: TermSeries, step: Array) -> TermSeries:
    """A series at scale $|h|$ turned into the series at scale $h$: odd orders
    negated for $h < 0$."""
    signs = step_signs(step, series.coefficients.shape[-1] - 1)
    dense = series.dense
    if dense is not None:
        dense = dense * signs.astype(dense.dtype)[:, None, None]
    return TermSeries(
        series.coefficients * signs.astype(series.coefficients.dtype)[None, :],
        series.matrices,
        dense,
        series.constant,
    )
