"""The sorting network and the running counts by products that merge Pauli
strings where a backend chooses them (`BackendChoices.merge_networks`, the TPU's):
the same permutation as NumPy's stable lexicographic sort, the same counts as
NumPy's cumulative sum, and a Pauli computation under the TPU's choices equal to
the dense one (the suite has no TPU: the backend is set through the seam
`_choices.default_platform`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hierax
from hierax._core import _cache, _choices
from hierax._operators._pauli import _growth
from hierax._operators._pauli._compress import compress, sort_order
from hierax._operators._pauli._counting import running_count
from hierax._operators._pauli._merging import merged_overlaps
from hierax._operators._pauli._sorting import network_order

from .helpers import compile_count, dense_lanczos


def _numpy_order(keys: list[np.ndarray]) -> np.ndarray:
    """NumPy's stable lexicographic sort, the first key most significant."""
    return np.lexsort(keys[::-1])


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 100, 1025])
@pytest.mark.parametrize("n_keys", [1, 3])
def test_the_network_sorts_as_numpy_stably(m, n_keys):
    """Many ties (few distinct values), the largest key value (the padding's), and
    lengths on and off a power of two: the permutation is NumPy's, ties in index
    order."""
    rng = np.random.default_rng(m * 10 + n_keys)
    keys = [
        rng.choice(np.array([0, 1, 7, 0xFFFFFFFF], np.uint32), size=m)
        for _ in range(n_keys)
    ]
    order = jax.jit(network_order)([jnp.asarray(k) for k in keys])
    assert order.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(order), _numpy_order(keys))


def test_the_network_sorts_all_largest_keys_before_the_padding():
    """Every key the largest value: the entries stay in index order, none swapped
    with the padding that fills the length up to a power of two."""
    keys = [jnp.full(6, 0xFFFFFFFF, jnp.uint32)] * 2
    np.testing.assert_array_equal(np.asarray(network_order(keys)), np.arange(6))


@pytest.mark.parametrize("m", [1, 127, 128, 129, 40000])
@pytest.mark.parametrize("share", [0.0, 0.3, 1.0])
def test_running_counts_by_products_are_numpys(m, share):
    """One, two and three levels of blocks (40000 > 128^2), no flag, some, and
    every one (the largest counts): exactly NumPy's cumulative sum, in int32."""
    flags = np.random.default_rng(m).random(m) < share
    for by_products in (True, False):
        counts = jax.jit(running_count, static_argnums=1)(
            jnp.asarray(flags), by_products
        )
        assert counts.dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(counts), np.cumsum(flags))


@pytest.mark.parametrize("n_qubits", [5, 40])
@pytest.mark.parametrize("x64", [True, False])
def test_string_orders_agree_with_and_without_the_network(n_qubits, x64):
    """`sort_order` by the network and by XLA's sorts (in x64 the radix passes, in
    x32 the comparator sort), one and two words a string: both NumPy's stable
    order of (x words, z words)."""
    words = (n_qubits + 31) // 32
    rng = np.random.default_rng(n_qubits)
    top = 1 << min(n_qubits, 32)
    pool_x = rng.integers(0, top, size=(40, words), dtype=np.uint64).astype(np.uint32)
    pool_z = rng.integers(0, top, size=(40, words), dtype=np.uint64).astype(np.uint32)
    pick = rng.integers(0, 40, size=300)  # repeated strings: ties
    x, z = pool_x[pick], pool_z[pick]
    keys = [x[:, w] for w in range(words)] + [z[:, w] for w in range(words)]
    expected = _numpy_order(keys)
    try:
        jax.config.update("jax_enable_x64", x64)
        for network in (True, False):
            order = jax.jit(sort_order, static_argnums=(2, 3))(
                jnp.asarray(x), jnp.asarray(z), n_qubits, network
            )
            np.testing.assert_array_equal(np.asarray(order), expected)
    finally:
        jax.config.update("jax_enable_x64", True)


def test_compress_is_the_same_by_either_sort(monkeypatch):
    """The merge that every Pauli operation ends in, traced under the TPU's choices
    (no sort and no scatter-add in its program: equal strings summed by doubling)
    and the CPU's (a sort, a segment sum): the same strings, counts and removed
    weight, the coefficients equal to rounding (summed in another order)."""
    rng = np.random.default_rng(3)
    pick = rng.integers(0, 50, size=500)
    x = rng.integers(0, 1 << 12, size=(50, 1), dtype=np.uint32)[pick]
    z = rng.integers(0, 1 << 12, size=(50, 1), dtype=np.uint32)[pick]
    c = rng.normal(size=500) + 1j * rng.normal(size=500)
    results = []
    for platform in ("tpu", "cpu"):
        monkeypatch.setattr(_choices, "default_platform", lambda p=platform: p)
        merged = jax.jit(lambda x, z, c: compress(x, z, c, 12, 30))  # traced anew
        program = merged.lower(x, z, c).as_text()
        assert ("stablehlo.sort" in program) == (platform == "cpu")
        assert ("reduce_window" in program) == (platform == "cpu")  # cumsum
        # One scatter of the kept rows on the TPU; on the CPU the segment sum's
        # and one each of the strings and the coefficients.
        assert program.count('"stablehlo.scatter"') == (3 if platform == "cpu" else 1)
        results.append(merged(x, z, c))
    (tx, tz, tc, tn, td), (cx, cz, cc, cn, cd) = results
    for a, b in [(tx, cx), (tz, cz), (tn, cn)]:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(np.asarray(tc), np.asarray(cc), rtol=1e-14)
    np.testing.assert_allclose(float(td), float(cd), rtol=1e-13)


@pytest.fixture
def on_tpu(monkeypatch):
    """The TPU's choices for what is traced from then on."""
    monkeypatch.setattr(_choices, "default_platform", lambda: "tpu")
    yield
    _cache.clear()


def test_lanczos_under_the_tpus_choices_against_dense(on_tpu):
    """`lanczos` and `moments` with the strings sorted by the network (a capacity no
    other test uses, so the programs are traced here, under the TPU's choices)
    against |L^k O|^2 from dense matrices."""
    assert _choices.backend_choices().merge_networks
    h = hierax.PauliSum.ising_chain(4, 1.0, 0.9, 0.4)
    o = hierax.PauliSum.from_strings(["ZIII", "IXII"], [1.0, 0.5])
    dh, do = np.asarray(h.todense()), np.asarray(o.todense())
    before = compile_count()
    mu, lost = hierax.moments(h, o, 6, capacity=4**4 - 3)
    assert compile_count() > before  # traced and compiled here
    a, norm2 = do, np.trace(do @ do).real
    for k in range(1, 7):
        a = dh @ a - a @ dh
        expected = np.trace(a.conj().T @ a).real / norm2
        np.testing.assert_allclose(float(mu[k]), expected, rtol=1e-12)
    assert np.all(np.asarray(lost) == 0)


def test_lanczos_on_the_tpus_working_sizes(monkeypatch):
    """The TPU's working sizes of a Pauli step (capacity / 16^k: two compiled
    branches at capacity 4096 where the CPU's capacity / 4^k have three), with the
    Krylov operators growing from the smaller one into the larger (past 256
    strings from step 14): the same coefficients as dense Lanczos, exact to
    rounding."""
    sizes = {}
    for platform in ("cpu", "tpu"):
        monkeypatch.setattr(_choices, "default_platform", lambda p=platform: p)
        sizes[platform] = _growth._sizes(4096)
    assert sizes == {"cpu": [256, 1024, 4096], "tpu": [256, 4096]}
    _cache.clear()
    h = hierax.PauliSum.ising_chain(5, 1.0, 1.05, 0.5)
    o = hierax.PauliSum.from_strings(["ZIIII"], [1.0])
    result = hierax.lanczos(h, o, 16, capacity=4096)  # under the TPU's choices
    expected = dense_lanczos(np.asarray(h.todense()), np.asarray(o.todense()), 16)
    np.testing.assert_allclose(np.asarray(result.b), expected, rtol=1e-12)
    assert np.all(np.asarray(result.dropped) == 0)
    _cache.clear()


def _sorted_sums(rng, rows: int, m: int, pool: np.ndarray, words: int, real: bool):
    """`rows` sums of `m` slots, each its first `count` slots distinct strings of
    `pool` in sorted order (as `compress` leaves them), padding (identity, zero)
    after; counts from 0 to full."""
    x = np.zeros((rows, m, words), np.uint32)
    z = np.zeros((rows, m, words), np.uint32)
    c = np.zeros((rows, m), float if real else complex)
    counts = rng.integers(0, m + 1, rows)
    if rows > 1:
        counts[:2] = (0, m)
    for r, k in enumerate(counts):
        chosen = pool[np.sort(rng.choice(len(pool), k, replace=False))]
        x[r, :k], z[r, :k] = chosen[:, :words], chosen[:, words:]
        c[r, :k] = rng.normal(size=k) + (0 if real else 1j * rng.normal(size=k))
    return x, z, c, counts.astype(np.int32)


@pytest.mark.parametrize("real", [False, True])
@pytest.mark.parametrize("m, words", [(13, 1), (16, 2)])
def test_overlaps_by_merging_against_a_dictionary(real, m, words):
    """The inner products of sorted sums by the merging network (`_merging`, the
    TPU's way): each row against a sum A, from a small pool of strings (many
    shared, the identity among them, which is also the padding's string), empty
    and full sums, lengths on and off a power of two, two words a mask; against
    sums over a dictionary of A's strings."""
    rng = np.random.default_rng(m + words + real)
    pool = rng.integers(0, 4, size=(60, 2 * words)).astype(np.uint32)
    pool[0] = 0  # the identity
    pool = np.unique(pool, axis=0)  # sorted lexicographically: x words, z words
    assert len(pool) >= m
    merged = jax.jit(merged_overlaps)
    for _ in range(8):
        x, z, c, counts = _sorted_sums(rng, 6, m, pool, words, real)
        ax, az, ac, an = (a[0] for a in _sorted_sums(rng, 1, m, pool, words, real))
        got = merged(x, z, c, counts, ax, az, ac, an)
        assert got.dtype == c.dtype
        a = {(tuple(ax[i]), tuple(az[i])): ac[i] for i in range(an)}
        expected = [
            sum(
                np.conj(c[r, i]) * a.get((tuple(x[r, i]), tuple(z[r, i])), 0)
                for i in range(counts[r])
            )
            for r in range(len(counts))
        ]
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("reorthogonalize", [False, True])
def test_lanczos_overlaps_the_same_by_merging_and_by_lookups(
    monkeypatch, reorthogonalize
):
    """`lanczos`' Krylov overlaps (its loss-of-orthogonality diagnostic, and the
    components reorthogonalisation removes) by merging (the TPU's choice) and by
    binary searches (the CPU's), with room for every string: the same
    coefficients and diagnostics to rounding."""
    h = hierax.PauliSum.ising_chain(5, 1.0, 1.05, 0.5)
    o = hierax.PauliSum.from_strings(["ZIIII"], [1.0])
    results = {}
    for platform in ("cpu", "tpu"):
        monkeypatch.setattr(_choices, "default_platform", lambda p=platform: p)
        _cache.clear()
        results[platform] = hierax.lanczos(
            h, o, 10, capacity=4**5 - 1, reorthogonalize=reorthogonalize
        )
    cpu, tpu = results["cpu"], results["tpu"]
    np.testing.assert_allclose(np.asarray(tpu.b), np.asarray(cpu.b), rtol=1e-13)
    assert np.all(np.asarray(tpu.dropped) == 0)
    np.testing.assert_allclose(
        np.asarray(tpu.orthogonality), np.asarray(cpu.orthogonality), atol=1e-14
    )
    assert np.max(np.asarray(tpu.orthogonality)) < 1e-13
    _cache.clear()
