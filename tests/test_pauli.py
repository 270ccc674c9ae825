"""Pauli sums against dense matrices (NumPy Kronecker products), and Lanczos
coefficients against dense Lanczos and the free-fermion (Majorana) form of the
transverse-field Ising and XX chains."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import hierax

from .helpers import compile_count, dense_lanczos, fresh_output, fresh_script


PAULI = {
    "I": np.eye(2),
    "X": np.array([[0, 1], [1, 0]], complex),
    "Y": np.array([[0, -1j], [1j, 0]]),
    "Z": np.diag([1.0, -1.0]).astype(complex),
}


def dense_string(s: str) -> np.ndarray:
    out = np.ones((1, 1), complex)
    for char in s:
        out = np.kron(out, PAULI[char])
    return out


def random_sum(rng, n_qubits, terms, capacity=None, real=False):
    chars = np.array(list("IXYZ"))
    strings = ["".join(r) for r in chars[rng.integers(0, 4, (terms, n_qubits))]]
    c = rng.normal(size=terms) + (0 if real else 1j * rng.normal(size=terms))
    dense = np.zeros((2**n_qubits, 2**n_qubits), complex)
    for s, ci in zip(strings, c):
        dense += ci * dense_string(s)
    return hierax.PauliSum.from_strings(strings, c, capacity=capacity), dense


def test_strings_are_kronecker_products():
    for s in ["X", "Y", "Z", "I", "XYZI", "YYZX", "IIIY"]:
        np.testing.assert_array_equal(
            np.asarray(hierax.PauliSum.from_strings(s).todense()), dense_string(s)
        )
    # Beyond one 32-bit word the strings round-trip, and equal strings merge.
    long = "XYZI" * 10 + "Z"
    s = hierax.PauliSum.from_strings([long, long, "I" * 41], [1.0, 2.0, -1.0])
    assert s.terms() == {"I" * 41: -1.0 + 0j, long: 3.0 + 0j}
    assert s.x.shape == (3, 2) and int(s.count) == 2
    terms = hierax.PauliSum.from_terms([(0.5, [("Z", 0), ("X", 40)])], 41).terms()
    assert terms == {"Z" + "I" * 39 + "X": 0.5 + 0j}


def test_algebra_against_dense():
    """Products, commutators, sums, inner products, traces and adjoints of random
    sums at N = 4 against their matrices; the sparse form too."""
    rng = np.random.default_rng(0)
    a, da = random_sum(rng, 4, 9)
    b, db = random_sum(rng, 4, 7)

    def close(sum_, dense):
        np.testing.assert_allclose(np.asarray(sum_.todense()), dense, atol=1e-13)

    close(a @ b, da @ db)
    close(a.commutator(b), da @ db - db @ da)
    close(a + b, da + db)
    close(a - b, da - db)
    close(2.5j * a / 2, 1.25j * da)
    close(-a, -da)
    close(a.adjoint(), da.conj().T)
    np.testing.assert_allclose(
        complex(a.inner(b)), np.trace(da.conj().T @ db) / 16, atol=1e-14
    )
    np.testing.assert_allclose(
        complex(a.inner(a + 0.5j * b)),
        np.trace(da.conj().T @ (da + 0.5j * db)) / 16,
        rtol=1e-13,
    )
    np.testing.assert_allclose(complex(a.trace()), np.trace(da) / 16, atol=1e-14)
    np.testing.assert_allclose(
        float(a.norm()) ** 2, np.trace(da.conj().T @ da).real / 16, rtol=1e-13
    )
    np.testing.assert_allclose(np.asarray(a.to_sparse().todense()), da, atol=1e-13)
    # A - A cancels exactly (two equal terms per string); [A, A] to rounding (four
    # products per string, summed in a sorted order).
    assert int((a - a).count) == 0
    assert float(a.commutator(a).norm()) < 1e-14 * float(a.norm()) ** 2


def test_nested_commutators_to_order_12():
    """(ad_G)^k O for k <= 12 with room for every string (4^N), by repeated
    commutators and by `hierax.NestedCommutators` on Pauli sums: exact against
    the dense recursion (and the dense `NestedCommutators`), relative error per
    level below 1e-12."""
    rng = np.random.default_rng(1)
    h, dh = random_sum(rng, 5, 12, real=True)
    o, do = random_sum(rng, 5, 3, capacity=4**5, real=True)
    levels = hierax.NestedCommutators(h, o, 12, capacity=4**5)()
    dense = np.asarray(hierax.NestedCommutators(dh, do, 12)())
    assert len(levels) == 13 and levels[0].terms() == o.terms()
    for k in range(1, 13):
        o = h.commutator(o, capacity=4**5)
        do = dh @ do - do @ dh
        error = np.abs(np.asarray(o.todense()) - do).max() / np.abs(do).max()
        assert error < 1e-12, (k, error)
        assert float(o.dropped) == 0.0
        level = np.asarray(levels[k].todense())
        error = np.abs(level - do).max() / np.abs(do).max()
        assert error < 1e-12, (k, error)
        assert np.abs(dense[k] - do).max() < 1e-12 * np.abs(do).max()


def test_truncation_reports_what_it_removes():
    rng = np.random.default_rng(2)
    a, _ = random_sum(rng, 6, 40)
    weights = np.sort(np.abs(np.array(list(a.terms().values()))) ** 2)
    t = a.truncate(10)
    assert t.capacity == 10 and int(t.count) == 10
    np.testing.assert_allclose(float(t.dropped), weights[:-10].sum(), rtol=1e-12)
    kept = np.sort(np.abs(np.array(list(t.terms().values()))) ** 2)
    np.testing.assert_allclose(kept, weights[-10:], rtol=1e-12)
    # A threshold removes what it is asked to, and does not count it as dropped.
    cut = float(np.sqrt(weights[20]))
    u = a.truncate(threshold=cut)
    assert int(u.count) == 40 - 21 and float(u.dropped) == 0.0
    # An operation over capacity reports its truncation in the result.
    b, db = random_sum(rng, 6, 30)
    c = a.commutator(b, capacity=16)
    assert int(c.count) == 16 and float(c.dropped) > 0
    exact = a.commutator(b)
    np.testing.assert_allclose(
        float(c.norm()) ** 2 + float(c.dropped), float(exact.norm()) ** 2, rtol=1e-12
    )


def test_float32_and_no_retrace():
    """Without x64 (32-bit words and a comparator sort), and changing coefficient
    values never retraces."""
    h, dh = random_sum(np.random.default_rng(3), 4, 6)
    try:
        jax.config.update("jax_enable_x64", False)
        a = hierax.PauliSum.from_strings(["XYZI", "ZZII"], [1.0, 2.0])
        b = hierax.PauliSum.from_strings(["YIIX"], [0.5])
        assert a.dtype == jnp.complex64
        expected = dense_string("XYZI") @ dense_string("YIIX")
        expected = expected - dense_string("YIIX") @ dense_string("XYZI")
        expected = expected + 2 * (
            dense_string("ZZII") @ dense_string("YIIX")
            - dense_string("YIIX") @ dense_string("ZZII")
        )
        np.testing.assert_allclose(
            np.asarray(a.commutator(b).todense()), 0.5 * expected, atol=1e-6
        )
    finally:
        jax.config.update("jax_enable_x64", True)

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def f(h, scale):
        return (h * scale).commutator(h.adjoint() * 2.0, capacity=64).norm()

    for scale in (1.0, 2.0, 3.0):
        f(h, jnp.asarray(scale))
    f(eqx.tree_at(lambda s: s.coefficients, h, h.coefficients * 1.5), jnp.asarray(1.0))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="every string must have 3 sites"):
        hierax.PauliSum.from_strings(["XYZ", "XY"])
    with pytest.raises(ValueError, match=r"characters \['A'\]"):
        hierax.PauliSum.from_strings(["XAZ"])
    with pytest.raises(ValueError, match="on 2 qubits and `other` on 3.*one chain"):
        _ = hierax.PauliSum.from_strings("XY") @ hierax.PauliSum.from_strings("XYZ")
    with pytest.raises(ValueError, match="cannot hold the 3 distinct strings"):
        hierax.PauliSum.from_strings(["XI", "IX", "ZZ"], capacity=2)
    with pytest.raises(ValueError, match="outside the chain of 4 qubits"):
        hierax.PauliSum.from_terms([(1.0, [("X", 4)])], 4)
    with pytest.raises(ValueError, match="expected 2 coefficients"):
        hierax.PauliSum.from_strings(["XI", "IX"], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="truncate`: `capacity` must be a positive"):
        hierax.PauliSum.from_strings(["XI"]).truncate(0)
    with pytest.raises(ValueError, match="matrices are built for at most 14"):
        hierax.PauliSum.from_strings("X" * 15).todense()
    # A product forms every pair of slots before its merge: past 2^31 - 1 pairs
    # JAX's indices overflowed while tracing (a bare OverflowError), whatever the
    # result's capacity. Refused before any array is formed.
    wide = hierax.PauliSum.zeros(30, 50_000)
    with pytest.raises(ValueError, match="make 2500000000 pairs of slots"):
        wide.commutator(wide, capacity=64)
    with pytest.raises(ValueError, match="product`: the capacities 50000 and 50000"):
        _ = wide @ wide
    # So does each step of the recursions: H's slots times the capacity.
    chain40 = hierax.PauliSum.ising_chain(40, 1.0, 1.05, 0.5)
    z40 = hierax.PauliSum.from_strings("Z" + "I" * 39)
    with pytest.raises(ValueError, match="lanczos`: `hamiltonian`'s 119 slots"):
        hierax.lanczos(chain40, z40, 1, capacity=2**25)
    with pytest.raises(ValueError, match="moments`: `hamiltonian`'s 119 slots"):
        hierax.moments(chain40, z40, 1, capacity=2**25)
    with pytest.raises(ValueError, match="PauliHierarchy`: `hamiltonian`'s 119 slots"):
        hierax.PauliHierarchy(chain40, z40, 1, capacity=2**25)
    # The matrix-based calls say where Pauli sums go.
    chain = hierax.PauliSum.ising_chain(3, 1.0, 0.5)
    z0 = hierax.PauliSum.from_strings("ZII")
    with pytest.raises(
        TypeError,
        match=r"`hamiltonian` is a Pauli sum, so `observ.*PauliSum.todense\(\)",
    ):
        hierax.HeisenbergHierarchy(chain, np.eye(8), 3)
    with pytest.raises(TypeError, match="`operator` is a Pauli sum, so `generator"):
        hierax.NestedCommutators(np.eye(8), z0, 3)
    with pytest.raises(TypeError, match="`generator` must be constant"):
        hierax.NestedCommutators(hierax.Cos(1.0) * chain, z0, 3)
    with pytest.raises(TypeError, match="`observable` must be a constant"):
        hierax.HeisenbergHierarchy(chain, hierax.Cos(1.0) * z0, 3)
    with pytest.raises(TypeError, match="`capacity` is the room for strings"):
        hierax.HeisenbergHierarchy(np.eye(2), np.eye(2), 3, capacity=8)  # pyright: ignore
    with pytest.raises(TypeError, match="`time_scale` is for matrices"):
        hierax.HeisenbergHierarchy(chain, z0, 3, 2.0)
    with pytest.raises(ValueError, match="`generator` acts on 3 qubits and `oper"):
        hierax.NestedCommutators(chain, hierax.PauliSum.from_strings("ZI"), 3)
    with pytest.raises(TypeError, match="error_estimate`: not available for Pauli"):
        hierax.NestedCommutators(chain, z0, 3).error_estimate()
    with pytest.raises(TypeError, match="takes no arguments, got `t`"):
        hierax.NestedCommutators(chain, z0, 3)(0.5)
    with pytest.raises(TypeError, match="is a PauliSum.*HeisenbergHierarchy"):
        hierax.PropagatorDerivatives(chain, 3)
    with pytest.raises(TypeError, match="is a PauliTimeSum.*todense"):
        hierax.sesolve(hierax.Cos(1.0) * chain, np.ones(8) / 8**0.5, [0.0, 1.0])
    with pytest.raises(ValueError, match="must be a non-negative int"):
        hierax.PauliHierarchy(chain, hierax.PauliSum.from_strings("ZII"), -1)
    with pytest.raises(ValueError, match="`t` must be finite"):
        hierax.PauliHierarchy(chain, hierax.PauliSum.from_strings("ZII"), 2)(np.nan)
    # Checked inside the compiled call (no host read of device values).
    with pytest.raises(ValueError, match="`observable` must be Hermitian"):
        hierax.lanczos(
            hierax.PauliSum.ising_chain(3, 1.0, 1.0),
            hierax.PauliSum.from_strings("XII", [1j]),
            3,
        )


def test_lanczos_moments_and_autocorrelation_against_dense():
    """The chaotic Ising chain (N = 5, J = 1, h_x = 1.05, h_z = 0.5) and the
    observable Z_0 + 0.3 X_2: b_1..b_10 against dense Lanczos with full
    reorthogonalisation, the moments against |L^k O|^2, and C(t) against
    exp(iHt) O exp(-iHt)."""
    h = hierax.PauliSum.ising_chain(5, 1.0, 1.05, 0.5)
    o = hierax.PauliSum.from_strings(["ZIIII", "IIXII"], [1.0, 0.3])
    dh, do = np.asarray(h.todense()), np.asarray(o.todense())
    expected = dense_lanczos(dh, do, 10)
    result = hierax.lanczos(h, o, 10, capacity=4**5)
    np.testing.assert_allclose(np.asarray(result.b), expected, rtol=1e-12)
    assert np.all(np.asarray(result.dropped) == 0)
    assert np.max(np.asarray(result.orthogonality)) < 1e-10
    again = hierax.lanczos(h, o, 10, capacity=4**5, reorthogonalize=True)
    np.testing.assert_allclose(np.asarray(again.b), expected, rtol=1e-12)

    mu, lost = hierax.moments(h, o, 5, capacity=4**5)
    a, norm2 = do, np.trace(do @ do).real
    for k in range(1, 6):
        a = dh @ a - a @ dh
        np.testing.assert_allclose(
            float(mu[k]), np.trace(a.conj().T @ a).real / norm2, rtol=1e-12
        )
    assert float(mu[0]) == 1.0 and np.all(np.asarray(lost) == 0)

    series = np.asarray(hierax.autocorrelation_series(h, o, 5, capacity=4**5))
    t = 0.04
    u = scipy.linalg.expm(1j * dh * t)
    exact = np.trace((u @ do @ u.conj().T).conj().T @ do).real / norm2
    # The series to t^10: the first term left out is ~ mu_12 t^12 / 12!.
    np.testing.assert_allclose(np.polyval(series[::-1], t), exact, rtol=1e-14)


def _majoranas(n, string):
    """Jordan-Wigner Majoranas on n sites with `string` the parity operator:
    gamma_{2j} = (prod_{k<j} S_k) A_j, gamma_{2j+1} = (prod_{k<j} S_k) B_j, with
    (A, B) = (Z, Y) for S = X and (X, Y) for S = Z."""
    a, b = {"X": ("Z", "Y"), "Z": ("X", "Y")}[string]
    out = []
    for j in range(n):
        prefix = string * j
        rest = "I" * (n - j - 1)
        out += [prefix + a + rest, prefix + b + rest]
    return out


def _single_particle(bond_terms, field_terms, n, string):
    """The Liouvillian of a quadratic chain Hamiltonian on the 2n Majoranas, in
    NumPy: each term's coefficients h_ab on i gamma_a gamma_b are found by
    projecting its matrix at 4 sites (and checked to be all of it), then placed
    along the chain; [i g_a g_b, g_b] = 2i g_a and [i g_a g_b, g_a] = -2i g_b."""
    small = 4
    gammas = [dense_string(s) for s in _majoranas(small, string)]

    def quadratic(term_string):
        m = dense_string(term_string)
        h = np.zeros((2 * small, 2 * small))
        for p in range(2 * small):
            for q in range(p + 1, 2 * small):
                g = 1j * gammas[p] @ gammas[q]
                h[p, q] = (np.trace(g.conj().T @ m) / 2**small).real
        rebuilt = sum(
            h[p, q] * 1j * gammas[p] @ gammas[q]
            for p in range(2 * small)
            for q in range(p + 1, 2 * small)
        )
        np.testing.assert_allclose(rebuilt, m, atol=1e-12)  # quadratic indeed
        return h

    h = np.zeros((2 * n, 2 * n))
    for ops, coefficient in bond_terms:  # on sites (1, 2) at 4 sites, shifted
        local = quadratic("I" + ops + "I")
        for j in range(n - 1):
            shift = 2 * (j - 1)
            for p, q in zip(*np.nonzero(local)):
                h[p + shift, q + shift] += coefficient * local[p, q]
    for op, coefficient in field_terms:
        local = quadratic("I" + op + "II")
        for j in range(n):
            shift = 2 * (j - 1)
            for p, q in zip(*np.nonzero(local)):
                h[p + shift, q + shift] += coefficient * local[p, q]
    return 2j * (h - h.T)


def _vector_lanczos(matrix, start, steps):
    previous, current, b_prev, bs = 0 * start, start / np.linalg.norm(start), 0.0, []
    basis = [current]
    for _ in range(steps):
        a = matrix @ current - b_prev * previous
        for _ in range(2):
            for v in basis:
                a = a - np.vdot(v, a) * v
        b = np.linalg.norm(a)
        bs.append(b)
        previous, current, b_prev = current, a / b, b
        basis.append(current)
    return np.array(bs)


@pytest.mark.parametrize("chain", ["transverse-field Ising", "XX"], ids=["ising", "xx"])
def test_lanczos_of_free_fermion_chains_at_30_sites(chain):
    """b_n of an edge Majorana in chains of 30 sites, where no matrix fits, against
    Lanczos on the 60 Majorana modes (NumPy): the Krylov operators stay within 60
    strings, so capacity 64 is exact."""
    n = 30
    if chain == "XX":
        h = hierax.PauliSum.xxz_chain(n, jxy=0.7, jz=0.0, hz=0.4)
        matrix = _single_particle([("XX", 0.7), ("YY", 0.7)], [("Z", 0.4)], n, "Z")
        o = hierax.PauliSum.from_strings("X" + "I" * (n - 1))
    else:
        h = hierax.PauliSum.ising_chain(n, 1.0, hx=0.0, hz=0.0)
        h = h + hierax.PauliSum.from_terms([(0.8, [("X", j)]) for j in range(n)], n)
        matrix = _single_particle([("ZZ", 1.0)], [("X", 0.8)], n, "X")
        o = hierax.PauliSum.from_strings("Z" + "I" * (n - 1))
    start = np.zeros(2 * n, complex)
    start[0] = 1.0
    expected = _vector_lanczos(matrix, start, 20)
    result = hierax.lanczos(h, o, 20, capacity=64)
    np.testing.assert_allclose(np.asarray(result.b), expected, rtol=1e-11)
    assert np.all(np.asarray(result.dropped) == 0)


def test_chaotic_chain_converges_with_capacity():
    """The chaotic Ising chain at N = 30: b_n agree across capacities while nothing
    is dropped, and the larger capacity drops less."""
    h = hierax.PauliSum.ising_chain(30, 1.0, 1.05, 0.5)
    o = hierax.PauliSum.from_strings("Z" + "I" * 29)
    small = hierax.lanczos(h, o, 14, capacity=256)
    large = hierax.lanczos(h, o, 14, capacity=2048)
    exact = np.asarray(small.dropped) == 0
    assert exact[:6].all() and not exact.all()
    np.testing.assert_allclose(
        np.asarray(small.b)[exact], np.asarray(large.b)[exact], rtol=1e-12
    )
    assert np.sum(np.asarray(large.dropped)) < np.sum(np.asarray(small.dropped))
    # The first coefficients in closed form: b_1^2 = |[H, Z_0]|^2 = 4 h_x^2.
    np.testing.assert_allclose(float(large.b[0]), 2 * 1.05, rtol=1e-14)


def test_new_values_reuse_compiled_calls():
    """New coefficient values (a chain with other couplings, another observable on
    the same strings) compile nothing new: counted by JAX's compile events."""

    def run(coupling, field):
        h = hierax.PauliSum.ising_chain(8, coupling, field, 0.3)
        o = hierax.PauliSum.from_strings(["ZIIIIIII", "IXIIIIII"], [1.0, field])
        return hierax.lanczos(h, o, 6, capacity=128).b, h.commutator(o, capacity=64)

    run(1.0, 0.9)
    before = compile_count()
    run(0.7, 1.3)
    run(1.2, 0.2)
    assert compile_count() == before


def test_matrices_and_norms_are_one_program_each():
    """`todense`, `to_sparse`, `norm` and `trace` of a sum on a new chain compile
    one program each (not one per operation), and new values none."""
    strings = ["XYZIX", "ZZIII", "IIIYY"]
    a = hierax.PauliSum.from_strings(strings, [1.0, 2.0, 0.5], capacity=7)
    b = hierax.PauliSum.from_strings(strings, [0.3, -1.0, 4.0], capacity=7)
    before = compile_count()
    dense = a.todense()
    assert compile_count() == before + 1
    _ = a.to_sparse(), a.norm(), a.trace()
    assert compile_count() == before + 4
    sparse, norm, trace = b.to_sparse(), b.norm(), b.trace()
    assert compile_count() == before + 4  # new values: nothing new
    expected = sum(c * dense_string(s) for c, s in zip([1.0, 2.0, 0.5], strings))
    np.testing.assert_allclose(np.asarray(dense), expected, atol=1e-15)
    np.testing.assert_allclose(
        np.asarray(sparse.todense()),
        sum(c * dense_string(s) for c, s in zip([0.3, -1.0, 4.0], strings)),
        atol=1e-15,
    )
    np.testing.assert_allclose(float(norm), np.sqrt(0.09 + 1.0 + 16.0))
    assert complex(trace) == 0


def _driven_chain(n):
    hx = hierax.PauliSum.from_terms([(0.7, [("X", j)]) for j in range(n)], n)
    hzz = hierax.PauliSum.ising_chain(n, 1.0)
    hz = hierax.PauliSum.from_terms([(0.3, [("Z", j)]) for j in range(n)], n)
    return hx, hzz, hz


def test_heisenberg_levels_of_a_driven_chain_against_dense():
    """H(t) = cos(1.3 t) 0.7 sum X + sum ZZ + Gaussian(t) 0.3 sum Z on 4 sites, the
    observable Z_0 + 0.4 X_1 Y_2: levels 0..10 against the dense
    `hierax.HeisenbergHierarchy`, relative error per level below 1e-13; an offset
    c I in H changes nothing."""
    hx, hzz, hz = _driven_chain(4)
    drive, pulse = hierax.Cos(1.3), hierax.Gaussian(0.5, 0.8)
    h = drive * hx + hzz + pulse * hz
    o = hierax.PauliSum.from_strings(["ZIII", "IXYI"], [1.0, 0.4])
    dense_h = (
        drive * np.asarray(hx.todense())
        + np.asarray(hzz.todense())
        + pulse * np.asarray(hz.todense())
    )
    # The Pauli levels from `HeisenbergHierarchy` (which runs `PauliHierarchy`).
    hierarchy = hierax.HeisenbergHierarchy(h, o, 10, capacity=256)
    offset = hierax.PauliHierarchy(
        h + hierax.PauliSum.from_strings("IIII", [3.5]), o, 10, capacity=256
    )
    dense = hierax.HeisenbergHierarchy(dense_h, np.asarray(o.todense()), 10)
    # A real and a complex time (the series of the drives at t, not at Re t); the
    # offset at the real one.
    for t in (-1.2, 0.3 + 0.2j):
        expected = np.asarray(dense(t))
        levels = hierarchy(t)
        shifted = offset(t) if isinstance(t, float) else None
        for k in range(11):
            error = np.abs(np.asarray(levels[k].todense()) - expected[k]).max()
            assert error < 1e-13 * np.abs(expected[k]).max(), (t, k, error)
            if shifted is not None:
                np.testing.assert_allclose(
                    np.asarray(shifted[k].todense()),
                    np.asarray(levels[k].todense()),
                    atol=1e-13 * np.abs(expected[k]).max(),
                )
            assert float(levels[k].dropped) == 0.0
    normalised = hierarchy.normalised(0.37)
    np.testing.assert_allclose(
        np.asarray(normalised[10].todense()),
        np.asarray(hierarchy(0.37)[10].todense()) / 3628800,
        rtol=1e-12,
        atol=1e-15,
    )


def test_pauli_hierarchies_inside_jit_never_retrace():
    """A `hierax.HeisenbergHierarchy` of Pauli sums built inside the user's jit from
    a traced drive frequency, called at traced times: one trace for every value,
    its levels (and normalised levels) those of the dense hierarchy; a
    `hierax.NestedCommutators` of Pauli sums passes through `jax.jit` as an
    argument and gives (ad_G)^k Z_0 by repeated dense commutators."""
    hx, hzz, _ = _driven_chain(3)
    o = hierax.PauliSum.from_strings("ZII")
    dense_hx, dense_hzz = np.asarray(hx.todense()), np.asarray(hzz.todense())

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def levels(w, t):
        h = hierax.HeisenbergHierarchy(hierax.Cos(w) * hx + hzz, o, 5, capacity=64)
        return h(t), h.normalised(t)

    for w, t in ((1.3, 0.2), (0.4, -0.7), (2.0, 1.5)):
        got, normalised = levels(jnp.asarray(w), jnp.asarray(t))
        dense = hierax.HeisenbergHierarchy(
            hierax.Cos(w) * dense_hx + dense_hzz, np.asarray(o.todense()), 5
        )
        pairs = ((got, np.asarray(dense(t))), (normalised, dense.normalised(t)))
        for sums, expected in pairs:
            for k in range(6):
                exact = np.asarray(expected[k])
                error = np.abs(np.asarray(sums[k].todense()) - exact).max()
                assert error < 1e-13 * np.abs(exact).max(), (w, t, k, error)

    commutators = hierax.NestedCommutators(1j * (hx + hzz), o, 4, capacity=64)
    got = jax.jit(lambda c: [level.todense() for level in c()])(commutators)
    dense_g, x = 1j * (dense_hx + dense_hzz), np.asarray(o.todense())
    for k in range(5):
        assert np.abs(np.asarray(got[k]) - x).max() < 1e-13 * np.abs(x).max(), k
        x = dense_g @ x - x @ dense_g


def test_hierarchies_take_pauli_sums_by_their_structure():
    """Which recursion a hierarchy runs is chosen by the kind of its operators when
    it is built: a Pauli sum beside anything else is refused in either position,
    before a stray `capacity` is; a Pauli hierarchy has no error estimate, and
    says so after checking its arguments."""
    chain = hierax.PauliSum.ising_chain(3, 1.0, 0.5)
    z0 = hierax.PauliSum.from_strings("ZII")
    mixed = "is a Pauli sum, so `{}` must be one too.*got ndarray"
    with pytest.raises(TypeError, match="`observable` " + mixed.format("hamiltonian")):
        hierax.HeisenbergHierarchy(np.eye(8), hierax.Cos(1.0) * z0, 3)
    with pytest.raises(TypeError, match="`hamiltonian` " + mixed.format("observable")):
        hierax.HeisenbergHierarchy(hierax.Cos(1.0) * chain, np.eye(8), 3)
    with pytest.raises(TypeError, match="`generator` " + mixed.format("operator")):
        hierax.NestedCommutators(chain, np.eye(8), 3)
    with pytest.raises(TypeError, match="`operator` " + mixed.format("generator")):
        hierax.NestedCommutators(np.eye(8), z0, 3, capacity=8)  # pyright: ignore
    with pytest.raises(TypeError, match="`capacity` is the room for strings"):
        hierax.NestedCommutators(np.eye(2), np.eye(2), 3, capacity=8)  # pyright: ignore
    hierarchy = hierax.HeisenbergHierarchy(chain, z0, 3, capacity=16)
    with pytest.raises(
        TypeError,
        match=r"^`hierax.HeisenbergHierarchy\(...\).error_estimate`: not available",
    ):
        hierarchy.error_estimate(0.5)
    with pytest.raises(TypeError, match=r"error_estimate\(t\)`: takes `t`, got none"):
        hierarchy.error_estimate()
    with pytest.raises(ValueError, match="`t` must be finite"):
        hierarchy.error_estimate(np.nan)


def test_heisenberg_levels_on_40_sites():
    """On 40 sites (no matrix): level 1 is i[H(t), X_0] (a commutator of Pauli sums,
    another code path), and a capacity too small reports what it removed."""
    hx, hzz, hz = _driven_chain(40)
    h = hierax.Cos(1.3) * hx + hzz + hierax.Sin(0.4) * hz
    o = hierax.PauliSum.from_strings("IZ" + "I" * 38)
    t = 0.8
    levels = hierax.PauliHierarchy(h, o, 4, capacity=512)(t)
    expected = h(t).commutator(o) * 1j
    assert levels[1].terms().keys() == expected.terms().keys()
    for key, value in expected.terms().items():
        np.testing.assert_allclose(levels[1].terms()[key], value, rtol=1e-14)
    small = hierax.PauliHierarchy(h, o, 4, capacity=8)(t)
    assert float(small[-1].dropped) > 0 and int(small[-1].count) == 8
    assert float(levels[-1].dropped) == 0.0


_SHARDED = fresh_script(
    "Pauli sums sharded across two devices",
    """
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
import hierax

mesh = jax.make_mesh((2,), ("strings",), devices=jax.devices()[:2])
h = hierax.PauliSum.ising_chain(30, 1.0, 1.05, 0.5, capacity=90)
o = hierax.PauliSum.from_strings(
    ["Z" + "I" * 29, "I" * 15 + "X" + "I" * 14], [1.0, 0.5], capacity=256
)
hs, os_ = hierax.shard_rows(h, mesh), hierax.shard_rows(o, mesh)
assert len(os_.x.sharding.device_set) == 2
assert not os_.x.sharding.is_fully_replicated
c, cs = h.commutator(o, capacity=512).terms(), hs.commutator(os_, capacity=512).terms()
assert c.keys() == cs.keys()
np.testing.assert_allclose([cs[k] for k in c], list(c.values()), rtol=1e-14)
a = hierax.lanczos(h, o, 12, capacity=1024)
b = hierax.lanczos(hs, os_, 12, capacity=1024)
np.testing.assert_allclose(np.asarray(b.b), np.asarray(a.b), rtol=1e-13)
print("sharded ok")
""",
)


def test_sums_sharded_by_strings_on_two_devices(tmp_path_factory):
    """A Pauli sum split by strings over two (forced host) devices with
    `hierax.shard_rows`: commutators and Lanczos coefficients equal one device's."""
    result = fresh_output(tmp_path_factory, _SHARDED)
    assert result["status"] == 0, result["stderr"]
    assert "sharded ok" in result["stdout"]


# --- issue 48: hostile input (round two) and issue 49: no host round trip ---------


def _dense_of(terms: dict, n: int) -> np.ndarray:
    out = np.zeros((2**n, 2**n), complex)
    for s, c in terms.items():
        out += c * dense_string(s)
    return out


def _weight(d: np.ndarray) -> float:
    """Tr(D^dagger D)/2^N, from the matrix."""
    return float(np.trace(d.conj().T @ d).real / d.shape[0])


@pytest.mark.parametrize(
    "threshold", [-1.0, -np.inf, np.float32(-2.0), -3, 0.0, "traced-", "device-"]
)
def test_truncate_below_zero_keeps_the_sum(threshold):
    """A threshold at or below zero removes nothing, and padding never becomes a
    string: the count and the inner product are those of the strings given."""
    c = np.array([1.0, 2.0, 3.0])
    a = hierax.PauliSum.from_strings(["XI", "IZ", "YY"], c, capacity=8)
    if threshold == "traced-":
        t = eqx.filter_jit(lambda a, v: a.truncate(threshold=v))(a, jnp.asarray(-1.0))
    elif threshold == "device-":
        t = a.truncate(threshold=jnp.asarray(-1.0))
    else:
        t = a.truncate(threshold=threshold)  # pyright: ignore[reportArgumentType]
    assert int(t.count) == 3
    np.testing.assert_allclose(complex(t.inner(t)), np.sum(c**2), rtol=1e-14)
    np.testing.assert_allclose(
        np.asarray(t.todense()), _dense_of(dict(zip(["XI", "IZ", "YY"], c)), 2)
    )


def test_truncate_thresholds_never_retrace_and_refuse_nan():
    c = np.array([0.5, -2.0, 3.0, 1e-3])
    a = hierax.PauliSum.from_strings(["XI", "IZ", "YY", "ZZ"], c, capacity=6)

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def cut(a, v):
        return a.truncate(threshold=v).count

    for v in (-1.0, 0.0, 0.4, 1.9, 2.5, np.inf):
        assert int(cut(a, jnp.asarray(v))) == int(np.sum(np.abs(c) > v))
        assert int(a.truncate(threshold=v).count) == int(np.sum(np.abs(c) > v))
    for nan in (np.nan, np.float32(np.nan), jnp.asarray(np.nan)):
        with pytest.raises(ValueError, match="truncate`: `threshold` must be a num"):
            a.truncate(threshold=nan)
    with pytest.raises(eqx.EquinoxRuntimeError, match="`threshold` must be a num"):
        eqx.filter_jit(lambda a, v: a.truncate(threshold=v).count)(
            a, jnp.asarray(np.nan)
        )
    for bad in ("1", True, 1j, jnp.ones(2), np.ones(2), None):
        # Refused by the annotations (in the tests' jaxtyping plugin) or by hand.
        with pytest.raises(TypeError, match="(?s)truncate.*`?threshold"):
            a.truncate(threshold=bad)  # pyright: ignore[reportArgumentType]


def test_overflowed_coefficients_do_not_wake_padding():
    """A coefficient that overflowed to inf times padding (zero) is no nan string: a
    product of a sum with spare slots keeps its inf, and nothing else appears."""
    a = hierax.PauliSum.from_strings(["XZ"], [1e300], capacity=4) * 1e10
    assert np.isinf(complex(a.terms()["XZ"]).real)
    # XZ XZ = II; the pairs with padding add no XZ (inf * 0), and the string stays.
    assert list((a @ a).terms()) == ["II"]
    for b in (a + a, a.truncate(2), a * 2.0):
        terms = b.terms()
        assert len(terms) == 1 and not np.isnan(list(terms.values())[0])
        assert np.isinf(abs(list(terms.values())[0]))
    assert np.isinf(float(a.norm())) and complex(a.trace()) == 0


def test_tiny_coefficients_survive_float32():
    """Coefficients whose squares underflow float32 (1e-25) are strings still, and
    the norm is not zero."""
    c = np.array([1e-25, -2e-25], np.complex64)
    a = hierax.PauliSum.from_strings(["XI", "IZ"], c)
    assert a.dtype == jnp.complex64 and int(a.count) == 2
    np.testing.assert_allclose(float(a.norm()), np.sqrt(5) * 1e-25, rtol=1e-6)
    b = a @ hierax.PauliSum.from_strings(["ZI"], np.array([1.0], np.complex64))
    np.testing.assert_allclose(
        np.asarray(b.todense()),
        _dense_of({"XI": 1e-25, "IZ": -2e-25}, 2) @ dense_string("ZI"),
        rtol=1e-6,
        atol=0,
    )


def test_dropped_is_carried_through_arithmetic():
    """`dropped` bounds |exact - computed|^2, checked against dense matrices: equal
    to it for one truncation, `2 * P` and `P + P` (both 4x), scaled by |s|^2,
    kept by negation and adjoint, and an upper bound for truncations of
    truncations, sums, products and commutators of truncated sums."""
    rng = np.random.default_rng(7)
    full_a, da = random_sum(rng, 3, 20)
    full_b, db = random_sum(rng, 3, 12)
    a, b = full_a.truncate(8), full_b.truncate(5)
    d = float(a.dropped)
    np.testing.assert_allclose(d, _weight(da - np.asarray(a.todense())), rtol=1e-12)
    np.testing.assert_allclose(float((2 * a).dropped), 4 * d, rtol=1e-14)
    np.testing.assert_allclose(float((a + a).dropped), 4 * d, rtol=1e-14)
    np.testing.assert_allclose(
        float((a + a).dropped), _weight(2 * da - np.asarray((a + a).todense()))
    )
    np.testing.assert_allclose(float((a / 2).dropped), d / 4, rtol=1e-14)
    np.testing.assert_allclose(float((1j * a).dropped), d, rtol=1e-14)
    assert float((-a).dropped) == d and float(a.adjoint().dropped) == d
    cases = [
        (a.truncate(4), da),
        (a + b, da + db),
        (a - b, da - db),
        (a @ b, da @ db),
        (a.commutator(b), da @ db - db @ da),
        (a.commutator(b, capacity=6), da @ db - db @ da),
        ((a @ b).truncate(3) * 0.5, 0.5 * da @ db),
    ]
    for computed, exact in cases:
        missing = _weight(exact - np.asarray(computed.todense()))
        assert missing > 1e-3  # something is missing in every case
        assert float(computed.dropped) >= missing * (1 - 1e-12), (
            float(computed.dropped),
            missing,
        )


BAD_COUNTS = [2.5, True, "3", -2, 0, None, np.float64(3.0)]


def _names(message: str, api: str, name: str) -> bool:
    """Whether an error names the call and the argument: by hand (`hierax.api`:
    `name`), or by the annotations (in the tests' jaxtyping plugin)."""
    by_hand = f"`hierax.{api}`" in message and f"`{name}`" in message
    method = api.split(".")[-1]
    annotated = f".{method}" in message and f"'{name}'" in message
    return by_hand or annotated


@pytest.mark.filterwarnings("error")  # the refusal comes first, no warning
@pytest.mark.parametrize("bad", BAD_COUNTS, ids=repr)
def test_qubit_counts_and_capacities_are_ints(bad):
    """Every call that takes a number of qubits, a capacity, a number of steps or an
    order refuses non-integers, bools, strings and values too small, naming the
    call and the argument."""
    z = hierax.PauliSum.from_strings("ZII")
    h = hierax.PauliSum.ising_chain(3, 1.0, 1.0)
    calls = {
        ("PauliSum.from_terms", "n_qubits"): lambda: hierax.PauliSum.from_terms(
            [(1.0, [("X", 0)])], bad
        ),
        ("PauliSum.zeros", "n_qubits"): lambda: hierax.PauliSum.zeros(bad, 2),
        ("PauliSum.zeros", "capacity"): lambda: hierax.PauliSum.zeros(2, bad),
        ("PauliSum.ising_chain", "n_qubits"): lambda: hierax.PauliSum.ising_chain(bad),
        ("PauliSum.xxz_chain", "n_qubits"): lambda: hierax.PauliSum.xxz_chain(bad),
        ("PauliSum.xxz_chain", "capacity"): lambda: hierax.PauliSum.xxz_chain(
            3, capacity=bad
        ),
        ("PauliSum.from_strings", "capacity"): lambda: hierax.PauliSum.from_strings(
            "XY", capacity=bad
        ),
        ("PauliSum.truncate", "capacity"): lambda: z.truncate(bad),
        ("PauliSum.product", "capacity"): lambda: z.product(z, bad),
        ("PauliSum.commutator", "capacity"): lambda: z.commutator(z, bad),
        ("lanczos", "steps"): lambda: hierax.lanczos(h, z, bad),
        ("lanczos", "capacity"): lambda: hierax.lanczos(h, z, 2, bad),
        ("moments", "capacity"): lambda: hierax.moments(h, z, 2, bad),
        ("autocorrelation_series", "capacity"): lambda: hierax.autocorrelation_series(
            h, z, 2, bad
        ),
        ("PauliHierarchy", "capacity"): lambda: hierax.PauliHierarchy(h, z, 2, bad),
        ("PauliSum", "n_qubits"): lambda: hierax.PauliSum(
            z.x, z.z, z.coefficients, z.count, z.dropped, bad
        ),
    }
    for (api, name), call in calls.items():
        if bad is None and name in ("capacity",) and api != "PauliSum.zeros":
            continue  # None is the default capacity
        with pytest.raises((TypeError, ValueError)) as info:
            call()
        assert _names(str(info.value), api, name), (api, str(info.value))


@pytest.mark.parametrize("order", [-1, 1.5, True])
def test_moments_and_lanczos_blame_their_own_argument(order):
    h = hierax.PauliSum.ising_chain(3, 1.0, 1.0)
    z = hierax.PauliSum.from_strings("ZII")
    for api, call in [
        ("moments", hierax.moments),
        ("autocorrelation_series", hierax.autocorrelation_series),
    ]:
        with pytest.raises((TypeError, ValueError)) as info:
            call(h, z, order)  # pyright: ignore[reportArgumentType]
        assert _names(str(info.value), api, "order"), str(info.value)
        assert "`capacity`" not in str(info.value)
    with pytest.raises(ValueError, match=r"`hierax.lanczos`: `steps` must be a posit"):
        hierax.lanczos(h, z, 0)


def test_constructors_refuse_what_is_not_a_pauli_sum():
    """Each refusal names the call and the argument (by hand, or by the annotations
    where the tests' jaxtyping plugin sees a wrong type first)."""
    P = hierax.PauliSum
    z = P.from_strings("X")
    F = "PauliSum.from_strings"
    refused = [
        (TypeError, F, "strings", lambda: P.from_strings(5)),  # pyright: ignore
        (TypeError, F, "strings", lambda: P.from_strings([5])),  # pyright: ignore
        (TypeError, F, "coefficients", lambda: P.from_strings("X", ["a"])),
        (TypeError, F, "coefficients", lambda: P.from_strings({"X": "a"})),
        (TypeError, F, "coefficients", lambda: P.from_strings("X", "1")),
        (TypeError, F, "coefficients", lambda: P.from_strings("X", [True])),
        (ValueError, F, "coefficients", lambda: P.from_strings("X", [np.nan])),
        (ValueError, F, "coefficients", lambda: P.from_strings("XY", [np.inf])),
        (
            ValueError,
            "PauliSum.from_terms",
            "coefficients",
            lambda: P.from_terms([(np.nan, [("X", 0)])], 1),
        ),
        (
            ValueError,
            "PauliSum.ising_chain",
            "coefficients",
            lambda: P.ising_chain(3, np.nan),
        ),
        (
            TypeError,
            "PauliSum.ising_chain",
            "periodic",
            lambda: P.ising_chain(3, periodic="yes"),  # pyright: ignore
        ),
        (
            TypeError,
            "PauliSum.from_terms",
            "terms",
            lambda: P.from_terms([(1.0, [("X", 1.5)])], 3),  # pyright: ignore
        ),
        (
            TypeError,
            "PauliSum.from_terms",
            "terms",
            lambda: P.from_terms([(1.0, "X0")], 3),  # pyright: ignore
        ),
        (
            TypeError,
            "PauliSum.from_terms",
            "terms",
            lambda: P.from_terms([1.0], 3),  # pyright: ignore
        ),
        (TypeError, "PauliSum.zeros", "dtype", lambda: P.zeros(2, 2, "foo")),
        (TypeError, "PauliSum.zeros", "dtype", lambda: P.zeros(2, 2, jnp.int32)),
        (
            TypeError,
            "PauliSum",
            "x",
            lambda: P(
                z.x.astype(jnp.int32), z.z, z.coefficients, z.count, z.dropped, 1
            ),
        ),
    ]
    for kind, api, name, call in refused:
        with pytest.raises(kind) as info:
            call()
        assert _names(str(info.value), api, name), (api, name, str(info.value))
    with pytest.raises(ValueError, match="`hierax.PauliSum . number`: the number m"):
        _ = z * np.nan
    with pytest.raises(ValueError, match="`hierax.PauliSum / number`: division by"):
        _ = z / 0
    # Traced coefficients and factors are checked when the program runs.
    with pytest.raises(eqx.EquinoxRuntimeError, match="`coefficients` must be finite"):
        eqx.filter_jit(lambda c: P.from_strings(["XI", "IZ"], c).coefficients)(
            jnp.asarray([1.0, np.nan])
        )
    with pytest.raises(eqx.EquinoxRuntimeError, match="number must be finite"):
        eqx.filter_jit(lambda s, f: (s * f).coefficients)(
            P.from_strings("X"), jnp.asarray(np.inf)
        )
    # Ints as floats and NumPy ints pass; a traced coupling is kept (not compared).
    assert P.from_terms([(1, [("X", 2)])], 3).n_qubits == 3
    chain = eqx.filter_jit(lambda j: P.ising_chain(3, j).coefficients)(jnp.asarray(2.0))
    np.testing.assert_allclose(np.sort(np.real(np.asarray(chain))), [2.0, 2.0])


def test_overflowing_levels_read_inf_never_nan():
    """H = w X, O = Z on one qubit: X_k = (2w)^k (Z, Y, -Z, -Y, ...) in closed form.
    Levels past the largest float read inf with a zero part zero (no nan), in x64
    and float32; the ones below it are exact; the normalised ones (2w)^k/k! stay
    finite where they fit."""
    for dtype, w, order, rtol in (
        (np.complex128, 1e30, 12, 1e-13),
        (np.complex64, 1e3, 14, 1e-5),
    ):
        h = hierax.PauliSum.from_strings("X", np.array([w], dtype))
        o = hierax.PauliSum.from_strings("Z", np.array([1.0], dtype))
        hierarchy = hierax.PauliHierarchy(h, o, order, capacity=4)
        largest = float(np.finfo(dtype).max)
        for normalised in (False, True):
            levels = hierarchy.normalised(0.0) if normalised else hierarchy(0.0)
            for k, level in enumerate(levels):
                log_value = k * np.log(2 * w) - (
                    math.lgamma(k + 1) if normalised else 0
                )
                terms = level.terms()
                assert list(terms) == (["Z"] if k % 2 == 0 else ["Y"]), (k, terms)
                value = complex(list(terms.values())[0])
                sign = (-1) ** (k // 2)
                assert not np.isnan(value.real) and not np.isnan(value.imag)
                assert value.imag == 0 and not np.isnan(float(level.dropped))
                if log_value < np.log(largest) - 1:
                    np.testing.assert_allclose(
                        value.real, sign * np.exp(log_value), rtol=rtol
                    )
                elif log_value > np.log(largest) + 1:
                    assert value.real == sign * np.inf, (dtype, k, value)


def test_strongly_driven_chain_in_float32_against_dense_x64():
    """A strongly driven Ising chain at order 24 in float32: the levels' series
    span many orders of magnitude (one scale for them all read 1e10 as inf);
    every level below the float32 range agrees with the dense x64 hierarchy, and
    none is nan."""
    n, order = 3, 24
    hx = hierax.PauliSum.from_terms([(50.0, [("X", j)]) for j in range(n)], n)
    hzz = hierax.PauliSum.ising_chain(n, 40.0)
    o = hierax.PauliSum.from_strings("Z" + "I" * (n - 1))

    def as32(s):
        return eqx.tree_at(
            lambda s: s.coefficients, s, s.coefficients.astype(jnp.complex64)
        )

    drive = hierax.Cos(30.0)
    levels = hierax.PauliHierarchy(
        drive * as32(hx) + as32(hzz), as32(o), order, capacity=64
    )(0.3)
    dense_h = drive * np.asarray(hx.todense()) + np.asarray(hzz.todense())
    expected = np.asarray(
        hierax.HeisenbergHierarchy(dense_h, np.asarray(o.todense()), order)(0.3)
    )
    checked = 0
    for k in range(order + 1):
        c = np.asarray(levels[k].coefficients)
        assert levels[k].dtype == jnp.complex64 and not np.isnan(c).any(), k
        scale = np.abs(expected[k]).max()
        if scale < 1e36:
            got = np.asarray(levels[k].todense())
            assert np.abs(got - expected[k]).max() < 1e-4 * scale, k
            checked += 1
    assert checked >= 14


def test_autocorrelation_series_past_170_factorial():
    """C(t) = cos(2 w t) for H = w X, O = Z: c_{2k} = (-1)^k (2w)^{2k}/(2k)!, also
    past (2k)! = 170! (which overflows float64)."""
    w, order = 4.0, 95
    h = hierax.PauliSum.from_strings("X", [w])
    o = hierax.PauliSum.from_strings("Z")
    c = np.asarray(hierax.autocorrelation_series(h, o, order))
    k = np.arange(order + 1)
    expected = (-1.0) ** k * np.exp(
        2 * k * np.log(2 * w) - np.array([math.lgamma(2 * j + 1) for j in k])
    )
    np.testing.assert_allclose(c[::2], expected, rtol=1e-10)
    assert np.all(c[1::2] == 0) and c[-1] != 0


def test_second_calls_stay_on_the_device():
    """Issue 49: `lanczos`, `moments` and `PauliHierarchy` called again on values
    already on the device move nothing between host and device."""
    h = hierax.PauliSum.ising_chain(4, 1.0, 1.05, 0.5)
    o = hierax.PauliSum.from_strings(["ZIII", "IXII"], [1.0, 0.3])
    t = jnp.asarray(0.4)
    hierarchy = hierax.PauliHierarchy(hierax.Cos(1.3) * h, o, 4, capacity=64)
    first = hierax.lanczos(h, o, 4, capacity=64)
    mu = hierax.moments(h, o, 3, capacity=64)[0]
    levels = hierarchy(t)
    with jax.transfer_guard("disallow"):
        again = hierax.lanczos(h, o, 4, capacity=64)
        mu_again = hierax.moments(h, o, 3, capacity=64)[0]
        levels_again = hierarchy(t)
        again_hierarchy = hierax.PauliHierarchy(hierax.Cos(1.3) * h, o, 4, capacity=64)
        levels_third = again_hierarchy(t)
    np.testing.assert_array_equal(np.asarray(again.b), np.asarray(first.b))
    np.testing.assert_array_equal(np.asarray(mu_again), np.asarray(mu))
    for a, b, c in zip(levels, levels_again, levels_third):
        np.testing.assert_array_equal(
            np.asarray(a.coefficients), np.asarray(b.coefficients)
        )
        np.testing.assert_array_equal(
            np.asarray(a.coefficients), np.asarray(c.coefficients)
        )
    # A time on the device is checked in the compiled call, and raised as the
    # one-line error it is.
    with pytest.raises(
        ValueError, match=r"^`hierax.PauliHierarchy\(...\)\(t\)`: `t` must"
    ):
        hierarchy(jnp.asarray(np.nan))


@pytest.mark.parametrize("reorthogonalize", [False, True])
@pytest.mark.parametrize("case", ["commutes", "three-dimensional space"])
def test_lanczos_stops_where_the_krylov_space_is_spent(case, reorthogonalize):
    """Where b_n is the rounding of the sums that formed A_n (an observable that
    commutes with H: b_1 = 0; a Krylov space of dimension 3: b_3 = 0), the
    coefficients from there on are 0, as in exact arithmetic, not O(|H|) numbers
    grown from the rounding noise normalised to 1."""
    if case == "commutes":
        h = hierax.PauliSum.ising_chain(4, 1.0, 1.05, 0.5)
        o, steps, capacity, live = h, 5, 64, 0
    else:
        h = hierax.PauliSum.from_strings(["XII"], [0.7])
        o = hierax.PauliSum.from_strings(["ZII", "IZI"], [1.0, 0.3])
        steps, capacity, live = 6, 16, 2
    result = hierax.lanczos(h, o, steps, capacity, reorthogonalize=reorthogonalize)
    b = np.asarray(result.b)
    dh, do = np.asarray(h.todense()), np.asarray(o.todense())
    np.testing.assert_allclose(b[:live], dense_lanczos(dh, do, live), rtol=1e-12)
    assert np.all(b[live:] == 0)
    assert np.all(np.isfinite(np.asarray(result.orthogonality)))


def test_moments_past_an_overflow_are_inf_not_nan():
    """Moments whose true values overflow read +inf (they are log-convex from
    mu_0 = 1), and the autocorrelation series +-inf: past the overflow the strings'
    commutators were inf - inf = nan."""
    h = hierax.PauliSum.ising_chain(4, 1e100, 1.05e100, 0.5e100)
    o = hierax.PauliSum.from_strings(["ZIII"], [1.0])
    mu, _ = hierax.moments(h, o, 5, capacity=256)
    mu = np.asarray(mu)
    assert mu[0] == 1 and np.isfinite(mu[1]) and np.all(np.isposinf(mu[2:]))
    series = np.asarray(hierax.autocorrelation_series(h, o, 5, capacity=256))
    assert not np.any(np.isnan(series))


def test_a_sum_times_zero_holds_no_strings():
    """The first `count` slots hold nonzero coefficients: `O * 0` had kept its
    strings with zero coefficients (`O - O` held none)."""
    o = hierax.PauliSum.from_strings(["ZIIII", "IIXII"], [1.0, 2.0])
    for zero in (0, 0.0, jnp.asarray(0.0)):
        scaled = o * zero
        assert int(scaled.count) == 0 and scaled.terms() == {}
    assert (o * 2.0).terms() == {"ZIIII": 2.0, "IIXII": 4.0}


def test_pauli_time_sum_arithmetic_against_dense_matrices():
    """`+`, `-`, unary `-`, `*` and `/` by numbers and `*` by time functions (both
    sides), `sum(...)` and `0 +`: the Pauli Hamiltonian's value at t against the
    same combination of dense matrices and closed-form functions in NumPy. They
    raised Python's bare "unsupported operand" errors, and `f * H` a message
    that called it no matrix."""
    hx = hierax.PauliSum.from_strings(["XII", "IXI", "IIX"], [0.5, -1.0, 2.0])
    hzz = hierax.PauliSum.from_strings(["ZZI", "IZZ"], [1.0, 0.25j])
    dx = 0.5 * dense_string("XII") - dense_string("IXI") + 2 * dense_string("IIX")
    dzz = dense_string("ZZI") + 0.25j * dense_string("IZZ")
    w = 1.3
    h = hierax.Cos(w) * hx + hzz
    g = hierax.Gaussian(0.2, 0.5)

    def cos(t):
        return np.cos(w * t)

    def gauss(t):
        return np.exp(-((t - 0.2) ** 2) / 0.5)

    cases = [
        (-h, lambda t: -(cos(t) * dx + dzz)),
        (h - hzz, lambda t: cos(t) * dx),
        (hzz - h, lambda t: -cos(t) * dx),
        (h - h, lambda t: 0 * dx),
        (2 * h, lambda t: 2 * (cos(t) * dx + dzz)),
        (h * (1 - 2j), lambda t: (1 - 2j) * (cos(t) * dx + dzz)),
        (h * np.float32(0.5), lambda t: 0.5 * (cos(t) * dx + dzz)),
        (h / 4, lambda t: (cos(t) * dx + dzz) / 4),
        (h * g, lambda t: gauss(t) * (cos(t) * dx + dzz)),
        (g * h, lambda t: gauss(t) * (cos(t) * dx + dzz)),
        (sum([h, hzz]), lambda t: cos(t) * dx + 2 * dzz),  # pyright: ignore
        (0 + h - 0, lambda t: cos(t) * dx + dzz),
        (0 - h, lambda t: -(cos(t) * dx + dzz)),
    ]
    for i, (op, dense) in enumerate(cases):
        assert isinstance(op, hierax.PauliTimeSum), i
        for t in (0.0, 0.7, -1.9):
            np.testing.assert_allclose(
                np.asarray(op(t).todense()), dense(t), atol=1e-14, err_msg=str(i)
            )
    # Numbers fold into the functions' amplitudes: the Pauli sums are untouched,
    # and a traced factor reuses one program.
    assert (2 * h).sums == h.sums
    assert [type(f) for f in (2 * h).functions] == [hierax.Cos, hierax.Constant]
    levels = jax.jit(lambda a: hierax.PauliHierarchy(a * h, hzz, 2)(0.3)[1].todense())
    np.testing.assert_allclose(
        np.asarray(levels(2.0)),
        np.asarray(hierax.PauliHierarchy(2 * h, hzz, 2)(0.3)[1].todense()),
        atol=1e-13,
    )


def test_pauli_time_sum_refusals_name_the_operation():
    """Bad operands and constructor arguments get a one-line error naming the
    operation and what to do, never a raw Python or NumPy error (they were
    "object of type 'Cos' has no len()", "'numpy.ndarray' object has no attribute
    'n_qubits'", NumPy's matmul signature, and a float taken as a function)."""
    hx = hierax.PauliSum.from_strings(["XI", "IX"])
    h = hierax.Cos(1.0) * hx
    sx = np.array([[0.0, 1.0], [1.0, 0.0]])
    refused = [
        (lambda: h + 1, TypeError, "PauliTimeSum + ...`: cannot add", "identity"),
        (lambda: 2 - h, TypeError, "... - hierax.PauliTimeSum`", "identity"),
        (lambda: h + hierax.Cos(), TypeError, "cannot add", "multiply it by a Pauli"),
        (lambda: h + sx, TypeError, "cannot add a value of type ndarray", "matrices"),
        (lambda: sx - h, TypeError, "... - hierax.PauliTimeSum`", "matrices"),
        (lambda: h + None, TypeError, "cannot add", "hierax.PauliSum"),
        (lambda: h * hx, TypeError, "PauliTimeSum * ...`", "no operator product"),
        (lambda: hx * h, TypeError, "... * hierax.PauliTimeSum`", "no operator pr"),
        (lambda: h @ hx, TypeError, "PauliTimeSum @ ...`", "f * (a @ b)"),
        (lambda: hx @ h, TypeError, "... @ hierax.PauliTimeSum`", "f * (a @ b)"),
        (lambda: h @ sx, TypeError, "PauliTimeSum @ ...`", "no operator product"),
        (lambda: h * sx, TypeError, "PauliTimeSum * ...`", "matrices do not mix"),
        (lambda: sx * h, TypeError, "... * hierax.PauliTimeSum`", "matrices do not"),
        (lambda: h * "a", TypeError, "PauliTimeSum * ...`", "got str"),
        (lambda: h * np.nan, ValueError, "PauliTimeSum * number`", "finite, got nan"),
        (lambda: np.inf * h, ValueError, "number * hierax.PauliTimeSum`", "finite"),
        (lambda: h * True, TypeError, "PauliTimeSum * number`", "the boolean True"),
        (lambda: h * 10**400, ValueError, "PauliTimeSum * number`", "1329 bits"),
        (lambda: h / 0, ValueError, "PauliTimeSum / number`", "division by zero"),
        (lambda: h / hx, TypeError, "PauliTimeSum / number`", "must be a number"),
        (lambda: hx * 10**400, ValueError, "hierax.PauliSum * number`", "1329 bits"),
        (
            lambda: hierax.PauliTimeSum(hierax.Cos(), hx),  # pyright: ignore
            TypeError,
            "PauliTimeSum`: `functions` must be a tuple or list",
            "got Cos",
        ),
        (
            lambda: hierax.PauliTimeSum((hierax.Cos(),), (sx,)),  # pyright: ignore
            TypeError,
            "PauliTimeSum`: `sums[0]` must be a `hierax.PauliSum`",
            "ndarray",
        ),
        (
            lambda: hierax.PauliTimeSum(("cos",), (hx,)),
            TypeError,
            "PauliTimeSum`: `functions[0]` must be a time function",
            "str",
        ),
        (
            lambda: hierax.PauliTimeSum((hierax.Cos(),), (hx, hx)),
            ValueError,
            "one time function per Pauli sum",
            "got 1 and 2",
        ),
        (
            lambda: h + hierax.PauliSum.from_strings("ZZZ"),
            ValueError,
            "every term must act on the same chain",
            "[2, 3]",
        ),
    ]
    for call, kind, first, second in refused:
        with pytest.raises(kind) as info:
            call()
        message = str(info.value)
        assert first in message and second in message, message
        assert message.startswith("`") and "\n" not in message, message
    # A number given as a function is a constant.
    constant = hierax.PauliTimeSum((2.0,), (hx,))
    assert isinstance(constant.functions[0], hierax.Constant)
    np.testing.assert_allclose(
        np.asarray(constant(0.4).todense()), 2 * np.asarray(hx.todense()), atol=1e-15
    )
    # A PauliSum times a large int that fits a float (it overflowed JAX's int64).
    np.testing.assert_allclose(
        np.asarray((hx * 10**300).todense()),
        1e300 * np.asarray(hx.todense()),
        rtol=1e-15,
    )


def _dense_ising(n: int, hx):
    """The Ising chain of `PauliSum.ising_chain(n, 1, hx, 0.5)` as a dense JAX
    matrix (differentiable in `hx`)."""

    def at(char, k):
        return jnp.asarray(dense_string("I" * k + char + "I" * (n - k - 1)))

    h = sum(at("Z", k) @ at("Z", k + 1) for k in range(n - 1))
    return h + sum(hx * at("X", k) + 0.5 * at("Z", k) for k in range(n))


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_derivatives_through_merges_against_dense(monkeypatch, platform):
    """Derivatives in a Hamiltonian's parameter through the merges of Pauli sums,
    under each backend's choices (the merges' sorted rows, sums and scatters are
    not differentiable as such: they carry their own rules): `moments` by
    `jax.grad` and `jax.jvp` against JAX's derivatives of the dense moments, and
    `lanczos`' b (reorthogonalised: the Krylov overlaps enter them) by
    `jax.jacfwd` and `jax.jacrev` against central differences of dense Lanczos."""
    from hierax._core import _cache, _choices

    monkeypatch.setattr(_choices, "default_platform", lambda: platform)
    _cache.clear()
    n, o = 4, hierax.PauliSum.from_strings(["ZIII", "IXII"], [1.0, 0.5])
    do = jnp.asarray(dense_string("ZIII") + 0.5 * dense_string("IXII"))

    def mu(hx):
        h = hierax.PauliSum.ising_chain(n, 1.0, hx, 0.5)
        return hierax.moments(h, o, 4, capacity=256)[0]

    def dense_mu(hx):
        h, a, out = _dense_ising(n, hx), do, [jnp.asarray(1.0)]
        for _ in range(4):
            a = h @ a - a @ h
            out.append(jnp.trace(a.conj().T @ a).real / jnp.trace(do @ do).real)
        return jnp.stack(out)

    hx = 1.05
    np.testing.assert_allclose(np.asarray(mu(hx)), np.asarray(dense_mu(hx)), rtol=1e-12)
    want = jax.jacfwd(dense_mu)(hx)
    np.testing.assert_allclose(np.asarray(jax.jacrev(mu)(hx)), want, rtol=1e-11)
    _, tangent = jax.jvp(mu, (hx,), (1.0,))
    np.testing.assert_allclose(np.asarray(tangent), want, rtol=1e-11)

    def b(hx):
        h = hierax.PauliSum.ising_chain(n, 1.0, hx, 0.5)
        return hierax.lanczos(h, o, 4, capacity=256, reorthogonalize=True).b

    def dense_b(hx):
        return dense_lanczos(np.asarray(_dense_ising(n, hx)), np.asarray(do), 4)

    step = 1e-5
    central = (dense_b(hx + step) - dense_b(hx - step)) / (2 * step)
    for jac in (jax.jacfwd, jax.jacrev):
        np.testing.assert_allclose(np.asarray(jac(b)(hx)), central, rtol=1e-7)
    _cache.clear()
