"""Time-dependent operators: sums of time functions times matrices, and callables."""

import abc
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Inexact

from ._coefficients import AbstractCoefficient, Constant, _as_coefficient_or_none
from ._custom_types import OperatorSeries, OrderLike, TimeLike, typechecked
from ._function_series import function_series
from ._series import lower_toeplitz, scalar_cauchy_product
from ._validation import as_square_matrix, check_order, trace_callable


class TermSeries(NamedTuple):
    """The series of an operator $H(t+\\tau) = \\sum_a f_a(t+\\tau) H_a + D(t+\\tau)$,
    kept in parts so that algorithms can use the term structure.

    - `coefficients`: `(A, K+1)`, the series of each $f_a$.
    - `matrices`: `(A, n, n)`, the constant matrices $H_a$.
    - `dense`: `(K+1, n, n)` or `None`, the series of a part without term structure.
    """

    coefficients: Array
    matrices: Array
    dense: Array | None

    def full(self) -> Array:
        """The series of the whole operator, `(K+1, n, n)`."""
        dtype = result_dtype(self)
        out = jnp.einsum(
            "ak,anm->knm", self.coefficients.astype(dtype), self.matrices.astype(dtype)
        )
        if self.dense is not None:
            out = out + self.dense.astype(dtype)
        return out


def result_dtype(*parts: Any) -> jnp.dtype:
    """The common dtype of arrays (and `TermSeries`), never narrower than float32."""
    leaves = [x for x in jax.tree_util.tree_leaves(parts) if x is not None]
    return jnp.result_type(*leaves)


class AbstractTimeOperator(eqx.Module):
    """An $n \\times n$ operator-valued function of time $H(t)$.

    Calling it gives the matrix at a time, [`hierax.AbstractTimeOperator.taylor`][]
    its normalised Taylor coefficients. Operators add, subtract, and multiply by
    numbers and by time functions ([`hierax.AbstractCoefficient`][]).
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
    def taylor_terms(
        self, t: Array, order: OrderLike, scale: Array | None = None
    ) -> TermSeries:
        """The series of the operator at `t` to order `order`, in parts; with
        `scale`, the series of $s \\mapsto H(t + \\text{scale}\\cdot s)$."""

    @typechecked
    def __call__(self, t: TimeLike) -> Inexact[Array, "n n"]:
        """The operator at one time.

        **Arguments:**

        - `t`: the time, a scalar.

        **Returns:**

        The matrix $H(t)$, shape `(n, n)`.
        """
        return self.taylor_terms(jnp.asarray(t), 0).full()[0]

    @typechecked
    def taylor(self, t: TimeLike, order: OrderLike) -> OperatorSeries:
        """Normalised Taylor coefficients of the operator at `t`.

        **Arguments:**

        - `t`: the time, a scalar.
        - `order`: the highest order $K$, a non-negative Python int.

        **Returns:**

        An array of shape `(order + 1, n, n)` holding $H^{(j)}(t) / j!$.
        """
        order = check_order(order, f"hierax.{type(self).__name__}.taylor")
        return self.taylor_terms(jnp.asarray(t), order).full()

    def __add__(self, other):
        if isinstance(other, (int, float, complex)) and other == 0:
            return self
        other = as_operator(other, "other", "hierax.AbstractTimeOperator.__add__")
        if other.size != self.size:
            raise ValueError(
                f"Cannot add operators of sizes {self.size} and {other.size}."
            )
        if isinstance(self, TimeOperator) and isinstance(other, TimeOperator):
            dtype = result_dtype(self.matrices, other.matrices)
            matrices = jnp.concatenate([self.matrices, other.matrices]).astype(dtype)
            return TimeOperator(self.coefficients + other.coefficients, matrices)
        return OperatorSum((self, other))

    def __radd__(self, other):
        if isinstance(other, (int, float, complex)) and other == 0:
            return self  # so that `sum(...)` works
        other = as_operator(other, "other", "hierax.AbstractTimeOperator.__radd__")
        return other + self

    def __neg__(self):
        return self * -1.0

    def __sub__(self, other):
        return self + (
            -as_operator(other, "other", "hierax.AbstractTimeOperator.__sub__")
        )

    def __rsub__(self, other):
        return as_operator(other, "other", "hierax.AbstractTimeOperator.__rsub__") + (
            -self
        )

    def __mul__(self, other):
        coefficient = _as_coefficient_or_none(other)
        if coefficient is None:
            return NotImplemented
        return ScaledOperator(coefficient, self)

    def __rmul__(self, other):
        return self.__mul__(other)


def _as_coefficient(x: Any, name: str, api: str) -> AbstractCoefficient:
    coefficient = _as_coefficient_or_none(x)
    if coefficient is None:
        raise TypeError(
            f"`{api}`: `{name}` must be a time function (e.g. `hierax.Cos()`) or a "
            f"number, got {type(x).__name__}."
        )
    return coefficient


class TimeOperator(AbstractTimeOperator):
    """A Hamiltonian or observable with term structure,
    $H(t) = \\sum_{a=1}^{A} f_a(t) H_a$, with closed-form time functions $f_a$ and
    constant matrices $H_a$.

    Usually built by arithmetic: `hierax.Cos(2.0) * sx + 0.5 * sz` is a two-term
    `TimeOperator`. The term structure lets the hierarchies spend $A$ matrix products
    per order instead of $K$.
    """

    coefficients: tuple[AbstractCoefficient, ...]
    matrices: Inexact[Array, "terms n n"]

    def __init__(
        self,
        coefficients: Sequence[AbstractCoefficient | complex],
        matrices: Sequence[ArrayLike] | ArrayLike,
    ):
        """**Arguments:**

        - `coefficients`: the time functions $f_a$ (numbers mean constants).
        - `matrices`: the matrices $H_a$, a sequence of `(n, n)` arrays or one
            `(A, n, n)` array. Integer and real matrices are promoted.
        """
        api = "hierax.TimeOperator"
        coefficients = tuple(
            _as_coefficient(c, f"coefficients[{i}]", api)
            for i, c in enumerate(coefficients)
        )
        if hasattr(matrices, "ndim") and matrices.ndim == 3:
            matrices = list(matrices)
        mats = [
            as_square_matrix(m, f"matrices[{i}]", api) for i, m in enumerate(matrices)
        ]
        if len(mats) != len(coefficients):
            raise ValueError(
                f"`{api}`: got {len(coefficients)} coefficients but {len(mats)} "
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
        dtype = jnp.result_type(*mats)
        self.coefficients = coefficients
        self.matrices = jnp.stack([m.astype(dtype) for m in mats])

    @property
    def size(self) -> int:
        return self.matrices.shape[-1]

    @property
    def is_constant(self) -> bool:
        return all(c.is_constant for c in self.coefficients)

    def taylor_terms(
        self, t: Array, order: OrderLike, scale: Array | None = None
    ) -> TermSeries:
        series = [c.scaled_taylor(t, order, scale) for c in self.coefficients]
        dtype = jnp.result_type(*series)
        return TermSeries(
            jnp.stack([s.astype(dtype) for s in series]), self.matrices, None
        )


class FunctionOperator(AbstractTimeOperator):
    """Any JAX-traceable function of time $t \\mapsto H(t)$, an `(n, n)` array.

    The function may be a plain Python function or an Equinox module (so that its
    parameters are trained with the rest of a model). Its Taylor coefficients are
    exact, computed by [`hierax.taylor`][].
    """

    fn: Callable[[Array], Array]
    n: int = eqx.field(static=True)

    def __init__(self, fn: Callable[[Array], Array]):
        """**Arguments:**

        - `fn`: a callable taking a scalar time array and returning an `(n, n)`
            numeric array.
        """
        api = "hierax.FunctionOperator"
        self.fn = fn
        self.n = _check_callable_operator(fn, "fn", api)

    @property
    def size(self) -> int:
        return self.n

    @property
    def is_constant(self) -> bool:
        return False

    def taylor_terms(
        self, t: Array, order: OrderLike, scale: Array | None = None
    ) -> TermSeries:
        dense = function_series(self.fn, t, order, scale=scale)
        dtype = dense.dtype
        return TermSeries(
            jnp.zeros((0, order + 1), dtype),
            jnp.zeros((0, self.n, self.n), dtype),
            dense,
        )


def _check_callable_operator(fn: Callable, name: str, api: str) -> int:
    """Trace `fn` once on a dummy time and check it returns a square numeric array."""
    out = trace_callable(fn, name, api)
    if not isinstance(out, jax.ShapeDtypeStruct):
        raise TypeError(
            f"`{api}`: `{name}` must return one array of shape (n, n), got "
            f"{type(out).__name__}."
        )
    if out.dtype == jnp.bool_ or not (jnp.issubdtype(out.dtype, jnp.number)):
        raise TypeError(
            f"`{api}`: `{name}` must return a numeric array, got {out.dtype}."
        )
    if len(out.shape) != 2 or out.shape[0] != out.shape[1] or out.shape[0] == 0:
        raise ValueError(
            f"`{api}`: `{name}` must return a square matrix of shape (n, n), got "
            f"shape {tuple(out.shape)}."
        )
    return out.shape[0]


class ScaledOperator(AbstractTimeOperator):
    """$f(t)\\,H(t)$: an operator times a time function (what `f * H` builds when $H$
    is not a plain [`hierax.TimeOperator`][])."""

    coefficient: AbstractCoefficient
    operator: AbstractTimeOperator

    def __init__(self, coefficient: AbstractCoefficient | complex, operator):
        """**Arguments:**

        - `coefficient`: the time function or number $f$.
        - `operator`: the operator $H$ (anything [`hierax.as_operator`][] accepts).
        """
        api = "hierax.ScaledOperator"
        self.coefficient = _as_coefficient(coefficient, "coefficient", api)
        self.operator = as_operator(operator, "operator", api)

    @property
    def size(self) -> int:
        return self.operator.size

    @property
    def is_constant(self) -> bool:
        return self.coefficient.is_constant and self.operator.is_constant

    def taylor_terms(
        self, t: Array, order: OrderLike, scale: Array | None = None
    ) -> TermSeries:
        c = self.coefficient.scaled_taylor(t, order, scale)
        inner = self.operator.taylor_terms(t, order, scale)
        dtype = result_dtype(c, inner)
        c = c.astype(dtype)
        # (f g_a) for each term: a Cauchy product of scalar series per term.
        coefficients = (
            jax.vmap(lambda g: scalar_cauchy_product(c, g))(
                inner.coefficients.astype(dtype)
            )
            if inner.coefficients.shape[0]
            else inner.coefficients.astype(dtype)
        )
        dense = None
        if inner.dense is not None:
            dense = jnp.einsum(
                "ik,knm->inm",
                lower_toeplitz(c),
                inner.dense.astype(dtype),
            )
        return TermSeries(coefficients, inner.matrices, dense)


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
        for i, op in enumerate(operators):
            op = as_operator(op, f"operators[{i}]", api)
            ops.extend(op.operators if isinstance(op, OperatorSum) else [op])
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

    def taylor_terms(
        self, t: Array, order: OrderLike, scale: Array | None = None
    ) -> TermSeries:
        parts = [op.taylor_terms(t, order, scale) for op in self.operators]
        dtype = result_dtype(parts)
        coefficients = jnp.concatenate([p.coefficients.astype(dtype) for p in parts])
        matrices = jnp.concatenate([p.matrices.astype(dtype) for p in parts])
        denses = [p.dense.astype(dtype) for p in parts if p.dense is not None]
        dense = sum(denses[1:], denses[0]) if denses else None
        return TermSeries(coefficients, matrices, dense)


@typechecked
def as_operator(x: Any, name: str = "operator", api: str = "hierax.as_operator"):
    """Turn what a user passes as an operator into a [`hierax.AbstractTimeOperator`][].

    **Arguments:**

    - `x`: an operator (returned as is), a square matrix (a constant operator), or a
        callable `t -> (n, n)` (a [`hierax.FunctionOperator`][]).
    - `name`, `api`: used in error messages.

    **Returns:**

    An [`hierax.AbstractTimeOperator`][].
    """
    if isinstance(x, AbstractTimeOperator):
        return x
    if isinstance(x, AbstractCoefficient):
        raise TypeError(
            f"`{api}`: `{name}` must be an operator, got the scalar time function "
            f"{type(x).__name__}; multiply it by a matrix, e.g. `{type(x).__name__}"
            "(...) * sigma_x`."
        )
    if callable(x) and not hasattr(x, "shape"):
        return FunctionOperator(x)
    return TimeOperator((Constant(1.0),), [as_square_matrix(x, name, api)])
