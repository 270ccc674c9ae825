"""QuTiP and dynamiqs objects as hierax operators and states, term structure kept.

Objects are recognised by the module their type comes from (`type(x).__module__`),
so hierax never imports QuTiP or dynamiqs: an object from them can only exist once
the user has imported the package. What is converted:

- QuTiP `Qobj`: an operator (CSR and Dia data kept sparse, as `scipy.sparse`
  matrices are; Dense data as an array), a ket `(n, 1)` as a state `(n,)`.
- QuTiP `QobjEvo`: one [`hierax.TimeOperator`][] term per element of `to_list()`,
  its coefficient as a time function: constants as constants, JAX-traceable
  functions as [`hierax.CallableTimeFunction`][] (called as QuTiP calls them, with
  their `args`), arrays as the spline QuTiP interpolates them with.
- dynamiqs `QArray` (dense, or DIA kept sparse) and every `TimeQArray`: constant,
  modulated (a time function times the matrix), pwc ([`hierax.PiecewiseConstant`][]),
  timecallable ([`hierax.CallableOperator`][]) and sums (one term per part).
"""

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._core import as_square_matrix, built_for, is_traced
from .._data import AbstractSparseMatrix, SparseMatrix, as_sparse, from_coo
from .._time import (
    AbstractTimeFunction,
    CallableTimeFunction,
    Constant,
    CubicSpline,
    PiecewiseConstant,
    PiecewiseLinear,
    TimeFunctionProduct,
    TimeFunctionSum,
)
from ._time_operators import (
    AbstractTimeOperator,
    CallableOperator,
    OperatorSum,
    TimeOperator,
    as_time_operator,
    register_foreign_operator,
    summands,
    times_terms,
)


def foreign_library(x: Any) -> str | None:
    """`"qutip"` or `"dynamiqs"` when `x` is an object of that package, else None."""
    module = type(x).__module__
    for library in ("qutip", "dynamiqs"):
        if module == library or module.startswith(library + "."):
            return library
    return None


def _kind(x: Any) -> str:
    return type(x).__name__


# ----------------------------------------------------------------------------------
# Constant matrices
# ----------------------------------------------------------------------------------


def _qobj_matrix(x: Any, name: str, api: str) -> Array | AbstractSparseMatrix:
    """A QuTiP operator `Qobj` as a matrix: sparse data stays sparse."""
    kind = getattr(x, "type", None)
    if kind in ("ket", "bra"):
        raise TypeError(
            f"`{api}`: `{name}` must be an operator, got a QuTiP {kind} of shape "
            f"{tuple(x.shape)}; an operator is `(n, n)` (e.g. `psi.proj()` for a "
            "projector)."
        )
    if kind != "oper":
        raise TypeError(
            f"`{api}`: `{name}` must be an operator, got a QuTiP Qobj of type "
            f"{kind!r}; hierax takes Hamiltonians, observables and jump operators "
            "(mesolve builds the Lindbladian itself)."
        )
    if _kind(x.data) in ("CSR", "Dia"):
        return as_sparse(x.data.as_scipy(), name, api)
    return as_square_matrix(np.asarray(x.full()), name, api)


def _dia_rows(offsets: Sequence[int], diags: Any, name: str) -> SparseMatrix:
    """The row layout of a matrix stored by diagonals as dynamiqs does: entry `j` of
    the diagonal with offset `k` sits at row `j - k`, column `j`."""
    n = diags.shape[-1]
    rows, columns, picks = [], [], []
    for i, k in enumerate(offsets):
        j = np.arange(max(k, 0), min(n, n + k))
        rows.append(j - k)
        columns.append(j)
        picks.append(i * n + j)
    flat = diags.reshape(-1) if is_traced(diags) else np.asarray(diags).reshape(-1)
    values = flat[np.concatenate(picks)]
    return from_coo(np.concatenate(rows), np.concatenate(columns), values, n, name)


def _qarray_matrix(x: Any, name: str, api: str) -> Array | AbstractSparseMatrix:
    """A dynamiqs operator `QArray` as a matrix: DIA data stays sparse."""
    shape = tuple(x.shape)
    if len(shape) != 2:
        raise ValueError(
            f"`{api}`: `{name}` must be one operator of shape (n, n), got a dynamiqs "
            f"QArray of shape {shape}; hierax takes one operator (use `jax.vmap` "
            "over a batch)."
        )
    if shape[0] != shape[1]:
        what = "ket" if shape[1] == 1 else "bra" if shape[0] == 1 else "matrix"
        raise TypeError(
            f"`{api}`: `{name}` must be an operator of shape (n, n), got a dynamiqs "
            f"{what} of shape {shape}."
        )
    if getattr(x, "vectorized", False):
        raise TypeError(
            f"`{api}`: `{name}` is a vectorized dynamiqs QArray (a superoperator); "
            "hierax takes Hamiltonians, observables and jump operators."
        )
    data = getattr(x, "data", None)
    if data is not None and _kind(data) == "SparseDIADataArray":
        return _dia_rows(data.offsets, data.diags, name)
    return as_square_matrix(x.to_jax(), name, api)


def _constant_matrix(
    x: Any, name: str, api: str
) -> Array | AbstractSparseMatrix | None:
    """A foreign constant operator as a matrix; None if `x` is not one."""
    library = foreign_library(x)
    if library == "qutip" and _kind(x) == "Qobj":
        return _qobj_matrix(x, name, api)
    if library == "dynamiqs" and hasattr(x, "to_jax") and not callable(x):
        return _qarray_matrix(x, name, api)
    return None


def as_matrix(x: Any, name: str, api: str) -> Any:
    """`x` as a dense `(n, n)` array when it is a QuTiP or dynamiqs constant
    operator (for the calls that take constant matrices); anything else unchanged,
    for the caller's own checks."""
    if foreign_library(x) is None:
        return x
    matrix = _constant_matrix(x, name, api)
    if matrix is None:
        operator = foreign_operator(x, name, api)
        if operator is None or not operator.is_constant:
            raise TypeError(
                f"`{api}`: `{name}` must be a constant matrix, got a time-dependent "
                f"{_kind(x)}."
            )
        return operator(0.0)
    return matrix.todense() if isinstance(matrix, AbstractSparseMatrix) else matrix


# ----------------------------------------------------------------------------------
# Operators
# ----------------------------------------------------------------------------------


def _sum(terms: Sequence[tuple[AbstractTimeFunction, Any]]) -> AbstractTimeOperator:
    """`sum_a f_a H_a` as one `TimeOperator` per storage (sparse terms together,
    dense terms together), one term per part."""
    groups: dict[bool, list] = {True: [], False: []}
    for function, matrix in terms:
        groups[isinstance(matrix, AbstractSparseMatrix)].append((function, matrix))
    operators = [
        TimeOperator([f for f, _ in group], [m for _, m in group])
        for group in groups.values()
        if group
    ]
    return operators[0] if len(operators) == 1 else OperatorSum(operators)


def _times(function: AbstractTimeFunction, operator: AbstractTimeOperator):
    """`f * H`, distributed over the terms of a `TimeOperator` or a sum."""
    parts = [times_terms(function, op) for op in summands(operator)]
    return parts[0] if len(parts) == 1 else OperatorSum(parts)


def foreign_operator(x: Any, name: str, api: str) -> AbstractTimeOperator | None:
    """A QuTiP or dynamiqs operator (constant or time-dependent) as a hierax
    operator with its term structure; None if `x` comes from neither package."""
    library = foreign_library(x)
    if library is None:
        return None
    matrix = _constant_matrix(x, name, api)
    if matrix is not None:
        return TimeOperator((Constant(1.0),), [matrix])
    if library == "qutip" and _kind(x) == "QobjEvo":
        return _qobjevo(x, name, api)
    if library == "dynamiqs" and hasattr(x, "tstart"):
        return _timeqarray(x, name, api)
    raise TypeError(
        f"`{api}`: `{name}` must be an operator, got the {library} object "
        f"{_kind(x)}, which hierax does not convert; pass a Qobj, QobjEvo, QArray "
        "or TimeQArray."
    )


# ----------------------------------------------------------------------------------
# QuTiP QobjEvo
# ----------------------------------------------------------------------------------


def _cython_state(coefficient: Any) -> tuple:
    """The attributes QuTiP's Cython coefficients pickle (they have no Python
    accessors): a tuple, in the order of the attribute names."""
    reduced = coefficient.__reduce_ex__(2)
    if len(reduced) > 2 and reduced[2] is not None:
        return tuple(reduced[2])
    return tuple(reduced[1][2])


class _Conjugate(AbstractTimeFunction):
    """$\\overline{f(t)}$ at real times: the conjugate series (QuTiP's `conj`)."""

    function: AbstractTimeFunction

    @property
    def is_constant(self) -> bool:
        return self.function.is_constant

    @property
    def series_degree(self) -> int | None:
        return self.function.series_degree

    def series(self, t, order, time_scale):
        return jnp.conj(self.function.series(t, order, time_scale))


class _Window(AbstractTimeFunction):
    """1 on $[a, b)$ and 0 elsewhere, either end possibly open: dynamiqs' time
    bounds, and the held ends of QuTiP's step interpolation. Its series is the
    value alone (one-sided at the edges, as every sampled function's)."""

    start: Array | None
    end: Array | None

    @property
    def knots(self) -> Array:
        """The finite edges (jump times for a step-size controller)."""
        return jnp.stack([e for e in (self.start, self.end) if e is not None])

    @property
    def is_constant(self) -> bool:
        return False

    @property
    def series_degree(self) -> int:
        return 0

    def series(self, t, order, time_scale):
        edges = [e for e in (self.start, self.end) if e is not None]
        dtype = jnp.result_type(*edges, jnp.real(t))
        x = jnp.real(t).astype(dtype)
        inside = jnp.ones((), bool)
        if self.start is not None:
            inside = inside & (x >= self.start)
        if self.end is not None:
            inside = inside & (x < self.end)
        value = jnp.where(inside, jnp.ones((), dtype), jnp.zeros((), dtype))
        return jnp.zeros((order + 1,), dtype).at[0].set(value)


def _window(start: Any, end: Any) -> _Window:
    def edge(x: Any) -> Array | None:
        return None if x is None else jnp.asarray(x, jnp.result_type(float))

    return _Window(edge(start), edge(end))


class _QutipFunction(eqx.Module):
    """A QuTiP function coefficient, called as QuTiP calls it: `func(t, **args)`
    (pythonic style) or `func(t, args)` (dict style). Numeric `args` are arrays, so
    a new value never recompiles."""

    func: Callable = eqx.field(static=True)
    args: dict
    pythonic: bool = eqx.field(static=True)

    def __call__(self, t: Array) -> Array:
        if self.pythonic:
            return self.func(t, **self.args)
        return self.func(t, self.args)


def _as_arrays(args: dict) -> dict:
    def convert(value: Any) -> Any:
        if isinstance(value, (int, float, complex, np.number, np.ndarray)) and not (
            isinstance(value, bool)
        ):
            return jnp.asarray(value)
        return value

    return {key: convert(value) for key, value in args.items()}


def _function_coefficient(coefficient: Any, where: str, api: str):
    state = _cython_state(coefficient)
    funcs = [s for s in state if callable(s)]
    flags = [s for s in state if isinstance(s, bool)]
    dicts = [s for s in state if isinstance(s, dict)]
    func = funcs[0] if len(funcs) == 1 else None
    label = getattr(func, "__qualname__", _kind(func))
    candidates: list[Callable] = []
    if func is not None and len(flags) == 1 and len(dicts) == 1:
        candidates = [
            _QutipFunction(func, _as_arrays(dicts[0]), flags[0]),
            _QutipFunction(func, dict(dicts[0]), flags[0]),
        ]
    else:  # an unexpected layout: QuTiP's own call passes its args
        candidates = [lambda t: coefficient(t)]
    error: Exception | None = None
    for fn in candidates:
        try:
            out = jax.eval_shape(fn, jax.ShapeDtypeStruct((), jnp.result_type(float)))
        except Exception as e:  # noqa: BLE001 (reported below, with the cause)
            error = error or e
            continue
        if isinstance(out, jax.ShapeDtypeStruct) and out.shape in ((), (1,)):
            if not jnp.issubdtype(out.dtype, jnp.inexact):
                fn = _Promoted(fn)
            return CallableTimeFunction(fn)
        error = error or TypeError(f"it returns {out}, not a scalar")
    cause = f"{type(error).__name__}: {str(error).splitlines()[0] if error else ''}"
    raise TypeError(
        f"`{api}`: {where} has the function coefficient `{label}`, which JAX cannot "
        f"trace ({cause}). hierax takes each coefficient's exact Taylor series by "
        "tracing it: give the term as a hierax time function times the operator, "
        "e.g. `hierax.Cos(w) * H1` for `np.cos(w * t)` (also `Sin`, `Exp`, "
        "`Gaussian`, `Polynomial`, their sums and products), or "
        "`hierax.CallableTimeFunction(lambda t: jnp.cos(w * t)) * H1` for any JAX "
        "function; coefficients written with plain arithmetic (`w * t**2`) convert "
        "as they are."
    )


class _Promoted(eqx.Module):
    """An integer-valued coefficient, as floats."""

    fn: Callable

    def __call__(self, t: Array) -> Array:
        return jnp.asarray(self.fn(t)).astype(jnp.result_type(float))


def _real_if_real(values: np.ndarray) -> np.ndarray:
    return np.real(values) if np.all(np.imag(values) == 0) else values


def _interpolated(coefficient: Any, where: str, api: str) -> AbstractTimeFunction:
    """QuTiP's array coefficient: the same piecewise polynomial, from the knots and
    coefficients it holds (descending powers of `t - t_i`, one column per knot)."""
    reduced = coefficient.__reduce__()
    times = np.asarray(reduced[1][0], np.float64)
    poly = np.asarray(reduced[1][1])
    degree = poly.shape[0] - 1
    samples = _real_if_real(poly[-1])
    if degree == 0:
        # QuTiP holds the first and last value outside the knots, where a piecewise
        # constant pulse is zero: two windows hold them.
        inner = PiecewiseConstant(times, samples[:-1])
        before = _window(None, times[0]) * Constant(samples[0])
        after = _window(times[-1], None) * Constant(samples[-1])
        return TimeFunctionSum((inner, before, after))
    if degree == 1:
        return PiecewiseLinear(times, samples)
    if degree in (2, 3) and times.shape[0] >= 3:
        import scipy.interpolate  # QuTiP depends on scipy: present when QuTiP is

        padded = np.concatenate([np.zeros((3 - degree, poly.shape[1])), poly])[:, :-1]
        # Compared as each segment's values, c_j h^(3-j): QuTiP solves for the
        # spline its own way, and the cubic coefficient's rounding goes as
        # eps |y| / h^3 (1e-10 of 0.3 on 301 knots, over the old threshold), while
        # that of its contribution over the segment stays eps |y|.
        powers = np.diff(times)[None, :] ** np.arange(3, -1, -1)[:, None]
        padded = padded * powers
        scale = max(float(np.max(np.abs(padded))), np.finfo(np.float64).tiny)
        for bc_type in ("not-a-knot", "natural", "clamped"):
            spline = scipy.interpolate.CubicSpline(times, samples, bc_type=bc_type)
            if np.allclose(spline.c * powers, padded, rtol=1e-9, atol=1e-12 * scale):
                return CubicSpline(times, samples, bc_type=bc_type)
    raise TypeError(
        f"`{api}`: {where} has an array coefficient interpolated with degree "
        f"{degree} or boundary conditions that hierax's splines do not reproduce; "
        "use QuTiP's default `order=3` (cubic, not-a-knot), `order=1` or `order=0`, "
        "or give a hierax time function (`hierax.CubicSpline(tlist, values, "
        'bc_type="natural")`) times the operator.'
    )


def _qutip_coefficient(coefficient: Any, where: str, api: str) -> AbstractTimeFunction:
    kind = _kind(coefficient)
    if kind == "ConstantCoefficient":
        (value,) = [s for s in _cython_state(coefficient) if isinstance(s, complex)]
        return Constant(value.real if value.imag == 0 else value)
    if kind == "FunctionCoefficient":
        return _function_coefficient(coefficient, where, api)
    if kind == "InterCoefficient":
        return _interpolated(coefficient, where, api)
    if kind in ("SumCoefficient", "MulCoefficient"):
        first, second = [
            _qutip_coefficient(s, where, api)
            for s in _cython_state(coefficient)
            if foreign_library(s) == "qutip"
        ]
        if kind == "SumCoefficient":
            return TimeFunctionSum((first, second))
        return TimeFunctionProduct(first, second)
    if kind in ("ConjCoefficient", "NormCoefficient"):
        (base,) = [
            _qutip_coefficient(s, where, api)
            for s in _cython_state(coefficient)
            if foreign_library(s) == "qutip"
        ]
        if kind == "ConjCoefficient":
            return _Conjugate(base)
        return TimeFunctionProduct(base, _Conjugate(base))
    if kind in ("StrFunctionCoefficient", "StrCoefficient"):
        text = _string_code(coefficient, kind)
        raise TypeError(
            f"`{api}`: {where} has the string coefficient {text!r}, which hierax "
            "cannot differentiate (QuTiP compiles it to C), and QuTiP accepts no "
            "JAX function in its place. Build that term in hierax, times the same "
            "Qobj, and add the others: e.g. `H0 + hierax.Cos(w) * H1` for "
            "[H0, [H1, 'cos(w*t)']] (also `Sin`, `Exp`, `Gaussian`, `Polynomial`, "
            "and sums and products of them), or any one-argument JAX function of "
            "time, `hierax.CallableTimeFunction(lambda t: jnp.cos(w * t)) * H1`."
        )
    raise TypeError(
        f"`{api}`: {where} has a coefficient of type {kind}, which hierax does not "
        "convert; give a hierax time function times the operator instead."
    )


def _string_code(coefficient: Any, kind: str) -> str:
    """The code of a QuTiP string coefficient: interpreted (no C compiler) it is the
    first argument of its reconstruction; compiled by Cython (`StrCoefficient`,
    a class of its own per string) the first string of its pickled state."""
    if kind == "StrFunctionCoefficient":
        return coefficient.__reduce__()[1][0]
    state = coefficient.__reduce__()[2]
    return next((s for s in state if isinstance(s, str)), "?")


def _qobjevo(x: Any, name: str, api: str) -> AbstractTimeOperator:
    terms: list[tuple[AbstractTimeFunction, Any]] = []
    for element in x.to_list():
        # Named by what the user wrote: QuTiP's `to_list()` does not keep the order
        # of the terms as given.
        where = f"`{name}` (a QuTiP QobjEvo), in one of its terms,"
        if foreign_library(element) == "qutip":
            terms.append((Constant(1.0), _qobj_matrix(element, name, api)))
            continue
        operator, coefficient = element
        if foreign_library(operator) != "qutip":
            label = getattr(operator, "__qualname__", _kind(operator))
            raise TypeError(
                f"`{api}`: {where} is the function `{label}` returning a Qobj, which "
                "JAX cannot trace. Write the QobjEvo as `[[H_a, f_a], ...]` with "
                "constant operators and JAX-traceable coefficients, or pass a JAX "
                "function `t -> (n, n) array` (a `hierax.CallableOperator`)."
            )
        function = built_for(
            api,
            f"`{name}` (a QuTiP QobjEvo), the coefficient of one of its terms",
            _qutip_coefficient,
            coefficient,
            where,
            api,
        )
        terms.append((function, _qobj_matrix(operator, name, api)))
    if not terms:
        raise ValueError(f"`{api}`: `{name}` is an empty QuTiP QobjEvo.")
    return _sum(terms)


# ----------------------------------------------------------------------------------
# dynamiqs TimeQArray
# ----------------------------------------------------------------------------------


class _DenseOutput(eqx.Module):
    """A dynamiqs `timecallable`'s function, returning an array instead of a
    QArray."""

    f: Callable

    def __call__(self, t: Array) -> Array:
        out = self.f(t)
        return out.to_jax() if hasattr(out, "to_jax") else jnp.asarray(out)


def _bounds(x: Any) -> AbstractTimeFunction | None:
    """dynamiqs' time bounds (zero before `tstart` and from `tend` on) as a window;
    None without bounds."""
    if x.tstart is None and x.tend is None:
        return None
    return _window(x.tstart, x.tend)


def _scalar_values(values: Any) -> Any:
    if is_traced(values):
        return values
    values = np.asarray(values)
    return (
        values.real if np.iscomplexobj(values) and np.all(values.imag == 0) else values
    )


def _timeqarray(x: Any, name: str, api: str) -> AbstractTimeOperator:
    kind = _kind(x)
    if len(tuple(x.shape)) != 2:
        raise ValueError(
            f"`{api}`: `{name}` must be one operator of shape (n, n), got a dynamiqs "
            f"{kind} of shape {tuple(x.shape)}; hierax takes one operator (use "
            "`jax.vmap` over a batch)."
        )
    operator: AbstractTimeOperator
    if kind == "ConstantTimeQArray":
        operator = TimeOperator((Constant(1.0),), [_qarray_matrix(x.qarray, name, api)])
    elif kind == "ModulatedTimeQArray":
        where = f"`{name}` (a dynamiqs modulated TimeQArray)"
        try:
            function = CallableTimeFunction(x.f)
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"`{api}`: the function of {where} must return a float or complex "
                f"scalar that JAX can trace: {e}"
            ) from e
        operator = TimeOperator((function,), [_qarray_matrix(x.qarray, name, api)])
    elif kind == "PWCTimeQArray":
        function = built_for(
            api,
            f"`{name}` (a dynamiqs pwc TimeQArray), its pulse",
            PiecewiseConstant,
            x.times,
            _scalar_values(x.values),
        )
        operator = TimeOperator((function,), [_qarray_matrix(x.qarray, name, api)])
    elif kind == "CallableTimeQArray":
        operator = CallableOperator(_DenseOutput(x.f))
    elif kind == "SummedTimeQArray":
        parts = [
            _timeqarray(part, f"{name} (part {i})", api)
            for i, part in enumerate(x.timeqarrays)
        ]
        structured = [as_time_operator(part) for part in parts]
        terms = [
            (f, m)
            for part in structured
            if part is not None
            for f, m in zip(part.functions, _matrices(part))
        ]
        others = [p for p, s in zip(parts, structured, strict=True) if s is None]
        operators = ([_sum(terms)] if terms else []) + others
        operator = operators[0] if len(operators) == 1 else OperatorSum(operators)
    else:
        raise TypeError(
            f"`{api}`: `{name}` is a dynamiqs {kind}, which hierax does not convert."
        )
    window = _bounds(x)
    return operator if window is None else _times(window, operator)


def _matrices(operator: TimeOperator) -> list:
    return list(operator.matrices)


register_foreign_operator(foreign_operator)


# ----------------------------------------------------------------------------------
# States
# ----------------------------------------------------------------------------------


def as_state(x: Any, name: str, api: str, density: bool = False) -> Any:
    """A QuTiP or dynamiqs state as an array; anything else unchanged (the caller
    checks it).

    A ket `(n, 1)` becomes a vector `(n,)`; an operator `(n, n)` an `(n, n)` array,
    which the call given it reads as it reads any square state (a propagator in
    [`hierax.PropagatorDerivatives`][] and [`hierax.sesolve`][], a density matrix
    in [`hierax.DensityMatrixDerivatives`][] and [`hierax.mesolve`][]). Where a
    density matrix is meant (`density=True`), a ket becomes $|\\psi\\rangle\\langle
    \\psi|$, as in QuTiP's `mesolve`. Bras are refused.
    """
    library = foreign_library(x)
    if library is None:
        return x
    if library == "qutip" and _kind(x) == "Qobj":
        kind = x.type
        if kind == "ket":
            array = jnp.asarray(x.full()[:, 0])
        elif kind == "oper":
            array = jnp.asarray(x.full())
        elif kind == "bra":
            raise TypeError(
                f"`{api}`: `{name}` must be a ket or an operator, got a QuTiP bra of "
                f"shape {tuple(x.shape)}; pass the ket `{name}.dag()`."
            )
        else:
            raise TypeError(
                f"`{api}`: `{name}` must be a ket or an operator, got a QuTiP Qobj "
                f"of type {kind!r}."
            )
    elif library == "dynamiqs" and hasattr(x, "to_jax") and not callable(x):
        shape = tuple(x.shape)
        if len(shape) != 2:
            raise ValueError(
                f"`{api}`: `{name}` must be one state, got a dynamiqs QArray of shape "
                f"{shape}; give several states as the columns of an `(n, m)` array, "
                "or use `jax.vmap`."
            )
        if shape[0] == 1 and shape[1] != 1:
            raise TypeError(
                f"`{api}`: `{name}` must be a ket or an operator, got a dynamiqs bra "
                f"of shape {shape}; pass the ket `{name}.dag()`."
            )
        array = x.to_jax()
        array = array[:, 0] if shape[1] == 1 and shape[0] != 1 else array
    else:
        raise TypeError(
            f"`{api}`: `{name}` must be a state (a ket or a square matrix), got the "
            f"{library} object {_kind(x)}."
        )
    if density and array.ndim == 1:
        return jnp.outer(array, jnp.conj(array))
    return array


def as_matrices(xs: Any, name: str, api: str) -> Any:
    """A list or tuple of operators (e.g. `exp_ops`) with the QuTiP and dynamiqs ones
    as dense arrays; anything else unchanged."""
    if foreign_library(xs) is not None:
        raise TypeError(
            f"`{api}`: `{name}` must be a list of operators, got one {_kind(xs)}; "
            f"pass `[{name}]`."
        )
    if isinstance(xs, (list, tuple)):
        return [as_matrix(x, f"{name}[{i}]", api) for i, x in enumerate(xs)]
    return xs
