"""Differential fuzz of `sesolve` under `jax.vmap` from `REAL_STATE_SIZE` (256)
levels, where the terms with real matrices step in real arithmetic apart from the
others (`real_and_other_series`) and a batch that differs only in constant
coefficients and drive amplitudes steps in lockstep (`_lockstep.ColumnsTerm`).

Random Hamiltonians (fixed seeds) mix real and complex Hermitian matrices in one
`TimeOperator`, in sums of operators and of `hierax.as_operator` pieces, with
known matrices (complex ones split into real halves by `real_terms`) and with
matrices traced by an enclosing `jax.jit` (complex ones then stay complex: the
"other" series). Sweeps over constant coefficients of real terms, of complex
terms and of both, over real and complex amplitudes of Cos, Sin, Gaussian and Exp
drives, over kets with parameters and in nested maps; sizes 256, 260 and 300;
sparse-ish matrices (a diagonal, a band, ~3% nonzeros: applied by their nonzeros,
so a swept batch goes element by element, a shared one in lockstep); x64 at rtol
1e-10 (within 1e-8) and complex64 at rtol 1e-5 (within 1e-4).

Every element is checked against its solve alone (hierax, unmapped) and some
elements of every case against scipy's DOP853 (`propagate`, rtol 1e-12), which
is independent of hierax; whether the batch was stepped in lockstep is read off
`_lockstep._in_lockstep`'s returns.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hierax
from hierax._solvers import _lockstep

from .helpers import propagate, recorded_returns


SPAN = 0.8
X64 = dict(rtol=1e-10, atol=1e-12, tol=1e-8)
X32 = dict(rtol=1e-5, atol=1e-7, tol=1e-4)


def _error(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def _hermitian(rng, n, kind="real"):
    """A random Hermitian matrix of spectral norm 1: `real` (symmetric), `complex`,
    `diagonal`, `banded` (half-width 2), `sparse` (about 3% nonzeros, real)."""
    if kind == "diagonal":
        return np.diag(rng.normal(size=n))
    m = rng.normal(size=(n, n))
    if kind == "complex":
        m = m + 1j * rng.normal(size=(n, n))
    elif kind == "banded":
        i, j = np.indices((n, n))
        m = m * (np.abs(i - j) <= 2)
    elif kind == "sparse":
        m = m * (rng.random((n, n)) < 0.015)
    m = (m + m.conj().T) / 2
    return m / np.linalg.norm(m, 2)


def _ket(rng, n, count=None):
    shape = (n,) if count is None else (count, n)
    k = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    return k / np.linalg.norm(k, axis=-1, keepdims=True)


def _gauss(t, mean, width):
    return np.exp(-((t - mean) ** 2) / (2 * width**2))


def _pick(params, axes, k):
    return tuple(p[k] if a == 0 else p for p, a in zip(params, axes))


def _as_numpy(params):
    return tuple(complex(p) if np.iscomplexobj(p) else float(p) for p in params)


def _sweep(
    build,
    matrix,
    mats,
    params,
    axes,
    ket,
    ket_axis=None,
    *,
    traced=False,
    jit=True,
    low=False,
    reference=(0, -1),
):
    """`sesolve` of `build(mats, *p)` from `ket` over [0, SPAN], mapped by
    `jax.vmap` over the parameters `params` (`axes`: 0 or None each) and the
    kets (`ket_axis`), jitted with the matrices as the program's arguments
    (`traced`) or as known NumPy constants. Each element is compared to its solve
    alone (known matrices, unmapped) and the elements `reference` to DOP853 of
    `matrix(mats, *p)(t)`. Returns the largest deviations (alone, reference)."""
    setting = X32 if low else X64
    real, cplx = (np.float32, np.complex64) if low else (np.float64, np.complex128)
    mats = tuple(np.asarray(m, cplx if np.iscomplexobj(m) else real) for m in mats)
    params = tuple(jnp.asarray(p, cplx if np.iscomplexobj(p) else real) for p in params)
    ket = jnp.asarray(ket, cplx)
    times = jnp.asarray([0.0, SPAN], real)

    def one(ms, p, k):
        solution = hierax.sesolve(
            build(ms, *p),
            k,
            times,
            rtol=setting["rtol"],
            atol=setting["atol"],
        )
        return solution.final_state

    mapped = jax.vmap(one, in_axes=(None, tuple(axes), ket_axis))
    if traced:
        finals = jax.jit(mapped)(tuple(jnp.asarray(m) for m in mats), params, ket)
    elif not jit:
        finals = mapped(mats, params, ket)
    else:
        finals = jax.jit(lambda p, k: mapped(mats, p, k))(params, ket)
    finals = np.asarray(finals)
    assert finals.dtype == cplx
    size = finals.shape[0]
    worst_alone = worst_reference = 0.0
    for k in range(size):
        p = _pick(params, axes, k)
        start = ket[k] if ket_axis == 0 else ket
        alone = one(mats, p, start)
        worst_alone = max(worst_alone, _error(finals[k], alone))
    wide = tuple(np.asarray(m, np.result_type(m, float)) for m in mats)
    for k in sorted({r % size for r in reference}):
        p = _as_numpy(_pick(params, axes, k))
        start = np.asarray(ket[k] if ket_axis == 0 else ket, complex)
        exact = propagate(matrix(wide, *p), 0.0, SPAN, start, rtol=1e-12)
        worst_reference = max(worst_reference, _error(finals[k], exact))
    print(f"alone {worst_alone:.1e} reference {worst_reference:.1e}")
    assert worst_alone <= setting["tol"]
    assert worst_reference <= setting["tol"]
    return worst_alone, worst_reference


def _stepped(monkeypatch):
    """The returns of `_lockstep._in_lockstep` during the test (`None`: element by
    element). JAX's caches are cleared first: seen here, a mapped solve after
    solves of the same structure (an earlier test's, or its elements solved
    alone) reached no batching rule, and nothing was recorded (its results were
    right)."""
    jax.clear_caches()
    return recorded_returns(monkeypatch, _lockstep, "_in_lockstep")


# --------------------------------------------------------------------------------
# 1. Real and complex matrices, constants and drives swept together
# --------------------------------------------------------------------------------


def _two_kinds(ms, c_real, c_complex, a_cos, a_sin, a_gauss, a_exp):
    """A sum of a `TimeOperator` of real matrices (a constant, a Cos and an Exp
    drive) and one of complex Hermitian matrices (a constant, a Sin and a Gaussian
    drive)."""
    r0, r1, r2, c0, c1, c2 = ms
    real = hierax.TimeOperator(
        [
            hierax.Constant(c_real),
            hierax.Cos(1.3, 0.2, a_cos),
            hierax.Exp(-0.7, a_exp),
        ],
        [r0, r1, r2],
    )
    other = hierax.TimeOperator(
        [
            hierax.Constant(c_complex),
            hierax.Sin(2.1, -0.4, a_sin),
            hierax.Gaussian(0.5, 0.3, a_gauss),
        ],
        [c0, c1, c2],
    )
    return hierax.OperatorSum([real, other])


def _two_kinds_matrix(ms, c_real, c_complex, a_cos, a_sin, a_gauss, a_exp):
    r0, r1, r2, c0, c1, c2 = ms

    def h(t):
        return (
            c_real * r0
            + a_cos * np.cos(1.3 * t + 0.2) * r1
            + a_exp * np.exp(-0.7 * t) * r2
            + c_complex * c0
            + a_sin * np.sin(2.1 * t - 0.4) * c1
            + a_gauss * _gauss(t, 0.5, 0.3) * c2
        )

    return h


def _two_kinds_mats(rng, n):
    kinds = ["real"] * 3 + ["complex"] * 3
    return tuple(_hermitian(rng, n, k) for k in kinds)


# The parameters of three elements: the constants of both kinds, real amplitudes
# (0 included, negative) and complex ones (the Sin's and the Gaussian's).
_PARAMS = (
    np.array([0.3, -1.2, 2.0]),
    np.array([1.1, 0.0, -0.8]),
    np.array([0.0, 0.7, -1.5]),
    np.array([0.5, 1.0 - 0.6j, 0.4j]),
    np.array([1.4, -0.3 + 0.2j, 0.0]),
    np.array([0.8, 0.0, -1.3]),
)


@pytest.mark.parametrize("mode", ["traced", "known", "eager"])
def test_real_and_complex_terms_swept_together(monkeypatch, mode):
    """n = 256: constants of a real and of a complex term, and real and complex
    amplitudes of Cos, Sin, Gaussian and Exp drives, all swept in one map, in
    lockstep. `traced`: the matrices are arguments of the `jax.jit` (the real
    terms one real series, the complex ones another); `known`: traceless NumPy
    constants inside it (known matrices, the complex ones split into real halves:
    one real series; with nonzero traces the swept constants' traces would be
    removed with JAX operations, the matrices traced: the `traced` program);
    `eager`: `jax.vmap` outside any `jax.jit` (known matrices, traces removed
    eagerly, split into real halves)."""
    stepped = _stepped(monkeypatch)
    rng = np.random.default_rng({"traced": 1, "known": 2, "eager": 3}[mode])
    n = 256
    mats = _two_kinds_mats(rng, n)
    if mode == "known":
        mats = tuple(m - np.trace(m) / n * np.eye(n) for m in mats)
    axes = (0,) * 6
    _sweep(
        _two_kinds,
        _two_kinds_matrix,
        mats,
        _PARAMS,
        axes,
        _ket(rng, n),
        traced=mode == "traced",
        jit=mode != "eager",
        reference=(1, 2),
    )
    assert stepped and all(s is not None for s in stepped)


def test_one_kind_of_constant_swept_with_kets(monkeypatch):
    """n = 256, traced matrices: only the real term's constant, or only the
    complex term's, swept (the other shared), with a ket per element."""
    stepped = _stepped(monkeypatch)
    rng = np.random.default_rng(10)
    n = 256
    mats = _two_kinds_mats(rng, n)
    values = np.array([-0.9, 0.0, 1.6])
    shared = tuple(p[0] for p in _PARAMS)
    for swept in (0, 1):
        params = tuple(values if i == swept else p for i, p in enumerate(shared))
        axes = tuple(0 if i == swept else None for i in range(6))
        kets = _ket(rng, n, 3)
        _sweep(
            _two_kinds,
            _two_kinds_matrix,
            mats,
            params,
            axes,
            kets,
            0,
            traced=True,
            reference=(1,),
        )
    assert len(stepped) == 2 and all(s is not None for s in stepped)


# --------------------------------------------------------------------------------
# 2. Sums of pieces, a dense matrix beside drives, nested maps, n above 256
# --------------------------------------------------------------------------------


def test_sums_of_pieces_and_nested_maps(monkeypatch):
    """n = 260: `hierax.as_operator` of a dense complex matrix, plus a swept
    constant times a real one, plus a `TimeOperator` of a real Gaussian-driven and
    a complex Cos-driven term (its amplitude swept, complex), plus a second
    `TimeOperator` with a shared Exp drive: nested `jax.vmap`s over the parameters
    (outer) and kets (inner), in lockstep; and a single map over kets alone."""
    stepped = _stepped(monkeypatch)
    rng = np.random.default_rng(20)
    n = 260
    h0, d, v, w, e = (
        _hermitian(rng, n, k) for k in ("complex", "real", "real", "complex", "real")
    )
    kets = _ket(rng, n, 2)

    def build(ms, detuning, amplitude):
        h0, d, v, w, e = ms
        drives = hierax.TimeOperator(
            [hierax.Gaussian(0.4, 0.25, 0.9), hierax.Cos(3.0, 0.0, amplitude)], [v, w]
        )
        return (
            hierax.as_operator(h0)
            + hierax.Constant(detuning) * d
            + drives
            + hierax.TimeOperator([hierax.Exp(0.3 + 2.0j, 0.5)], [e])
        )

    def matrix(ms, detuning, amplitude):
        h0, d, v, w, e = ms
        return lambda t: (
            h0
            + detuning * d
            + 0.9 * _gauss(t, 0.4, 0.25) * v
            + amplitude * np.cos(3.0 * t) * w
            + 0.5 * np.exp((0.3 + 2.0j) * t) * e
        )

    mats = (h0, d, v, w, e)
    detunings = np.array([0.0, 1.7, -0.6])
    amplitudes = np.array([1.0, 0.5 - 0.5j, -2.0])
    times = jnp.array([0.0, SPAN])

    def one(detuning, amplitude, ket):
        h = build(mats, detuning, amplitude)
        return hierax.sesolve(h, ket, times, rtol=1e-10, atol=1e-12).final_state

    inner = jax.vmap(one, in_axes=(None, None, 0))
    nested = jax.jit(jax.vmap(inner, in_axes=(0, 0, None)))(
        jnp.asarray(detunings), jnp.asarray(amplitudes), jnp.asarray(kets)
    )
    assert nested.shape == (3, 2, n)
    assert stepped and all(s is not None for s in stepped)
    worst = 0.0
    for i in range(3):
        for k in range(2):
            alone = one(detunings[i], amplitudes[i], jnp.asarray(kets[k]))
            worst = max(worst, _error(nested[i, k], alone))
    assert worst <= 1e-8
    for i, k in ((0, 0), (1, 1), (2, 0)):
        h = matrix(mats, detunings[i], amplitudes[i])
        assert _error(nested[i, k], propagate(h, 0.0, SPAN, kets[k], 1e-12)) <= 1e-8
    print(f"nested: alone {worst:.1e}")


# --------------------------------------------------------------------------------
# 3. Sparse-ish matrices: applied by their nonzeros
# --------------------------------------------------------------------------------


def test_sparse_terms_swept_and_shared(monkeypatch):
    """n = 300: a diagonal with a swept constant, a banded matrix under a Cos
    drive and one with ~3% nonzeros under a Gaussian (both amplitudes swept),
    beside a dense complex term: applied by their nonzeros, so the swept batch
    goes element by element (under `jax.jit` the matrices are traced, see
    below: dense, in lockstep); with one Hamiltonian for the batch, its kets
    step in lockstep (any structure). Against DOP853 and the elements alone."""
    stepped = _stepped(monkeypatch)
    rng = np.random.default_rng(30)
    n = 300
    mats = tuple(
        _hermitian(rng, n, k) for k in ("diagonal", "banded", "sparse", "complex")
    )
    assert np.count_nonzero(mats[2]) < 0.04 * n * n

    def build(ms, detuning, a, b):
        diag, band, sparse, dense = ms
        return hierax.TimeOperator(
            [
                hierax.Constant(detuning),
                hierax.Cos(1.9, 0.1, a),
                hierax.Gaussian(0.3, 0.4, b),
                hierax.Constant(0.7),
            ],
            [diag, band, sparse, dense],
        )

    def matrix(ms, detuning, a, b):
        diag, band, sparse, dense = ms
        return lambda t: (
            detuning * diag
            + a * np.cos(1.9 * t + 0.1) * band
            + b * _gauss(t, 0.3, 0.4) * sparse
            + 0.7 * dense
        )

    params = (
        np.array([0.0, 2.0, -1.0]),
        np.array([1.0, 0.3, -0.8]),
        np.array([1.5, 0.0, 0.6]),
    )
    # Outside `jax.jit` (known matrices: inside one, the swept constant's trace
    # is removed with JAX operations, the matrices are traced and stay dense).
    ket = _ket(rng, n)
    _sweep(build, matrix, mats, params, (0, 0, 0), ket, jit=False, reference=(0,))
    assert stepped and all(s is None for s in stepped)
    stepped.clear()
    # Inside it: dense, in lockstep.
    _sweep(build, matrix, mats, params, (0, 0, 0), ket, reference=(2,))
    assert stepped and all(s is not None for s in stepped)
    stepped.clear()
    shared = tuple(p[1] for p in params)
    _sweep(
        build,
        matrix,
        mats,
        shared,
        (None, None, None),
        _ket(rng, n, 3),
        0,
        reference=(1,),
    )
    assert stepped and all(s is not None for s in stepped)


# --------------------------------------------------------------------------------
# 4. complex64
# --------------------------------------------------------------------------------


def test_complex64_sweeps(monkeypatch):
    """The sweep of section 1 in complex64 (float32 matrices, times and
    parameters), rtol 1e-5, with traced matrices and with known traceless ones:
    within 1e-4 of DOP853 and of the elements alone, in lockstep, the dtype
    kept."""
    stepped = _stepped(monkeypatch)
    rng = np.random.default_rng(40)
    n = 256
    for traced in (True, False):
        jax.clear_caches()  # (the first sweep's solves alone: see `_stepped`)
        mats = _two_kinds_mats(rng, n)
        if not traced:
            mats = tuple(m - np.trace(m) / n * np.eye(n) for m in mats)
        _sweep(
            _two_kinds,
            _two_kinds_matrix,
            mats,
            _PARAMS,
            (0,) * 6,
            _ket(rng, n),
            traced=traced,
            low=True,
            reference=(1, 2),
        )
    assert len(stepped) == 2 and all(s is not None for s in stepped)


# --------------------------------------------------------------------------------
# 5. Batches that go element by element
# --------------------------------------------------------------------------------


def test_other_batches_go_element_by_element(monkeypatch):
    """n = 256, dense real and complex terms: a swept drive frequency, and a swept
    Gaussian width with its amplitude (not a scale alone), go element by element;
    each element against DOP853 and its solve alone."""
    stepped = _stepped(monkeypatch)
    rng = np.random.default_rng(50)
    n = 256
    mats = (_hermitian(rng, n), _hermitian(rng, n, "complex"), _hermitian(rng, n))

    def build(ms, frequency, width, amplitude):
        r0, c1, r2 = ms
        return hierax.TimeOperator(
            [
                hierax.Constant(0.8),
                hierax.Cos(frequency, 0.0, 0.9),
                hierax.Gaussian(0.4, width, amplitude),
            ],
            [r0, c1, r2],
        )

    def matrix(ms, frequency, width, amplitude):
        r0, c1, r2 = ms
        return lambda t: (
            0.8 * r0
            + 0.9 * np.cos(frequency * t) * c1
            + amplitude * _gauss(t, 0.4, width) * r2
        )

    ket = _ket(rng, n)
    params = (np.array([0.5, 2.5, 4.0]), 0.3, 1.0)
    _sweep(build, matrix, mats, params, (0, None, None), ket, reference=(2,))
    params = (1.0, np.array([0.2, 0.5]), np.array([1.0, -0.7]))
    _sweep(build, matrix, mats, params, (None, 0, 0), ket, reference=(0,))
    assert len(stepped) == 2 and all(s is None for s in stepped)
