"""The vec(rho) layout of `hierax.mesolve` on the superoperators' nonzero diagonals
at sizes above two dozen levels (issue 52): the layout chosen, its solves against
scipy on the dense Liouvillian (`expm` for a constant generator, DOP853 for a
driven one), in complex128 and complex64, a gradient through it against central
differences and against the structured kernel (which traced matrices take), and
the memory of its assembly."""

import functools
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.sparse
import scipy.special
from scipy.integrate import solve_ivp

import hierax
from hierax import LindbladTerm, mesolve
from hierax._kernels.density import StructuredParts, VectorisedParts
from hierax._kernels.propagator import Diagonals
from hierax._solvers._density import (
    density_step_terms,
    generic_density_terms,
    known_density_parts,
)


DETUNING, KERR, DRIVE, OMEGA = -0.3, 0.02, 0.4, 0.9
RATES = (0.1, 0.05, 0.02)


def _layout(hamiltonian, jumps):
    term = LindbladTerm(hamiltonian, jumps)
    parts = known_density_parts(term.hamiltonian, term.jump_operators, jnp.complex128)
    if isinstance(parts, StructuredParts):
        return "structured"
    assert isinstance(parts, VectorisedParts)
    return "diagonals" if isinstance(parts.stacked, Diagonals) else "dense"


def _ladder(n):
    return np.diag(np.sqrt(np.arange(1.0, n)), 1).astype(complex)


def _oscillator(n, drive=DRIVE):
    """A Kerr oscillator driven as cos(w t) (a + a^dagger), with one- and
    two-photon loss and dephasing; its matrices (H0, H1, jump operators) and a
    coherent-like initial state with every entry of rho nonzero."""
    a = _ladder(n)
    ad = a.conj().T
    h0 = DETUNING * ad @ a + 0.5 * KERR * ad @ ad @ a @ a
    h1 = drive * (a + ad)
    k1, k2, kphi = RATES
    jumps = [np.sqrt(k1) * a, np.sqrt(k2) * a @ a, np.sqrt(kphi) * ad @ a]
    psi = np.exp(-0.3 * np.arange(n)) * np.exp(0.7j * np.arange(n))
    rho = np.outer(psi, psi.conj()) / np.vdot(psi, psi)
    return h0, h1, jumps, rho


def _liouvillian(hamiltonian, jumps):
    """The dense generator on row-major vec(rho): vec(A rho B) = (A kron B^T)."""
    n = hamiltonian.shape[0]
    eye = np.eye(n)
    out = -1j * (np.kron(hamiltonian, eye) - np.kron(eye, hamiltonian.T))
    for jump in jumps:
        number = jump.conj().T @ jump
        out = out + np.kron(jump, jump.conj())
        out = out - 0.5 * (np.kron(number, eye) + np.kron(eye, number.T))
    return out


def _error(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


@pytest.mark.parametrize("n", [9, 16, 24, 25, 30, 32, 40, 50, 64])
def test_few_diagonals_take_the_diagonal_layout_at_any_size(n):
    """The driven oscillator's superoperators have 13 nonzero diagonals whatever n:
    vec(rho) on diagonals, below and above the old limit of 24 levels."""
    h0, h1, jumps, _ = _oscillator(n)
    assert _layout(h0 + hierax.Cos(OMEGA) * h1, jumps) == "diagonals"


@pytest.mark.parametrize("n", [12, 25, 40])
def test_many_diagonals_keep_the_structured_kernel(n):
    """A dense Hermitian H has 2n - 1 diagonals, its commutator's superoperator
    about 4n^2: the structured kernel's products."""
    rng = np.random.default_rng(0)
    m = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
    a = _ladder(n)
    assert _layout((m + m.conj().T) / 4, [np.sqrt(0.1) * a]) == "structured"


def test_the_choice_follows_the_band_width_at_a_fixed_size():
    """At n = 32, a Hamiltonian of bandwidth w and a drive, two jump operators:
    diagonals for a narrow band, the structured kernel's products for a wide one,
    with one switch between."""
    n = 32
    rng = np.random.default_rng(2)
    a = _ladder(n)
    layouts = []
    for width in range(1, 9):
        m = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
        m = np.triu(np.tril(m, width), -width)
        hamiltonian = (m + m.conj().T) / 4 + hierax.Cos(1.0) * (a + a.T)
        layouts.append(_layout(hamiltonian, [np.sqrt(0.1) * a, 0.1 * a.T @ a]))
    assert layouts[0] == "diagonals" and layouts[-1] == "structured"
    switches = sum(x != y for x, y in zip(layouts, layouts[1:]))
    assert switches == 1, layouts


_EXPM_TIMES = (0.0, 0.7, 1.5)


@functools.cache
def _expm_reference(n: int) -> np.ndarray:
    """rho(t) at `_EXPM_TIMES` for the oscillator of n levels with the drive held
    constant, by `scipy.linalg.expm` of the dense Liouvillian (n^2 x n^2): computed
    once per process for both dtypes (read-only, so that no test changes it)."""
    h0, h1, jumps, rho = _oscillator(n)
    generator = _liouvillian(h0 + h1, jumps)
    reference = np.stack(
        [
            (scipy.linalg.expm(generator * t) @ rho.reshape(-1)).reshape(n, n)
            for t in _EXPM_TIMES
        ]
    )
    reference.flags.writeable = False
    return reference


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_constant_generator_against_expm(dtype):
    """n = 30, the drive held constant: against `scipy.linalg.expm` of the dense
    Liouvillian."""
    n = 30
    h0, h1, jumps, rho = _oscillator(n)
    hamiltonian = h0 + h1
    assert _layout(hamiltonian, jumps) == "diagonals"
    times = np.array(_EXPM_TIMES)
    _check_in(dtype, hamiltonian, jumps, rho, times, _expm_reference(n))


def _check_in(dtype, hamiltonian, jumps, rho, times, reference) -> None:
    """mesolve in `dtype` (complex64 at rtol 1e-5, complex128 at 1e-10) keeps the
    dtype and lands within 1e-5 / 1e-9 of `reference`."""
    low = dtype == np.complex64
    rtol = 1e-5 if low else 1e-10
    ours = mesolve(
        hamiltonian,
        jumps,
        rho.astype(dtype),
        times.astype(np.float32 if low else np.float64),
        rtol=rtol,
        atol=rtol * 1e-2,
    )
    assert ours.states.dtype == dtype
    assert _error(ours.states, reference) <= (1e-5 if low else 1e-9)


@pytest.mark.parametrize(
    "n, dtype", [(25, np.complex128), (40, np.complex128), (32, np.complex64)]
)
def test_driven_oscillator_against_dop853(n, dtype):
    """A time-dependent drive, one- and two-photon loss and dephasing, against
    scipy's DOP853 at rtol 1e-12 on the dense Liouvillian (held sparse for the
    products)."""
    h0, h1, jumps, rho = _oscillator(n)
    hamiltonian = h0 + hierax.Cos(OMEGA) * h1
    assert _layout(hamiltonian, jumps) == "diagonals"
    fixed = scipy.sparse.csr_matrix(_liouvillian(h0, jumps))
    driven = scipy.sparse.csr_matrix(_liouvillian(h1, []))
    times = np.array([0.0, 0.6, 1.2])
    solved = solve_ivp(
        lambda t, v: fixed @ v + np.cos(OMEGA * t) * (driven @ v),
        (times[0], times[-1]),
        rho.reshape(-1),
        method="DOP853",
        rtol=1e-12,
        atol=1e-14,
        t_eval=times,
    )
    reference = solved.y.T.reshape(-1, n, n)
    _check_in(dtype, hamiltonian, jumps, rho, times, reference)


def test_step_series_at_64_levels_equal_the_generic_kernel():
    """One backward step's series at n = 64 (the superoperators' dense real
    embeddings would hold 4n^4 = 6.7e7 entries each) on diagonals, against the
    generic kernel's n x n products; and the assembly's memory stays far below one
    n^4 array (measured: 2.9 MiB, 6.6 MiB at n = 96)."""
    n = 64
    h0, h1, jumps, rho = _oscillator(n)
    term = LindbladTerm(h0 + hierax.Cos(OMEGA) * h1, jumps)
    operators = (term.hamiltonian, term.jump_operators)
    tracemalloc.start()
    parts = known_density_parts(*operators, jnp.complex128)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert isinstance(parts, VectorisedParts)
    assert isinstance(parts.stacked, Diagonals)
    assert peak < n**4  # bytes: 16 MiB
    t, step, order = jnp.asarray(0.4), jnp.asarray(-0.05), 16
    known = jax.jit(
        lambda term, parts: density_step_terms(
            term.hamiltonian,
            term.jump_operators,
            t,
            step,
            jnp.asarray(rho),
            order,
            parts,
        )
    )(term, parts)
    generic = jax.jit(
        lambda term: generic_density_terms(
            term.hamiltonian, term.jump_operators, t, step, jnp.asarray(rho), order
        )
    )(term)
    size = float(np.max(np.abs(generic)))
    assert _error(known, generic) <= 1e-14 * size


def test_gradient_through_the_diagonal_layout():
    """n = 25: the gradient of a population with respect to the drive amplitude
    (a traced constant of known matrices: the diagonal layout is kept) against a
    central difference, and against the gradient with the drive's matrix itself
    traced (the structured kernel, assembled in the program)."""
    n = 25
    h0, h1, jumps, rho = _oscillator(n, drive=1.0)
    times = np.array([0.0, 1.0])
    assert _layout(h0 + 0.4 * hierax.as_operator(h1), jumps) == "diagonals"

    def population(amplitude, traced_matrix=False):
        drive = jnp.asarray(h1) * amplitude if traced_matrix else h1
        coefficient = 1.0 if traced_matrix else amplitude
        hamiltonian = h0 + coefficient * hierax.Cos(OMEGA) * hierax.as_operator(drive)
        final = mesolve(hamiltonian, jumps, rho, times, rtol=1e-11, atol=1e-13)
        return jnp.real(final.final_state[1, 1])

    value, slope = jax.jit(jax.value_and_grad(population))(0.4)
    step = 1e-5
    difference = (population(0.4 + step) - population(0.4 - step)) / (2 * step)
    assert float(slope) == pytest.approx(float(difference), rel=1e-6)
    structured = jax.jit(jax.value_and_grad(lambda x: population(x, True)))(0.4)
    assert abs(float(value) - float(structured[0])) <= 1e-10
    assert float(slope) == pytest.approx(float(structured[1]), rel=1e-8)


def test_diagonal_layout_invariances_and_zeros():
    """On the diagonal layout (n = 30): a shift H -> H + cI leaves rho unchanged
    (it drops out of the commutator); with H exactly zero and one jump a, the
    populations decay in closed form, p_k(t) = sum_{m >= k} C(m, k) e^{-kappa k t}
    (1 - e^{-kappa t})^{m-k} p_m(0), and coherences that start at exact zero stay
    exactly zero."""
    n = 30
    h0, h1, jumps, rho = _oscillator(n)
    hamiltonian = h0 + h1
    times = np.array([0.0, 0.8])
    shifted = hamiltonian + 37.5 * np.eye(n)
    assert _layout(hamiltonian, jumps) == _layout(shifted, jumps) == "diagonals"
    base = mesolve(hamiltonian, jumps, rho, times, rtol=1e-10, atol=1e-12)
    moved = mesolve(shifted, jumps, rho, times, rtol=1e-10, atol=1e-12)
    assert _error(moved.states, base.states) <= 1e-9

    kappa = RATES[0]
    a = _ladder(n)
    populations = np.exp(-0.4 * np.arange(n))
    populations /= populations.sum()
    start = np.diag(populations).astype(complex)
    zero = np.zeros((n, n), complex)
    assert _layout(zero, [np.sqrt(kappa) * a]) == "diagonals"
    out = mesolve(zero, [np.sqrt(kappa) * a], start, times, rtol=1e-10, atol=1e-14)
    final = np.asarray(out.states[-1])
    t = times[-1]
    stay, leave = np.exp(-kappa * t), 1 - np.exp(-kappa * t)
    expected = [
        sum(
            scipy.special.comb(m, k) * stay**k * leave ** (m - k) * populations[m]
            for m in range(k, n)
        )
        for k in range(n)
    ]
    np.testing.assert_allclose(np.real(np.diag(final)), expected, rtol=1e-8, atol=1e-13)
    assert np.all(final[~np.eye(n, dtype=bool)] == 0)
