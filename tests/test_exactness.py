"""Exact at every scale and every edge: offsets, spectators, lab-frame and SI-unit
energies, far tails, exact zeros and their gradients, float32, bad input.

Every level is compared against an oracle independent of hierax: the SymPy + mpmath
direct recursion at 30 digits (`helpers.sympy_levels`), closed forms, or central
finite differences for gradients. Relative error per level is
max-norm-free Frobenius: ||got - want|| / ||want||.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import hierax

from .helpers import (
    SIGMA_X,
    SIGMA_Y,
    SIGMA_Z,
    fresh_output,
    fresh_script,
    mp_relative_errors,
    mp_to_numpy,
    relative_error,
    sympy_levels,
    t_sym,
)


I2 = jnp.eye(2)
SX, SY = sp.Matrix([[0, 1], [1, 0]]), sp.Matrix([[0, -sp.I], [sp.I, 0]])


@pytest.fixture(scope="module")
def seed_reference():
    """X_0..X_30 of the seed at t = 1 (30 digits)."""
    return sympy_levels([(sp.cos(t_sym), SY)], [(sp.Integer(1), SX)], 1, 30)


def _per_level(got, reference):
    return mp_relative_errors(np.asarray(got), reference)


def _check_estimate(estimate, observed, dtype: type = np.float64):
    """The error estimate is never below the observed error, and within 1000x of
    max(observed, 10 eps)."""
    estimate = np.asarray(estimate)
    floor = 10 * np.finfo(dtype).eps
    assert estimate.shape == observed.shape
    assert np.all(estimate >= observed), (estimate, observed)
    assert np.all(estimate <= 1000 * np.maximum(observed, floor)), (estimate, observed)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_powers_of_two_are_exact(dtype):
    """The scales carried with the levels are exact powers of two (`jnp.exp2` is
    off by up to 50 ulp on a CPU), zero below the normal range and inf above it."""
    from hierax._data._series import exact_exp2

    info = np.finfo(dtype)
    e = np.arange(info.minexp - 60, info.maxexp + 60).astype(dtype)
    got = np.asarray(jax.jit(exact_exp2)(jnp.asarray(e)))
    with np.errstate(over="ignore"):
        want = np.ldexp(np.ones((), dtype), e.astype(int))
    normal = (e >= info.minexp) & (e < info.maxexp)
    np.testing.assert_array_equal(got[normal], want[normal])
    assert np.all(got[e < info.minexp] <= want[e < info.minexp])
    assert np.all(np.isposinf(got[e >= info.maxexp]))
    assert got.dtype == dtype


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_binades_are_read_off_the_bits(dtype):
    """`binade(v)`: the power of two p = 2^e with p <= v < 2p, against NumPy's
    `frexp`, for normal values across the whole range and at powers of two."""
    from hierax._data._series import binade

    info = np.finfo(dtype)
    rng = np.random.default_rng(3)
    v = np.concatenate(
        [
            np.ldexp(dtype(1), np.arange(info.minexp, info.maxexp, 7)),
            np.exp(rng.uniform(np.log(info.tiny), np.log(info.max), 200)),
            np.array([info.tiny, info.max, 1.0, 1.5, np.nextafter(2.0, 0.0)]),
        ]
    ).astype(dtype)
    power, e = jax.jit(binade)(jnp.asarray(v))
    _, exponent = np.frexp(v)  # v = f 2^exponent, f in [0.5, 1)
    np.testing.assert_array_equal(np.asarray(e), (exponent - 1).astype(dtype))
    np.testing.assert_array_equal(
        np.asarray(power), np.ldexp(np.ones_like(v), exponent - 1)
    )
    assert np.all(np.asarray(power) <= v) and np.all(v / 2 < np.asarray(power))


def test_unrolled_hermite_terms_are_the_looped_ones():
    """A `Gaussian`'s Hermite recurrence unrolled (a TPU's choice,
    `BackendChoices.unroll_scalar_series`) gives the loop's terms to rounding, at
    small and large x and steps, and both match mp."""
    from hierax._time._time_functions import _hermite_terms

    order = 20
    for x, c in ((0.3, 0.7), (-4.0, 2.5), (900.0, 1e-3), (0.0, 40.0)):
        args = (jnp.asarray(x), jnp.asarray(c), order)
        looped = [np.asarray(a) for a in _hermite_terms(*args)]
        unrolled = [np.asarray(a) for a in _hermite_terms(*args, unroll=True)]
        np.testing.assert_array_equal(unrolled[1], looped[1])  # exact exponents
        np.testing.assert_allclose(unrolled[0], looped[0], rtol=1e-14, atol=0)
        for j in (1, 7, order):
            he = mp.hermite(j, mp.mpf(x) / mp.sqrt(2)) / mp.mpf(2) ** (mp.mpf(j) / 2)
            want = (-1) ** j * he * mp.mpf(c) ** j / mp.factorial(j)
            got = mp.mpf(float(unrolled[0][j])) * 2 ** int(unrolled[1][j])
            assert abs(got - want) <= 1e-12 * abs(want), (x, c, j)


def test_eager_call_and_user_jit_agree(seed_reference):
    """The eager call of a small hierarchy (`hierax._core._jit`'s direct path) and
    the same call inside a user's `jax.jit` (inlined into the user's program) are exact
    against the oracle and agree to rounding."""
    h = hierax.HeisenbergHierarchy(hierax.Cos() * SIGMA_Y, SIGMA_X, 12)
    eager = np.asarray(h(1.0))
    jitted = np.asarray(jax.jit(lambda h, t: h(t))(h, 1.0))
    reference = seed_reference[:13]
    assert np.all(_per_level(eager, reference) <= 1e-14)
    assert np.all(_per_level(jitted, reference) <= 1e-14)
    np.testing.assert_allclose(eager, jitted, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("offset", [1e2, 1e4, 1e6])
def test_offset_changes_nothing(offset, seed_reference):
    """H + cI has the same hierarchy as H: exact to rounding at every level."""
    h = hierax.HeisenbergHierarchy(hierax.Cos() * SIGMA_Y + offset * I2, SIGMA_X, 30)
    errors = _per_level(h(1.0), seed_reference)
    assert np.all(errors[:13] <= 1e-11) and np.all(errors <= 1e-9), errors
    _check_estimate(h.error_estimate(1.0), errors)


@pytest.mark.parametrize("offset", [1e2, 1e3])
def test_offset_inside_the_constant_matrix_of_a_qutrit(offset):
    """A 3-level system whose constant part carries the offset in the same matrix
    (the input itself still holds the digits for c <= 1e3), and also as a separate
    term of 1e6."""
    h0 = sp.diag(sp.Rational(3, 10), -sp.Rational(1, 5), sp.Rational(1, 2))
    h1 = sp.Matrix(
        [[0, 1, sp.Rational(1, 5)], [1, 0, sp.I], [sp.Rational(1, 5), -sp.I, 0]]
    )
    x = sp.Matrix([[0, 1, 0], [1, 0, 1], [0, 1, 0]])
    cos = sp.cos(sp.Rational(13, 10) * t_sym)
    reference = sympy_levels(
        [(sp.Integer(1), h0), (cos, h1)], [(sp.Integer(1), x)], sp.Rational(3, 5), 12
    )
    as_np = lambda m: jnp.asarray(np.array(m.evalf(20).tolist(), dtype=complex))  # noqa: E731
    shifted = as_np(h0) + offset * jnp.eye(3)
    for hamiltonian in (
        shifted + hierax.Cos(1.3) * as_np(h1),
        as_np(h0) + hierax.Cos(1.3) * as_np(h1) + 1e6 * jnp.eye(3),
    ):
        levels = hierax.HeisenbergHierarchy(hamiltonian, as_np(x), 12)(0.6)
        errors = _per_level(levels, reference)
        assert np.all(errors <= 1e-11), errors


@pytest.mark.parametrize("detuning", [10.0, 100.0, 1000.0])
def test_far_detuned_spectator_costs_no_digits(detuning, seed_reference):
    """H = cos(t) sy (x) 1 + w 1 (x) sz, X_0 = sx (x) 1: the levels are those of the
    seed, (x) 1."""
    hamiltonian = hierax.Cos() * jnp.kron(SIGMA_Y, I2) + detuning * jnp.kron(
        I2, SIGMA_Z
    )
    h = hierax.HeisenbergHierarchy(hamiltonian, jnp.kron(SIGMA_X, I2), 30)
    reference = [
        mp.matrix(np.kron(np.array(m.tolist(), dtype=object), np.eye(2)).tolist())
        for m in seed_reference
    ]
    errors = _per_level(h(1.0), reference)
    assert np.all(errors[:13] <= 1e-11) and np.all(errors <= 1e-9), errors
    _check_estimate(h.error_estimate(1.0), errors)


def _ladder(levels: int) -> sp.Matrix:
    a = sp.zeros(levels)
    for i in range(1, levels):
        a[i - 1, i] = sp.sqrt(i)
    return a


def _kron(a: sp.Matrix, b: sp.Matrix) -> sp.Matrix:
    return sp.Matrix(sp.kronecker_product(a, b))


def test_lab_frame_transmon_and_resonator():
    """A transmon (3 levels, 5.0 GHz, -0.3 GHz anharmonicity) coupled by 10 MHz to
    a 5.3 GHz mode (2 levels), driven resonantly at 20 MHz, time in ns, in the lab
    frame: X_0 = the transmon's lowering operator (not Hermitian)."""
    two_pi = 2 * sp.pi
    b, c = _ladder(3), _ladder(2)
    b3, c2 = sp.eye(3), sp.eye(2)
    nb = b.T * b
    h_static = (
        two_pi * 5 * _kron(nb, c2)
        + two_pi * sp.Rational(-3, 20) * _kron(nb * (nb - b3), c2)
        + two_pi * sp.Rational(53, 10) * _kron(b3, c.T * c)
        + two_pi * sp.Rational(1, 100) * (_kron(b.T, c) + _kron(b, c.T))
    )
    drive = _kron(b + b.T, c2)
    amplitude = two_pi * sp.Rational(2, 100)
    h_terms = [
        (sp.Integer(1), h_static),
        (amplitude * sp.cos(two_pi * 5 * t_sym), drive),
    ]
    x = _kron(b, c2)
    t0 = sp.Rational(37, 10)
    reference = sympy_levels(h_terms, [(sp.Integer(1), x)], t0, 12)
    as_np = lambda m: jnp.asarray(np.array(m.evalf(25).tolist(), dtype=complex))  # noqa: E731
    hamiltonian = as_np(h_static) + hierax.Cos(
        float(two_pi * 5), amplitude=float(amplitude)
    ) * as_np(drive)
    h = hierax.HeisenbergHierarchy(hamiltonian, as_np(x), 12)
    levels = h(float(t0))
    errors = _per_level(levels, reference)
    # The input energies are rounded to 1e-16 relative (~5e-15 rad/ns absolute):
    # that, not the algorithm, bounds what any method can reach here.
    assert np.all(errors <= 1e-11), errors
    # The estimate models the rounding of the computation, not of its inputs: it
    # is checked against the levels of the inputs as hierax received them (the
    # float64 matrices, frequency, amplitude and time, each exactly as rational).
    given = lambda m: sp.Matrix(  # noqa: E731
        [[sp.Rational(v.real) + sp.I * sp.Rational(v.imag) for v in row] for row in m]
    )
    given_terms = [
        (sp.Integer(1), given(np.asarray(as_np(h_static)))),
        (
            sp.Rational(float(amplitude))
            * sp.cos(sp.Rational(float(two_pi * 5)) * t_sym),
            given(np.asarray(as_np(drive))),
        ),
    ]
    as_given = sympy_levels(
        given_terms,
        [(sp.Integer(1), given(np.asarray(as_np(x))))],
        sp.Rational(float(t0)),
        12,
    )
    _check_estimate(h.error_estimate(float(t0)), _per_level(levels, as_given))


def test_si_units_through_the_normalised_levels():
    """The same qubit in seconds (energies ~3e10 rad/s) and in nanoseconds: the
    normalised levels agree after the change of unit, X_k/k! [SI] =
    X_k/k! [ns] * 1e9^k."""
    omega, rabi = 2 * sp.pi * 5, 2 * sp.pi * sp.Rational(2, 100)  # rad/ns
    h_terms = [
        (omega / 2, sp.Matrix([[1, 0], [0, -1]])),
        (rabi * sp.cos(omega * t_sym), SX),
    ]
    lowering = sp.Matrix([[0, 1], [0, 0]])
    order = 12
    reference = mp_to_numpy(
        sympy_levels(h_terms, [(sp.Integer(1), lowering)], sp.Rational(37, 10), order)
    )
    factorials = np.cumprod(np.concatenate([[1.0], np.arange(1.0, order + 1)]))
    want = (
        reference
        / factorials[:, None, None]
        * (1e9 ** np.arange(order + 1))[:, None, None]
    )
    w, r = float(omega) * 1e9, float(rabi) * 1e9  # rad/s
    hamiltonian = (w / 2) * SIGMA_Z + hierax.Cos(w, amplitude=r) * SIGMA_X
    h = hierax.HeisenbergHierarchy(hamiltonian, jnp.asarray([[0.0, 1], [0, 0]]), order)
    got = np.asarray(h.normalised(3.7e-9))
    errors = relative_error(got, want, per_level=True)
    assert np.all(errors <= 1e-11), errors
    _check_estimate(h.error_estimate(3.7e-9), errors)


# --------------------------------------------------------------------------------
# The outside probe: each item a regression test.
# --------------------------------------------------------------------------------


def _closed_form_commutators(h: np.ndarray, x: np.ndarray, order: int) -> np.ndarray:
    out = [x.astype(complex)]
    for _ in range(order):
        out.append(1j * (h @ out[-1] - out[-1] @ h))
    return np.stack(out)


def test_constant_complex64_levels_are_not_zero():
    """Nested commutators in complex64: finite levels where the carried
    normalisation used to underflow to 0."""
    cases = [
        (np.asarray(SIGMA_Y) + 100 * np.eye(2), np.asarray(SIGMA_X), 20),
        (
            np.diag([0.0, 1.0, 1000.0]),
            np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0.0]]),
            30,
        ),
    ]
    for hmat, x, order in cases:
        levels = hierax.HeisenbergHierarchy(
            jnp.asarray(hmat, jnp.complex64), jnp.asarray(x, jnp.complex64), order
        )(0.0)
        assert levels.dtype == jnp.complex64
        want = _closed_form_commutators(hmat, x, order)
        errors = relative_error(levels, want, per_level=True)
        assert np.all(errors <= 1e-5), errors
    # x64: diag(0, 1, 1e6), the levels stay at |X_k| = sqrt(2) to order 60.
    hmat = np.diag([0.0, 1.0, 1e6])
    x = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0.0]])
    levels = hierax.HeisenbergHierarchy(jnp.asarray(hmat), jnp.asarray(x), 60)(0.0)
    norms = np.linalg.norm(np.asarray(levels), axis=(1, 2))
    np.testing.assert_allclose(norms, np.sqrt(2), rtol=1e-12)


def test_overflow_reads_inf_never_nan_or_zero():
    """Seed with constant H (sy, sx) in complex64 to order 400: |X_k| = 2^k, inf
    from where 2^k leaves float32 on, never 0 or nan; the seed with time dependence
    at high order: X_k reads inf past float32's range, not 0."""
    levels = np.asarray(
        hierax.HeisenbergHierarchy(
            jnp.asarray(SIGMA_Y, jnp.complex64),
            jnp.asarray(SIGMA_X, jnp.complex64),
            400,
        )(0.0)
    )
    size = np.abs(levels).max(axis=(1, 2))
    k = np.arange(401)
    assert not np.isnan(levels).any()
    assert np.all(size[k < 127] > 0) and np.all(np.isfinite(size[k < 127]))
    assert np.all(np.isinf(size[k >= 129]))
    sy32, sx32 = jnp.asarray(SIGMA_Y, jnp.complex64), jnp.asarray(SIGMA_X, jnp.float32)
    seed = hierax.HeisenbergHierarchy(hierax.Cos(jnp.float32(1)) * sy32, sx32, 100)
    levels = np.asarray(seed(jnp.float32(1)))
    size = np.abs(levels).max(axis=(1, 2))
    assert not np.isnan(levels).any()
    assert np.all(size > 0)
    assert np.isinf(size[-1])


def _fd_gradient(fn, x, eps=1e-6):
    x = np.asarray(x, float)
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[i] = eps
        grad[i] = (fn(jnp.asarray(x + step)) - fn(jnp.asarray(x - step))) / (2 * eps)
    return grad


def test_gradients_at_exact_zeros():
    """Entries that are exactly zero at the point still carry their derivative."""

    def commutator_entry(g):
        return jnp.real(hierax.NestedCommutators(g, SIGMA_X, 2)()[1, 0, 1])

    # Each gradient jitted whole: one compile of the forward and reverse passes.
    g0 = np.zeros((2, 2))
    np.testing.assert_allclose(
        jax.jit(jax.grad(commutator_entry))(jnp.asarray(g0)),
        _fd_gradient(commutator_entry, g0),
        atol=1e-8,
    )

    def level_entry(hmat):
        return jnp.real(hierax.HeisenbergHierarchy(hmat, SIGMA_X, 4)(0.0)[2, 0, 0])

    h0 = np.asarray(SIGMA_Z)
    fd = _fd_gradient(level_entry, h0)
    np.testing.assert_allclose(
        jax.jit(jax.grad(level_entry))(jnp.asarray(h0)), fd, atol=1e-7
    )
    assert np.abs(fd).max() > 1  # the test can fail

    def polynomial_level(a2, derivatives=False):
        f = hierax.Polynomial(jnp.stack([0.3, 1.0, a2]))
        if derivatives:
            return jnp.real(
                hierax.PropagatorDerivatives(f * SIGMA_Y, 5)(0.7, SIGMA_X)[4, 0, 1]
            )
        return jnp.real(
            hierax.HeisenbergHierarchy(f * SIGMA_Y, SIGMA_X, 5)(0.7)[4, 0, 1]
        )

    for derivatives in (False, True):
        fn = lambda a, d=derivatives: polynomial_level(a, d)  # noqa: E731
        grad = jax.jit(jax.grad(fn))(jnp.asarray(0.0))
        fd = _fd_gradient(fn, np.asarray(0.0))
        np.testing.assert_allclose(grad, fd, rtol=1e-6)
        assert abs(fd) > 1


class _Ramp(hierax.AbstractTimeFunction):
    """A user's time function: slope * t, written as its series."""

    slope: jax.Array

    @property
    def is_constant(self):
        return False

    def series(self, t, order, time_scale):
        s = 1.0 if time_scale is None else time_scale
        out = (
            jnp.zeros((order + 1,), jnp.result_type(self.slope, t))
            .at[0]
            .set(self.slope * t)
        )
        return out.at[1].set(self.slope * s) if order >= 1 else out


def test_user_time_function_gradient_at_zero_slope():
    def level(slope):
        return jnp.real(
            hierax.HeisenbergHierarchy(_Ramp(slope) * SIGMA_Y, SIGMA_X, 4)(0.5)[2, 0, 0]
        )

    grad = jax.jit(jax.grad(level))(jnp.asarray(0.0))
    fd = _fd_gradient(level, np.asarray(0.0))
    np.testing.assert_allclose(grad, fd, rtol=1e-6)
    assert abs(fd) > 0.1


@pytest.mark.parametrize(
    "dtype,times,tol",
    [(np.float32, [1e4, 1e6], 2e-7), (np.float64, [1e13, 1e16], 1e-15)],
    ids=["float32", "float64"],
)
def test_cos_sin_exact_at_large_times(dtype, times, tol):
    """The phase is never rounded as one sum: each coefficient of cos(t + 0.3) and
    sin(2t) at large t matches mpmath at the float time itself."""
    mp.mp.dps = 40
    for t in times:
        t = dtype(t)
        exact_t = mp.mpf(float(t))
        got_cos = np.asarray(hierax.Cos(dtype(1), dtype(0.3)).taylor(t, 3))
        got_sin = np.asarray(hierax.Sin(dtype(2)).taylor(t, 3))
        for j in range(4):
            want_cos = mp.cos(
                exact_t + mp.mpf(float(dtype(0.3))) + j * mp.pi / 2
            ) / mp.factorial(j)
            want_sin = 2**j * mp.sin(2 * exact_t + j * mp.pi / 2) / mp.factorial(j)
            assert abs(got_cos[j] - float(want_cos)) <= tol, (t, j)
            assert abs(got_sin[j] - float(want_sin)) <= tol * 2**j, (t, j)


@pytest.mark.parametrize(
    "make",
    [
        lambda: hierax.Cos(),
        lambda: hierax.Gaussian(),
        lambda: hierax.Polynomial(jnp.array([1.0, 2.0])),
        lambda: hierax.CallableTimeFunction(jnp.sin),
        lambda: hierax.Cos() * SIGMA_X,
        lambda: hierax.CallableOperator(lambda t: t * SIGMA_X),
    ],
    ids=["cos", "gaussian", "polynomial", "callable", "operator", "callable-operator"],
)
def test_non_scalar_time_is_refused(make):
    f = make()
    with pytest.raises(ValueError, match="`t` must be a scalar"):
        f(jnp.array([0.5, 1.0]))
    with pytest.raises(ValueError, match="`t` must be a scalar"):
        f.taylor(jnp.array([0.0, 1.0]), 1)


def test_gaussian_far_tail_is_finite():
    """A narrow Gaussian pulse (far tail at t = 1) in complex64 at K = 25 and in x64
    at K = 140: finite everywhere, X_0 included, and the float32 levels agree with
    x64 where they are in float32's range."""

    def hierarchy(width, order, f32):
        cast = (lambda m: jnp.asarray(m, jnp.complex64)) if f32 else jnp.asarray  # noqa: E731
        ham = hierax.Gaussian(width=jnp.float32(width) if f32 else width) * cast(
            SIGMA_X
        )
        return hierax.HeisenbergHierarchy(ham + cast(SIGMA_Z), cast(SIGMA_Y), order)

    levels32 = np.asarray(hierarchy(0.05, 25, True)(jnp.float32(1.0)))
    levels64 = np.asarray(hierarchy(0.05, 25, False)(1.0))
    assert np.all(np.isfinite(levels32))
    fits = np.abs(levels64).max(axis=(1, 2)) < 1e30
    errors = relative_error(levels32[fits], levels64[fits], per_level=True)
    assert np.all(errors <= 1e-4), errors
    wide = np.asarray(hierarchy(0.01, 140, False).normalised(1.0))
    assert not np.isnan(wide).any()
    series = np.asarray(hierax.Gaussian(width=0.01).taylor(1.0, 140))
    assert not np.isnan(series).any() and series[0] == 0.0  # e^{-5000} underflows


def test_time_scale_extremes_in_float32():
    """Explicit time scales from 1e-6 to 1e6 in complex64: X_0 is never nan, and
    no level is nan; the result matches the automatic one within the window."""
    sy32, sx32 = jnp.asarray(SIGMA_Y, jnp.complex64), jnp.asarray(SIGMA_X, jnp.float32)
    hamiltonian = hierax.Cos(jnp.float32(1)) * sy32
    auto = np.asarray(hierax.HeisenbergHierarchy(hamiltonian, sx32, 9)(jnp.float32(1)))
    for scale in (1e-6, 1e-4, 0.25, 3e4, 1e6):
        h = hierax.HeisenbergHierarchy(
            hamiltonian, sx32, 9, time_scale=jnp.float32(scale)
        )
        levels = np.asarray(h(jnp.float32(1)))
        assert np.all(np.isfinite(levels)), scale
        assert np.all(relative_error(levels, auto, per_level=True) <= 1e-5), scale
        d = hierax.PropagatorDerivatives(hamiltonian, 9, time_scale=jnp.float32(scale))
        assert np.all(np.isfinite(np.asarray(d(jnp.float32(1), sx32))))


def test_nan_time_under_user_transformations_names_t():
    h = hierax.HeisenbergHierarchy(hierax.Cos() * SIGMA_Y, SIGMA_X, 4)
    with pytest.raises(Exception, match="`t` must be finite"):
        jax.block_until_ready(jax.jit(lambda t: h(t))(jnp.nan))
    with pytest.raises(Exception, match="`t` must be finite"):
        jax.block_until_ready(jax.vmap(h)(jnp.array([0.0, jnp.nan])))


_FLOAT32_OVERFLOW = fresh_script(
    "float32 time overflow",
    "import hierax, jax.numpy as jnp\n"
    "h = hierax.HeisenbergHierarchy(hierax.Cos() * jnp.eye(2), jnp.eye(2), 3)\n"
    "try:\n    h(1e39)\nexcept ValueError as e:\n    print(e)\n",
)


def test_time_overflowing_float32_is_refused(tmp_path_factory):
    """Without x64, 1e39 overflows float32: a clear error naming `t` (checked in a
    fresh interpreter, where x64 is off)."""
    result = fresh_output(tmp_path_factory, _FLOAT32_OVERFLOW)
    assert "`t` must be finite" in result["stdout"], result
    assert result["status"] == 0 and "Traceback" not in result["stderr"], result


@pytest.mark.parametrize(
    "make,name",
    [
        (lambda: hierax.Cos(jnp.nan), "frequency"),
        (lambda: hierax.Exp(jnp.inf), "rate"),
        (lambda: hierax.Constant(jnp.nan), "value"),
        (lambda: hierax.Polynomial(jnp.array([1.0, jnp.nan])), "coefficients"),
        (lambda: hierax.Gaussian(width=0.0), "width"),
        (
            lambda: hierax.TimeOperator([1.0], [jnp.array([[jnp.nan, 0], [0, 1]])]),
            "matrices",
        ),
        (
            lambda: hierax.HeisenbergHierarchy(
                SIGMA_Z, jnp.array([[1, jnp.inf], [0, 1]]), 3
            ),
            "observable",
        ),
        (
            lambda: hierax.PropagatorDerivatives(SIGMA_Z, 3)(
                0.0, jnp.array([1.0, jnp.nan])
            ),
            "state",
        ),
    ],
    ids=[
        "cos",
        "exp",
        "constant",
        "polynomial",
        "gaussian",
        "matrix",
        "observable",
        "state",
    ],
)
def test_non_finite_inputs_are_refused(make, name):
    with pytest.raises(ValueError, match=f"`{name}"):
        make()


def test_non_finite_parameters_under_jit_are_reported():
    """A nan parameter known only inside the user's jit: a runtime error, not nan."""

    @jax.jit
    def levels(freq):
        return hierax.HeisenbergHierarchy(hierax.Cos(freq) * SIGMA_Y, SIGMA_X, 3)(0.5)

    assert np.all(np.isfinite(np.asarray(levels(1.0))))
    with pytest.raises(Exception, match="must be finite"):
        jax.block_until_ready(levels(jnp.nan))


def test_hermitian_flag_refuses_swapped_matrices():
    """The one-product commutator is chosen from the matrices at construction; a
    hierarchy whose matrices were swapped for non-Hermitian ones refuses to run."""
    h = hierax.HeisenbergHierarchy(hierax.Cos() * SIGMA_Y, SIGMA_X, 4)
    assert h.hermitian
    swapped = eqx.tree_at(
        lambda m: m.hamiltonian.matrices, h, jnp.asarray([[[0, 1.0], [0, 0]]], complex)
    )
    with pytest.raises(Exception, match="non-Hermitian"):
        jax.block_until_ready(swapped(0.5))


def test_density_error_estimate_of_a_damped_oscillator_against_mpmath():
    """A driven, damped oscillator (n = 8) at order 30: the norm of its Lindbladian
    compounded over the orders read 1e9 where the error is 2e-15; the estimate
    now grows the carried errors as a perturbation of the same recursion does,
    and stays above the error observed against a 40-digit recursion and below
    1e-8."""
    n, order = 8, 30
    a = np.diag(np.sqrt(np.arange(1, n)), 1).astype(complex)
    h = a.conj().T @ a + 0.3 * (a + a.conj().T)
    jump = np.sqrt(0.5) * a
    rho = np.zeros((n, n), complex)
    rho[1, 1] = 1
    mp.mp.dps = 40
    hm, lm = mp.matrix(h.tolist()), mp.matrix(jump.tolist())
    levels = [mp.matrix(rho.tolist())]
    for k in range(order):
        r = levels[-1]
        step = -1j * (hm * r - r * hm) + lm * r * lm.H
        step -= 0.5 * (lm.H * lm * r + r * lm.H * lm)
        levels.append(step / (k + 1))
    derivatives = hierax.DensityMatrixDerivatives(h, [jump], order)
    got = np.asarray(derivatives.normalised(0.0, rho))
    want = np.array([np.array(m.tolist(), complex) for m in levels])
    observed = np.linalg.norm((got - want).reshape(order + 1, -1), axis=1)
    observed /= np.linalg.norm(want.reshape(order + 1, -1), axis=1)
    estimate = np.asarray(derivatives.error_estimate(0.0, rho))
    assert np.all(estimate >= observed), (estimate, observed)
    assert np.all(estimate <= 1e-8), estimate


@pytest.mark.parametrize("seed", range(4))
def test_error_estimates_of_random_systems_in_complex64(seed):
    """Random propagators and open systems, constant and driven (orders 8-40), in
    complex64 against the same call in complex128: the estimate is never below
    the observed error (measured on 40 such systems: at least 1.8 times it, and at
    most 2.6e9 times where the norm bound had read up to 1e29 times)."""
    g = np.random.default_rng(seed)
    n, order = int(g.choice([2, 3, 4, 8])), int(g.choice([8, 16, 30, 40]))

    def hermitian():
        x = g.normal(size=(n, n)) + 1j * g.normal(size=(n, n))
        return (x + x.conj().T) / 2

    h0, h1 = hermitian() * g.uniform(0.1, 5), hermitian()
    w, t = g.uniform(0.1, 5), g.uniform(-2, 2)
    jumps = [g.normal(size=(n, n)) * g.uniform(0, 1) for _ in range(g.integers(0, 3))]
    v = g.normal(size=n) + 1j * g.normal(size=n)
    v /= np.linalg.norm(v)

    def levels(dtype, real):
        h = jnp.asarray(h0, dtype) + hierax.Cos(real(w)) * jnp.asarray(h1, dtype)
        if seed % 2:
            state = jnp.asarray(np.outer(v, v.conj()), dtype)
            ls = [jnp.asarray(j, dtype) for j in jumps]
            made = hierax.DensityMatrixDerivatives(h, ls, order)
        else:
            state = jnp.asarray(v, dtype)
            made = hierax.PropagatorDerivatives(h, order)
        return made.normalised(real(t), state), made.error_estimate(real(t), state)

    got, estimate = levels(jnp.complex64, np.float32)
    want, _ = levels(jnp.complex128, np.float64)
    got = np.asarray(got, complex).reshape(order + 1, -1)
    want = np.asarray(want).reshape(order + 1, -1)
    observed = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
    assert np.all(np.asarray(estimate, float) >= observed), (estimate, observed)


def test_error_estimate_in_complex64_and_for_propagators(seed_reference):
    """complex64 seed (K = 10) against the 30-digit oracle; the propagator series of
    a qubit with an offset against an mpmath recursion."""
    sy32, sx32 = jnp.asarray(SIGMA_Y, jnp.complex64), jnp.asarray(SIGMA_X, jnp.float32)
    h = hierax.HeisenbergHierarchy(hierax.Cos(jnp.float32(1)) * sy32, sx32, 10)
    observed = _per_level(h(jnp.float32(1)), seed_reference[:11])
    _check_estimate(h.error_estimate(jnp.float32(1)), observed, np.float32)

    # u_{j+1} = -i/(j+1) sum_m h_m u_{j-m} in mpmath, H = cos(t) sy + 100 I.
    mp.mp.dps = 30
    order, t0 = 12, mp.mpf(1)
    sy = mp.matrix([[0, -1j], [1j, 0]])
    h_series = [
        mp.cos(t0 + j * mp.pi / 2) / mp.factorial(j) * sy
        + (100 if j == 0 else 0) * mp.eye(2)
        for j in range(order + 1)
    ]
    u = [mp.matrix([[0, 1], [1, 0]])]
    for j in range(order):
        total = mp.matrix(2, 2)
        for m in range(j + 1):
            total += h_series[m] * u[j - m]
        u.append(-1j / (j + 1) * total)
    derivatives = [m * mp.factorial(k) for k, m in enumerate(u)]
    d = hierax.PropagatorDerivatives(hierax.Cos() * SIGMA_Y + 100 * I2, order)
    observed = _per_level(d(1.0, SIGMA_X), derivatives)
    assert np.all(observed <= 1e-13), observed
    _check_estimate(d.error_estimate(1.0, SIGMA_X), observed)
