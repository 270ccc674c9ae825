import json
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
import scipy.linalg

import hierax

from .helpers import (
    SYSTEMS,
    Counting,
    fresh_output,
    fresh_script,
    mp_relative_errors,
    mp_to_numpy,
    naive_levels,
    propagate,
    relative_errors,
    sympy_levels,
)


ORDER = 12


@pytest.fixture(scope="module", params=SYSTEMS, ids=lambda s: s.__name__)
def system(request):
    s = request.param()
    s["reference"] = sympy_levels(s["h_terms"], s["x_terms"], s["t0"], ORDER)
    return s


def test_against_sympy_x64(system):
    h = hierax.HeisenbergHierarchy(system["hamiltonian"], system["observable"], ORDER)
    levels = h(float(system["t0"]))
    assert levels.shape == (ORDER + 1,) + levels.shape[1:]
    assert levels.dtype == jnp.complex128
    errors = mp_relative_errors(levels, system["reference"])
    assert np.all(errors <= 1e-11), errors
    # The normalised output is the same numbers divided by k!.
    normalised = h.normalised(float(system["t0"]))
    factorials = np.array(
        [float(np.prod(np.arange(1, k + 1))) for k in range(ORDER + 1)]
    )
    scaled = np.asarray(normalised) * factorials[:, None, None]
    assert np.all(relative_errors(scaled, mp_to_numpy(system["reference"])) <= 1e-11)


def test_against_sympy_complex64(system):
    """JAX's default precision: complex64 in, complex64 out, with honest tolerances.

    The relative error per level grows with k (each level adds rounding from
    commutators of growing terms), from ~1e-8 at k = 0 to ~5e-6 at k = 8 here.
    """
    f32 = lambda x: jax.tree_util.tree_map(
        lambda a: (
            a.astype(jnp.complex64 if jnp.iscomplexobj(a) else jnp.float32)
            if eqx.is_array(a)
            else a
        ),
        x,
    )
    order = 8
    h = hierax.HeisenbergHierarchy(
        f32(system["hamiltonian"]), f32(system["observable"]), order
    )
    levels = h(jnp.float32(float(system["t0"])))
    assert levels.dtype == jnp.complex64
    errors = mp_relative_errors(levels, system["reference"][: order + 1])
    # Measured (benchmarks/accuracy.py): at most 5e-6 at k <= 8 on these systems.
    assert np.all(errors <= 2e-5), errors


@pytest.mark.parametrize(
    "make,order", [(SYSTEMS[0], 5), (SYSTEMS[1], 4)], ids=["seed", "qutrit"]
)
def test_against_naive_recursion(make, order):
    s = make()
    h = hierax.HeisenbergHierarchy(s["hamiltonian"], s["observable"], order)
    t0 = float(s["t0"])
    reference = naive_levels(h.hamiltonian, h.observable, t0, order)
    errors = relative_errors(h(t0), reference)
    assert np.all(errors <= 1e-12), errors


@pytest.mark.parametrize("n", [2, 3])
def test_complex_time_functions_on_small_matrices(n):
    """A drive in the rotating frame, H = e^(-i w t) a + e^(i w t) a^+ + d N, has
    complex coefficients (the general kernel, not the Hermitian one); on a qubit
    and a qutrit (one call: elementwise sums; under vmap: matrix products) against
    the 30-digit direct recursion, with a non-Hermitian observable."""
    import sympy as sp

    from .helpers import t_sym

    a = sp.zeros(n)
    for i in range(1, n):
        a[i - 1, i] = sp.sqrt(i)
    number = a.T * a
    w, d, t0, order = sp.Rational(7, 5), sp.Rational(1, 3), sp.Rational(2, 5), 12
    h_terms = [
        (sp.exp(-sp.I * w * t_sym), a),
        (sp.exp(sp.I * w * t_sym), a.T),
        (d, number),
    ]
    x_terms = [(sp.Integer(1), a + 2 * number)]
    reference = sympy_levels(h_terms, x_terms, t0, order)
    arr = lambda m: jnp.asarray(np.array(m.evalf(30).tolist(), dtype=complex))  # noqa: E731
    h = hierax.HeisenbergHierarchy(
        hierax.Exp(-1j * float(w)) * arr(a)
        + hierax.Exp(1j * float(w)) * arr(a.T)
        + float(d) * arr(number),
        arr(a + 2 * number),
        order,
    )
    assert np.all(mp_relative_errors(h(float(t0)), reference) <= 1e-11)
    ts = jnp.array([float(t0), 0.9])
    batched = jax.vmap(h)(ts)
    assert np.all(mp_relative_errors(batched[0], reference) <= 1e-11)
    np.testing.assert_allclose(batched[1], h(0.9), rtol=1e-13, atol=1e-13)


def _random_hermitian(key, n):
    a = jax.random.normal(key, (n, n)) + 1j * jax.random.normal(
        jax.random.fold_in(key, 1), (n, n)
    )
    return (a + a.conj().T) / 2


def test_constant_hamiltonian_identity():
    """X_k = (i ad_H)^k X_0, for a structurally constant H (K commutators) and for
    the same H as a callable (the full series recursion)."""
    n, order = 5, 10
    hmat = _random_hermitian(jax.random.PRNGKey(0), n)
    x0 = _random_hermitian(jax.random.PRNGKey(1), n)
    expected = [np.asarray(x0)]
    for _ in range(order):
        x = expected[-1]
        expected.append(1j * (np.asarray(hmat) @ x - x @ np.asarray(hmat)))
    expected = np.stack(expected)
    by_commutators = hierax.HeisenbergHierarchy(hmat, x0, order)
    # A callable is not structurally constant: this carries full series.
    by_series = hierax.HeisenbergHierarchy(lambda t: hmat, x0, order)
    for h in (by_commutators, by_series):
        assert np.all(relative_errors(h(0.4), expected) <= 1e-12)
    commutators = hierax.NestedCommutators(1j * hmat, x0, order)()
    assert np.all(relative_errors(commutators, expected) <= 1e-13)


def test_heisenberg_taylor_sum_matches_ode():
    """sum_k X_k tau^k / k! = V^dagger X_0(t + tau) V, with V from an ODE solve."""
    s = SYSTEMS[1]()
    h = hierax.HeisenbergHierarchy(s["hamiltonian"], s["observable"], 30)
    t0, tau = 0.6, 0.15
    series = np.asarray(h.normalised(t0))
    taylor_sum = sum(series[k] * tau**k for k in range(31))
    v = propagate(h.hamiltonian, t0, tau, np.eye(3))
    assert isinstance(h.observable, hierax.AbstractTimeOperator)
    exact = v.conj().T @ np.asarray(h.observable(t0 + tau)) @ v
    assert np.linalg.norm(taylor_sum - exact) / np.linalg.norm(exact) < 1e-11


@pytest.mark.parametrize("shape", ["matrix", "vector"])
def test_propagator_derivatives_against_ode(shape):
    s = SYSTEMS[2]()
    hamiltonian = s["hamiltonian"]
    t0 = 0.3
    u0 = scipy.linalg.expm(-0.7j * np.asarray(hamiltonian(0.0)))  # some unitary
    if shape == "vector":
        u0 = u0[:, 1]
    d = hierax.PropagatorDerivatives(hamiltonian, 25)
    derivatives = np.asarray(d(t0, u0))
    assert derivatives.shape == (26,) + u0.shape
    # All derivatives at once: the Taylor sum reproduces the ODE solution...
    tau = 0.1
    normalised = np.asarray(d.normalised(t0, u0))
    taylor_sum = sum(normalised[k] * tau**k for k in range(26))
    exact = propagate(hamiltonian, t0, tau, u0)
    assert np.linalg.norm(taylor_sum - exact) / np.linalg.norm(exact) < 1e-11
    # ...and the first derivatives match central finite differences of the ODE.
    step = 1e-3
    plus = propagate(hamiltonian, t0, step, u0)
    minus = propagate(hamiltonian, t0, -step, u0)
    first = (plus - minus) / (2 * step)
    second = (plus - 2 * u0 + minus) / step**2
    assert np.linalg.norm(derivatives[1] - first) / np.linalg.norm(first) < 1e-5
    assert np.linalg.norm(derivatives[2] - second) / np.linalg.norm(second) < 1e-4
    # U' = -i H U exactly at order 1.
    np.testing.assert_allclose(
        derivatives[1], -1j * np.asarray(hamiltonian(t0)) @ u0, rtol=1e-13, atol=1e-13
    )


def test_hermiticity_and_linearity():
    s = SYSTEMS[1]()
    h = hierax.HeisenbergHierarchy(s["hamiltonian"], s["observable"], 9)
    levels = np.asarray(h(0.6))
    np.testing.assert_allclose(levels, np.conj(np.swapaxes(levels, -1, -2)), atol=1e-9)
    # Linear in the observable.
    other = jnp.asarray(np.diag([1.0, 2.0, -0.5]))
    combined = hierax.HeisenbergHierarchy(
        s["hamiltonian"], 2.0 * h.observable + other, 9
    )
    single = hierax.HeisenbergHierarchy(s["hamiltonian"], other, 9)
    np.testing.assert_allclose(
        np.asarray(combined(0.6)),
        2 * levels + np.asarray(single(0.6)),
        rtol=1e-11,
        atol=1e-9,
    )


def test_gradients_match_finite_differences():
    sy = jnp.array([[0, -1j], [1j, 0]])
    sz = jnp.array([[1.0, 0], [0, -1.0]])
    sx = jnp.array([[0.0, 1], [1, 0]])

    def level_sum(params, t):
        freq, amp = params
        hamiltonian = hierax.Cos(freq, 0.2, amp) * sy + hierax.Gaussian(0.1, 0.8) * sz
        levels = hierax.HeisenbergHierarchy(hamiltonian, sx, 6)(t)
        return jnp.real(levels[3, 0, 1]) + jnp.imag(levels[5, 1, 0])

    params = (jnp.asarray(1.3), jnp.asarray(0.7))
    jax.test_util.check_grads(
        level_sum,
        (params, jnp.asarray(0.4)),
        order=1,
        modes=("fwd", "rev"),
        atol=1e-6,
        rtol=1e-6,
    )


def test_vmap_over_times_and_parameters():
    sy = jnp.array([[0, -1j], [1j, 0]])
    sx = jnp.array([[0.0, 1], [1, 0]])
    h = hierax.HeisenbergHierarchy(hierax.Cos(1.1) * sy, sx, 7)
    ts = jnp.linspace(-1.0, 2.0, 5)
    batched = jax.vmap(h)(ts)
    looped = jnp.stack([h(t) for t in ts])
    np.testing.assert_allclose(batched, looped, rtol=1e-13, atol=1e-12)

    def at(freq, t):
        return hierax.HeisenbergHierarchy(hierax.Cos(freq) * sy, sx, 7)(t)

    freqs = jnp.array([0.5, 1.0, 2.0])
    batched = jax.vmap(at)(freqs, ts[:3])
    looped = jnp.stack([at(f, t) for f, t in zip(freqs, ts[:3])])
    np.testing.assert_allclose(batched, looped, rtol=1e-13, atol=1e-12)


def test_small_problem_under_vmap_takes_the_batched_layout_and_differentiates():
    """A small problem's one-call layout (fused elementwise sums) is replaced under
    `jax.vmap` by the matrix-product layout (`hierax._core._jit.by_batching`): the same
    levels as a loop, also under a `lax.cond` on a batched predicate, and
    derivatives in both modes that agree with each other, with finite differences,
    and (under vmap) with a loop."""
    sy = jnp.array([[0, -1j], [1j, 0]])
    sx = jnp.array([[0.0, 1], [1, 0]])
    h = hierax.HeisenbergHierarchy(hierax.Cos(1.3) * sy, sx, 9)
    ts = jnp.linspace(-0.5, 1.5, 4)
    looped = jnp.stack([h(t) for t in ts])
    np.testing.assert_allclose(jax.vmap(h)(ts), looped, rtol=1e-13, atol=1e-13)
    zeros = jnp.zeros_like(looped[0])
    gated = jax.vmap(lambda t: jax.lax.cond(t > 0, lambda t: h(t), lambda t: zeros, t))
    want = jnp.where((ts > 0)[:, None, None, None], looped, 0)
    np.testing.assert_allclose(gated(ts), want, rtol=1e-13, atol=1e-13)

    def size(w, t):
        levels = hierax.HeisenbergHierarchy(hierax.Cos(w) * sy, sx, 9)(t)
        return jnp.sum(jnp.abs(levels[9]) ** 2)

    reverse = jax.grad(size, argnums=(0, 1))(1.3, 0.7)
    forward = jax.jacfwd(size, argnums=(0, 1))(1.3, 0.7)
    np.testing.assert_allclose(reverse, forward, rtol=1e-12)
    step = 1e-6
    fd = (size(1.3 + step, 0.7) - size(1.3 - step, 0.7)) / (2 * step)
    np.testing.assert_allclose(reverse[0], fd, rtol=1e-7)
    by_time = jax.jit(jax.grad(size, argnums=1))  # traced once for the loop
    batched = jax.vmap(by_time, in_axes=(None, 0))(1.3, ts)
    one_by_one = jnp.stack([by_time(1.3, t) for t in ts])
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-12)


@pytest.mark.parametrize("differentiate_batched", [False, True])
def test_batching_rule_runs_one_layout_and_differentiates_the_chosen_one(
    differentiate_batched,
):
    """`by_batching(single, batched, differentiate_batched)`: one call runs
    `single`, `jax.vmap` runs `batched`, and derivatives (both modes, also under
    vmap) are those of `batched` when asked (the small hierarchy's matrix-product
    layout, whose derivative is the smaller program), else of `single`. The two
    layouts here differ in their derivatives on purpose, to tell them apart."""
    from hierax._core._jit import by_batching

    ran = []

    def single(x):
        ran.append("single")
        return x**2

    def batched(x):
        ran.append("batched")
        return jax.lax.stop_gradient(x) * x  # the same values, half the slope

    f = by_batching(single, batched, differentiate_batched)
    x = jnp.asarray(3.0)
    assert float(f(x)) == 9.0 and ran[-1] == "single"
    xs = jnp.arange(3.0)
    np.testing.assert_array_equal(jax.vmap(f)(xs), xs**2)
    assert ran[-1] == "batched"
    slope = 3.0 if differentiate_batched else 6.0
    assert float(jax.grad(f)(x)) == slope
    assert float(jax.jvp(f, (x,), (jnp.asarray(1.0),))[1]) == slope
    np.testing.assert_array_equal(jax.vmap(jax.grad(f))(xs), xs * slope / 3)


@pytest.mark.parametrize("kind", ["heisenberg", "propagator"])
def test_no_retrace_when_time_or_parameters_change(kind):
    traces = []
    sy = jnp.array([[0, -1j], [1j, 0]])
    sx = jnp.array([[0.0, 1], [1, 0]])

    def build(freq):
        hamiltonian = Counting(hierax.Cos(jnp.asarray(freq)), traces) * sy
        if kind == "heisenberg":
            return lambda t: hierax.HeisenbergHierarchy(hamiltonian, sx, 9)(t)
        return lambda t: hierax.PropagatorDerivatives(hamiltonian, 9)(t, sx)

    build(1.0)(0.5).block_until_ready()
    first = len(traces)  # one compile (the series, and the time-scale probe)
    for freq, t in [(1.0, 0.7), (2.0, jnp.asarray(0.1)), (3.0, -4.0)]:
        build(freq)(t).block_until_ready()
    assert len(traces) == first


def test_one_compile_policy_fast_and_filtered_paths():
    """Every leaf an array: the fast dispatch path. A Python function among the
    leaves: the filtered path (`eqx.filter_jit` semantics). Both give the same levels
    and trace once each across new times and parameter values; a NumPy scalar time
    after a Python float shares the trace."""
    sy = jnp.array([[0, -1j], [1j, 0]])
    sx = jnp.array([[0.0, 1], [1, 0]])
    zero = lambda t: 0.0 * t * sx  # noqa: E731
    fast_traces, filtered_traces = [], []
    results = {}
    for label, traces in (("fast", fast_traces), ("filtered", filtered_traces)):
        for freq, t in [(1.0, 0.5), (1.5, np.float64(0.7)), (2.0, jnp.asarray(0.1))]:
            hamiltonian = Counting(hierax.Cos(jnp.asarray(freq)), traces) * sy
            if label == "filtered":
                hamiltonian = hamiltonian + hierax.CallableOperator(zero)
            h = hierax.HeisenbergHierarchy(hamiltonian, sx, 9)
            results[label, freq] = np.asarray(h(t))
    # One compile each: the series and the time-scale probe, traced once.
    assert fast_traces == [3, 9] and filtered_traces == [3, 9]
    for freq in (1.0, 1.5, 2.0):
        np.testing.assert_allclose(
            results["fast", freq], results["filtered", freq], rtol=1e-13, atol=1e-13
        )


def test_high_order_normalised_is_finite():
    sy = jnp.array([[0, -1j], [1j, 0]])
    sx = jnp.array([[0.0, 1], [1, 0]])
    h = hierax.HeisenbergHierarchy(hierax.Cos() * sy, sx, 200)
    normalised = np.asarray(h.normalised(1.0))
    assert np.all(np.isfinite(normalised))
    levels = np.asarray(h(1.0))
    # X_k itself is finite while it is representable; it agrees with k! * normalised.
    k = 60
    np.testing.assert_allclose(
        levels[k],
        normalised[k] * float(np.prod(np.arange(1, k + 1, dtype=float))),
        rtol=1e-12,
    )
    assert np.all(np.isfinite(levels[:150]))


def test_phases_change_nothing(monkeypatch):
    """Large problems run in up to 8 phases of shrinking width, small ones in one
    (`_phases`): both give the same levels on a time-dependent
    system with a time-dependent observable and a dense (callable) term."""
    import hierax._kernels.heisenberg as algorithms

    sy = jnp.array([[0, -1j], [1j, 0]])
    sx = jnp.array([[0.0, 1], [1, 0]])
    sz = jnp.array([[1.0, 0], [0, -1]])
    H = hierax.Cos(1.3) * sy + 0.4 * sz + hierax.as_operator(lambda t: t**2 * sx)
    X = hierax.Sin(0.7) * sx + sz
    order = 12
    assert len(algorithms._phases(order, 2)) == 1

    one = np.asarray(hierax.HeisenbergHierarchy(H, X, order).normalised(0.4))
    monkeypatch.setattr(algorithms, "_WORK_PER_PHASE", 1)
    assert len(algorithms._phases(order, 2)) == 8
    # A zero term changes the structure, so this traces anew (with 8 phases) and
    # adds exactly nothing.
    phased = hierax.HeisenbergHierarchy(H + 0.0 * sz, X, order).normalised(0.4)
    errors = relative_errors(np.asarray(phased), one)
    assert np.all(errors <= 1e-13), errors


def test_float32_high_order_is_honest():
    """In complex64, X_k overflows past k ~ 42 for the seed: it must read inf (with
    the right sign), never nan or 0, while the normalised levels stay accurate."""
    sy = jnp.array([[0, -1j], [1j, 0]], jnp.complex64)
    sx = jnp.array([[0, 1], [1, 0]], jnp.float32)
    h32 = hierax.HeisenbergHierarchy(hierax.Cos(jnp.float32(1)) * sy, sx, 80)
    h64 = hierax.HeisenbergHierarchy(
        hierax.Cos() * sy.astype(complex), sx.astype(float), 80
    )
    levels32 = np.asarray(h32(jnp.float32(1)), np.complex64)
    levels64 = np.asarray(h64(1.0), np.complex128)
    assert levels32.dtype == np.complex64
    assert not np.any(np.isnan(levels32))
    big = np.abs(levels64.real) > 3.4e38
    assert np.all(np.isinf(levels32.real[big]))
    assert np.all(np.sign(levels32.real[big]) == np.sign(levels64.real[big]))
    fits = np.abs(levels64).max(axis=(1, 2)) < 1e37
    assert np.all(relative_errors(levels32[fits], levels64[fits]) < 1e-4)
    normalised = relative_errors(h32.normalised(jnp.float32(1)), h64.normalised(1.0))
    assert np.all(normalised < 1e-4), normalised


def test_constant_hamiltonian_normalised_survives_overflow():
    """Nested commutators divide by k as they go: X_k / k! stays finite (and right)
    where X_k itself overflows."""
    hmat = _random_hermitian(jax.random.PRNGKey(2), 3) * 4
    x0 = _random_hermitian(jax.random.PRNGKey(3), 3)
    h64 = hierax.HeisenbergHierarchy(hmat, x0, 150)
    h32 = hierax.HeisenbergHierarchy(
        hmat.astype(jnp.complex64), x0.astype(jnp.complex64), 150
    )
    levels32 = np.asarray(h32(0.0))
    assert np.isinf(levels32[-1]).any() and not np.isnan(levels32).any()
    normalised32, normalised64 = (
        np.asarray(h32.normalised(0.0)),
        np.asarray(h64.normalised(0.0)),
    )
    assert np.all(np.isfinite(normalised32))
    fits = np.abs(normalised64).max(axis=(1, 2)) > 1e-30  # above float32's underflow
    assert np.all(relative_errors(normalised32[fits], normalised64[fits]) < 1e-4)


def test_time_scale_changes_nothing_but_the_range():
    """An explicit time scale gives the same levels as the automatic one (x64), and
    float32 keeps levels whose normalised coefficients X_k/k! would underflow
    without one (0.01 cos(t) sigma_y at order 60)."""
    s = SYSTEMS[1]()
    plain = hierax.HeisenbergHierarchy(s["hamiltonian"], s["observable"], 30)
    scaled = hierax.HeisenbergHierarchy(
        s["hamiltonian"], s["observable"], 30, time_scale=7.0
    )
    for method in ("__call__", "normalised"):
        a = np.asarray(getattr(plain, method)(0.6))
        b = np.asarray(getattr(scaled, method)(0.6))
        assert np.all(relative_errors(b, a) < 1e-12)

    sy = jnp.array([[0, -1j], [1j, 0]])
    sx = jnp.array([[0.0, 1], [1, 0]])
    reference = np.asarray(
        hierax.HeisenbergHierarchy(hierax.Cos(amplitude=0.01) * sy, sx, 60)(1.0)
    )
    h32 = hierax.Cos(jnp.float32(1), amplitude=jnp.float32(0.01)) * sy.astype(
        jnp.complex64
    )
    x32 = sx.astype(jnp.float32)
    automatic32 = hierax.HeisenbergHierarchy(h32, x32, 60)
    scaled32 = hierax.HeisenbergHierarchy(h32, x32, 60, time_scale=jnp.float32(6))
    for h in (automatic32, scaled32):
        levels = np.asarray(h(jnp.float32(1)))
        assert levels.dtype == np.complex64
        assert np.all(relative_errors(levels, reference) < 1e-4)


def test_time_scale_is_traced_and_checked():
    sy = jnp.array([[0, -1j], [1j, 0]])
    sx = jnp.array([[0.0, 1], [1, 0]])
    traces = []
    hamiltonian = Counting(hierax.Cos(jnp.asarray(1.0)), traces) * sy
    for scale in (2.0, 3.0, 5.0):
        hierax.HeisenbergHierarchy(hamiltonian, sx, 9, time_scale=scale)(0.5)
    assert traces == [3, 9]  # one compile: the series and the time-scale probe
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(
            ValueError, match="`time_scale` must be positive and finite"
        ):
            hierax.HeisenbergHierarchy(hamiltonian, sx, 9, time_scale=bad)
    with pytest.raises(ValueError, match="`time_scale` must be a real scalar"):
        hierax.HeisenbergHierarchy(hamiltonian, sx, 9, time_scale=jnp.ones(2))


def test_propagator_time_scale():
    s = SYSTEMS[2]()
    u0 = np.eye(4)[:, 1]
    plain = hierax.PropagatorDerivatives(s["hamiltonian"], 25)
    scaled = hierax.PropagatorDerivatives(s["hamiltonian"], 25, time_scale=5.0)
    for method in ("__call__", "normalised"):
        a = np.asarray(getattr(plain, method)(0.3, u0))
        b = np.asarray(getattr(scaled, method)(0.3, u0))
        assert np.all(relative_errors(b, a) < 1e-12)


_FLOAT32_TOP_LEVELS = fresh_script(
    "automatic time scale keeps float32's top levels",
    """
import json
import numpy as np
import hierax

def series(generator, start, order):
    # Normalised levels X_k / k! of X_{k+1} = generator(X_k), in float64.
    levels = [start]
    for k in range(order):
        levels.append(generator(levels[-1]) / (k + 1))
    return np.stack(levels)

def errors(computed, reference):
    # Per level, in the Frobenius norm, each level scaled by its largest entry.
    computed = np.asarray(computed, np.complex128).reshape(len(reference), -1)
    reference = reference.reshape(len(reference), -1)
    scale = np.abs(reference).max(axis=1, keepdims=True)
    difference = np.linalg.norm((computed - reference) / scale, axis=1)
    return (difference / np.linalg.norm(reference / scale, axis=1)).tolist()

rng = np.random.default_rng(0)
n, order, t = 8, 40, np.float32(0.3)
a = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
h = (a + a.conj().T) / 2
u = np.linalg.qr(rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n)))[0]
rho = u[:, :1] @ u[:, :1].conj().T
factorials = np.array([float(np.prod(np.arange(1.0, k + 1))) for k in range(order + 1)])
h32 = h.astype(np.complex64)
out = {}

# The report: U^(k) = (-iH)^k U; the rate was read as 2 ||H - tr H / n||_F (16.0
# against ||H||_2 = 5.5) and levels 37-40 read exactly 0.
propagator = hierax.PropagatorDerivatives(h32, order)
levels = propagator(t, u.astype(np.complex64))
reference = series(lambda x: -1j * h @ x, u, order) * factorials[:, None, None]
out["propagator"] = errors(levels, reference)
out["dtype"] = str(levels.dtype)

density = hierax.DensityMatrixDerivatives(h32, [], order)
levels = density.normalised(t, rho.astype(np.complex64))
out["density"] = errors(levels, series(lambda x: -1j * (h @ x - x @ h), rho, order))

# An offset turns the state at rate 100, which the traceless norm did not see: the
# carried series overflowed to inf and nan.
shifted = 0.1 * h[:4, :4] + 100 * np.eye(4)
state = u[:4, 0] / np.linalg.norm(u[:4, 0])
offset = hierax.PropagatorDerivatives(shifted.astype(np.complex64), order)
levels = offset.normalised(t, state.astype(np.complex64))
out["offset"] = errors(levels, series(lambda x: -1j * shifted @ x, state, order))

# A time scale far too small (clipped to 1/16 of the automatic one) loses the top
# levels to underflow: their error estimates must say so.
small = hierax.PropagatorDerivatives(h32, order, time_scale=np.float32(1e-30))
out["lost"] = errors(small(t, u.astype(np.complex64)), reference)
out["lost_estimates"] = np.asarray(
    small.error_estimate(t, u.astype(np.complex64)), np.float64
).tolist()
print(json.dumps(out))
""",
)


def test_automatic_time_scale_keeps_float32_top_levels(tmp_path_factory):
    """float32 (JAX's default, in a fresh process): every level of order-40
    propagator and density-matrix derivatives of a random 8x8 H, and of a
    Hamiltonian with an offset, against NumPy float64 (measured: at most 5e-6);
    where levels do underflow (a time scale 16 times too small), the error estimate
    is not small."""
    result = fresh_output(tmp_path_factory, _FLOAT32_TOP_LEVELS)
    assert result["status"] == 0, result["stderr"]
    out = json.loads(result["stdout"])
    assert out["dtype"] == "complex64"
    for name in ("propagator", "density", "offset"):
        assert np.all(np.asarray(out[name]) < 1e-4), (name, out[name])
    lost = np.asarray(out["lost"]) > 1e-3
    assert lost[-1], out["lost"]
    estimates = np.asarray(out["lost_estimates"])
    assert np.all(estimates[lost] > 0.1), (out["lost"], out["lost_estimates"])


@pytest.mark.parametrize("case", ["dense", "offset"])
def test_automatic_time_scale_keeps_float64_top_levels(case):
    """x64, order 150: a random 64x64 H, whose rate the Frobenius norm overestimated
    eightfold (the top five levels underflowed to 0), and an offset of 1000 that the
    traceless norm did not see (the carried series overflowed from level 129);
    normalised levels against the NumPy recursion."""
    rng = np.random.default_rng(1)
    order = 150
    if case == "dense":
        n = 64
        a = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
        h = (a + a.conj().T) / 2
    else:
        n = 4
        a = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
        h = 0.05 * (a + a.conj().T) + 1000 * np.eye(n)
    state = rng.normal(size=n) + 1j * rng.normal(size=n)
    reference = [state]
    for k in range(order):
        reference.append(-1j * (h @ reference[-1]) / (k + 1))
    levels = hierax.PropagatorDerivatives(h, order).normalised(0.7, state)
    # Each level scaled by its largest entry (1000^k / k! reaches 1e187).
    reference = np.stack(reference)
    scale = np.abs(reference).max(axis=1, keepdims=True)
    errors = relative_errors(np.asarray(levels) / scale, reference / scale)
    assert np.all(errors < 1e-10), errors


_KEEPS_NO_MODULE = fresh_script(
    "compiled call keeps no module alive",
    """
import gc, weakref
import jax.numpy as jnp
import numpy as np
import hierax

sx = jnp.array([[0.0, 1], [1, 0]])
sy = jnp.array([[0, -1j], [1j, 0]])
h = hierax.HeisenbergHierarchy(hierax.Cos() * sy, sx, 3)
first = np.asarray(h(0.3))
assert np.array_equal(np.asarray(h(0.3)), first)  # served from the cache
ref = weakref.ref(h)
del h
gc.collect()
print(ref() is None)
""",
)


def test_compiled_call_keeps_no_module_alive(tmp_path_factory):
    """The compile policy caches a module's flattened form; it must not keep the
    module (and its matrices) alive once the user drops it. (In a plain process:
    pytest keeps frames' locals of its own.)"""
    result = fresh_output(tmp_path_factory, _KEEPS_NO_MODULE)
    assert result["status"] == 0, result["stderr"]
    assert result["stdout"].strip() == "True"


def _cos_series(w, phase, t, order):
    """Closed form: the coefficients of $\\cos(w t + \\varphi)$ at t."""
    j = np.arange(order + 1)
    factorials = np.array([math.factorial(int(k)) for k in j], float)
    return w**j * np.cos(w * t + phase + j * np.pi / 2) / factorials


def _propagator_reference(terms, t, state, order):
    """The recursion $u_{j+1} = -i/(j+1) \\sum_m h_m u_{j-m}$ in NumPy, with the
    terms' coefficients in closed form; returns $U^{(j)} = j!\\, u_j$."""
    h = np.zeros((order + 1, 2, 2), complex)
    for (w, p), m in terms:
        h += _cos_series(w, p, t, order)[:, None, None] * m[None]
    u = [np.asarray(state, complex)]
    for j in range(order):
        total = np.zeros_like(u[0])
        for m in range(j + 1):
            total += h[m] @ u[j - m]
        u.append(-1j / (j + 1) * total)
    return np.stack([math.factorial(j) * u[j] for j in range(order + 1)])


_SX = np.array([[0, 1], [1, 0]], complex)
_SY = np.array([[0, -1j], [1j, 0]])
_SZ = np.diag([1.0, -1.0]).astype(complex)
# (frequency, phase) per term; frequency 0 and phase 0 is a constant term.
_SMALL_STRUCTURES = {
    "one cosine": [((1.0, 0.0), _SY)],
    "two varying": [((1.0, 0.0), _SY), ((1.3, -np.pi / 2), _SX)],
    "constant and varying": [((0.0, 0.0), _SZ), ((0.7, 0.0), _SX)],
    "three terms": [((1.0, 0.0), _SX), ((2.0, 0.4), _SZ), ((0.0, 0.0), _SY)],
}


@pytest.mark.parametrize("structure", list(_SMALL_STRUCTURES))
def test_propagator_derivatives_small_orders(structure):
    """Issue 48 (C1): every order from 0, for tiny states (the summed-generator
    kernel), kets and propagators, x64 and complex64: order 0 raised an IndexError."""
    terms = _SMALL_STRUCTURES[structure]
    hamiltonian = sum(hierax.Cos(w, p) * m if w else m for (w, p), m in terms)
    t = 0.3
    states = [np.array([0.6, 0.8j]), scipy.linalg.expm(-0.4j * _SX)]
    kinds = [(jnp.complex128, 1e-12), (jnp.complex64, 1e-5)]
    combinations = [(s, k) for s in states for k in kinds]
    for order in range(6):
        d = hierax.PropagatorDerivatives(hamiltonian, order)
        # Order 0 in every combination; the others in one each, in turn (a compile
        # each).
        cases = combinations if order == 0 else [combinations[order % 4]]
        for state, (dtype, tolerance) in cases:
            reference = _propagator_reference(terms, t, state, order)
            levels = np.asarray(d(t, jnp.asarray(state, dtype)))
            assert levels.shape == (order + 1,) + state.shape
            assert levels.dtype == dtype
            flat = (order + 1, -1)
            scale = np.abs(reference).reshape(flat).max(1)
            errors = np.abs(levels - reference).reshape(flat).max(1)
            assert np.all(errors <= tolerance * scale), (order, dtype, errors)
