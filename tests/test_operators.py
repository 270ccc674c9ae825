import functools

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest

import hierax


sx = jnp.array([[0.0, 1.0], [1.0, 0.0]])
sy = jnp.array([[0, -1j], [1j, 0]])
sz = jnp.array([[1.0, 0.0], [0.0, -1.0]])


def _plain(t):
    return (
        jnp.cos(1.3 * t) * sy
        + (0.5 - t + 0.25 * t**2) * sz
        + jnp.exp(-0.4 * t) * jnp.sin(2 * t) * sx
        + 0.3 * sx
    )


OPERATORS = {
    "time-operator": lambda: (
        hierax.Cos(1.3) * sy
        + hierax.Polynomial(jnp.array([0.5, -1.0, 0.25])) * sz
        + (hierax.Exp(-0.4) * hierax.Sin(2.0)) * sx
        + 0.3 * sx
    ),
    "function-operator": lambda: hierax.CallableOperator(_plain),
    "mixed-sum": lambda: (
        hierax.CallableOperator(lambda t: jnp.cos(1.3 * t) * sy)
        + hierax.Polynomial(jnp.array([0.5, -1.0, 0.25])) * sz
        + hierax.Exp(-0.4) * hierax.CallableOperator(lambda t: jnp.sin(2 * t) * sx)
        + 0.3 * sx
    ),
    "plain-callable": lambda: hierax.as_operator(_plain),
}


@functools.cache
def _plain_series(t: float, order: int) -> np.ndarray:
    """The oracle, once for every parametrisation: the Taylor coefficients of each
    scalar function of `_plain` by mpmath at 30 digits, times its matrix."""
    mp = mpmath.mp.clone()
    mp.dps = 30
    scalars = [
        (lambda s: mp.cos(mp.mpf(1.3) * s), sy),
        (lambda s: mp.mpf(0.5) - s + mp.mpf(0.25) * s**2, sz),
        (lambda s: mp.exp(mp.mpf(-0.4) * s) * mp.sin(2 * s), sx),
    ]
    series = np.zeros((order + 1, 2, 2), complex)
    series[0] += 0.3 * np.asarray(sx)
    for f, matrix in scalars:
        c = np.array([complex(x) for x in mp.taylor(f, mp.mpf(t), order)])
        series += c[:, None, None] * np.asarray(matrix)
    return series


@pytest.mark.parametrize("name", list(OPERATORS))
def test_operator_series(name):
    op = OPERATORS[name]()
    t, order = 0.35, 5
    expected = _plain_series(t, order)
    np.testing.assert_allclose(op.taylor(t, order), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(op(t), _plain(t), rtol=1e-13, atol=1e-14)
    assert op.size == 2


@pytest.mark.parametrize("name", ["function-operator", "mixed-sum"])
def test_hierarchy_structure_does_not_change_the_answer(name):
    """Term structure, dense series and mixtures give the same hierarchy."""
    reference = hierax.HeisenbergHierarchy(OPERATORS["time-operator"](), sx, 8)(0.35)
    other = hierax.HeisenbergHierarchy(OPERATORS[name](), sx, 8)(0.35)
    np.testing.assert_allclose(other, reference, rtol=1e-11, atol=1e-9)
    d_ref = hierax.PropagatorDerivatives(OPERATORS["time-operator"](), 8)(0.35, sz)
    d_other = hierax.PropagatorDerivatives(OPERATORS[name](), 8)(0.35, sz)
    np.testing.assert_allclose(d_other, d_ref, rtol=1e-11, atol=1e-9)


def test_arithmetic_builds_the_expected_structure():
    op = hierax.Cos() * sx + hierax.Sin() * sy
    assert isinstance(op, hierax.TimeOperator)
    assert not isinstance(op.matrices, tuple) and op.matrices.shape == (2, 2, 2)
    op2 = sx * hierax.Cos()  # matrix times function, from either side
    assert isinstance(op2, hierax.TimeOperator)
    np_op = np.asarray(sx) * hierax.Cos()  # numpy arrays defer to us too
    assert isinstance(np_op, hierax.TimeOperator)
    np.testing.assert_allclose((op - op)(0.7), np.zeros((2, 2)), atol=1e-15)
    np.testing.assert_allclose((2.0 * op)(0.7), 2 * np.asarray(op(0.7)))
    np.testing.assert_allclose((op / 4.0)(0.7), np.asarray(op(0.7)) / 4, rtol=1e-15)
    with pytest.raises(TypeError):
        _ = op / op  # pyright: ignore[reportOperatorIssue]
    scaled = hierax.Gaussian() * op
    np.testing.assert_allclose(
        scaled(0.7), np.exp(-(0.7**2) / 2) * np.asarray(op(0.7)), rtol=1e-13
    )
    assert sum([op, op])(0.3).shape == (2, 2)  # pyright: ignore[reportCallIssue]
    assert not op.is_constant and hierax.as_operator(sx).is_constant


def test_numbers_times_operators_scale_the_terms_functions():
    """A number (traced or not) times an operator with terms scales each term's
    function (`2 * (Cos(w) * sx)` is `Cos(w, amplitude=2) * sx`): a sum
    distributes it, a scaled operator merges it, a callable operator stays scaled.
    The series are the number times the operator's, to the last digit, and a
    traced number changes the values, not the structure (one trace)."""
    callable_part = hierax.as_operator(lambda t: jnp.sin(t) * jnp.asarray(sz))
    op = hierax.Cos(1.3, 0.2) * sx + hierax.Gaussian(0.1, 0.5) * (1j * sy) + 0.5 * sz
    total = op + callable_part
    reference = np.asarray(total.taylor(0.7, 6))
    for c, scaled in [
        (2.5, 2.5 * total),
        (-1.0, -total),
        (0.25, total / 4.0),
        (1.5j, total * 1.5j),
        (0.0, 0.0 * total),
    ]:
        assert isinstance(scaled, hierax.OperatorSum)
        terms, rest = scaled.operators
        assert isinstance(terms, hierax.TimeOperator)
        assert [type(f) for f in terms.functions] == [
            hierax.Cos,
            hierax.Gaussian,
            hierax.Constant,
        ]
        assert isinstance(rest, hierax.ScaledOperator)
        series = np.asarray(scaled.taylor(0.7, 6))
        assert np.all(np.isfinite(series))
        np.testing.assert_allclose(series, c * reference, rtol=1e-14, atol=1e-15)
    twice = 3.0 * (2.0 * callable_part)  # one scaled operator, its factor 6
    assert isinstance(twice, hierax.ScaledOperator)
    assert not isinstance(twice.operator, hierax.ScaledOperator)
    np.testing.assert_allclose(twice(0.4), 6 * np.asarray(callable_part(0.4)))
    traces = []

    @jax.jit
    def scaled_series(a):
        traces.append(None)
        return (a * op).taylor(0.7, 6)

    for a in (0.5, -2.0):
        np.testing.assert_allclose(
            scaled_series(a), a * np.asarray(op.taylor(0.7, 6)), rtol=1e-14, atol=1e-15
        )
    assert len(traces) == 1


def test_function_operator_with_equinox_module_is_trainable():
    import equinox as eqx

    class Pulse(eqx.Module):
        amplitude: jax.Array

        def __call__(self, t):
            return self.amplitude * jnp.tanh(t) * sx + sz

    def loss(pulse):
        levels = hierax.HeisenbergHierarchy(hierax.CallableOperator(pulse), sy, 4)(0.2)
        return jnp.sum(jnp.abs(levels[2]) ** 2)

    pulse = Pulse(jnp.asarray(0.8))
    grad = jax.grad(loss)(pulse).amplitude
    eps = 1e-6
    fd = (loss(Pulse(jnp.asarray(0.8 + eps))) - loss(Pulse(jnp.asarray(0.8 - eps)))) / (
        2 * eps
    )
    np.testing.assert_allclose(grad, fd, rtol=1e-6)


def test_callable_module_with_python_int_field():
    """A Python int in a user's module stays static (as under `eqx.filter_jit`): it
    may drive a Python loop inside the callable."""
    import equinox as eqx

    class Harmonics(eqx.Module):
        weights: jax.Array
        count: int

        def __call__(self, t):
            total = 0.0
            for k in range(self.count):
                total = total + self.weights[k] * jnp.cos((k + 1) * t)
            return total * sx + sz

    pulse = Harmonics(jnp.array([0.5, -0.25, 0.1]), 3)
    levels = hierax.HeisenbergHierarchy(pulse, sy, 4)(0.3)
    reference = hierax.HeisenbergHierarchy(
        hierax.Cos(1.0, 0.0, 0.5) * sx
        + hierax.Cos(2.0, 0.0, -0.25) * sx
        + hierax.Cos(3.0, 0.0, 0.1) * sx
        + sz,
        sy,
        4,
    )(0.3)
    np.testing.assert_allclose(levels, reference, rtol=1e-12, atol=1e-12)


def test_functions_of_one_structure_share_one_series():
    """A `TimeOperator`'s time functions of one structure (here `Cos` drives and
    Gaussians) are expanded together under `jax.vmap`, sums and products taken
    apart into their factors (two Gaussian envelopes times a cosine, a DRAG
    pulse's Gaussian and its slope, a Gaussian plus a cosine): all the Gaussians
    are one series (one recurrence in the program). Each series equals the
    function's own, at a real and a complex time, with functions of other
    structures (a polynomial, a constant, a callable) beside them, and the
    operator's gradient with respect to a drive's amplitude equals a central
    difference."""
    from hierax._operators._time_operators import function_series

    def functions(amplitude):
        return [
            hierax.Cos(1.3, amplitude=amplitude),
            hierax.Gaussian(0.5, 0.7) * hierax.Cos(2.0),
            hierax.Cos(0.4, 0.3),
            hierax.Polynomial(jnp.array([0.2, -0.1, 0.05])),
            hierax.Gaussian(-0.3, 1.1) * hierax.Cos(0.7, -0.2),
            hierax.Constant(0.8),
            hierax.Cos(2.9, 1.1, amplitude=0.5),
            hierax.CallableTimeFunction(lambda t: jnp.tanh(t)),
            hierax.Gaussian(1.0, 0.4, amplitude=amplitude),
            hierax.Polynomial(jnp.array([0.3, -0.5])) * hierax.Gaussian(1.0, 0.4),
            hierax.Gaussian(0.2, 0.9) + 0.5 * hierax.Sin(1.0),
        ]

    # Compiled as one program each (op by op, each operation compiles alone).
    together_at = jax.jit(
        lambda t: function_series(functions(0.6), t, 12, jnp.asarray(0.9))
    )
    alone_at = jax.jit(
        lambda t: [f.series(t, 12, jnp.asarray(0.9)) for f in functions(0.6)]
    )
    program = jax.make_jaxpr(together_at)(jnp.asarray(0.37))
    # One recurrence for the five Gaussians, one per polynomial (two lengths) and
    # one in the callable's Taylor transform (taken apart, the products and the
    # sum had four more).
    assert str(program).count("scan[") == 4
    for t in (jnp.asarray(0.37), jnp.asarray(0.37 + 0.2j)):
        for series, alone in zip(together_at(t), alone_at(t), strict=True):
            np.testing.assert_allclose(
                np.asarray(series), np.asarray(alone), rtol=1e-14, atol=1e-15
            )

    def first(amplitude):
        matrices = jnp.eye(2)[None].repeat(11, axis=0)
        op = hierax.TimeOperator(functions(amplitude), matrices)
        return jnp.real(op.sparse_series(jnp.asarray(0.37), 6, None).coefficients[0, 3])

    step = 1e-6
    first = jax.jit(first)
    numeric = (first(0.6 + step) - first(0.6 - step)) / (2 * step)
    slope = jax.jit(jax.grad(first))(0.6)
    np.testing.assert_allclose(float(slope), float(numeric), rtol=1e-7)


def test_products_are_refused_in_the_name_of_the_product():
    """Issue 48: a factor that is no number (a sparse matrix wrapped by
    `np.asarray`) or a number that is not finite is refused by the product the user
    wrote, never by `hierax.Constant`, which hierax builds for it."""
    import scipy.sparse

    sx = np.array([[0, 1], [1, 0]], complex)
    operator = hierax.Cos() * np.array([[0, -1j], [1j, 0]])
    wrapped = np.asarray(scipy.sparse.csr_matrix(sx))
    for product in (lambda: operator * wrapped, lambda: wrapped * operator):
        with pytest.raises(TypeError, match=r"^`hierax.TimeOperator \* ...`: `other`"):
            product()
    for factor in (np.nan, np.float64(np.inf), jnp.asarray(np.nan)):
        for product in (lambda f=factor: operator * f, lambda f=factor: f * operator):
            with pytest.raises(ValueError) as info:
                product()
            message = str(info.value)
            assert message.startswith("`hierax.TimeOperator * ...`: the factor")
            assert "hierax.Constant" not in message


def test_each_term_storage_is_a_class_and_kinds_answer_their_queries():
    """Dense and sparse term matrices are each a class with the methods callers
    need (no caller tests which one an operator holds), `op.matrices` and
    `op.is_sparse` keep their meaning, and each kind of operator says whether its
    matrices are Hermitian: checked against NumPy and plain evaluation."""
    import equinox as eqx
    import scipy.sparse as sp

    from hierax._operators._term_matrices import (
        DenseTermMatrices,
        SparseTermMatrices,
    )

    sp_ = jnp.array([[0.0, 1.0], [0.0, 0.0]])  # sigma_+, not Hermitian
    dense = hierax.Cos(1.3) * sx + 0.5 * sz
    sparse = hierax.TimeOperator(
        [hierax.Cos(1.3), 0.5], [sp.csr_matrix(np.asarray(sx)), np.asarray(sz)]
    )
    assert isinstance(dense.term_matrices, DenseTermMatrices) and not dense.is_sparse
    assert dense.matrices.shape == (2, 2, 2)
    assert isinstance(sparse.term_matrices, SparseTermMatrices) and sparse.is_sparse
    assert all(isinstance(m, hierax.SparseMatrix) for m in sparse.matrices)
    t = 0.4
    expected = np.cos(1.3 * t) * np.asarray(sx) + 0.5 * np.asarray(sz)
    for op in (dense, sparse):
        np.testing.assert_allclose(op(t), expected, rtol=1e-14)
    # A sum of two of one storage keeps it; scaling keeps the checked matrices.
    for op, storage in ((sparse, SparseTermMatrices), (dense, DenseTermMatrices)):
        twice = op + op
        assert isinstance(twice, hierax.TimeOperator)
        assert isinstance(twice.term_matrices, storage)
        np.testing.assert_allclose(twice(t), 2 * expected, rtol=1e-14)
    assert isinstance(dense + sparse, hierax.OperatorSum)
    for op in (dense, sparse):
        scaled = 2.0 * op
        assert isinstance(scaled, hierax.TimeOperator)
        assert scaled.term_matrices is op.term_matrices
        np.testing.assert_allclose(scaled(t), 2 * expected, rtol=1e-14)
    # The stack is still a field's leaf for `eqx.tree_at`.
    swapped = eqx.tree_at(lambda o: o.matrices, dense, dense.matrices[::-1])
    np.testing.assert_allclose(swapped.matrices, np.asarray(dense.matrices)[::-1])

    def hermitian(op):
        return all(np.array_equal(m, np.conj(m).T) for m in map(np.asarray, op))

    drive = hierax.TimeOperator([hierax.Cos(1.0)], [sp.csr_matrix(np.asarray(sp_))])
    kinds = {
        "dense": (dense, [sx, sz]),
        "sparse": (sparse, [sx, sz]),
        "scaled": (hierax.ScaledOperator(hierax.Sin(2.0), dense), [sx, sz]),
        "sum": (hierax.OperatorSum([dense, sparse]), [sx, sz]),
        "not hermitian dense": (hierax.Cos() * sp_ + sz, [sp_, sz]),
        "not hermitian sparse": (drive, [sp_]),
        "sum with one not": (hierax.OperatorSum([dense, drive]), [sx, sz, sp_]),
    }
    for name, (op, matrices) in kinds.items():
        assert op.is_hermitian() == hermitian(matrices), name
    assert not hierax.CallableOperator(lambda t: jnp.cos(t) * sx).is_hermitian()

    # Traced matrices are not known here (hierarchies check them when compiled).
    seen = []

    @jax.jit
    def traced(stack):
        seen.append(hierax.TimeOperator([1.0, 2.0], stack).is_hermitian())
        return stack

    traced(jnp.stack([sx, sz]))
    assert seen == [False]


def test_operator_queries_are_plain_calls():
    """The queries answered in Python before compiling (`host_method`) are looked
    up as plain bound calls, not as the `BoundMethod` module Equinox builds for a
    method on every look-up (tens of microseconds each on every eager `floquet`);
    they answer as the functions they wrap, and stay abstract on the bases."""
    import abc

    import equinox as eqx

    from hierax._core import host_method
    from hierax._operators._term_matrices import AbstractTermMatrices

    SX, SZ = np.asarray(sx), np.asarray(sz)
    op = hierax.Cos(1.0) * SX + 0.5 * SZ
    for query in (op.is_hermitian, op.term_matrices.known_stack):
        assert isinstance(query, functools.partial)
        assert not isinstance(query, eqx.Module)
    assert op.is_hermitian() is True
    np.testing.assert_array_equal(
        op.term_matrices.known_stack(), np.stack([SX, SZ / 2])
    )
    assert not (hierax.Cos(1.0) * (SX + 1j * SZ)).is_hermitian()
    with pytest.raises(TypeError, match="abstract"):
        AbstractTermMatrices()  # type: ignore[abstract]

    class Base(eqx.Module):
        @host_method
        @abc.abstractmethod
        def query(self, x: int) -> int: ...

    class Final(Base):
        offset: int

        @host_method
        def query(self, x: int) -> int:
            return x + self.offset

    with pytest.raises(TypeError, match="abstract"):
        Base()  # type: ignore[abstract]
    assert Final(2).query(3) == 5 and Final.query(Final(1), 3) == 4
