"""Sparse terms kept sparse: construction against scipy/NumPy, the state kernels
against repeated sparse products and scipy's DOP853, memory, sharding, bad input."""

import functools
import math
import textwrap
from typing import cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.sparse as sp
from jax.experimental import sparse as jsparse

import hierax

from .helpers import (
    compile_count,
    fresh_output,
    fresh_script,
    propagate,
    recorded_returns,
    relative_error,
    relative_errors,
)


SX = np.array([[0.0, 1.0], [1.0, 0.0]])
SY = np.array([[0.0, -1j], [1j, 0.0]])
SZ = np.diag([1.0, -1.0])


def _dense_kron(*ops):
    return functools.reduce(np.kron, ops)


def _chain(op, site, sites):
    return _dense_kron(*[op if j == site else np.eye(2) for j in range(sites)])


def _scipy_chain(op, site, sites):
    out = sp.identity(1, format="csr")
    for j in range(sites):
        out = sp.kron(out, sp.csr_matrix(op) if j == site else sp.identity(2), "csr")
    return out


def test_construction_matches_scipy_and_numpy():
    rng = np.random.default_rng(0)
    a = sp.random(7, 7, density=0.3, rng=1) + 1j * sp.random(7, 7, density=0.3, rng=2)
    dense = a.toarray()
    for matrix in (
        a.tocsr(),
        a.tocoo(),
        jsparse.BCOO.fromdense(dense),
        jsparse.BCSR.fromdense(dense),
        dense,
    ):
        s = hierax.SparseMatrix.from_matrix(matrix)
        np.testing.assert_array_equal(np.asarray(s.todense()), dense)
    # Duplicate entries are summed, explicit zeros dropped.
    coo = sp.coo_matrix(([1.0, 2.0, 0.0, 5.0], ([0, 0, 1, 2], [1, 1, 1, 0])), (3, 3))
    s = hierax.SparseMatrix.from_matrix(coo)
    np.testing.assert_array_equal(np.asarray(s.todense()), coo.toarray())
    assert s.width == 1
    # Arithmetic, products, transposes and kron against NumPy.
    b = hierax.SparseMatrix.from_matrix(sp.random(7, 7, density=0.4, rng=3))
    bd = np.asarray(b.todense())
    s = hierax.SparseMatrix.from_matrix(a)
    v = rng.normal(size=(7, 3))
    checks = {
        "sum": (s + b, dense + bd),
        "difference": (s - 2.0 * b, dense - 2.0 * bd),
        "quotient": (s / 4.0, dense / 4.0),
        "product": (s @ b, dense @ bd),
        "transpose": (s.T, dense.T),
        "adjoint": (s.conj().T, dense.conj().T),
        "kron": (hierax.kron(s, SY, b), _dense_kron(dense, SY, bd)),
        "builtin sum": (sum([s, b, b]), dense + 2 * bd),
    }
    for name, (got, want) in checks.items():
        np.testing.assert_allclose(
            np.asarray(got.todense()), want, atol=1e-14, err_msg=name
        )
    np.testing.assert_allclose(np.asarray(s @ v), dense @ v, atol=1e-14)
    assert not s.is_hermitian()
    assert (s + s.conj().T).is_hermitian()


def test_site_operators_build_a_chain():
    sites = 4
    x = [hierax.site_operator(SX, i, sites) for i in range(sites)]
    z = [hierax.site_operator(SZ, i, sites) for i in range(sites)]
    ising = sum(x) + 0.7 * sum(z[i] @ z[i + 1] for i in range(sites - 1))
    assert isinstance(ising, hierax.SparseMatrix)
    want = sum(_chain(SX, i, sites) for i in range(sites)) + 0.7 * sum(
        _chain(SZ, i, sites) @ _chain(SZ, i + 1, sites) for i in range(sites - 1)
    )
    np.testing.assert_allclose(np.asarray(ising.todense()), want, atol=1e-15)
    assert x[2].width == 1 and (z[0] @ z[1]).diagonal
    # Mixed local dimensions: a qubit and a qutrit.
    a = np.diag([0.0, 1.0, 2.0])
    got = hierax.site_operator(a, 1, 2, dims=[2, 3])
    np.testing.assert_array_equal(np.asarray(got.todense()), np.kron(np.eye(2), a))


def _tfim(sites, field):
    """The transverse-field Ising chain with a time-dependent field, as hierax
    builds it from site operators, and the same terms in scipy."""
    x = [hierax.site_operator(SX, i, sites) for i in range(sites)]
    z = [hierax.site_operator(SZ, i, sites) for i in range(sites)]
    hamiltonian = field * sum(x) + (-1.0) * sum(
        z[i] @ z[i + 1] for i in range(sites - 1)
    )
    xs = functools.reduce(
        lambda a, b: a + b, [_scipy_chain(SX, i, sites) for i in range(sites)]
    ).tocsr()
    zz = functools.reduce(
        lambda a, b: a + b,
        [
            sp.csr_matrix(
                _scipy_chain(SZ, i, sites).multiply(_scipy_chain(SZ, i + 1, sites))
            )
            for i in range(sites - 1)
        ],
    ).tocsr()
    return hamiltonian, xs, -zz


def test_propagator_derivatives_against_repeated_sparse_products():
    # H(t) = p(t) A + B with scipy matrices; y^(k+1) = -i sum_j C(k,j) H^(j) y^(k-j),
    # with H^(j) = p^(j)(t) A (+ B at j = 0): repeated sparse products in scipy.
    sites, order, t = 7, 12, 0.3
    p = np.array([0.5, -1.0, 0.25, 0.1])  # coefficients of a cubic
    hamiltonian, xs, zz = _tfim(sites, hierax.Polynomial(p))
    n = 2**sites
    rng = np.random.default_rng(5)
    state = rng.normal(size=(n, 2)) + 1j * rng.normal(size=(n, 2))
    poly = np.polynomial.Polynomial(p)
    dp = [poly.deriv(j)(t) if j else poly(t) for j in range(order + 1)]
    ys = [state]
    for k in range(order):
        total = sum(
            float(math.comb(k, j)) * (dp[j] * (xs @ ys[k - j])) for j in range(k + 1)
        )
        ys.append(-1j * (total + zz @ ys[k]))
    reference = np.stack(ys)
    got = hierax.PropagatorDerivatives(hamiltonian, order)(t, state)
    assert np.max(relative_errors(got, reference)) <= 1e-12
    # The same operator stored dense gives the same levels.
    dense = hierax.Polynomial(p) * xs.toarray() + zz.toarray()
    same = hierax.PropagatorDerivatives(dense, order)(t, state)
    assert np.max(relative_errors(got, same)) <= 1e-13


def test_sesolve_12_qubit_chain_against_dop853():
    # n = 4096, sparse: hierax at rtol 1e-10 against scipy's DOP853 at rtol 1e-12
    # on the sparse equation; the compiled step uses far less memory than one dense
    # n x n matrix per term.
    sites = 12
    n = 2**sites
    field = 1.0 + hierax.Sin(2.0, amplitude=0.5)
    hamiltonian, xs, zz = _tfim(sites, field)
    state = np.zeros(n, complex)
    state[0] = 1.0  # all spins up
    times = np.array([0.0, 0.25, 0.5])

    def rhs(t, y):
        return -1j * ((1.0 + 0.5 * np.sin(2 * t)) * (xs @ y) + zz @ y)

    reference = scipy.integrate.solve_ivp(
        rhs, (0.0, 0.5), state, "DOP853", t_eval=times, rtol=1e-12, atol=1e-14
    ).y.T
    solution = hierax.sesolve(hamiltonian, state, times, rtol=1e-10, atol=1e-12)
    errors = np.linalg.norm(np.asarray(solution.states) - reference, axis=1)
    assert np.max(errors) <= 1e-8
    # Memory of the compiled step (what XLA allocates besides its arguments).
    from hierax._solvers._term import schrodinger_terms as step_terms

    step = jax.jit(
        lambda h, y: step_terms(h, jnp.asarray(0.1), jnp.asarray(0.05), y, 20)
    )
    memory = step.lower(hamiltonian, jnp.asarray(state)).compile().memory_analysis()
    assert memory is not None
    dense_term = n * n * 16
    assert memory.temp_size_in_bytes + memory.argument_size_in_bytes < dense_term / 50


def test_known_dense_many_body_terms_step_by_their_nonzeros(monkeypatch):
    """A driven 8-site XXZ chain given as dense NumPy matrices (n = 256, 8 nonzeros
    a row), with a random coupling of 8% nonzeros, steps all three terms by their
    nonzeros: the step's operator holds `SparseMatrix` terms, and the states equal
    DOP853's for one ket. For kets as columns and under `jax.vmap` the coupling
    (up to 12% of a row) is taken dense again, the chain's terms are not; the
    mapped solve equals the single one. The gradient with respect to a traced
    scale of the known matrices (`a * H`, whose terms are read too) matches a
    central difference."""
    from hierax._solvers import _term

    sites = 8
    n = 2**sites
    bonds = sum(
        _chain(p, k, sites) @ _chain(p, k + 1, sites)
        for p in (SX, SY, SZ)
        for k in range(sites - 1)
    ).real  # Y Y is real
    field = sum(_chain(SX, k, sites) for k in range(sites))
    rng = np.random.default_rng(5)
    coupling = (rng.random((n, n)) < 0.04) * rng.normal(size=(n, n)) / n
    coupling = coupling + coupling.T
    hamiltonian = (
        hierax.Cos(2.0, amplitude=0.3) * field + hierax.Sin(1.0) * coupling + bonds
    )
    stepped = _term.SchrodingerTerm(hamiltonian).hamiltonian
    assert isinstance(stepped, hierax.TimeOperator)
    assert isinstance(stepped.matrices, tuple)
    widths = [m.values.shape[1] for m in stepped.matrices]
    assert widths[0] == widths[2] == 8 and 0.08 * n < widths[1] <= 0.2 * n
    kets = rng.normal(size=(n, 2)) + 1j * rng.normal(size=(n, 2))
    kets /= np.linalg.norm(kets, axis=0)
    times = np.array([0.0, 0.1])
    reference = propagate(
        lambda t: bonds + 0.3 * np.cos(2.0 * t) * field + np.sin(t) * coupling,
        0.0,
        0.1,
        kets,
        1e-12,
    )
    solve = lambda h, y: hierax.sesolve(h, y, times, rtol=1e-10).final_state
    made_dense = recorded_returns(monkeypatch, _term, "_wide_sparse_made_dense")
    one = solve(hamiltonian, kets[:, 0])
    assert relative_error(one, reference[:, 0]) < 1e-8 and not made_dense
    # New values with the same zeros: the same program.
    compiles = compile_count()
    solve(
        hierax.Cos(2.0, amplitude=0.3) * field
        + hierax.Sin(1.0) * (0.5 * coupling)
        + 0.5 * bonds,
        kets[:, 1],
    )
    assert compile_count() == compiles
    # H + 5 I: the trace is taken out before the nonzeros are read (the same
    # widths, so the same program), and the states gain the phase e^{-5it}.
    shifted = (
        hierax.Cos(2.0, amplitude=0.3) * field
        + hierax.Sin(1.0) * coupling
        + (bonds + 5.0 * np.eye(n))
    )
    assert _term.SchrodingerTerm(shifted).energy_shift == pytest.approx(5.0)
    moved = solve(shifted, kets[:, 0])
    assert compile_count() == compiles
    assert relative_error(moved, np.exp(-5j * times[-1]) * one) < 1e-9
    # float32 matrices and a complex64 ket: float32 nonzeros, complex64 answer.
    f32 = lambda m: np.asarray(m, np.float32)
    single = (
        hierax.Cos(2.0, amplitude=0.3) * f32(field)
        + hierax.Sin(1.0) * f32(coupling)
        + f32(bonds)
    )
    stepped = _term.SchrodingerTerm(single).hamiltonian
    assert isinstance(stepped, hierax.TimeOperator)
    assert all(m.values.dtype == np.float32 for m in stepped.matrices)
    low = hierax.sesolve(
        single, kets[:, 0].astype(np.complex64), times.astype(np.float32), rtol=1e-5
    ).final_state
    assert low.dtype == jnp.complex64 and relative_error(low, one) < 1e-5
    mapped = jax.vmap(lambda y: solve(hamiltonian, y), 1, 1)(kets)
    assert relative_error(mapped, reference) < 1e-8
    np.testing.assert_allclose(mapped[:, 0], one, rtol=0, atol=1e-12)
    under_vmap = list(made_dense)
    made_dense.clear()
    assert relative_error(solve(hamiltonian, kets), reference) < 1e-8
    # Each time (a step is traced more than once by diffrax): one term, the
    # coupling, made dense; the chain's two kept sparse.
    assert under_vmap and made_dense
    for real, series in under_vmap + made_dense:
        assert real.matrices.shape[0] + series.matrices.shape[0] == 1
        assert len(series.sparse.matrices) == 2

    def population(a):
        return jnp.abs(solve(a * hamiltonian, kets[:, 0])[3]) ** 2

    gradient = jax.grad(population)(1.0)
    eps = 1e-5
    central = (population(1.0 + eps) - population(1.0 - eps)) / (2 * eps)
    assert abs(gradient - central) <= 1e-6 * abs(central) + 1e-10, (gradient, central)


def test_wide_sparse_terms_made_dense_keep_every_term():
    """The dense layout of a step's series (`_wide_sparse_made_dense`) moves each
    sparse term with many nonzeros a row to the dense terms (real values to the
    real part, complex ones to the other) and keeps the rest: the operator the
    series sums to is unchanged, with no dense term to start from too."""
    from hierax._data._series import TermSeries
    from hierax._data._sparse import SparseTerms
    from hierax._solvers._term import _wide_sparse_made_dense

    n, width = 300, 40
    rng = np.random.default_rng(2)

    def sparse(count, dtype):
        m = np.zeros((n, n), dtype)
        for r in range(n):
            columns = rng.choice(n, count, replace=False)
            values = rng.normal(size=count)
            m[r, columns] = values + 1j if dtype is complex else values
        return hierax.SparseMatrix.from_matrix(m)

    matrices = (sparse(width, complex), sparse(2, float), sparse(width, float))
    coefficients = jnp.asarray(rng.normal(size=(3, 5)) + 1j * rng.normal(size=(3, 5)))
    terms = SparseTerms(coefficients, matrices, (False, True, False))
    empty = TermSeries(jnp.zeros((0, 5), complex), jnp.zeros((0, n, n)), None)

    def total(real, series):
        parts = [p for p in (real, series) if p is not None]
        out = sum(
            jnp.einsum("ak,aij->kij", p.coefficients, p.matrices.astype(complex))
            for p in parts
        )
        if series.sparse is not None:
            for c, m in zip(series.sparse.coefficients, series.sparse.matrices):
                out = out + c[:, None, None] * m.todense()[None]
        return out

    expected = total(None, empty._replace(sparse=terms))
    real, series = _wide_sparse_made_dense(None, empty._replace(sparse=terms))
    assert real is not None and real.matrices.shape[0] == 1
    assert series.matrices.shape[0] == 1 and jnp.iscomplexobj(series.matrices)
    assert series.sparse is not None and series.sparse.matrices == (matrices[1],)
    assert series.sparse.constant == (True,)
    np.testing.assert_allclose(total(real, series), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "carried, uniform",
    [(False, False), (True, False), (False, True)],
    ids=["fused", "carried", "uniform"],
)
def test_step_series_of_sparse_terms_against_numpy(carried, uniform, monkeypatch):
    """One Taylor step's series (a backward step) with sparse terms, constant and
    time-dependent, against a NumPy recursion with the closed-form series of the
    time functions. `carried` takes the path of large states (each order carried
    beside the series so that XLA threads the products) at n = 64; `uniform` the
    products of matrices whose entries are all equal (sum_i X_i), as `sesolve`
    hands them to its program."""
    from hierax._data._sparse import AbstractSparseMatrix, UniformSparseMatrix
    from hierax._kernels import propagator
    from hierax._operators._rewrites import uniform_products
    from hierax._solvers._term import schrodinger_terms

    if carried:
        monkeypatch.setattr(propagator, "_PARALLEL_STATE_SIZE", 1)
    sites, order = 6, 14
    t, h = 0.3, -0.2
    x = [hierax.site_operator(SX, i, sites) for i in range(sites)]
    z = [hierax.site_operator(SZ, i, sites) for i in range(sites)]
    xs = sum(_chain(SX, i, sites) for i in range(sites))
    zz = sum(_chain(SZ, i, sites) @ _chain(SZ, i + 1, sites) for i in range(sites - 1))
    k = np.arange(order + 1)
    factorial = np.array([math.factorial(int(i)) for i in k], float)
    # Series in sigma of 1 + 0.5 sin(2 (t + h sigma)) and cos(t + h sigma).
    field = 0.5 * (2 * h) ** k / factorial * np.sin(2 * t + k * np.pi / 2)
    field[0] += 1.0
    cos = h**k / factorial * np.cos(t + k * np.pi / 2)
    zz_sum = sum(z[i] @ z[i + 1] for i in range(sites - 1))
    cases = [
        (
            (1.0 + hierax.Sin(2.0, amplitude=0.5)) * sum(x) - zz_sum,
            -np.eye(order + 1)[0],
        ),
        (
            (1.0 + hierax.Sin(2.0, amplitude=0.5)) * sum(x) + hierax.Cos(1.0) * zz_sum,
            cos,
        ),
    ]
    rng = np.random.default_rng(3)
    for hamiltonian, coupling in cases:
        if uniform:
            hamiltonian = uniform_products(hamiltonian)
            kinds = [
                type(m)
                for m in jax.tree.leaves(
                    hamiltonian, is_leaf=lambda m: isinstance(m, AbstractSparseMatrix)
                )
                if isinstance(m, AbstractSparseMatrix)
            ]
            # sum_i X_i is uniform; the ZZ sum is diagonal, which reads its values.
            assert kinds.count(UniformSparseMatrix) == 1, kinds
        for shape in [(2**sites,), (2**sites, 2)]:
            y0 = rng.normal(size=shape) + 1j * rng.normal(size=shape)
            want = np.zeros((order + 1, *shape), complex)
            want[0] = y0
            for j in range(order):
                total = sum(
                    (field[m] * xs + coupling[m] * zz) @ want[j - m]
                    for m in range(j + 1)
                )
                want[j + 1] = -1j * h / (j + 1) * total
            got = jax.jit(
                lambda hamiltonian, y: schrodinger_terms(
                    hamiltonian, jnp.asarray(t), jnp.asarray(h), y, order
                )
            )(hamiltonian, jnp.asarray(y0))
            for level in range(order + 1):
                scale = np.max(np.abs(want[level]))
                assert (
                    np.max(np.abs(np.asarray(got[level]) - want[level]))
                    <= 1e-13 * scale
                )


def test_uniform_products_only_for_known_equal_entries():
    """Only known, non-diagonal matrices with all entries equal are read as one
    value; traced entries (a gradient with respect to them) keep every entry, and
    the gradient then matches the one through the dense matrix."""
    from hierax._data._sparse import UniformSparseMatrix
    from hierax._operators._rewrites import uniform_products

    sites = 4
    x = cast(
        hierax.SparseMatrix,
        sum(hierax.site_operator(SX, i, sites) for i in range(sites)),
    )
    y = sum(hierax.site_operator(SY, i, sites) for i in range(sites))
    padded = hierax.site_operator(SX, 0, sites) + hierax.site_operator(SZ, 1, sites)
    z = sum(hierax.site_operator(SZ, i, sites) for i in range(sites))
    field = hierax.Cos(1.0)
    for matrix, expected in [
        (x, True),
        (2.5 * x, True),
        (y, False),
        (padded, False),
        (z, False),
    ]:
        got = uniform_products(field * matrix)
        assert isinstance(got.matrices[0], UniformSparseMatrix) == expected
    state = np.zeros(2**sites, complex)
    state[0] = 1.0
    times = np.array([0.0, 0.7])

    columns = x.columns

    def population(values, dense):
        if dense:
            rows = jnp.arange(2**sites)[:, None]
            matrix = jnp.zeros((2**sites, 2**sites)).at[rows, columns].add(values)
        else:
            matrix = hierax.SparseMatrix(values, columns)
        h = field * matrix + z
        final = hierax.sesolve(h, state, times, rtol=1e-10, atol=1e-12).states[-1]
        return jnp.abs(final[0]) ** 2

    values = x.values
    plain = population(values, False)
    assert float(plain) == pytest.approx(float(population(values, True)), abs=1e-9)
    sparse = jax.grad(population)(values, False)
    dense = jax.grad(population)(values, True)
    assert np.max(np.abs(np.asarray(sparse) - np.asarray(dense))) <= 1e-8
    # Not all entries' gradients are equal: each entry kept its own.
    assert np.ptp(np.asarray(sparse)) > 1e-6


@pytest.mark.parametrize("kind", ["general", "diagonal", "uniform"])
def test_each_sparse_kind_products_against_the_dense_matrix(kind):
    """Each kind of sparse matrix (all abstract or final: a uniform matrix is no
    `SparseMatrix`) computes its product, transposed product and the values'
    cotangent by its own rule; each against the dense matrix and `jax.vjp` of the
    product, and the arithmetic of any kind gives a plain `SparseMatrix`."""
    from hierax._data._sparse import (
        AbstractSparseMatrix,
        UniformSparseMatrix,
        is_sparse,
    )

    rng = np.random.default_rng(7)
    n = 6
    if kind == "diagonal":
        matrix = hierax.SparseMatrix(
            rng.normal(size=(n, 1)), np.arange(n)[:, None], diagonal=True
        )
    else:
        # Two entries in every row (a uniform matrix has no padding).
        mask = np.eye(n, dtype=bool) | np.roll(np.eye(n, dtype=bool), 2, axis=1)
        general = hierax.SparseMatrix.from_matrix(mask * rng.normal(size=(n, n)))
        matrix = general
        if kind == "uniform":
            ones = hierax.SparseMatrix.from_matrix(mask * 1.5)
            matrix = UniformSparseMatrix(ones.values, ones.columns)
            assert not isinstance(matrix, hierax.SparseMatrix)
    assert isinstance(matrix, AbstractSparseMatrix) and is_sparse(matrix)
    dense = np.asarray(matrix.todense())
    x = rng.normal(size=(n, 3))
    np.testing.assert_allclose(matrix.matvec(jnp.asarray(x)), dense @ x, atol=1e-12)
    np.testing.assert_allclose(matrix.rmatvec(jnp.asarray(x)), dense.T @ x, atol=1e-12)
    us, gs = rng.normal(size=(4, n, 3)), rng.normal(size=(4, n, 3))

    def products(values):
        rebuilt = eqx.tree_at(lambda m: m.values, matrix, values)
        return jnp.stack([rebuilt.matvec(u) for u in jnp.asarray(us)])

    _, back = jax.vjp(products, matrix.values)
    (expected,) = back(jnp.asarray(gs))
    got = matrix.values_cotangent(jnp.asarray(us), jnp.asarray(gs))
    np.testing.assert_allclose(got, expected, atol=1e-12)
    for result in (2.0 * matrix, matrix + matrix, matrix.conj(), matrix.T):
        assert type(result) is hierax.SparseMatrix
    np.testing.assert_allclose((matrix + matrix).todense(), 2 * dense, atol=1e-12)
    assert type(matrix.astype(np.complex128)) is type(matrix)


def test_sparse_chain_complex64_and_offset():
    """The sparse state kernel (uniform sum_i X_i, diagonal ZZ) with a complex64
    state and float32 times stays complex64 and within float32 rounding of the x64
    solve; a sparse offset 1000 I changes only the global phase."""
    sites = 6
    n = 2**sites
    field = 1.0 + hierax.Sin(2.0, amplitude=0.5)
    hamiltonian, _, _ = _tfim(sites, field)
    state = np.zeros(n, np.complex64)
    state[0] = 1.0
    times = np.array([0.0, 0.5, 1.0], np.float32)
    low = hierax.sesolve(hamiltonian, state, times, rtol=1e-5, atol=1e-7)
    assert low.states.dtype == jnp.complex64
    high = hierax.sesolve(
        hamiltonian, state.astype(complex), times.astype(float), rtol=1e-11, atol=1e-13
    )
    assert (
        np.max(np.abs(np.asarray(low.states) - np.asarray(high.states))) <= 1e-6
    )  # 1.1e-7
    offset = hamiltonian + 1000.0 * hierax.SparseMatrix.from_matrix(sp.identity(n))
    shifted = hierax.sesolve(
        offset, state.astype(complex), times.astype(float), rtol=1e-11, atol=1e-13
    )
    phases = np.exp(-1000j * times.astype(float))[:, None]
    assert (
        np.max(np.abs(np.asarray(shifted.states) - phases * high.states)) <= 1e-12
    )  # 1e-14


def test_gradient_of_sparse_coupling_equals_dense():
    sites, order = 5, 6
    z = [hierax.site_operator(SZ, i, sites) for i in range(sites)]
    x = [hierax.site_operator(SX, i, sites) for i in range(sites)]
    zd = [_chain(SZ, i, sites) for i in range(sites)]
    xd = [_chain(SX, i, sites) for i in range(sites)]
    state = np.ones(2**sites, complex) / np.sqrt(2**sites)

    def loss(coupling, sparse):
        zz = (
            sum(z[i] @ z[i + 1] for i in range(sites - 1))
            if sparse
            else sum(zd[i] @ zd[i + 1] for i in range(sites - 1))
        )
        h = hierax.Cos(1.3) * (sum(x) if sparse else sum(xd)) + coupling * zz
        levels = hierax.PropagatorDerivatives(h, order)(0.2, state)
        return jnp.sum(jnp.abs(levels[-1]) ** 2)

    g_sparse = jax.grad(loss)(0.7, True)
    g_dense = jax.grad(loss)(0.7, False)
    step = 1e-5
    fd = (loss(0.7 + step, True) - loss(0.7 - step, True)) / (2 * step)
    assert abs(g_sparse - g_dense) <= 1e-12 * abs(g_dense)
    assert abs(g_sparse - fd) <= 1e-7 * abs(fd)


def test_dense_requests_say_what_they_need():
    sites = 16  # n = 65536: one dense matrix is 64 GiB in complex128
    x = hierax.site_operator(SX, 0, sites)
    hamiltonian = hierax.Cos(1.0) * x + hierax.site_operator(SZ, 1, sites)
    with pytest.raises(MemoryError, match="GiB"):
        hamiltonian(0.0)
    with pytest.raises(MemoryError, match="sesolve"):
        hierax.HeisenbergHierarchy(hamiltonian, x, 4)(0.0)
    # A state-vector computation at the same size stays sparse and runs.
    state = jnp.zeros(2**sites, complex).at[0].set(1.0)
    levels = hierax.PropagatorDerivatives(hamiltonian, 2)(0.0, state)
    assert levels.shape == (3, 2**sites)
    assert np.isclose(float(jnp.linalg.norm(levels[1])), np.sqrt(2.0))


def test_bad_sparse_input_names_the_argument():
    with pytest.raises(ValueError, match="`hamiltonian` must be a square matrix"):
        hierax.sesolve(sp.random(4, 5, density=0.5), np.ones(4), np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="finite"):
        hierax.as_operator(sp.csr_matrix(np.array([[np.nan, 0], [0, 1.0]])))
    with pytest.raises(ValueError, match="same shape"):
        hierax.TimeOperator([1.0, 2.0], [sp.identity(2), sp.identity(3)])
    with pytest.raises(ValueError, match="state"):
        hierax.sesolve(sp.identity(4), np.ones(3), np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="0 <= site < sites"):
        hierax.site_operator(SX, 3, 3)
    with pytest.raises(ValueError, match="0 <= column < n = 2"):
        hierax.SparseMatrix(np.ones((2, 1)), np.array([[0], [2]]))
    with pytest.raises(ValueError, match="same shape"):
        hierax.SparseMatrix(np.ones((2, 1)), np.zeros((2, 2), int))
    with pytest.raises(ValueError, match="unbatched"):
        # Rows stored whole (one dense axis), built directly (fromdense compiles).
        rows = (jnp.ones((3, 3)), jnp.arange(3)[:, None])
        hierax.as_operator(jsparse.BCOO(rows, shape=(3, 3)))


_SHARDED = fresh_script(
    "sparse terms sharded across four devices",
    textwrap.dedent(
        """
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec
    import hierax

    assert len(jax.devices()) == 4
    sx = np.array([[0.0, 1.0], [1.0, 0.0]]); sz = np.diag([1.0, -1.0])
    L = 6
    x = [hierax.site_operator(sx, i, L) for i in range(L)]
    z = [hierax.site_operator(sz, i, L) for i in range(L)]
    h = hierax.Cos(2.0) * sum(x) - sum(z[i] @ z[i + 1] for i in range(L - 1))
    times = jnp.array([0.0, 0.3, 0.6])
    rng = np.random.default_rng(0)
    psi = rng.normal(size=2**L) + 1j * rng.normal(size=2**L)
    psi = jnp.asarray(psi / np.linalg.norm(psi))
    # Automatic axes (JAX's partitioner places the gathers); shard_rows converts an
    # explicit mesh itself.
    auto = jax.make_mesh((4,), ("rows",), axis_types=(jax.sharding.AxisType.Auto,))
    mesh = jax.make_mesh((4,), ("rows",))

    # (b) one state split by rows, the sparse terms partitioned by rows.
    one = hierax.sesolve(h, psi, times, rtol=1e-10).states
    split = hierax.sesolve(
        hierax.shard_rows(h, mesh), hierax.shard_rows(psi, mesh), times, rtol=1e-10
    ).states
    assert len(split.sharding.device_set) == 4, split.sharding
    b = float(jnp.max(jnp.abs(split - one)))

    # (a) a batch of initial states split across the devices (all derivatives of
    # each evolved state).
    batch = jnp.stack([psi, jnp.roll(psi, 1), jnp.roll(psi, 2), jnp.roll(psi, 3)])
    derivatives = hierax.PropagatorDerivatives(h, 6)
    run = jax.vmap(lambda y: derivatives(0.4, y))
    loop = jnp.stack([run(batch[i : i + 1])[0] for i in range(4)])
    sharded = run(jax.device_put(batch, NamedSharding(auto, PartitionSpec("rows"))))
    assert len(sharded.sharding.device_set) == 4, sharded.sharding
    a = float(jnp.max(jnp.abs(sharded - loop)))
    print(a, b)
    assert a <= 1e-13 and b <= 1e-13, (a, b)
    """
    ),
)


def test_sharded_across_four_devices_equals_one_device(tmp_path_factory):
    result = fresh_output(tmp_path_factory, _SHARDED)
    assert result["status"] == 0, result["stderr"][-3000:]
