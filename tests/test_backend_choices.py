"""The structure choices made per backend (`_core/_choices.py`): a TPU applies the
known matrices of a state's step by dense products where the CPU gathers their
nonzeros, and the Lindblad step's layout follows each backend's measured costs.
The same answer either way, and a term built for one backend is never reused on
another (the suite has no TPU: the backend is set through the seam
`_choices.default_platform`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import hierax
from hierax._core import _cache, _choices
from hierax._data import AbstractSparseMatrix
from hierax._solvers import _sesolve


def _chain(sites: int) -> np.ndarray:
    """A Heisenberg chain in a field: a few nonzeros a row (well under 10%)."""
    paulis = [
        np.array([[0, 1], [1, 0]], complex),
        np.array([[0, -1j], [1j, 0]]),
        np.diag([1.0, -1.0]).astype(complex),
    ]

    def at(op, k):
        return np.kron(np.kron(np.eye(2**k), op), np.eye(2 ** (sites - k - 1)))

    h = np.zeros((2**sites, 2**sites), complex)
    for k in range(sites - 1):
        for p in paulis:
            h += at(p, k) @ at(p, k + 1)
    for k in range(sites):
        h += 0.3 * at(paulis[0], k)
    return h


def _sparse_terms(term) -> int:
    leaves = jax.tree.leaves(
        term, is_leaf=lambda x: isinstance(x, AbstractSparseMatrix)
    )
    return sum(isinstance(x, AbstractSparseMatrix) for x in leaves)


@pytest.fixture
def on(monkeypatch):
    """`on("tpu")`: the backend the choices are read for, from then on."""

    def set_platform(platform: str) -> None:
        monkeypatch.setattr(_choices, "default_platform", lambda: platform)

    yield set_platform
    _cache.clear()


def test_a_tpu_steps_dense_where_the_cpu_gathers_and_both_are_exact(on):
    h = _chain(8)  # n = 256: the state's step in real arithmetic
    n = h.shape[0]
    psi = np.zeros(n, complex)
    psi[0b01010101] = 1.0
    times = np.array([0.0, 0.7])
    exact = scipy.linalg.expm(-0.7j * h) @ psi
    finals, terms = {}, {}
    for platform in ("cpu", "tpu", "cpu"):
        on(platform)
        terms[platform] = _sesolve._term(h)[0]
        solution = hierax.sesolve(h, psi, times, rtol=1e-11, atol=1e-13)
        finals[platform] = np.asarray(solution.final_state)
    assert _sparse_terms(terms["cpu"]) > 0
    assert _sparse_terms(terms["tpu"]) == 0
    for final in finals.values():
        np.testing.assert_allclose(final, exact, atol=1e-9)
    np.testing.assert_allclose(finals["cpu"], finals["tpu"], atol=1e-10)


def test_a_term_is_kept_per_backend(on):
    h = _chain(8)
    on("cpu")
    cpu = _sesolve._term(h)[0]
    assert _sesolve._term(h)[0] is cpu  # kept
    on("tpu")
    tpu = _sesolve._term(h)[0]
    assert tpu is not cpu and _sparse_terms(tpu) == 0
    on("cpu")
    assert _sesolve._term(h)[0] is cpu


def test_large_matrices_are_gathered_on_every_backend():
    # Past n = 4096 a dense product grows as n^2: the TPU keeps the CPU's rule.
    for choices in (_choices.CPU, _choices.TPU):
        assert choices.applies_sparse(8192) == pytest.approx(0.1)
    assert _choices.CPU.applies_sparse(256) == pytest.approx(0.1)
    assert _choices.TPU.applies_sparse(4096) is None


@pytest.mark.parametrize(
    "count, products, n, complex_, cpu, tpu",
    [
        # Measured winners (`_choices`): the open 6-site XXZ chain, n = 64 ...
        (97, 16, 64, False, False, False),
        # ... its 5-site form on the CPU, n = 32 ...
        (80, 14, 32, False, True, True),
        # ... and the Kerr oscillator at n = 30 and 50.
        (13, 8, 30, True, True, True),
        (13, 8, 50, False, True, True),
        # 60 diagonals at n = 64 with 16 products: within the CPU's caches'
        # bound the diagonals pay there, a TPU's products are cheaper.
        (60, 16, 64, False, True, False),
    ],
)
def test_the_lindblad_layout_follows_each_backends_costs(
    count, products, n, complex_, cpu, tpu
):
    assert _choices.CPU.diagonals_pay(count, products, n, complex_) is cpu
    assert _choices.TPU.diagonals_pay(count, products, n, complex_) is tpu


def test_the_default_platform_follows_the_default_device():
    assert _choices.default_platform() == jax.default_backend()
    with jax.default_device(jax.devices("cpu")[0]):
        assert _choices.default_platform() == "cpu"
    assert _choices.backend_choices("gpu") is _choices.CPU  # unmeasured: the CPU's


def test_mesolve_under_each_backends_choices_is_exact(on):
    # An open 4-site chain (n = 16, 4 decaying sites) against expm of its
    # Liouvillian on row-major vec(rho).
    sites = 4
    h = _chain(sites)
    n = h.shape[0]
    lower = np.array([[0, 1], [0, 0]], complex)
    jumps = [
        np.sqrt(0.1)
        * np.kron(np.kron(np.eye(2**k), lower), np.eye(2 ** (sites - k - 1)))
        for k in range(sites)
    ]
    eye = np.eye(n)
    liouvillian = -1j * (np.kron(h, eye) - np.kron(eye, h.T))
    for j in jumps:
        number = j.conj().T @ j
        liouvillian += np.kron(j, j.conj())
        liouvillian -= 0.5 * (np.kron(number, eye) + np.kron(eye, number.T))
    rho = np.zeros_like(h)
    rho[5, 5] = 1.0
    exact = (scipy.linalg.expm(0.5 * liouvillian) @ rho.ravel()).reshape(n, n)
    for platform in ("cpu", "tpu"):
        on(platform)
        solution = hierax.mesolve(
            h, jumps, rho, jnp.array([0.0, 0.5]), rtol=1e-10, atol=1e-12
        )
        np.testing.assert_allclose(solution.final_state, exact, atol=1e-9)


@pytest.mark.parametrize(
    "dtype, tolerance", [(np.complex128, 1e-9), (np.complex64, 2e-5)]
)
def test_a_tpus_dense_step_keeps_the_invariances(on, dtype, tolerance):
    # Under the TPU's choices: H -> H + c I only multiplies the state by
    # e^{-i c t}, an exact zero amplitude (a conserved sector) stays zero, and
    # complex64 keeps its dtype.
    on("tpu")
    h = _chain(8)
    n = h.shape[0]
    # The field is dropped so that the magnetisation is conserved: a ket of one
    # sector never leaves it.
    magnetisation = np.array(
        [sum(1 - 2 * ((k >> s) & 1) for s in range(8)) for k in range(n)]
    )
    h = h - 0.3 * sum(
        np.kron(
            np.kron(np.eye(2**k), np.array([[0, 1], [1, 0]])), np.eye(2 ** (8 - k - 1))
        )
        for k in range(8)
    )
    psi = np.zeros(n, complex)
    psi[0b01010101] = 1.0
    times = np.array([0.0, 0.9], np.float32 if dtype == np.complex64 else np.float64)
    c = 37.5
    rtol = 1e-6 if dtype == np.complex64 else 1e-11
    plain = hierax.sesolve(h, psi.astype(dtype), times, rtol=rtol, atol=rtol * 1e-2)
    shifted = hierax.sesolve(
        h + c * np.eye(n), psi.astype(dtype), times, rtol=rtol, atol=rtol * 1e-2
    )
    assert plain.final_state.dtype == dtype
    exact = scipy.linalg.expm(-0.9j * h) @ psi
    np.testing.assert_allclose(plain.final_state, exact, atol=tolerance)
    np.testing.assert_allclose(
        shifted.final_state, np.exp(-1j * c * 0.9) * exact, atol=tolerance
    )
    other_sector = magnetisation != 0  # the Neel state: magnetisation zero
    assert np.all(np.asarray(plain.final_state)[other_sector] == 0)


def test_floquet_sweeps_are_blocked_by_each_backends_choice(on, monkeypatch):
    """A `floquet` sweep runs in blocks of the backend's size (a TPU's hold the
    whole sweep, the CPU's fit its caches), kept per backend; the same
    quasienergies either way."""
    from hierax._periodic import _floquet

    blocks: list[int] = []
    real = _floquet.in_blocks

    def recording(single, block):
        blocks.append(block)
        return real(single, block)

    monkeypatch.setattr(_floquet, "in_blocks", recording)
    levels = 6
    a = np.diag(np.sqrt(np.arange(1, levels)), 1)
    number = a.T @ a
    h0, drive = number - 0.15 * number @ (number - np.eye(levels)), a + a.T

    def energies(amplitude):
        h = h0 + hierax.Cos(0.9, amplitude=amplitude) * drive
        return hierax.floquet(h, 2 * np.pi / 0.9, rtol=1e-10).quasienergies

    amplitudes = jnp.linspace(0.0, 0.05, 300)
    found = {}
    for platform in ("cpu", "tpu"):
        on(platform)
        found[platform] = np.asarray(jax.jit(jax.vmap(energies))(amplitudes))
    lane = 17 * 2 * levels**2 * 8  # order 16 (x64): the series of one lane
    assert blocks == [
        _choices.CPU.period_block_bytes // lane,
        _choices.TPU.period_block_bytes // lane,
    ]
    assert blocks[0] < 300 <= blocks[1]
    np.testing.assert_allclose(found["cpu"], found["tpu"], atol=1e-10)
