"""The Taylor method as a diffrax solver: each step sums the exact series of the
state, carried in the step's own time scale."""

import math
from typing import Any, ClassVar

import diffrax
import equinox as eqx
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Inexact, PyTree

from .._lindblad import density_generator, density_series
from .._operators import AbstractTimeOperator, OperatorSum, TimeOperator
from .._series import TermSeries, real_dtype
from .._sparse import sparse_products
from ._density import (
    DensityParts,
    VectorisedParts,
    lagged_weights,
    operator_series,
    real_embedding,
    step_signs,
    structured_density_terms,
    traced_density_parts,
    vectorised_density_terms,
)
from ._term import REAL_STATE_SIZE, LindbladTerm, SchrodingerTerm, UnitTimeTerm


class TaylorInterpolation(diffrax.AbstractLocalInterpolation):
    """Dense output over one step of [`hierax.TaylorSolver`][]: the step's own series,
    $y(t_0 + \\theta h) = e^{r \\theta} \\sum_j v_j \\theta^j$ for
    $0 \\le \\theta \\le 1$, as accurate anywhere in the step as at its end."""

    t0: Array
    t1: Array
    terms: Inexact[Array, "order_plus_1 n *rest"]
    rate: Array

    def evaluate(
        self, t0: ArrayLike, t1: ArrayLike | None = None, left: bool = True
    ) -> Array:
        del left
        if t1 is not None:
            return self.evaluate(t1) - self.evaluate(t0)
        span = self.t1 - self.t0
        theta = (jnp.asarray(t0) - self.t0) / jnp.where(span == 0, 1, span)
        return jnp.exp(self.rate * theta) * horner(self.terms, theta)


class TaylorSolver(diffrax.AbstractAdaptiveSolver):
    """The Taylor method of order $K$ for the Schrödinger equation: a step from $t$
    to $t + h$ sums the exact series of the state,
    $y(t + h) \\approx \\sum_{j=0}^{K} v_j$, $v_j = y^{(j)}(t)\\, h^j / j!$. The
    terms follow the recursion of [`hierax.PropagatorDerivatives`][] in the step's
    own time scale, $v_{j+1} = -\\frac{ih}{j+1} \\sum_{m \\le j} h_m v_{j-m}$ with
    $h_m$ the series of $\\tau \\mapsto H(t + h\\tau)$
    (`AbstractTimeOperator.term_series`): a few matrix products per
    order, and no power of $h$ or factorial is ever formed, so nothing overflows or
    underflows in float32.

    The error estimate is the size of the last two terms,
    $\\max(|v_{K-1}|, |v_K|)$ elementwise (Jorba and Zou's control), so
    a `diffrax.PIDController` with its default integral control sets the next step
    to where those terms meet the tolerance. Dense output (`SaveAt(ts=...)`,
    `SaveAt(dense=True)`) evaluates the step's own series, so saving at many times
    costs no extra steps and no accuracy.

    With a [`hierax.LindbladTerm`][] the state is a density matrix and the terms
    are those of its series, computed as [`hierax.DensityMatrixDerivatives`][]
    computes them, in the step's own time scale; the error estimate, dense output
    and step control are the same.

    Use it with a [`hierax.SchrodingerTerm`][] or a [`hierax.LindbladTerm`][].
    Supported adjoints are `diffrax.RecursiveCheckpointAdjoint` (the default),
    `diffrax.DirectAdjoint` and `diffrax.ForwardMode`.

    !!! example

        ```python
        term = hierax.SchrodingerTerm(hierax.Cos(1.0) * sx + sz)
        solution = diffrax.diffeqsolve(
            term, hierax.TaylorSolver(20), t0=0.0, t1=10.0, dt0=0.1, y0=psi0,
            stepsize_controller=diffrax.PIDController(rtol=1e-10, atol=1e-12),
        )
        ```

    ??? cite "Reference"

        ```bibtex
        @article{jorba2005software,
            title={A software package for the numerical integration of ODEs by means
                   of high-order Taylor methods},
            author={Jorba, {\\`A}ngel and Zou, Maorong},
            journal={Experimental Mathematics},
            volume={14},
            number={1},
            pages={99--117},
            year={2005}
        }
        ```
    """

    taylor_order: int = eqx.field(static=True)

    # A `SchrodingerTerm` or a `LindbladTerm`: `_unwrap` checks which, with a message.
    term_structure: ClassVar = diffrax.AbstractTerm
    interpolation_cls: ClassVar = TaylorInterpolation

    def __init__(self, order: int):
        """**Arguments:**

        - `order`: the order $K$ of the series, a Python int >= 1. It also sets the
            order of the error estimate; [`hierax.sesolve`][] chooses it from the
            tolerance.
        """
        self.taylor_order = check_taylor_order(order, "hierax.TaylorSolver")

    def order(self, terms: PyTree) -> int:
        del terms
        return self.taylor_order

    def error_order(self, terms: PyTree) -> int:
        del terms
        return self.taylor_order

    def init(self, terms, t0, t1, y0, args) -> None:
        del terms, t0, t1, y0, args
        return None

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del solver_state, made_jump
        term, direction, start, span = _unwrap(terms)
        # diffrax integrates in s = direction * t (or in the unit time of a
        # `UnitTimeTerm`); the series is in physical time.
        time = start + span * (direction * t0)
        step = span * (direction * (t1 - t0))
        if isinstance(term, LindbladTerm):
            # `mesolve` hands the generator's parts, assembled before compiling, as
            # diffrax's `args`; without them the step assembles its own.
            parts = args if isinstance(args, DensityParts) else None
            v = _density_step_terms(term, time, step, y0, self.taylor_order, parts)
            rate = jnp.zeros((), v.dtype)
        else:
            v = _step_terms(term.hamiltonian, time, step, y0, self.taylor_order)
            rate = (-1j * step * term.energy_shift).astype(v.dtype)
        phase = jnp.exp(rate)
        y1 = phase * jnp.sum(v, axis=0)
        y_error = truncation_estimate(v) * jnp.abs(phase)
        dense_info = dict(terms=v, rate=rate)
        return y1, y_error, dense_info, None, diffrax.RESULTS.successful

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)


def _unwrap(
    terms: Any,
) -> tuple[SchrodingerTerm | LindbladTerm, Array, Array, Array]:
    """The `SchrodingerTerm` or `LindbladTerm` inside the time-reversal wrapper
    diffrax puts around every term, the direction of integration, and the map
    $t = $ `start + span * s` of a `UnitTimeTerm` (0 and 1 without one)."""
    direction = jnp.ones((), int)
    start, span = jnp.zeros(()), jnp.ones(())
    while not isinstance(terms, SchrodingerTerm | LindbladTerm):
        if isinstance(terms, UnitTimeTerm):
            start, span, terms = terms.start, terms.span, terms.term
            continue
        # diffrax's `WrapTerm(term, direction)`; adjoint wrappers carry no direction.
        if not (hasattr(terms, "term") and hasattr(terms, "direction")):
            raise TypeError(
                "`hierax.TaylorSolver` steps a `hierax.SchrodingerTerm` or a "
                f"`hierax.LindbladTerm`, got "
                f"`{type(terms).__name__}`. Backsolve adjoints are not supported: use "
                "`diffrax.RecursiveCheckpointAdjoint()` (the default), "
                "`diffrax.DirectAdjoint()` or `diffrax.ForwardMode()`."
            )
        direction = direction * terms.direction
        terms = terms.term
    return terms, direction, start, span


def step_terms(
    hamiltonian: AbstractTimeOperator, t: Array, step: Array, y0: Array, order: int
) -> Array:
    """The terms $v_j = y^{(j)}(t)\\, h^j / j!$, $j = 0..K$, of $\\dot y = -iH y$,
    $y(t) = y_0$, for a step $h$ of either sign: shape `(order + 1, *y0.shape)`.

    With $\\tau = t + h\\sigma$, $dy/d\\sigma = -ih\\, H(t + h\\sigma)\\, y$, so
    $v_{j+1} = -\\frac{ih}{j+1} \\sum_m h_m v_{j-m}$ with $h_m$ the series of
    $H(t + h\\sigma)$: the series at scale $|h|$ with odd orders negated for
    $h < 0$. A loop over orders of fixed shape, so the traced program does not grow
    with K; the state's dtype sets the precision. Terms with real matrices (see
    `real_terms`) are applied in real arithmetic, to the real and imaginary parts
    of the state side by side: half the work of complex products.
    """
    dtype = jnp.result_type(y0, 1j)
    rdtype = real_dtype(dtype)
    size = jnp.abs(step)
    scale = jnp.where(size > 0, size, 1)
    small = y0.shape[0] < REAL_STATE_SIZE
    real, series = _real_and_other_series(hamiltonian, t, order, scale, not small)
    signs = step_signs(step, order)
    if (
        small
        and real is None
        and series is not None
        and series.dense is None
        and series.sparse is None
    ):
        return _embedded_step_terms(series, (signs * step).astype(rdtype), y0, order)
    signs = signs.astype(dtype)
    # -i h / (j + 1) goes into the weights, so each order costs the products only.
    factor = signs * (-1j * step).astype(dtype)
    n = y0.shape[0]
    parts = []
    for part, matrix_dtype in ((real, rdtype), (series, dtype)):
        if part is None or part.coefficients.shape[0] == 0:
            continue
        # (A, n, n) -> (n, A n): the products of all terms as one matrix product.
        count = part.coefficients.shape[0]
        stacked = jnp.transpose(part.matrices.astype(matrix_dtype), (1, 0, 2))
        coefficients = part.coefficients.astype(dtype) * factor[None, :]
        parts.append((coefficients, stacked.reshape(n, count * n)))
    dense = sparse = None
    if series is not None and series.dense is not None:
        shape = (-1,) + (1,) * (series.dense.ndim - 1)
        dense = series.dense.astype(dtype) * factor.reshape(shape)
    if series is not None and series.sparse is not None:
        # The matrices keep their kind: `sparse_products` casts them.
        sparse = series.sparse._replace(
            coefficients=series.sparse.coefficients.astype(dtype) * factor[None, :]
        )
    return _series_loop(parts, dense, sparse, y0.astype(dtype), order)


def _embedded_step_terms(
    series: TermSeries, factor: Array, y0: Array, order: int
) -> Array:
    """`step_terms` for a small state and dense terms, in real arithmetic: the state
    as $(\\Re y, \\Im y)$ and each $-iH_a = I_a - iR_a$ ($H_a = R_a + iI_a$) as the
    real matrix $\\begin{pmatrix} I_a & R_a \\\\ -R_a & I_a \\end{pmatrix}$. The
    same operations as a complex product, but XLA's CPU products of small complex
    matrices cost about four times as much as real ones of twice the size (measured,
    n = 32: 1.15 us against 0.27 us per product). A complex coefficient
    $c = c_r + i c_i$ adds the terms $c_i H_a$ (embedded as
    $\\begin{pmatrix} R_a & -I_a \\\\ I_a & R_a \\end{pmatrix}$). `factor` holds
    $h$ with odd orders negated for $h < 0$."""
    dtype = jnp.result_type(y0, 1j)
    rdtype = real_dtype(dtype)
    n = y0.shape[0]
    matrices = series.matrices.astype(dtype)
    # -iH = I - iR, formed part by part (no product with -1j).
    blocks = [real_embedding(lax.complex(matrices.imag, -matrices.real))]
    coefficients = [series.coefficients.real.astype(rdtype) * factor[None, :]]
    if jnp.iscomplexobj(series.coefficients):
        blocks.append(real_embedding(matrices))
        coefficients.append(series.coefficients.imag.astype(rdtype) * factor[None, :])
    # Side by side, (2n, A' 2n), as one concatenation of the blocks (not a
    # transpose of their stack: formed every step, and XLA's older CPU emitters,
    # with which small states compile, transpose slowly).
    stacked = jnp.concatenate([b for block in blocks for b in block], axis=1)
    y = y0.astype(dtype)
    v = _series_loop(
        [(jnp.concatenate(coefficients), stacked)],
        None,
        None,
        jnp.concatenate([y.real, y.imag]),
        order,
    )
    return lax.complex(v[:, :n], v[:, n:])


# From this many entries of a state on, `_series_loop` carries each order beside the
# series (see there). Measured (`sesolve`, Ising chains with sparse terms, 2 cores):
# unequal fields (products that read every entry) n = 65536 282 -> 212 ms, n = 16384
# 55 -> 50 ms; a uniform sum_i X_i (`UniformSparseMatrix`) 160 -> 156 ms and
# 40 -> 44 ms; below, handing the products to threads costs more than it saves
# (n = 8192 20-21 -> 22 ms, n = 4096 18 -> 24 ms).
_PARALLEL_STATE_SIZE = 16384


def _series_loop(
    parts: list[tuple[Array, Array]],
    dense: Array | None,
    sparse: Any,
    y0: Array,
    order: int,
) -> Array:
    """The recursion $v_{j+1} = \\frac{1}{j+1} \\sum_m h_m v_{j-m}$, $v_0 = y_0$,
    with the step's factor already in the series: `parts` are (coefficients
    `(A, K+1)`, matrices side by side `(n, A n)`), `dense` a series `(K+1, n, n)`,
    `sparse` sparse terms. A loop over orders of fixed shape, so the traced program
    does not grow with K. Real matrices with a complex state are applied to its real
    and imaginary parts side by side."""
    dtype = y0.dtype
    n = y0.shape[0]
    columns = math.prod(y0.shape[1:])
    lags = jnp.arange(order + 1)
    v = jnp.zeros((order + 1,) + y0.shape, dtype).at[0].set(y0)
    # The Cauchy product's window of each order (with its 1 / (j + 1)), formed once.
    windows = [lagged_weights(c) for c, _ in parts]

    def body(j, v, current):
        out = jnp.zeros((n, columns), dtype)
        for window, (_, stacked) in zip(windows, parts):
            weights = lax.dynamic_index_in_dim(window, j, axis=1, keepdims=False)
            inner = jnp.tensordot(weights, v, axes=(1, 0)).reshape(-1, columns)
            if jnp.iscomplexobj(stacked) or not jnp.iscomplexobj(inner):
                out = out + stacked @ inner
            else:
                # One pass over the real matrices for both halves of the state.
                both = stacked @ jnp.concatenate([inner.real, inner.imag], axis=1)
                out = out + lax.complex(both[:, :columns], both[:, columns:])
        out = out.reshape(y0.shape)
        if dense is not None or sparse is not None:
            valid = lags <= j
            index = jnp.where(valid, j - lags, 0)
            rest = jnp.zeros(y0.shape, dtype)
            if dense is not None:
                window = jnp.where(
                    valid.reshape((-1,) + (1,) * (dense.ndim - 1)), dense[index], 0
                )
                rest = rest + jnp.tensordot(window, v, axes=((0, 2), (0, 1)))
            if sparse is not None:
                rest = rest + sparse_products(sparse, v, j, current)
            # 1 / (j + 1) as a real factor: a complex division costs far more.
            out = out + rest * (1 / (j + 1)).astype(real_dtype(dtype))
        return out

    if sparse is None or n * columns < _PARALLEL_STATE_SIZE:
        return lax.fori_loop(
            0,
            order,
            lambda j, v: lax.dynamic_update_index_in_dim(v, body(j, v, None), j + 1, 0),
            v,
        )

    # XLA:CPU fuses the computation of an order into the in-place update of `v`,
    # which it runs on one thread. For a large state the order is also carried
    # beside `v` (read by the next order's constant terms, and written once more
    # after the loop, so that the carry stays live whatever the terms): the
    # products then form a loop fusion of their own, which XLA splits across
    # threads.
    def carried(j, state):
        v, current = state
        out = body(j, v, current)
        return lax.dynamic_update_index_in_dim(v, out, j + 1, 0), out

    v, last = lax.fori_loop(0, order, carried, (v, v[0]))
    return lax.dynamic_update_index_in_dim(v, last, order, 0)


def _real_and_other_series(
    hamiltonian: AbstractTimeOperator,
    t: Array,
    order: int,
    scale: Array,
    use_real: bool,
) -> tuple[TermSeries | None, TermSeries | None]:
    """The series of the dense terms whose matrices are real, and of the rest (each
    `None` when empty): kept apart, because a sum's series casts every matrix to
    the dtype of its (here complex) coefficients."""
    ops = hamiltonian.operators if isinstance(hamiltonian, OperatorSum) else ()
    ops = ops or (hamiltonian,)
    is_real = [
        use_real
        and isinstance(op, TimeOperator)
        and not op.is_sparse
        and not jnp.iscomplexobj(op.matrices)
        for op in ops
    ]
    real = [op.sparse_series(t, order, scale) for op, r in zip(ops, is_real) if r]
    rest = [op for op, r in zip(ops, is_real) if not r]
    real_series = None
    if real:
        dtype = jnp.result_type(*[s.coefficients for s in real])
        real_series = TermSeries(
            jnp.concatenate([s.coefficients.astype(dtype) for s in real]),
            jnp.concatenate([s.matrices for s in real]),
            None,
        )
    if not rest:
        return real_series, None
    other = rest[0] if len(rest) == 1 else OperatorSum(rest)
    return real_series, other.sparse_series(t, order, scale)


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


def density_step_terms(
    term: LindbladTerm,
    t: Array,
    step: Array,
    rho: Array,
    order: int,
    parts: DensityParts | None = None,
) -> Array:
    """The terms $v_j = \\rho^{(j)}(t)\\, h^j / j!$, $j = 0..K$, of the Lindblad
    equation with $\\rho(t) = $ `rho`, for a step $h$ of either sign: shape
    `(order + 1, n, n)`. Operators of `TimeOperator`s with dense or diagonal
    matrices go to the structured kernels, with `parts` (`known_density_parts`) or,
    without, parts assembled here; the rest to `generic_density_terms`. The state's
    dtype sets the precision."""
    dtype = jnp.result_type(rho, 1j)
    size = jnp.abs(step)
    scale = jnp.where(size > 0, size, 1)
    signs = step_signs(step, order)  # once for every operator
    # With parts, only the time-dependent terms' series (and all of a
    # time-dependent jump operator's) are needed.
    hamiltonian = operator_series(
        term.hamiltonian, t, order, scale, signs, parts is None
    )
    jumps = [
        operator_series(op, t, order, scale, signs, parts is None or not _constant(op))
        for op in term.jump_operators
    ]
    if hamiltonian is not None and all(j is not None for j in jumps):
        jumps = [j for j in jumps if j is not None]
        if parts is None:
            parts = traced_density_parts(term, hamiltonian, jumps, dtype)
        rho = rho.astype(dtype)
        # Small systems on vec(rho): one product per order beats a dozen tiny ones.
        if isinstance(parts, VectorisedParts):
            return vectorised_density_terms(parts, hamiltonian, jumps, step, rho, order)
        return structured_density_terms(parts, hamiltonian, jumps, step, rho, order)
    return generic_density_terms(term, t, step, rho, order)


def generic_density_terms(
    term: LindbladTerm, t: Array, step: Array, rho: Array, order: int
) -> Array:
    """`density_step_terms` for any operators (callables, general sparse
    matrices): the series of `density_series` at the scale $h$ itself."""
    dtype = jnp.result_type(rho, 1j)
    size = jnp.abs(step)
    scale = jnp.where(size > 0, size, 1)
    h = _signed(term.hamiltonian.term_series(t, order, scale), step)
    jumps = [
        _signed(op.term_series(t, order, scale), step) for op in term.jump_operators
    ]
    step = step.astype(jnp.finfo(dtype).dtype)
    left, right, jumps = density_generator(h, jumps, step, dtype)
    return density_series(left, right, jumps, step, rho.astype(dtype), order)


def _constant(operator: AbstractTimeOperator) -> bool:
    """Whether every term of an operator has a constant time function."""
    ops = operator.operators if isinstance(operator, OperatorSum) else (operator,)
    return all(
        isinstance(op, TimeOperator) and all(f.is_constant for f in op.functions)
        for op in ops
    )


# diffrax traces a solver's step twice, once to learn its loop's static structure
# and once for the loop itself; behind a jit boundary the second trace reuses the
# first (a few hundredths of a second of each solve's compile).
_step_terms = eqx.filter_jit(step_terms)
_density_step_terms = eqx.filter_jit(density_step_terms)


def horner(terms: Array, theta: ArrayLike) -> Array:
    """$\\sum_j v_j \\theta^j$ by Horner's rule."""
    theta = jnp.asarray(theta).astype(terms.dtype)
    body = lambda total, v: (total * theta + v, None)
    total, _ = lax.scan(body, terms[-1], terms[:-1], reverse=True)
    return total


def truncation_estimate(terms: Array) -> Array:
    """$\\max(|v_{K-1}|, |v_K|)$ elementwise (the last term alone for K = 1). It
    steers the step size only, so it carries no gradient."""
    terms = lax.stop_gradient(terms)
    order = terms.shape[0] - 1
    if order == 1:
        return jnp.abs(terms[1])
    return jnp.maximum(jnp.abs(terms[order - 1]), jnp.abs(terms[order]))


def order_for_tolerance(tolerance: float, dtype: Any) -> int:
    """The series order for a local tolerance.

    Jorba and Zou's optimum, $K \\approx -\\tfrac12 \\ln \\varepsilon + 1$, assumes
    an O(K^2) cost per step; here a step costs a few matrix products per order, so
    a step of order K goes about K / (e^2 ||H||) far and higher orders pay: we take
    about twice theirs. The cap keeps $x = \\|H\\| h$ below about 4, where the
    largest term of the series, about $e^x$, costs no more than two digits to
    rounding (30 in float64, 18 in float32).
    """
    eps = float(jnp.finfo(dtype).eps)
    cap = 30 if eps < 1e-10 else 18
    tolerance = max(float(tolerance), eps)
    return min(cap, max(4, math.ceil(-math.log(tolerance) + 2)))


def check_taylor_order(order: Any, api: str) -> int:
    if isinstance(order, bool) or not isinstance(order, int | np.integer):
        raise TypeError(
            f"`{api}`: `order` must be a Python int >= 1, got {type(order).__name__}."
        )
    if order < 1:
        raise ValueError(f"`{api}`: `order` must be >= 1, got {order}.")
    return int(order)
