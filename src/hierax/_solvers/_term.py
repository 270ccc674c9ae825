"""The Schrodinger and Lindblad equations as diffrax terms that the Taylor solver
steps through one method, `AbstractTaylorTerm.taylor_terms`."""

import abc
from collections.abc import Callable
from typing import Any, TypeVar, cast

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Complex, PyTree

from .._core import (
    as_time,
    backend_choices,
    by_batching,
    on_backend,
    placed,
    to_jax,
)
from .._data import SparseTerms, TermSeries, real_dtype
from .._kernels.density import REAL_DENSITY_SIZE, DensityParts
from .._kernels.propagator import (
    REAL_STATE_SIZE,
    SMALL_EMBEDDED_SIZE,
    DenseEmbedding,
    EmbeddedParts,
    dense_embedding,
    embedded_parts,
    state_series,
    step_signs,
)
from .._operators import (
    AbstractTimeOperator,
    OperatorSum,
    TimeOperator,
    apply_at_order_zero,
    as_time_operator,
    bind_args,
    check_jump_operators,
    merge_equal_terms,
    operator_bound,
    real_terms,
    series_degree,
    split_constant_trace,
    summands,
    time_operators,
    to_operator,
)
from ._density import density_step_terms, program_density_parts
from ._remainder import remainder_size
from ._resolution import equation_truncation


class _TimeControl(diffrax.AbstractTerm):
    """A term whose control is time, as in `diffrax.ODETerm`: the step's length
    times the vector field."""

    def contr(self, t0: ArrayLike, t1: ArrayLike, **kwargs) -> Array:
        del kwargs
        return jnp.asarray(t1) - jnp.asarray(t0)

    def prod(self, vf: Array, control: ArrayLike) -> Array:
        return vf * jnp.asarray(control).astype(vf.dtype)


class AbstractTaylorTerm(_TimeControl):
    """An equation $\\dot y = \\mathcal{G}_t[y]$, linear in the state, that
    [`hierax.TaylorSolver`][] steps with the exact Taylor series of the state (the
    control is time, as in `diffrax.ODETerm`; any diffrax solver can use its vector
    field).

    Subclasses say what the step's series is (`taylor_terms`), bound the size of
    the generator for the first step (`generator_bound`), and list their operators
    (`operators`: the Hamiltonian first).
    """

    @property
    @abc.abstractmethod
    def operators(self) -> tuple[AbstractTimeOperator, ...]:
        """The equation's operators, the Hamiltonian first."""

    @abc.abstractmethod
    def taylor_terms(
        self,
        t: Array,
        step: Array,
        y0: Array,
        order: int,
        args: PyTree,
        adjoint: bool = False,
    ) -> tuple[Array, Array]:
        """The terms $v_j = y^{(j)}(t)\\, h^j / j!$, $j = 0..K$, of the state's
        series for a step $h$ = `step` of either sign from $y(t) = $ `y0`, shape
        `(order + 1, *y0.shape)`, and the rate $r$ of an exact phase $e^{r}$
        applied to their sum (zero when there is none). `args`: diffrax's, the
        user's, passed to the operators' callables built with `takes_args=True`
        (`bind_args`); what the step needs is in the term's fields.
        `adjoint`: reverse mode differentiates the recursion by its adjoint
        recursion, and forward mode is refused (see `TaylorSolver`)."""

    def with_program_parts(self, t: Array, dtype: Any) -> "AbstractTaylorTerm":
        """The term with its step's parts assembled once inside the solve's
        program, at its start `t`, for the state's `dtype`, where none were
        assembled before compiling (traced operators); the term itself (the
        default) where the step assembles what it needs."""
        del t, dtype
        return self

    def function_truncation(
        self, t: Array, step: Array, order: int, args: PyTree
    ) -> Array | None:
        """How far a step of length `step` from `t` leaves the equation's time
        functions, at amplitude 1, unresolved at order K: a share that broadcasts
        against the state, or `None` without time-dependent functions (see
        `_resolution`)."""
        return equation_truncation(self.operators, args, t, step, order)

    def generator_remainder(
        self, t: Array, step: Array, order: int, args: PyTree, norms: Any
    ) -> Array | None:
        """A bound on how far the generator's series of order K at `t` strays from
        the generator anywhere in a step of length `step`, counted for the time
        functions whose series may hide a peak (`_remainder`); `None` where there
        are none. `norms`: the operators' `term_norms`, or `None`."""
        del t, step, order, args, norms
        return None

    @abc.abstractmethod
    def generator_bound(self, t: Array, norms: tuple[Any, ...]) -> Array:
        """An upper bound on the size of the generator at `t`, from which the first
        step is chosen; `norms`: the operators' `term_norms` (each `None` where not
        known before compiling)."""

    @property
    def size(self) -> int:
        """The dimension $n$ of the Hilbert space."""
        return self.operators[0].size


class SchrodingerTerm(AbstractTaylorTerm):
    """The right-hand side of the Schrödinger equation $\\dot y = -i H(t)\\, y$, for a
    state vector $y$ of shape `(n,)`, several states as columns `(n, m)`, or a
    propagator `(n, n)`, as a diffrax term (the control is time, as in
    `diffrax.ODETerm`).

    Any diffrax solver can use it through its vector field; [`hierax.TaylorSolver`][]
    uses its structure instead, and steps with the exact Taylor series of the state.

    The trace of the constant part of $H$ is kept apart as an energy shift $c$:
    $H(t) = H_0(t) + c\\,\\mathbb{1}$ with $H_0$ = `hamiltonian`. A multiple of the
    identity commutes with everything, so the solver applies it as the exact phase
    $e^{-ic\\tau}$ and expands only $H_0$ in series: an offset or the mean of large
    level energies then costs neither step size nor digits.

    What the step needs assembled once (`parts`: the terms' real embeddings) is a
    field of the term, which [`hierax.sesolve`][] fills; a term built here steps
    without it. diffrax's `args` are the user's: the term passes them to the
    callables of $H$ built with `takes_args=True` ([`hierax.CallableOperator`][],
    [`hierax.CallableTimeFunction`][]) and reads nothing else from them.
    """

    hamiltonian: AbstractTimeOperator
    energy_shift: Complex[Array, ""]
    parts: EmbeddedParts | DenseEmbedding | None

    def __init__(self, hamiltonian: Any):
        """**Arguments:**

        - `hamiltonian`: $H(t)$, in any form [`hierax.as_operator`][] accepts: a
            square matrix, a callable `t -> (n, n)`, or an operator such as
            `hierax.Cos(w) * sx + sz`.
        """
        operator = to_operator(hamiltonian, "hamiltonian", "hierax.SchrodingerTerm")
        operator = merge_equal_terms(operator)
        # The trace first, from the known dense matrices (in NumPy), then the terms
        # in real arithmetic, those with few nonzeros a row by their nonzeros where
        # the backend's gathers pay (`backend_choices`).
        operator, self.energy_shift = split_constant_trace(operator)
        if operator.size >= REAL_STATE_SIZE:
            sparse = backend_choices().applies_sparse(operator.size)
            operator = real_terms(operator, sparse=sparse)
        self.hamiltonian = operator
        # The terms' real embeddings: `sesolve` sets them (`with_parts`).
        self.parts = None

    @property
    def operators(self) -> tuple[AbstractTimeOperator, ...]:
        return (self.hamiltonian,)

    def taylor_terms(self, t, step, y0, order, args, adjoint=False):
        v = _schrodinger_terms(
            bind_args(self.hamiltonian, args), t, step, y0, order, self.parts, adjoint
        )
        # The energy shift, exactly, as the phase e^{-i c h}.
        return v, (-1j * step * self.energy_shift).astype(v.dtype)

    def with_program_parts(self, t, dtype):
        del t
        if self.parts is not None:
            return self
        return with_parts(self, program_embedded_parts(self.hamiltonian, dtype))

    def generator_bound(self, t, norms):
        return operator_bound(self.hamiltonian, t, norms[0])

    def generator_remainder(self, t, step, order, args, norms):
        operator = bind_args(self.hamiltonian, args)
        return remainder_size(operator, t, step, order, _norms_of(norms, 0))

    @on_backend("hierax.SchrodingerTerm")
    def vf(self, t: ArrayLike, y: Array, args: PyTree) -> Array:
        # Sparse terms stay sparse. (Not the public `apply`: its check that `t` is
        # finite is an `eqx.error_if`, whose stack walk cost each trace of a solve
        # about 20 ms, and diffrax's time is finite.)
        t = as_time(t, "hierax.SchrodingerTerm.vf", canonical=False, in_program=True)
        operator = bind_args(self.hamiltonian, args)
        hy = apply_at_order_zero(operator.sparse_series(t, 0, None), y)
        dtype = jnp.result_type(y, hy, self.energy_shift, 1j)
        y = y.astype(dtype)
        return -1j * (hy.astype(dtype) + self.energy_shift.astype(dtype) * y)


def _norms_of(norms: Any, i: int) -> Any:
    """The `term_norms` of operator `i`, `None` where not known."""
    return None if norms is None else norms[i]


def schrodinger_terms(
    hamiltonian: AbstractTimeOperator,
    t: Array,
    step: Array,
    y0: Array,
    order: int,
    parts: EmbeddedParts | DenseEmbedding | None = None,
    adjoint: bool = False,
    series_of: Callable[..., tuple[TermSeries | None, TermSeries | None]] | None = None,
) -> Array:
    """The terms $v_j = y^{(j)}(t)\\, h^j / j!$, $j = 0..K$, of $\\dot y = -iH y$,
    $y(t) = y_0$, for a step $h$ of either sign: shape `(order + 1, *y0.shape)`.

    With $\\tau = t + h\\sigma$, $dy/d\\sigma = -ih\\, H(t + h\\sigma)\\, y$, so
    $v_{j+1} = -\\frac{ih}{j+1} \\sum_m h_m v_{j-m}$ with $h_m$ the series of
    $H(t + h\\sigma)$: the series at scale $|h|$ with odd orders negated for
    $h < 0$. A loop over orders of fixed shape, so the traced program does not grow
    with K; the state's dtype sets the precision. Terms with real matrices (see
    `real_terms`) are applied in real arithmetic, to the real and imaginary parts
    of the state side by side: half the work of complex products. `parts`: the
    terms' real embeddings, dense for a tiny state (`program_embedded_parts`) or
    held by their diagonals (`known_embedded_parts`). Sparse terms with more than
    a few nonzeros per row (`_is_wide`: known dense matrices made sparse by
    `real_terms`) are applied dense to a state of several columns, and to states
    mapped by `jax.vmap` (`by_batching`). `adjoint`: see `series_loop`.
    `series_of(hamiltonian, t, order, scale, use_real)`: the step's `(real, other)`
    term series (`real_and_other_series` by default; a batch in lockstep gives one
    series per column).
    """
    size = jnp.abs(step)
    scale = jnp.where(size > 0, size, 1)
    real, series = (series_of or real_and_other_series)(
        hamiltonian, t, order, scale, y0.shape[0] >= REAL_STATE_SIZE
    )
    factor = step_signs(step, order) * step
    degree = series_degree(hamiltonian)
    if series is None or not _has_wide_sparse_terms(series):
        return state_series(real, series, factor, y0, order, parts, adjoint, degree)
    if y0.ndim > 1:
        real, series = _wide_sparse_made_dense(real, series)
        return state_series(real, series, factor, y0, order, parts, adjoint, degree)
    # One state: sparse products; a batch of them under `jax.vmap`: dense ones.
    arrays, static = eqx.partition((real, series, factor, y0), eqx.is_array)

    def layout(dense: bool):
        def run(arrays):
            real, series, factor, y0 = eqx.combine(arrays, static)
            if dense:
                real, series = _wide_sparse_made_dense(real, series)
            return state_series(real, series, factor, y0, order, parts, adjoint, degree)

        return run

    return by_batching(layout(False), layout(True))(arrays)


# Sparse terms with more nonzeros per row than this share of n are applied dense to
# a state of several columns or to states mapped by `jax.vmap` (up to n =
# `_WIDE_SPARSE_SIZE`): there one dense product serves every column, where a sparse
# one gathers per column. Measured (x64, 2 cores, 8 columns / a vmap of 16 kets,
# sparse against dense time): random terms at n = 256 with at most 6% a row
# 0.92 / 0.90, with 12% 1.7 / 2.3; n = 1024 with 5% 0.58 / 0.95, with 10% 1.7 /
# 2.5; the 8-site XXZ chain (3%) 0.28 / 0.67.
_WIDE_SPARSE_DENSITY = 0.08
_WIDE_SPARSE_SIZE = 4096


def _is_wide(matrix: Any) -> bool:
    n = matrix.values.shape[0]
    return n <= _WIDE_SPARSE_SIZE and matrix.values.shape[1] > _WIDE_SPARSE_DENSITY * n


def _has_wide_sparse_terms(series: TermSeries) -> bool:
    return series.sparse is not None and any(
        _is_wide(m) for m in series.sparse.matrices
    )


def _wide_sparse_made_dense(
    real: TermSeries | None, series: TermSeries
) -> tuple[TermSeries | None, TermSeries]:
    """`real` and `series` with the wide sparse terms (`_is_wide`) moved to the
    dense terms: those with real values to `real`, the others to `series`."""
    sparse = series.sparse
    moved = [s for s, m in enumerate(sparse.matrices) if _is_wide(m)]
    kept = [s for s in range(len(sparse.matrices)) if s not in moved]
    to_real = [s for s in moved if not jnp.iscomplexobj(sparse.matrices[s].values)]
    to_series = [s for s in moved if s not in to_real]

    def joined(part: TermSeries | None, chosen: list[int]) -> TermSeries | None:
        if not chosen:
            return part
        coefficients = jnp.stack([sparse.coefficients[s] for s in chosen])
        matrices = jnp.stack([sparse.matrices[s].todense() for s in chosen])
        flags = tuple(sparse.constant[s] for s in chosen)
        if part is None:
            return TermSeries(coefficients, matrices, None, flags)
        if part.coefficients.shape[0] == 0:
            return TermSeries(coefficients, matrices, part.dense, flags, part.sparse)
        dtype = jnp.result_type(part.coefficients, coefficients)
        mdtype = jnp.result_type(part.matrices, matrices)
        return TermSeries(
            jnp.concatenate(
                [part.coefficients.astype(dtype), coefficients.astype(dtype)]
            ),
            jnp.concatenate([part.matrices.astype(mdtype), matrices.astype(mdtype)]),
            part.dense,
            part.constant_flags() + flags,
            part.sparse,
        )

    rest = None
    if kept:
        rest = SparseTerms(
            jnp.stack([sparse.coefficients[s] for s in kept]),
            tuple(sparse.matrices[s] for s in kept),
            tuple(sparse.constant[s] for s in kept),
        )
    other = joined(series._replace(sparse=rest), to_series)
    assert other is not None
    return joined(real, to_real), other


def known_embedded_parts(
    hamiltonian: AbstractTimeOperator, dtype: Any
) -> EmbeddedParts | DenseEmbedding | None:
    """The parts of the small-state kernel (`_embedded_series`), in NumPy before
    compiling, placed in the real dtype of `dtype`, for a Hamiltonian of known
    dense terms below `REAL_STATE_SIZE` whose embeddings' diagonals pay
    (`embedded_parts`; else `None`). A tiny state's dense embeddings are formed
    in the solve's program instead (`program_embedded_parts`): from NumPy they
    were no faster (a qubit's eager `sesolve` 86 us either way, 128 against 125 us
    over a longer span; the same compile time).
    The terms are in the order of the step's series (the summands' in turn)."""
    ops = time_operators(hamiltonian)
    if ops is None or hamiltonian.size >= REAL_STATE_SIZE:
        return None
    if 2 * hamiltonian.size <= SMALL_EMBEDDED_SIZE:
        return None
    if any(op.is_sparse or placed(op.matrices) for op in ops):
        return None
    matrices = np.concatenate([np.asarray(op.matrices) for op in ops])
    parts = embedded_parts(matrices.astype(np.result_type(matrices, complex)))
    if parts is None:
        return None
    rdtype = real_dtype(dtype)
    return jax.tree.map(lambda x: to_jax(np.asarray(x, rdtype)), parts)


def program_embedded_parts(
    hamiltonian: AbstractTimeOperator, dtype: Any
) -> DenseEmbedding | None:
    """The `DenseEmbedding` of a tiny state's dense terms (known, or made inside a
    user's `jax.jit`), formed once inside the solve's program instead of in every
    step; `None` for any other."""
    ops = time_operators(hamiltonian)
    if ops is None or 2 * hamiltonian.size > SMALL_EMBEDDED_SIZE:
        return None
    if any(op.is_sparse for op in ops):
        return None
    dense = [cast(Array, op.matrices) for op in ops]  # not sparse: checked above
    embedding = dense_embedding(jnp.concatenate(dense).astype(dtype))
    return jax.tree.map(lambda x: x.astype(real_dtype(dtype)), embedding)


def real_and_other_series(
    hamiltonian: AbstractTimeOperator,
    t: Array,
    order: int,
    scale: Array,
    use_real: bool,
) -> tuple[TermSeries | None, TermSeries | None]:
    """The series of the dense terms whose matrices are real, and of the rest (each
    `None` when empty): kept apart, because a sum's series casts every matrix to
    the dtype of its (here complex) coefficients."""
    ops = summands(hamiltonian)
    is_real = [use_real and _real_dense(as_time_operator(op)) for op in ops]
    real = [op.sparse_series(t, order, scale) for op, r in zip(ops, is_real) if r]
    rest = [op for op, r in zip(ops, is_real) if not r]
    real_series = None
    if real:
        dtype = jnp.result_type(*[s.coefficients for s in real])
        real_series = TermSeries(
            jnp.concatenate([s.coefficients.astype(dtype) for s in real]),
            jnp.concatenate([s.matrices for s in real]),
            None,
            # Which rows are constant: a batch in lockstep takes each column's
            # values of those rows (`ColumnsTerm`), and the kernels merge them.
            sum((s.constant_flags() for s in real), ()),
        )
    if not rest:
        return real_series, None
    other = rest[0] if len(rest) == 1 else OperatorSum(rest)
    return real_series, other.sparse_series(t, order, scale)


def _real_dense(terms: TimeOperator | None) -> bool:
    return (
        terms is not None
        and not terms.is_sparse
        and not jnp.iscomplexobj(terms.matrices)
    )


class LindbladTerm(AbstractTaylorTerm):
    """The right-hand side of the Lindblad master equation for a density matrix
    $\\rho$ of shape `(n, n)` ($\\hbar = 1$),

    $$\\dot\\rho = -i[H(t), \\rho] + \\sum_j \\Big(L_j(t) \\rho L_j(t)^\\dagger
      - \\tfrac12 \\{L_j(t)^\\dagger L_j(t), \\rho\\}\\Big),$$

    as a diffrax term (the control is time, as in `diffrax.ODETerm`).

    Any diffrax solver can use it through its vector field; [`hierax.TaylorSolver`][]
    uses its structure instead, and steps with the exact Taylor series of $\\rho$,
    computed as [`hierax.DensityMatrixDerivatives`][] computes it.

    What the step needs assembled once (`parts`: the generator's step-independent
    parts) is a field of the term, which [`hierax.mesolve`][] fills; a term built
    here steps without it. diffrax's `args` are the user's: the term passes them
    to the callables of its operators built with `takes_args=True`
    ([`hierax.CallableOperator`][], [`hierax.CallableTimeFunction`][]) and reads
    nothing else from them.
    """

    hamiltonian: AbstractTimeOperator
    jump_operators: tuple[AbstractTimeOperator, ...]
    parts: DensityParts | None

    def __init__(self, hamiltonian: Any, jump_operators: Any):
        """**Arguments:**

        - `hamiltonian`: $H(t)$, in any form [`hierax.as_operator`][] accepts: a
            square matrix, a callable `t -> (n, n)`, or an operator such as
            `hierax.Cos(w) * sx + sz`.
        - `jump_operators`: a list (or tuple) of the $L_j(t)$, in the same forms,
            rates included in the operators (`jnp.sqrt(gamma) * sm`,
            `hierax.Polynomial(c) * sm`); `[]` for a closed system. One operator
            alone is one jump operator, and an `(J, n, n)` array is J of them, as
            in [`hierax.mesolve`][].
        """
        api = "hierax.LindbladTerm"
        hamiltonian = to_operator(hamiltonian, "hamiltonian", api)
        jumps = check_jump_operators(jump_operators, hamiltonian.size, api)
        # Structure for the Taylor solver's kernel: diagonal matrices act
        # elementwise, real and imaginary ones in real arithmetic.
        split = hamiltonian.size >= REAL_DENSITY_SIZE
        self.hamiltonian = real_terms(
            merge_equal_terms(hamiltonian), diagonal=True, split=split
        )
        self.jump_operators = tuple(
            real_terms(op, diagonal=True, split=split) for op in jumps
        )
        # The generator's step-independent parts: `mesolve` sets them
        # (`with_parts`).
        self.parts = None

    @property
    def operators(self) -> tuple[AbstractTimeOperator, ...]:
        return (self.hamiltonian, *self.jump_operators)

    def taylor_terms(self, t, step, y0, order, args, adjoint=False):
        # Without parts (`None`) the step assembles its own.
        v = _lindblad_terms(
            bind_args(self.hamiltonian, args),
            bind_args(self.jump_operators, args),
            t,
            step,
            y0,
            order,
            self.parts,
            adjoint,
        )
        return v, jnp.zeros((), v.dtype)

    def with_program_parts(self, t, dtype):
        if self.parts is not None:
            return self
        parts = program_density_parts(self.hamiltonian, self.jump_operators, t, dtype)
        return with_parts(self, parts)

    def generator_bound(self, t, norms):
        # The commutator's 2|H| and the dissipator's 2 sum_j |L_j|^2.
        size = 2 * operator_bound(self.hamiltonian, t, norms[0])
        for op, op_norms in zip(self.jump_operators, norms[1:]):
            size = size + 2 * operator_bound(op, t, op_norms) ** 2
        return size

    def generator_remainder(self, t, step, order, args, norms):
        # The commutator's 2 |dH|; a dissipator's |L rho L^+ - L' rho L'^+| and its
        # anticommutator's are each at most |dL| (|L| + |L'|), with |L'| <= |L| +
        # |dL| and |L| over the step at most its value at t plus |dL| (the series
        # to order K is exact up to the remainder).
        hamiltonian, jumps = bind_args((self.hamiltonian, self.jump_operators), args)
        found = remainder_size(hamiltonian, t, step, order, _norms_of(norms, 0))
        total = None if found is None else 2 * found
        for k, op in enumerate(jumps):
            d = remainder_size(op, t, step, order, _norms_of(norms, k + 1))
            if d is None:
                continue
            size = operator_bound(op, t, _norms_of(norms, k + 1))
            part = 4 * d * (2 * (size + d))
            total = part if total is None else total + part
        return total

    @on_backend("hierax.LindbladTerm")
    def vf(self, t: ArrayLike, y: Array, args: PyTree) -> Array:
        matrix = bind_args(self.hamiltonian, args)(t)
        jumps = [op(t) for op in bind_args(self.jump_operators, args)]
        dtype = jnp.result_type(y, matrix, *jumps, 1j)
        y = y.astype(dtype)
        h = matrix.astype(dtype)
        out = -1j * (h @ y - y @ h)
        for jump in jumps:
            jump = jump.astype(dtype)
            adjoint = jnp.conj(jump.T)
            number = adjoint @ jump
            out = out + jump @ y @ adjoint - 0.5 * (number @ y + y @ number)
        return out


_Term = TypeVar("_Term", SchrodingerTerm, LindbladTerm)


def with_parts(term: _Term, parts: PyTree) -> _Term:
    """`term` with its step's parts (`parts`, a field of `SchrodingerTerm` and
    `LindbladTerm`) replaced by `parts`: what `sesolve` and `mesolve` assemble
    before compiling, or the solve inside its program. The parts travel with the
    term, never in diffrax's `args`, which stay the user's."""
    if parts is None and term.parts is None:
        return term
    return eqx.tree_at(lambda t: t.parts, term, parts, is_leaf=lambda x: x is None)


class UnitTimeTerm(_TimeControl):
    """A term on $[t_0, t_1]$ seen on $s \\in [0, 1]$, $t = t_0 + s\\,(t_1 - t_0)$:
    how `sesolve` and `mesolve` hand their equation to diffrax, so that diffrax's
    bounds are constants (see `_steps` in `_integrate`). [`hierax.TaylorSolver`][]
    steps the wrapped term in physical time."""

    term: AbstractTaylorTerm
    start: Array
    span: Array

    def vf(self, t: ArrayLike, y: Array, args: PyTree) -> Array:
        out = self.term.vf(self.start + jnp.asarray(t) * self.span, y, args)
        return out * self.span.astype(out.dtype)


# diffrax traces a solver's step twice, once to learn its loop's static structure
# and once for the loop itself; behind a jit boundary the second trace reuses the
# first (a few hundredths of a second of each solve's compile).
_schrodinger_terms = eqx.filter_jit(schrodinger_terms)
_lindblad_terms = eqx.filter_jit(density_step_terms)
