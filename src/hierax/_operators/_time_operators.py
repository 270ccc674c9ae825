"""Time-dependent operators: sums of time functions times matrices, and callables."""

import abc
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jaxtyping import Array, ArrayLike, Inexact, PyTree

from .._core import (
    OperatorSeries,
    OrderLike,
    Time,
    TimeLike,
    as_sequence,
    as_square_matrix,
    as_time,
    built_for,
    check_order,
    check_time_finite,
    host_method,
    is_traced,
    module_jit,
    object_hint,
    placed,
    refuse_non_matrix,
    run_checked,
    to_jax,
    trace_callable,
    typechecked,
)
from .._data import (
    SparseTerms,
    TermSeries,
    apply_terms,
    as_sparse,
    densified,
    is_sparse,
    lower_toeplitz,
    result_dtype,
    scalar_cauchy_product,
)
from .._time import (
    AbstractTimeFunction,
    CallableTimeFunction,
    Constant,
    TimeFunctionProduct,
    TimeFunctionSum,
    as_time_function,
    bound_args,
    callable_series,
    check_takes_args,
    held_args,
    largest_degree,
    product_degree,
    register_operator_product,
)
from ._term_matrices import (
    AbstractTermMatrices,
    DenseTermMatrices,
    SparseTermMatrices,
)


_T = TypeVar("_T")


class AbstractTimeOperator(eqx.Module):
    """An $n \\times n$ operator-valued function of time $H(t)$.

    Subclasses implement one method, [`hierax.AbstractTimeOperator.term_series`][]
    (and say their `size` and whether they are constant). Calling the object gives
    the matrix at a time, `taylor` its normalised Taylor coefficients. Operators
    add, subtract, and multiply by numbers and by time functions
    ([`hierax.AbstractTimeFunction`][]).
    """

    __array_ufunc__ = None

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """The dimension $n$ of the operator."""

    @property
    @abc.abstractmethod
    def is_constant(self) -> bool:
        """Whether the operator is constant in time (from its structure)."""

    @abc.abstractmethod
    def term_series(self, t: Time, order: int, time_scale: Array | None) -> TermSeries:
        """The series of $\\sigma \\mapsto H(t + s\\sigma)$ to order `order`, in
        parts: time-function coefficients times constant matrices, plus a dense
        part. Called with arguments already checked, as
        [`hierax.AbstractTimeFunction.series`][] is."""

    def sparse_series(
        self, t: Time, order: int, time_scale: Array | None
    ) -> TermSeries:
        """`term_series` with sparse matrices kept sparse (in its `sparse` part):
        what the kernels that act on states use. The default is `term_series`."""
        return self.term_series(t, order, time_scale)

    def apply(self, t: TimeLike, state: ArrayLike) -> Array:
        """$H(t)$ times a state of shape `(n,)` or `(n, m)`, with sparse terms
        kept sparse (`H(t) @ state` without forming the matrix)."""
        api = f"hierax.{type(self).__name__}.apply"
        t = as_time(t, api, canonical=False, in_program=True)
        return run_checked(_apply, self, t, jnp.asarray(state))

    @typechecked
    def __call__(self, t: TimeLike) -> Inexact[Array, "n n"]:
        """The operator at one time.

        **Arguments:**

        - `t`: the time, a scalar.

        **Returns:**

        The matrix $H(t)$, shape `(n, n)`.
        """
        api = f"hierax.{type(self).__name__}(...)(t)"
        t = as_time(t, api, canonical=False, in_program=True)
        return run_checked(_value, self, t)

    @typechecked
    def taylor(self, t: TimeLike, order: OrderLike) -> OperatorSeries:
        """Normalised Taylor coefficients of the operator at `t`.

        **Arguments:**

        - `t`: the time, a scalar.
        - `order`: the highest order $K$, a non-negative Python int.

        **Returns:**

        An array of shape `(order + 1, n, n)` holding $H^{(j)}(t) / j!$.
        """
        api = f"hierax.{type(self).__name__}.taylor"
        order = check_order(order, api)
        t = as_time(t, api, canonical=False, in_program=True)
        return run_checked(_taylor, self, t, order=order)

    def __add__(self, other: Any) -> "AbstractTimeOperator":
        if _is_zero(other):
            return self
        other = to_operator(other, "other", f"hierax.{type(self).__name__} + ...")
        if other.size != self.size:
            raise ValueError(
                f"Cannot add operators of sizes {self.size} and {other.size}."
            )
        mine, theirs = as_time_operator(self), as_time_operator(other)
        if (
            mine is not None
            and theirs is not None
            and mine.is_sparse == theirs.is_sparse
        ):
            # Both already checked: their matrices joined, not split and checked
            # again (a sum of twelve drives checked each matrix 78 times).
            functions = mine.functions + theirs.functions
            return TimeOperator(
                functions, mine.term_matrices.joined(theirs.term_matrices)
            )
        return OperatorSum((self, other))

    def __radd__(self, other: Any) -> "AbstractTimeOperator":
        if _is_zero(other):
            return self  # so that `sum(...)` works
        return to_operator(other, "other", f"... + hierax.{type(self).__name__}") + self

    def __neg__(self) -> "AbstractTimeOperator":
        return self * -1.0

    def __sub__(self, other: Any) -> "AbstractTimeOperator":
        if _is_zero(other):
            return self
        api = f"hierax.{type(self).__name__} - ..."
        return self + (-to_operator(other, "other", api))

    def __rsub__(self, other: Any) -> "AbstractTimeOperator":
        api = f"... - hierax.{type(self).__name__}"
        return to_operator(other, "other", api) + (-self)

    def __mul__(self, other: Any) -> "AbstractTimeOperator":
        if isinstance(other, AbstractTimeFunction) or _is_number(other):
            return _scaled(other, self)
        hint = object_hint(other)
        if hint:
            raise TypeError(
                f"`hierax.{type(self).__name__} * ...`: `other` must be a number or "
                f"a time function, got an array of dtype object{hint}."
            )
        return NotImplemented

    def __rmul__(self, other: Any) -> "AbstractTimeOperator":
        return self.__mul__(other)

    def __truediv__(self, other: Any) -> "AbstractTimeOperator":
        if _is_number(other):
            return _scaled(1 / other, self)
        return NotImplemented

    def _times_constant(self, factor: "Constant") -> "AbstractTimeOperator":
        """`factor * self` for a constant factor; operators with terms fold it into
        their terms' functions."""
        return ScaledOperator(factor, self)

    # Queries of the operator's structure, answered by each kind of operator (the
    # defaults are those of an operator without structure, a callable).

    @host_method
    def is_hermitian(self) -> bool:
        """Whether every constant matrix of the operator is known here to be exactly
        Hermitian (concrete values; callables and traced matrices are not known).
        With real time functions, which a compiled call checks from their dtype,
        the operator is then Hermitian at every time."""
        return False

    @host_method
    def is_mirrored(self, sign: Callable[[AbstractTimeFunction], int]) -> bool:
        """Whether $H(c + s) = \\overline{H(c - s)}$ for every real s, as far as the
        structure and known values tell (no where they do not), given for each
        time function f the sign $\\sigma$ = `sign(f)` with
        $f(c + s) = \\sigma\\, \\overline{f(c - s)}$ (0: none, or not known)."""
        del sign
        return False

    def fold_functions(
        self,
        function: Callable[[AbstractTimeFunction], _T],
        terms: Callable[[list[_T]], _T],
        times: Callable[[_T, _T], _T],
        unknown: _T,
    ) -> _T:
        """The time functions folded along the operator's structure: each by
        `function`, those of a sum of terms (a `TimeOperator`'s terms, an
        `OperatorSum`'s parts) by `terms`, a time function and the operator it
        scales by `times`; `unknown` for an operator without that structure."""
        del function, terms, times
        return unknown


def _scaled(factor: Any, operator: AbstractTimeOperator) -> AbstractTimeOperator:
    """`factor * operator`: a number (a traced one too) folded into the terms'
    functions where the operator has terms (`2 * (Cos(w) * sx)` is
    `Cos(w, amplitude=2) * sx`), so that a solve's step computes no product of
    series for it; a time function otherwise scales the whole operator."""
    api = f"hierax.{type(operator).__name__} * ..."
    function = built_for(api, "the factor", as_time_function, factor, "factor", api)
    if isinstance(function, Constant):
        return operator._times_constant(function)
    return ScaledOperator(function, operator)


def _is_number(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, (int, float, complex)):
        return True
    # (A 0-d array of objects is no number: `np.asarray` of a sparse matrix is one.)
    return (
        hasattr(x, "shape")
        and hasattr(x, "dtype")
        and x.shape == ()
        and np.dtype(x.dtype).kind in "iufc"
    )


# What `term_series` says when a sparse operator would need too much memory dense.
_DENSE_USE = "A dense use of a sparse operator (its matrix, series or hierarchy)"


def apply_at_order_zero(series: TermSeries, state: Array) -> Array:
    """$H(t)$ times `state` from the order-0 coefficients of a series."""
    dtype = jnp.result_type(result_dtype(series), state)
    series = series.astype(dtype)
    state = state.astype(dtype)
    out = jnp.tensordot(
        jnp.tensordot(series.coefficients[:, 0], series.matrices, axes=(0, 0)),
        state,
        axes=(1, 0),
    )
    if series.dense is not None:
        out = out + series.dense[0] @ state
    if series.sparse is not None:
        c = series.sparse.coefficients[:, 0]
        out = out + apply_terms(
            series.sparse, c.reshape(c.shape + (1,) * state.ndim) * state[None]
        )
    return out


def _is_zero(x: Any) -> bool:
    return type(x) in (int, float, complex) and x == 0


class TimeOperator(AbstractTimeOperator):
    """A Hamiltonian or observable with term structure,
    $H(t) = \\sum_{a=1}^{A} f_a(t) H_a$, with time functions $f_a$ and constant
    matrices $H_a$.

    Usually built by arithmetic: `hierax.Cos(2.0) * sx + 0.5 * sz` is a two-term
    `TimeOperator`. The term structure lets the hierarchies spend a few matrix
    products per term and order instead of one per order and order.
    """

    functions: tuple[AbstractTimeFunction, ...]
    term_matrices: AbstractTermMatrices

    def __init__(
        self,
        functions: Sequence[Any],
        matrices: Sequence[Any] | ArrayLike | AbstractTermMatrices,
    ):
        """**Arguments:**

        - `functions`: the time functions $f_a$ (numbers mean constants).
        - `matrices`: the matrices $H_a$, a sequence of `(n, n)` arrays or one
            `(A, n, n)` array. Integer and real matrices are promoted. Sparse
            matrices (`scipy.sparse`, BCOO, [`hierax.SparseMatrix`][]) are kept
            sparse; if any matrix is sparse, all are stored sparse.
        """
        api = "hierax.TimeOperator"
        functions = tuple(
            as_time_function(f, f"functions[{i}]", api)
            for i, f in enumerate(as_sequence(functions, "functions", api, "functions"))
        )
        if isinstance(matrices, AbstractTermMatrices):
            # Another operator's term matrices (checked when it was built).
            if len(matrices.matrices) == len(functions):
                self.functions, self.term_matrices = functions, matrices
                return
            matrices = list(matrices.matrices)
        if isinstance(matrices, (jax.Array, np.ndarray)) and matrices.ndim == 3:
            matrices = _unstack(matrices)
        if not isinstance(matrices, Sequence):
            raise TypeError(
                f"`{api}`: `matrices` must be a sequence of (n, n) matrices or one "
                f"(A, n, n) array, got {type(matrices).__name__}."
            )
        mats: list[Any]
        sparse = any(is_sparse(m) for m in matrices)
        if sparse:
            mats = [as_sparse(m, f"matrices[{i}]", api) for i, m in enumerate(matrices)]
        else:
            mats = [
                as_square_matrix(m, f"matrices[{i}]", api)
                for i, m in enumerate(matrices)
            ]
        if len(mats) != len(functions):
            raise ValueError(
                f"`{api}`: got {len(functions)} time functions but {len(mats)} "
                "matrices; give one time function per matrix."
            )
        if len(mats) == 0:
            raise ValueError(f"`{api}`: needs at least one term.")
        sizes = {m.shape[0] for m in mats}
        if len(sizes) != 1:
            raise ValueError(
                f"`{api}`: all matrices must have the same shape, got shapes "
                f"{[tuple(m.shape) for m in mats]}."
            )
        dtype = jnp.result_type(*[m.dtype for m in mats])
        self.functions = functions
        self.term_matrices = (
            SparseTermMatrices(tuple(m.astype(dtype) for m in mats))
            if sparse
            else DenseTermMatrices(_stack(mats, dtype))
        )

    @property
    def matrices(self) -> Any:
        """The matrices $H_a$: one `(A, n, n)` array, or a tuple of sparse matrices
        where they are stored sparse. (Annotated `Any`: `eqx.tree_at` reads it on a
        tree of placeholders.)"""
        return self.term_matrices.matrices

    @property
    def is_sparse(self) -> bool:
        """Whether the matrices are stored sparse."""
        return self.term_matrices.is_sparse

    @property
    def size(self) -> int:
        return self.term_matrices.size

    @property
    def is_constant(self) -> bool:
        return all(f.is_constant for f in self.functions)

    def _times_constant(self, factor):
        return times_terms(factor, self)

    @host_method
    def is_hermitian(self) -> bool:
        return self.term_matrices.is_hermitian()

    @host_method
    def is_mirrored(self, sign: Callable[[AbstractTimeFunction], int]) -> bool:
        # Term by term: f(c + s) M = sigma conj(f(c - s)) M must be conj(f(c - s) M),
        # i.e. M real for sigma = +1 and imaginary for sigma = -1.
        signs = [sign(f) for f in self.functions]
        return self.term_matrices.is_conjugate_symmetric(signs)

    @host_method
    def fold_functions(self, function, terms, times, unknown):
        del times, unknown
        return terms([function(f) for f in self.functions])

    def term_series(self, t, order, time_scale):
        return densified(self.sparse_series(t, order, time_scale), _DENSE_USE)

    def sparse_series(self, t, order, time_scale):
        series = function_series(self.functions, t, order, time_scale)
        dtype = jnp.result_type(*series)
        coefficients = jnp.stack([s.astype(dtype) for s in series])
        # (Per step: a piecewise-constant pulse's series is constant too.)
        constant = tuple(f.has_constant_series for f in self.functions)
        return self.term_matrices.series(coefficients, constant)


def function_series(
    functions: Sequence[AbstractTimeFunction], t: Any, order: int, time_scale: Any
) -> list[Array]:
    """The series of each time function, those of one structure (twelve `Cos`
    drives, two Gaussian envelopes) computed together as one vectorised series
    (`jax.vmap` over their stacked parameters): one computation where there were
    as many, each of which costs XLA a few operations per order."""
    # Sums and products are taken apart (a Gaussian envelope times a cosine, a DRAG
    # pulse's Gaussian and its slope): their factors join the groups, and each
    # sum or product is formed from its factors' series after.
    leaves: list[AbstractTimeFunction] = []

    def plan(function: AbstractTimeFunction) -> Any:
        if isinstance(function, TimeFunctionSum | TimeFunctionProduct):
            return function, [plan(f) for f in function.factors]
        leaves.append(function)
        return len(leaves) - 1

    def formed(step: Any, series: list[Array]) -> Array:
        if isinstance(step, int):
            return series[step]
        function, steps = step
        return function.combine([formed(s, series) for s in steps])

    plans = [plan(f) for f in functions]
    series = _grouped_series(leaves, t, order, time_scale)
    return [formed(p, series) for p in plans]


def _grouped_series(
    functions: Sequence[AbstractTimeFunction], t: Any, order: int, time_scale: Any
) -> list[Array]:
    """The series of each function, those of one structure as one vmapped series."""
    out: list[Any] = [None] * len(functions)
    groups: dict[Any, list[int]] = {}
    flat = []
    for i, function in enumerate(functions):
        leaves, tree = jax.tree.flatten(function)
        flat.append(leaves)
        arrays = all(isinstance(x, jax.Array | Tracer) for x in leaves)
        if arrays and leaves:
            key: Any = (tree, tuple((x.shape, x.dtype) for x in leaves))
        else:  # a Python callable or number inside: on its own
            key = ("alone", i)
        groups.setdefault(key, []).append(i)
    for key, members in groups.items():
        if len(members) == 1:
            i = members[0]
            out[i] = functions[i].series(t, order, time_scale)
            continue
        tree = key[0]
        stacked = [jnp.stack(column) for column in zip(*(flat[i] for i in members))]

        def one(leaves: list, tree: Any = tree) -> Array:
            return jax.tree.unflatten(tree, leaves).series(t, order, time_scale)

        together = jax.vmap(one)(stacked)
        for k, i in enumerate(members):
            out[i] = together[k]
    return out


class CallableOperator(AbstractTimeOperator):
    """Any JAX-traceable function of time $t \\mapsto H(t)$, an `(n, n)` array.

    The function may be a plain Python function or an Equinox module (so that its
    parameters are trained with the rest of a model). Its Taylor coefficients are
    exact, computed by [`hierax.taylor`][]'s transform.

    An operator built with `takes_args=True` is called as `fn(t, args)`, as a
    diffrax vector field is: `args` is a field of this object (dynamic, so a new
    value never retraces), and [`hierax.SchrodingerTerm`][] and
    [`hierax.LindbladTerm`][] replace it with the `args` given to
    `diffrax.diffeqsolve`. The series is in $t$ alone: `args` are held fixed.
    What `args` holds, and what `fn` may read from outside it, are as for
    [`hierax.CallableTimeFunction`][]: its compiled program is kept by the
    identity of `fn`, and a global it reads is frozen into it.
    """

    fn: Callable[..., Array]
    args: PyTree
    n: int = eqx.field(static=True)
    takes_args: bool = eqx.field(static=True)

    def __init__(
        self,
        fn: Callable[..., Array],
        *,
        takes_args: bool = False,
        args: PyTree = None,
    ):
        """**Arguments:**

        - `fn`: a callable taking a scalar time array (and `args`, with
            `takes_args=True`) and returning an `(n, n)` numeric array.
        - `takes_args`: whether `fn` is called as `fn(t, args)` rather than `fn(t)`.
        - `args`: with `takes_args=True`, the `args` passed to `fn`: an example
            pytree, required, with which `fn` is checked here (and its size $n$
            read) and which a direct call (`H(t)`, `H.taylor(t, K)`) uses; a
            diffrax solve of a hierax term passes its own `args` instead. `None`
            (and refused) otherwise.
        """
        api = "hierax.CallableOperator"
        self.takes_args = check_takes_args(takes_args, args, api)
        self.fn = fn
        self.args = held_args(args)
        self.n = check_callable_operator(self._function_of_time(api), "fn", api)

    @property
    def size(self) -> int:
        return self.n

    @property
    def is_constant(self) -> bool:
        return False

    def with_args(self, args: PyTree) -> "CallableOperator":
        """The operator with `args` in place of its own (for `takes_args=True`).

        **Arguments:**

        - `args`: the pytree passed to `fn` as its second argument.

        **Returns:** a new `hierax.CallableOperator`.
        """
        if not self.takes_args:
            raise TypeError(
                "`hierax.CallableOperator.with_args`: this operator's `fn` takes no "
                "`args` (built with `takes_args=False`)."
            )
        return eqx.tree_at(
            lambda f: f.args, self, held_args(args), is_leaf=lambda x: x is None
        )

    def _function_of_time(self, api: str) -> Callable[[Array], Array]:
        """`fn` as a function of time alone, with `args` bound where it takes them
        (named as `fn`, for the Taylor transform's messages)."""
        return bound_args(self.fn, self.takes_args, self.args, api)

    def term_series(self, t, order, time_scale):
        api = "hierax.CallableOperator"
        dense = callable_series(self._function_of_time(api), t, order, time_scale, api)
        dtype = dense.dtype
        return TermSeries(
            jnp.zeros((0, order + 1), dtype),
            jnp.zeros((0, self.n, self.n), dtype),
            dense,
        )


def _takes_args(x: Any) -> bool:
    return isinstance(x, (CallableOperator, CallableTimeFunction)) and x.takes_args


def bind_args(operators: _T, args: Any) -> _T:
    """`operators` (an operator, or a tuple of them) with diffrax's `args` in place
    of the `args` of every callable in them built with `takes_args=True`
    ([`hierax.CallableOperator`][], [`hierax.CallableTimeFunction`][]): how a
    user's `args` reach their callables. `None` changes nothing; known matrices and
    a term's assembled parts are untouched."""
    if args is None:
        return operators
    return jax.tree.map(
        lambda x: x.with_args(args) if _takes_args(x) else x,
        operators,
        is_leaf=_takes_args,
    )


def _checked_time(operator: AbstractTimeOperator, t: Array, method: str) -> Array:
    """Inside the compiled evaluations: a time given as a JAX array is checked here
    (`as_time(in_program=True)` does not read it back from the device)."""
    return check_time_finite(t, f"hierax.{type(operator).__name__}{method}")


# The public evaluations, compiled once per structure like the hierarchies.
_value = module_jit(
    lambda op, t: op.term_series(_checked_time(op, t, "(...)(t)"), 0, None).full()[0]
)
_taylor = module_jit(
    lambda op, t, order: op.term_series(
        _checked_time(op, t, ".taylor"), order, None
    ).full()
)
_apply = module_jit(
    lambda op, t, state: apply_at_order_zero(
        op.sparse_series(_checked_time(op, t, ".apply"), 0, None), state
    )
)


def _unstack(matrices: Any) -> list[Any]:
    """The matrices of an `(A, n, n)` array, split in NumPy when concrete (eager
    indexing of a JAX array compiles a program per shape)."""
    if placed(matrices):
        return list(matrices)
    return list(np.asarray(matrices))


def _stack(matrices: Sequence[Any], dtype: Any) -> Array:
    """`(n, n)` matrices stacked to one `(A, n, n)` array of `dtype`, in NumPy when
    concrete."""
    if any(placed(m) for m in matrices):
        return jnp.stack([jnp.asarray(m).astype(dtype) for m in matrices])
    return to_jax(np.stack([np.asarray(m) for m in matrices]).astype(dtype))


def check_callable_operator(fn: Callable, name: str, api: str) -> int:
    """Trace `fn` once on a dummy time and check it returns a square matrix of a
    supported dtype; returns n."""
    out = trace_callable(fn, name, api)
    if not isinstance(out, jax.ShapeDtypeStruct):
        raise TypeError(
            f"`{api}`: `{name}` must return one array of shape (n, n), got "
            f"{type(out).__name__}."
        )
    if out.dtype == jnp.bool_ or not jnp.issubdtype(out.dtype, jnp.number):
        raise TypeError(
            f"`{api}`: `{name}` must return a numeric array, got {out.dtype}."
        )
    if out.dtype in (jnp.float16, jnp.bfloat16):
        raise TypeError(
            f"`{api}`: `{name}` returns {out.dtype}, which hierax does not support; "
            "return float32/complex64 or float64/complex128."
        )
    if len(out.shape) != 2 or out.shape[0] != out.shape[1] or out.shape[0] == 0:
        raise ValueError(
            f"`{api}`: `{name}` must return a square matrix of shape (n, n), got "
            f"shape {tuple(out.shape)}."
        )
    return out.shape[0]


class ScaledOperator(AbstractTimeOperator):
    """$f(t)\\,H(t)$: an operator times a time function (what `f * H` builds when $H$
    is not a plain [`hierax.TimeOperator`][]; a number times an operator with terms
    scales their functions instead)."""

    function: AbstractTimeFunction
    operator: AbstractTimeOperator

    def __init__(self, function: Any, operator: Any):
        """**Arguments:**

        - `function`: the time function or number $f$.
        - `operator`: the operator $H$ (anything [`hierax.as_operator`][] accepts).
        """
        api = "hierax.ScaledOperator"
        self.function = as_time_function(function, "function", api)
        self.operator = to_operator(operator, "operator", api)

    @property
    def size(self) -> int:
        return self.operator.size

    @property
    def is_constant(self) -> bool:
        return self.function.is_constant and self.operator.is_constant

    def _times_constant(self, factor):
        return ScaledOperator(factor * self.function, self.operator)

    @host_method
    def is_hermitian(self) -> bool:
        return self.operator.is_hermitian()

    @host_method
    def is_mirrored(self, sign: Callable[[AbstractTimeFunction], int]) -> bool:
        return sign(self.function) == 1 and self.operator.is_mirrored(sign)

    @host_method
    def fold_functions(self, function, terms, times, unknown):
        inner = self.operator.fold_functions(function, terms, times, unknown)
        return times(function(self.function), inner)

    def term_series(self, t, order, time_scale):
        return densified(self.sparse_series(t, order, time_scale), _DENSE_USE)

    def sparse_series(self, t, order, time_scale):
        c = self.function.series(t, order, time_scale)
        inner = self.operator.sparse_series(t, order, time_scale)
        dtype = result_dtype(c, inner)
        c = c.astype(dtype)

        def times_function(g: Array) -> Array:
            # (f g_a) for each term: a Cauchy product of scalar series per term.
            if not g.shape[0]:
                return g.astype(dtype)
            return jax.vmap(lambda g: scalar_cauchy_product(c, g))(g.astype(dtype))

        coefficients = times_function(inner.coefficients)
        sparse = inner.sparse
        if sparse is not None:
            sparse = SparseTerms(
                times_function(sparse.coefficients),
                sparse.matrices,
                tuple(k and self.function.has_constant_series for k in sparse.constant),
            )
        dense = None
        if inner.dense is not None:
            dense = jnp.einsum(
                "ik,knm->inm", lower_toeplitz(c), inner.dense.astype(dtype)
            )
        constant = tuple(
            c and self.function.has_constant_series for c in inner.constant_flags()
        )
        return TermSeries(coefficients, inner.matrices, dense, constant, sparse)


class OperatorSum(AbstractTimeOperator):
    """A sum of operators of any kind, $H(t) = \\sum_i H_i(t)$."""

    operators: tuple[AbstractTimeOperator, ...]

    def __init__(self, operators: Sequence[Any]):
        """**Arguments:**

        - `operators`: the summands, anything [`hierax.as_operator`][] accepts, all
            of one size.
        """
        api = "hierax.OperatorSum"
        ops = []
        for i, op in enumerate(as_sequence(operators, "operators", api, "operators")):
            ops.extend(summands(to_operator(op, f"operators[{i}]", api)))
        if not ops:
            raise ValueError(f"`{api}`: needs at least one operator.")
        if len({op.size for op in ops}) != 1:
            raise ValueError(
                f"`{api}`: all operators must have the same size, got "
                f"{[op.size for op in ops]}."
            )
        self.operators = tuple(ops)

    @property
    def size(self) -> int:
        return self.operators[0].size

    @property
    def is_constant(self) -> bool:
        return all(op.is_constant for op in self.operators)

    def _times_constant(self, factor):
        return OperatorSum([op._times_constant(factor) for op in self.operators])

    @host_method
    def is_hermitian(self) -> bool:
        return all(op.is_hermitian() for op in self.operators)

    @host_method
    def is_mirrored(self, sign: Callable[[AbstractTimeFunction], int]) -> bool:
        return all(op.is_mirrored(sign) for op in self.operators)

    @host_method
    def fold_functions(self, function, terms, times, unknown):
        return terms(
            [
                op.fold_functions(function, terms, times, unknown)
                for op in self.operators
            ]
        )

    def term_series(self, t, order, time_scale):
        return densified(self.sparse_series(t, order, time_scale), _DENSE_USE)

    def sparse_series(self, t, order, time_scale):
        parts = [op.sparse_series(t, order, time_scale) for op in self.operators]
        dtype = result_dtype(parts)
        coefficients = jnp.concatenate([p.coefficients.astype(dtype) for p in parts])
        matrices = jnp.concatenate([p.matrices.astype(dtype) for p in parts])
        denses = [p.dense.astype(dtype) for p in parts if p.dense is not None]
        dense = sum(denses[1:], denses[0]) if denses else None
        constant = tuple(c for p in parts for c in p.constant_flags())
        sparses = [p.sparse for p in parts if p.sparse is not None]
        sparse = None
        if sparses:
            sparse = SparseTerms(
                jnp.concatenate([q.coefficients.astype(dtype) for q in sparses]),
                tuple(m for q in sparses for m in q.matrices),
                tuple(k for q in sparses for k in q.constant),
            )
        return TermSeries(coefficients, matrices, dense, constant, sparse)


# Queries of an operator's structure, one function each, answered by the operator's
# type (`functools.singledispatch`): the kernels and rewrites that need a term
# structure ask for it instead of testing types.


@functools.singledispatch
def summands(operator: AbstractTimeOperator) -> tuple[AbstractTimeOperator, ...]:
    """The summands of an operator: the parts of an `OperatorSum`, the operator
    itself otherwise (sums are flat: no summand is a sum)."""
    return (operator,)


@summands.register
def _(operator: OperatorSum) -> tuple[AbstractTimeOperator, ...]:
    return operator.operators


@functools.singledispatch
def series_degree(operator: AbstractTimeOperator) -> int | None:
    """The highest order at which any series of the operator can be nonzero, known
    from its structure (`AbstractTimeFunction.series_degree`), or `None`: unknown
    (a callable, an operator of another kind)."""
    del operator
    return None


@series_degree.register
def _(operator: TimeOperator) -> int | None:
    return largest_degree([f.series_degree for f in operator.functions])


@series_degree.register
def _(operator: OperatorSum) -> int | None:
    return largest_degree([series_degree(op) for op in operator.operators])


@series_degree.register
def _(operator: ScaledOperator) -> int | None:
    # The Cauchy product of the function's series with the operator's.
    return product_degree(
        operator.function.series_degree, series_degree(operator.operator)
    )


@functools.singledispatch
def as_time_operator(operator: Any) -> "TimeOperator | None":
    """The operator's term structure $\\sum_a f_a(t) H_a$ as a `TimeOperator`, or
    `None` for an operator without one (a callable, a scaled operator, a sum)."""
    del operator
    return None


@as_time_operator.register
def _(operator: TimeOperator) -> "TimeOperator | None":
    return operator


def time_operators(operator: AbstractTimeOperator) -> tuple[TimeOperator, ...] | None:
    """The `TimeOperator`s of an operator whose every summand is one, else `None`."""
    parts = [as_time_operator(op) for op in summands(operator)]
    if any(p is None for p in parts):
        return None
    return tuple(p for p in parts if p is not None)


def to_operator(x: Any, name: str, api: str) -> AbstractTimeOperator:
    """`x` as an operator, with errors that name the argument `name` of the public
    call `api`."""
    if isinstance(x, AbstractTimeOperator):
        return x
    refuse_non_matrix(x, name, api)
    if isinstance(x, AbstractTimeFunction):
        raise TypeError(
            f"`{api}`: `{name}` must be an operator, got the scalar time function "
            f"{type(x).__name__}; multiply it by a matrix, e.g. `{type(x).__name__}"
            "(...) * sigma_x`."
        )
    if is_sparse(x):
        return TimeOperator((Constant(1.0),), [as_sparse(x, name, api)])
    foreign = _foreign_operator(x, name, api)
    if foreign is not None:
        return foreign
    if _is_function(x):
        check_callable_operator(x, name, api)
        return CallableOperator(cast(Callable[[Array], Array], x))
    return TimeOperator((Constant(1.0),), [as_square_matrix(x, name, api)])


def jump_list(jump_operators: Any, api: str) -> tuple[Any, ...]:
    """The jump operators of the public call `api` as a tuple, in every form the
    calls take: a list or tuple as it is, except a nested list of numbers (one
    matrix written as lists); an `(J, n, n)` array as its J matrices; one operator
    alone (a matrix, an operator, a callable) as one jump operator. `None` is
    refused."""
    if jump_operators is None:
        raise TypeError(
            f"`{api}`: `jump_operators` must be a list or tuple of operators (e.g. "
            "`[jnp.sqrt(gamma) * sigma_minus]`, or `[]` for none), got None."
        )
    if not isinstance(jump_operators, list | tuple):
        if getattr(jump_operators, "ndim", None) == 3:
            return tuple(jump_operators)
        return (jump_operators,)
    if jump_operators and all(isinstance(j, list | tuple) for j in jump_operators):
        try:
            matrix = np.asarray(jump_operators)
        except (TypeError, ValueError):
            matrix = None
        if matrix is not None and matrix.ndim == 2 and matrix.dtype.kind in "iufc":
            return (matrix,)
    return tuple(jump_operators)


def check_jump_operators(jumps: Any, size: int, api: str) -> tuple:
    """`jumps`, in any form `jump_list` reads, as operators on the Hamiltonian's
    space of `size`, with errors that name `jump_operators[i]` of the public call
    `api`."""
    jumps = jump_list(jumps, api)
    operators = tuple(
        to_operator(jump, f"jump_operators[{i}]", api) for i, jump in enumerate(jumps)
    )
    for i, op in enumerate(operators):
        if op.size != size:
            raise ValueError(
                f"`{api}`: `jump_operators[{i}]` is {op.size}x{op.size} but "
                f"`hamiltonian` is {size}x{size}; they must act on the same space."
            )
    return operators


# QuTiP and dynamiqs objects: the interop module, which comes after this one,
# registers its converter here (it returns None for everything else).
_FOREIGN: list[Callable[[Any, str, str], "AbstractTimeOperator | None"]] = []


def register_foreign_operator(
    fn: Callable[[Any, str, str], "AbstractTimeOperator | None"],
) -> None:
    _FOREIGN[:] = [fn]


def _foreign_operator(x: Any, name: str, api: str) -> "AbstractTimeOperator | None":
    return _FOREIGN[0](x, name, api) if _FOREIGN else None


def times_terms(function: AbstractTimeFunction, operator: AbstractTimeOperator) -> Any:
    """`f * H` with `f` folded into each term of a `TimeOperator` (`f` alone where a
    term's function is the constant 1), a `ScaledOperator` otherwise."""
    terms = as_time_operator(operator)
    if terms is None:
        return ScaledOperator(function, operator)
    operator = terms
    functions = [
        function
        # (Compared in NumPy: a JAX comparison inside a user's trace is traced.)
        if isinstance(g, Constant)
        and not is_traced(g.value)
        and np.asarray(g.value) == 1
        else function * g
        for g in operator.functions
    ]
    # The checked matrices themselves: kept as they are.
    return TimeOperator(functions, operator.term_matrices)


def _is_function(x: Any) -> bool:
    """A function of time: anything callable but an array (a time-dependent object
    with a `.shape` is a function too, and gets a function's errors)."""
    return callable(x) and not isinstance(x, (jax.Array, np.ndarray))


@typechecked
def as_operator(x: Any) -> AbstractTimeOperator:
    """Turn what a user passes as an operator into a [`hierax.AbstractTimeOperator`][].

    **Arguments:**

    - `x`: an operator (returned as is), a square matrix (a constant operator; a
        `scipy.sparse` or BCOO matrix stays sparse), a callable `t -> (n, n)` (a
        [`hierax.CallableOperator`][]), or a QuTiP `Qobj` / `QobjEvo` or dynamiqs
        `QArray` / `TimeQArray`, converted with one term per part (see "Coming
        from QuTiP or dynamiqs").

    **Returns:**

    An [`hierax.AbstractTimeOperator`][].
    """
    return to_operator(x, "x", "hierax.as_operator")


def _time_function_times(function: AbstractTimeFunction, other: Any) -> Any:
    """`f * M`: a one-term `TimeOperator` for a matrix M, a `ScaledOperator` for an
    operator; objects of their own kind (Pauli sums) say what they become."""
    own = getattr(other, "times_function", None)
    if own is not None:
        return own(function)
    if isinstance(other, AbstractTimeOperator):
        return ScaledOperator(function, other)
    api = f"hierax.{type(function).__name__} * ..."
    if is_sparse(other):
        return TimeOperator((function,), [as_sparse(other, "other", api)])
    foreign = _foreign_operator(other, "other", api)
    if foreign is not None:
        return times_terms(function, foreign)
    if _is_function(other):
        return ScaledOperator(function, to_operator(other, "other", api))
    return TimeOperator((function,), [as_square_matrix(other, "other", api)])


register_operator_product(_time_function_times)
