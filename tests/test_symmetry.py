"""Time-reversal symmetry about a time c, H(c + s) = conj(H(c - s)): the signs read
from the time functions' structure against their values at sample times, and
`hierax.floquet`'s half-period solve against the full one-period solve."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hierax
from hierax._periodic._symmetry import is_mirrored, mirror_center, mirror_sign

from .helpers import recorded_returns


TOLERANCE = 4 * float(np.finfo(np.float64).eps)
SX = np.array([[0.0, 1.0], [1.0, 0.0]])
SY = np.array([[0.0, -1j], [1j, 0.0]])
SZ = np.diag([1.0, -1.0])
SP = np.array([[0.0, 1.0], [0.0, 0.0]])
W = 1.7
PERIOD = 2 * np.pi / W
CENTER = PERIOD / 2
SAMPLES = np.array([0.13, 0.71, 1.9, 2.6])


def _relation_holds(function, center, sign):
    """f(c + s) == sign * conj(f(c - s)) at the sample offsets, by evaluation."""
    after = np.array([complex(function(center + s)) for s in SAMPLES])
    before = np.array([complex(function(center - s)) for s in SAMPLES])
    return np.allclose(after, sign * np.conj(before), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    ("function", "center", "sign"),
    [
        (hierax.Cos(W, amplitude=0.4), CENTER, 1),  # a minimum of the cosine
        (hierax.Cos(W, amplitude=0.4), 0.0, 1),
        (hierax.Cos(W, amplitude=0.4), CENTER / 2, -1),  # a zero: odd about it
        (hierax.Cos(W, amplitude=0.4j), CENTER, -1),  # imaginary: conj flips it
        (hierax.Cos(W, amplitude=0.4 + 0.1j), CENTER, 0),
        (hierax.Cos(W, phase=0.3), CENTER, 0),
        (hierax.Sin(W), CENTER, -1),
        (hierax.Sin(W, phase=-np.pi / 2), CENTER, 1),
        (hierax.Gaussian(CENTER, 0.6, 2.0), CENTER, 1),
        (hierax.Gaussian(CENTER + 0.1, 0.6, 2.0), CENTER, 0),
        (hierax.Constant(0.3), 1.234, 1),
        (hierax.Constant(0.3j), 1.234, -1),
        (hierax.Polynomial(np.array([1.0, 2.0])), CENTER, 0),
        (hierax.Exp(-0.5), CENTER, 0),
        (hierax.Exp(1j * W, 0.3), CENTER, 1),  # e^{2 i w c} = e^{2 pi i}
        (hierax.Exp(1j * W, 0.3), CENTER / 2, -1),
        (hierax.Exp(1j * W, 0.3), CENTER / 3, 0),
        (hierax.Exp(0.0, 0.3j), CENTER, -1),
        (hierax.Sin(W) * hierax.Sin(W, amplitude=2.0), CENTER, 1),
        (hierax.Cos(W) * hierax.Sin(W), CENTER, -1),
        (hierax.Cos(W) + hierax.Cos(2 * W, amplitude=0.5), CENTER, 1),
        (hierax.Cos(W) + hierax.Sin(W), CENTER, 0),
    ],
)
def test_mirror_sign_against_the_function_values(function, center, sign):
    assert mirror_sign(function, center, TOLERANCE) == sign
    if sign:
        assert _relation_holds(function, center, sign)
    else:  # neither sign: each relation fails somewhere (nothing symmetric missed)
        assert not _relation_holds(function, center, 1)
        assert not _relation_holds(function, center, -1)


def test_unknown_parameters_are_not_symmetric():
    """A traced frequency or a traced complex amplitude says nothing; a traced
    real amplitude is real whatever its value."""
    out = {}

    @jax.jit
    def signs(frequency, real, complex_amplitude):
        out["frequency"] = mirror_sign(hierax.Cos(frequency), CENTER, TOLERANCE)
        out["real"] = mirror_sign(hierax.Cos(W, amplitude=real), CENTER, TOLERANCE)
        out["complex"] = mirror_sign(
            hierax.Cos(W, amplitude=complex_amplitude), CENTER, TOLERANCE
        )
        return frequency

    signs(W, 0.3, 0.3 + 0j)
    assert out == {"frequency": 0, "real": 1, "complex": 0}


@pytest.mark.parametrize(
    ("hamiltonian", "mirrored"),
    [
        (0.5 * SZ + hierax.Cos(W, amplitude=0.4) * SX, True),
        (0.5 * SZ + hierax.Sin(W, amplitude=0.4) * SY, True),  # odd f, imaginary M
        (0.5 * SZ + hierax.Sin(W, amplitude=0.4) * SX, False),
        (0.5 * SZ + hierax.Cos(W, amplitude=0.4) * SY, False),
        (0.5 * SZ + hierax.Cos(W, 0.3, 0.4) * SX, False),
        (0.5 * SZ + hierax.Exp(1j * W) * SP + hierax.Exp(-1j * W) * SP.T, True),
        (hierax.Cos(W) * (0.5 * SZ + hierax.Cos(2 * W) * SX), True),
        (hierax.Sin(W) * (0.5 * SZ + hierax.Cos(2 * W) * SX), False),
        (0.5 * SZ + hierax.as_operator(lambda t: jnp.cos(W * t) * SX), False),
    ],
)
def test_operators_are_mirrored_term_by_term(hamiltonian, mirrored):
    """The structural answer, and where it is yes, H(c + s) = conj(H(c - s)) by
    evaluation; where it is no, the relation fails (except for the callable, whose
    symmetry is not read)."""
    operator = hierax.as_operator(hamiltonian)
    assert is_mirrored(operator, CENTER, TOLERANCE) == mirrored
    holds = all(
        np.allclose(
            np.asarray(operator(CENTER + s)), np.conj(np.asarray(operator(CENTER - s)))
        )
        for s in SAMPLES
    )
    callable_part = isinstance(operator, hierax.OperatorSum) and any(
        isinstance(p, hierax.CallableOperator) for p in operator.operators
    )
    assert holds == (mirrored or callable_part)


def _decisions(monkeypatch):
    """Where `floquet` found H's mirror centre, call by call: the shift (c - t0) / T
    (0.5: the middle of the period), `None` for the whole period."""
    import hierax._periodic._floquet as module

    return recorded_returns(monkeypatch, module, "_mirror_shift")


# Drives and where their mirror centre lies: the middle of the period (0.5),
# elsewhere (a phase, a sine on a real matrix, a cosine on an imaginary one:
# "shifted"), or nowhere (two tones whose phases share no centre; a cosine on a
# real and on an imaginary matrix).
DRIVES = [
    (hierax.Cos(W, amplitude=0.4) * SX, "middle"),
    (hierax.Sin(W, amplitude=0.3) * SY + hierax.Cos(W, amplitude=0.2) * SX, "middle"),
    (hierax.Cos(W, 0.4, 0.4) * SX, "shifted"),
    (hierax.Sin(W, amplitude=0.4) * SX, "shifted"),
    (hierax.Cos(W, -2.1, 0.3) * SY, "shifted"),
    (hierax.Cos(W, amplitude=0.4) * SX + hierax.Cos(2 * W, 0.7, 0.3) * SZ, None),
    (hierax.Cos(W, amplitude=0.4) * SX + hierax.Cos(W, amplitude=0.3) * SY, None),
]


@pytest.mark.parametrize(("drive", "where"), DRIVES)
@pytest.mark.parametrize("t0", [0.0, 0.37])
def test_floquet_solves_half_a_period_exactly_when_symmetric(
    monkeypatch, drive, where, t0
):
    """The propagator from half a period (U_h^T U_h, carried to t0 where the centre
    is not the period's middle) equals the full one-period solve (no symmetry
    used) to the solve's accuracy; drives without a centre are solved over the
    whole period."""
    hamiltonian = 0.5 * SZ + drive
    eye = jnp.eye(2, dtype=complex)
    span = [t0, t0 + PERIOD]
    full = hierax.sesolve(hamiltonian, eye, span, rtol=1e-13, atol=1e-15).states[-1]
    decisions = _decisions(monkeypatch)
    basis = hierax.floquet(hamiltonian, PERIOD, t0=t0, rtol=1e-12, atol=1e-14)
    [shift] = decisions
    if where is None:
        assert shift is None
    else:
        # The middle of the period from t0 = 0 for the cosine; from t0 = 0.37 it
        # is only for the phase-free drives that the middle moves off a centre.
        assert shift is not None and 0 < shift <= 0.5
        if where == "shifted" or t0 != 0.0:
            assert shift != 0.5
    np.testing.assert_allclose(np.asarray(basis.propagator), full, atol=1e-11)


@pytest.mark.parametrize(("drive", "where"), DRIVES)
def test_mirror_centre_is_a_centre_by_evaluation(drive, where):
    """The centre found lies in (t0, t0 + T/2], and H(c + s) = conj(H(c - s)) there
    by evaluation, from several starts."""
    operator = hierax.as_operator(0.5 * SZ + drive)
    for start in (0.0, 0.37, -5.2, 40 * PERIOD):
        distance = mirror_center(operator, start, PERIOD, TOLERANCE)
        if where is None:
            assert distance is None
            continue
        assert distance is not None and 0 < distance <= PERIOD / 2
        center = start + distance
        for s in SAMPLES:
            np.testing.assert_allclose(
                np.asarray(operator(center + s)),
                np.conj(np.asarray(operator(center - s))),
                atol=1e-12,
            )


def test_symmetry_kept_inside_jit_and_vmap_over_amplitudes_not_over_periods(
    monkeypatch,
):
    """Inside a user's jit and vmap over amplitudes the period is known: half a
    period, equal to the eager solve. A batch of periods is traced: the full
    period, equal to a loop."""
    decisions = _decisions(monkeypatch)

    def energies(amplitude, period):
        h = 0.5 * SZ + hierax.Cos(2 * np.pi / period, amplitude=amplitude) * SX
        return hierax.floquet(h, period, rtol=1e-12, atol=1e-14).quasienergies

    amplitudes = jnp.array([0.1, 0.4])
    by_amplitude = jax.jit(jax.vmap(lambda a: energies(a, PERIOD)))(amplitudes)
    assert decisions == [0.5]
    periods = jnp.array([PERIOD, 1.1 * PERIOD])
    by_period = jax.jit(jax.vmap(lambda p: energies(0.4, p)))(periods)
    assert decisions == [0.5, None]
    for k in range(2):
        np.testing.assert_allclose(
            np.asarray(by_amplitude[k]),
            np.asarray(energies(float(amplitudes[k]), PERIOD)),
            atol=1e-12,
        )
        loop = energies(0.4, float(periods[k]))
        np.testing.assert_allclose(
            np.asarray(by_period[k]), np.asarray(loop), atol=1e-11
        )


def test_half_span_identity_for_a_rotating_pair():
    """H = sz / 2 + e^{iwt} s+ + e^{-iwt} s- (Hermitian, its terms not) is mirrored
    about T / 2, and U(T, 0) = U_h^T U_h with U_h = U(T / 2, 0), both by
    `sesolve`."""
    hamiltonian = (
        0.5 * SZ + hierax.Exp(1j * W, 0.4) * SP + hierax.Exp(-1j * W, 0.4) * SP.T
    )
    assert is_mirrored(hierax.as_operator(hamiltonian), CENTER, TOLERANCE)

    def propagator(end):
        eye = jnp.eye(2, dtype=complex)
        solution = hierax.sesolve(hamiltonian, eye, [0.0, end], rtol=1e-13, atol=1e-15)
        return np.asarray(solution.states[-1])

    half = propagator(PERIOD / 2)
    np.testing.assert_allclose(half.T @ half, propagator(PERIOD), atol=1e-12)


def test_offset_and_a_late_start_keep_the_half_period(monkeypatch):
    """H + 5 I, started 1000 periods later: still symmetric about the middle of the
    period (half a period solved), and the quasienergies are those of H at t0 = 0
    shifted by 5 (folded), as the offset and the periodicity say."""
    decisions = _decisions(monkeypatch)
    hamiltonian = 0.5 * SZ + hierax.Cos(W, amplitude=0.4) * SX
    base = hierax.floquet(hamiltonian, PERIOD, rtol=1e-12, atol=1e-14)
    late = hierax.floquet(
        hamiltonian + 5.0 * np.eye(2), PERIOD, t0=1000 * PERIOD, rtol=1e-12, atol=1e-14
    )
    assert decisions == [0.5, 0.5]
    shifted = np.mod(np.asarray(base.quasienergies) + 5.0 + W / 2, W) - W / 2
    np.testing.assert_allclose(
        np.sort(np.asarray(late.quasienergies)), np.sort(shifted), atol=1e-9
    )
