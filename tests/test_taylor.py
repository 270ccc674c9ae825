"""`hierax.taylor` against independent references: `jax.experimental.jet`, nested
`jax.jacfwd`, and SymPy with mpmath precision."""

import math

import jax


jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.lax as lax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import mpmath  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import sympy as sp  # noqa: E402
from jax.experimental.jet import jet  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

from hierax._taylor import expand, supported_primitives, taylor  # noqa: E402


T0 = 0.3
ORDER = 5
A = jnp.array([[0.4, -1.1], [0.7, 0.2]])
B = jnp.array([[0.3 + 0.2j, -0.5j, 0.1], [0.6, 0.2 - 0.1j, 0.4j], [0.1j, 0.3, -0.2]])
V = jnp.array([0.5, -1.2, 2.0, 0.8])


def _relative_error(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


def _assert_tree_close(ours, reference, rtol):
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(reference)
    for a, b in zip(
        jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(reference)
    ):
        assert _relative_error(a, b) <= rtol, (_relative_error(a, b), a, b)


def _jet_coefficients(fn, t, order):
    """Normalised coefficients from `jax.experimental.jet` (which returns plain
    derivatives)."""
    return jax.jit(lambda t: _jet_impl(fn, t, order))(jnp.asarray(t))


def _jet_impl(fn, t, order):
    direction = [jnp.ones_like(t)] + [jnp.zeros_like(t)] * (order - 1)
    primal, series = jet(fn, (t,), (direction,))
    structure = jax.tree_util.tree_structure(primal)
    stacked = [
        jnp.stack([p] + [d / math.factorial(j + 1) for j, d in enumerate(s)])
        for p, s in zip(
            jax.tree_util.tree_leaves(primal), structure.flatten_up_to(series)
        )
    ]
    return jax.tree_util.tree_unflatten(structure, stacked)


def _jacfwd_coefficients(fn, t, order):
    """Normalised coefficients by nesting `jax.jacfwd` `order` times."""
    return jax.jit(lambda t: _jacfwd_impl(fn, t, order))(jnp.asarray(t))


def _jacfwd_impl(fn, t, order):
    holomorphic = jnp.iscomplexobj(t)
    derivatives = [fn(t)]
    g = fn
    for _ in range(order):
        g = jax.jacfwd(g, holomorphic=holomorphic)
        derivatives.append(g(t))
    return jax.tree_util.tree_map(
        lambda *d: jnp.stack([x / math.factorial(j) for j, x in enumerate(d)]),
        *derivatives,
    )


@jax.custom_jvp
def _softplus(x):
    return jnp.log1p(jnp.exp(x))


@_softplus.defjvp
def _softplus_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return _softplus(x), jax.nn.sigmoid(x) * dx


@jax.custom_vjp
def _sin_vjp(x):
    return jnp.sin(x)


_sin_vjp.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (g * jnp.cos(x),))


class _Scaled(eqx.Module):
    weight: jax.Array

    def __call__(self, t):
        return jnp.sin(self.weight * t) @ self.weight


# Functions that `jet` can expand too: compared with it.
JET_CORPUS = {
    "sin_exp_div_cos": lambda t: jnp.sin(t) * jnp.exp(t) / (2 + jnp.cos(t)),
    "log_sqrt_pow": lambda t: jnp.log(t) + jnp.sqrt(1 + t) + t**2.5 + t**-3,
    "tanh_matrix": lambda t: jnp.tanh(A * t) @ jnp.sqrt(2 + A * jnp.sin(t)),
    "logistic_erf": lambda t: jax.nn.sigmoid(3 * t) ** 3 + jax.scipy.special.erf(t),
    "sinh_cosh": lambda t: jnp.sinh(t) * jnp.cosh(2 * t) - jnp.sinh(A * t),
    "rsqrt_expm1_log1p": lambda t: lax.rsqrt(1 + t) + jnp.expm1(t) * jnp.log1p(t),
    "power_series_exponent": lambda t: t**t + (1 + A * A) ** t,
    "matrix_chain": lambda t: (
        (A * t + jnp.eye(2)) @ (A * t + jnp.eye(2)) @ jnp.sin(A * t)
    ),
    "complex_matrix": lambda t: (
        jnp.exp(-1j * t * B) @ B @ jnp.conj(jnp.exp(-1j * t * B)).T
    ),
    "real_imag_complex": lambda t: (
        lax.complex(jnp.sin(t), jnp.cos(t) ** 2) * jnp.real(jnp.exp(1j * t))
        + jnp.imag(B * t)
    ),
    "pytree_output": lambda t: {
        "a": jnp.sin(t),
        "b": (jnp.cos(t) * A, t**3),
    },
    "jit_inside": lambda t: jax.jit(lambda x: jnp.exp(x) @ x)(A * t) + jnp.sin(t),
    "nested_jit": lambda t: jax.jit(lambda x: jax.jit(jnp.tanh)(x) * x)(t * V),
    "norm": lambda t: jnp.linalg.norm(jnp.sin(A * t)),
    "structural": lambda t: (
        jnp.concatenate([jnp.sin(t * V)[1:3], jnp.pad(jnp.cos(t * V), (1, 2))])
        .reshape(3, 3)
        .T[::-1]
    ),
    "broadcast_squeeze": lambda t: jnp.squeeze(
        jnp.broadcast_to(jnp.exp(t * V)[None, :, None], (3, 4, 1))
    ).sum(axis=0),
    "where": lambda t: (
        jnp.where(t > 0, jnp.sin(t), jnp.cos(t)) * jnp.where(V > 0, V * t, V**2 * t)
    ),
    "gather_dynamic_slice": lambda t: (
        jnp.exp(t * V)[jnp.array([2, 0, 3])]
        + lax.dynamic_slice(jnp.sin(t * V), (1,), (3,))
    ),
    "max_min_abs": lambda t: (
        jnp.maximum(jnp.sin(t), jnp.cos(t))
        + jnp.minimum(t * V, -t * V) * jnp.abs(jnp.sin(t - 1))
    ),
    "cumsum_reduce_max": lambda t: jnp.cumsum(jnp.exp(t * V)) + jnp.max(t * V),
    "softmax_logsumexp": lambda t: (
        jax.nn.softmax(jnp.sin(t * V)) + jax.scipy.special.logsumexp(t * V)
    ),
    "gelu_silu": lambda t: jax.nn.gelu(t * V) + jax.nn.silu(t * V),
    "atan2_erfc": lambda t: jnp.arctan2(t, 1 + t**2) + jax.scipy.special.erfc(t),
    "square_integer_pow": lambda t: jnp.square(jnp.sin(t)) + jnp.cos(t) ** 7,
    "einsum": lambda t: jnp.einsum(
        "ij,jk,kl->il", jnp.sin(A * t), jnp.exp(A * t), jnp.cos(A * t)
    ),
    "division_matrix": lambda t: A / (1 + t**2) + (A + 3) / (A * t + 2),
    "module_closure": _Scaled(A),
    "commutator_of_drives": lambda t: (
        (jnp.cos(t) * A) @ (A.T * jnp.sin(2 * t))
        - (A.T * jnp.sin(2 * t)) @ (jnp.cos(t) * A)
    ),
    "sin_cos_quotient": lambda t: jnp.sin(t / 2) * jnp.cos(3 * t) / (1.5 + jnp.sin(t)),
    "dtype_conversion": lambda t: (
        jnp.sin(t.astype(jnp.complex128) * B).astype(jnp.complex128) * jnp.float32(2.0)
    ),
}


@pytest.mark.parametrize("name", sorted(JET_CORPUS))
def test_against_jet(name):
    fn = JET_CORPUS[name]
    ours = taylor(fn, T0, ORDER)
    _assert_tree_close(ours, _jet_coefficients(fn, T0, ORDER), 1e-12)


def test_complex_time_against_jet():
    fn = lambda t: jnp.exp(t * B) * jnp.sin(t) + t**3
    t = 0.4 + 0.2j
    _assert_tree_close(taylor(fn, t, ORDER), _jet_coefficients(fn, t, ORDER), 1e-12)


def _fori_static(t):
    return lax.fori_loop(0, 4, lambda i, x: x @ x * 0.5 + jnp.sin(t * i), A * t)


def _fori_dynamic(t):
    upper = 3 + jnp.int32(t > 0)
    return lax.fori_loop(0, upper, lambda i, x: jnp.cos(x) * t + x, t * V)


def _scan(t):
    def body(carry, x):
        new = jnp.tanh(carry * x + t)
        return new, new * t

    carry, ys = lax.scan(body, t, V)
    return carry + ys.sum(), ys


def _scan_constant_carry(t):
    # The carry starts constant and becomes time-dependent inside the loop.
    def body(carry, x):
        return carry + x * jnp.sin(t), carry * jnp.exp(x * t)

    return lax.scan(body, jnp.zeros(()), V)


def _while(t):
    def body(carry):
        i, x = carry
        return i + 1, x * jnp.exp(t) - 0.1 * x**2

    return lax.while_loop(lambda c: c[0] < 3, body, (0, t))[1]


def _cond(t):
    return lax.cond(t > 0, lambda x: jnp.sin(x) * t, lambda x: jnp.cos(x), t * V)


def _switch_constant_index(t):
    branches = [lambda x: x**2, lambda x: jnp.exp(x), lambda x: 1.0 + 0 * x]
    return lax.switch(1, branches, t * V) + lax.switch(2, branches, t)


# Functions that `jet` cannot expand: compared with nested `jax.jacfwd`.
JACFWD_CORPUS = {
    "custom_jvp": lambda t: _softplus(jnp.sin(t) * V),
    "nn_softplus": lambda t: jax.nn.softplus(t * V),
    "fori_static": _fori_static,
    "fori_dynamic": _fori_dynamic,
    "scan": _scan,
    "scan_constant_carry": _scan_constant_carry,
    "while": _while,
    "cond": _cond,
    "switch_constant_index": _switch_constant_index,
    "checkpoint": lambda t: jax.checkpoint(lambda x: jnp.sin(x) * x)(t * V),
    "tan_atan": lambda t: jnp.tan(t) + jnp.arctan(t * V),
    "inverse_trig": lambda t: jnp.arcsin(t) + jnp.arccos(t / 2) + jnp.arcsinh(t),
    "inverse_hyperbolic": lambda t: jnp.arccosh(1 + t) + jnp.arctanh(t),
    "cbrt_exp2": lambda t: jnp.cbrt(1 + t) * jnp.exp2(t),
    "reduce_prod": lambda t: jnp.prod(jnp.sin(t * V + 1)),
    "rem": lambda t: jnp.remainder(jnp.exp(t * V), 0.7),
    "erf_inv": lambda t: jax.scipy.special.erfinv(t * V / 3),
    "clip": lambda t: jnp.clip(jnp.sin(t * V), -0.3, 0.3),
    "dynamic_update_slice": lambda t: (
        lax.dynamic_update_slice(jnp.zeros(5), jnp.exp(t * V[:2]), (2,))
        + jnp.ones(5).at[1].set(jnp.sin(t))
    ),
    "fft_convolve_scatter_add": lambda t: (
        jnp.fft.fft(jnp.exp(t * V)).real
        + jnp.convolve(jnp.sin(t * V), jnp.cos(t * V))[:4]
        + jnp.zeros(4).at[jnp.array([0, 0, 2])].add(jnp.exp(t * V[:3]))
    ),
    "misc_structural": lambda t: (
        jnp.min(jnp.sin(t * V))
        + lax.optimization_barrier(jnp.expand_dims(jax.device_put(t * V), 0))[0]
        * (jnp.sign(t) + jnp.round(t))
    ),
    "split_stack": lambda t: jnp.stack(jnp.split(jnp.sin(t * V), 2)[::-1]),
}


def test_custom_vjp_expands_the_primal():
    # A custom VJP defines reverse mode only and forward-mode references refuse it:
    # the primal computation, sin(x) ** 2, is what is expanded.
    ours = taylor(lambda t: _sin_vjp(t * V) ** 2, T0, ORDER)
    reference = _jet_coefficients(lambda t: jnp.sin(t * V) ** 2, T0, ORDER)
    _assert_tree_close(ours, reference, 1e-12)


@pytest.mark.parametrize("name", sorted(JACFWD_CORPUS))
def test_against_jacfwd(name):
    fn = JACFWD_CORPUS[name]
    order = 4
    ours = taylor(fn, T0, order)
    _assert_tree_close(ours, _jacfwd_coefficients(fn, T0, order), 1e-12)


# --- SymPy to order 20 ------------------------------------------------------------

_s = sp.Symbol("s")

# Each function twice: in JAX, and as a SymPy expression whose Taylor coefficients
# mpmath evaluates at 50 significant digits.
SYMPY_CORPUS = {
    "exp_sin_div": (
        lambda t: jnp.exp(jnp.sin(t)) / (2 + jnp.cos(t)),
        sp.exp(sp.sin(_s)) / (2 + sp.cos(_s)),
    ),
    "tanh_sqrt": (
        lambda t: jnp.tanh(t) * jnp.sqrt(1 + t**2),
        sp.tanh(_s) * sp.sqrt(1 + _s**2),
    ),
    "log_atan": (
        lambda t: jnp.log(2 + t) ** 3 * jnp.arctan(t),
        sp.log(2 + _s) ** 3 * sp.atan(_s),
    ),
    "logistic_cosh": (
        lambda t: jax.nn.sigmoid(t) * jnp.cosh(t),
        sp.cosh(_s) / (1 + sp.exp(-_s)),
    ),
    "power_erf": (
        lambda t: (1 + t) ** 0.7 + jax.scipy.special.erf(t),
        (1 + _s) ** sp.Rational(7, 10) + sp.erf(_s),
    ),
    "tan_rational": (
        lambda t: jnp.tan(t) + (1 - t) / (1 + t**2),
        sp.tan(_s) + (1 - _s) / (1 + _s**2),
    ),
}


@pytest.mark.parametrize("name", sorted(SYMPY_CORPUS))
def test_against_sympy_order_20(name):
    fn, expression = SYMPY_CORPUS[name]
    order = 20
    ours = np.asarray(taylor(fn, T0, order))
    with mpmath.workdps(50):
        reference = mpmath.taylor(
            sp.lambdify(_s, expression, "mpmath"), mpmath.mpf(3) / 10, order
        )
        reference = np.array([float(c) for c in reference])
    np.testing.assert_allclose(ours, reference, rtol=1e-11, atol=0)


# --- the transform's contract -------------------------------------------------------


def test_expand_general_input_series():
    # Any input series, not only time: compare with jet fed the same polynomial path.
    x = jnp.array([0.4, -0.3, 0.25, 0.1, -0.05, 0.02])
    y = jnp.stack([A * c for c in (1.0, 0.5, -0.2, 0.1, 0.3, -0.1)])
    fn = lambda x, y: jnp.exp(x) * jnp.tanh(y) @ y
    factorials = jnp.array([math.factorial(j) for j in range(1, ORDER + 1)])

    @jax.jit  # both in one program: neither evaluated op by op
    def expansions(x, y):
        primal, series = jet(
            fn,
            (x[0], y[0]),
            (list(x[1:] * factorials), list(y[1:] * factorials[:, None, None])),
        )
        reference = jnp.stack(
            [primal] + [d / math.factorial(j + 1) for j, d in enumerate(series)]
        )
        return expand(fn, x, y), reference

    ours, reference = expansions(x, y)
    _assert_tree_close(ours, reference, 1e-12)


def test_order_zero_and_one():
    np.testing.assert_allclose(taylor(jnp.sin, T0, 0), [np.sin(T0)])
    np.testing.assert_allclose(taylor(jnp.sin, T0, 1), [np.sin(T0), np.cos(T0)])
    # A NumPy integer order, as `CallableTimeFunction.taylor` takes (it was refused
    # by the annotation).
    want = [np.sin(T0), np.cos(T0), -np.sin(T0) / 2]
    np.testing.assert_allclose(taylor(jnp.sin, T0, np.int64(2)), want)


def test_constant_and_integer_outputs():
    out = taylor(lambda t: (A, jnp.floor(t * 10).astype(int), 2.0 * t), T0, 3)
    np.testing.assert_allclose(out[0], jnp.stack([A] + [jnp.zeros_like(A)] * 3))
    np.testing.assert_array_equal(out[1], [3, 0, 0, 0])
    np.testing.assert_allclose(out[2], [2 * T0, 2, 0, 0])


def test_float32_stays_float32():
    out = taylor(lambda t: jnp.exp(t) * jnp.sin(t), jnp.float32(0.3), 6)
    assert out.dtype == jnp.float32
    reference = _jet_coefficients(
        lambda t: jnp.exp(t) * jnp.sin(t), jnp.float64(0.3), 6
    )
    np.testing.assert_allclose(out, reference, rtol=1e-5)


def test_gradient_with_respect_to_module_parameters():
    def loss(weight):
        return jnp.sum(taylor(_Scaled(weight), T0, 6) ** 2)

    check_grads(loss, (A,), order=1, modes=["rev"])


def test_gradient_with_respect_to_closed_over_value():
    def loss(w):
        return jnp.sum(taylor(lambda t: jnp.exp(w * t) / (1 + t * t), T0, 6))

    check_grads(loss, (jnp.asarray(0.7),), order=1, modes=["rev"])


def test_vmap_over_time_equals_loop():
    fn = JET_CORPUS["tanh_matrix"]
    ts = jnp.linspace(0.1, 1.0, 4)
    batched = jax.vmap(lambda t: taylor(fn, t, ORDER))(ts)
    looped = jnp.stack([taylor(fn, t, ORDER) for t in ts])
    np.testing.assert_allclose(batched, looped, rtol=1e-14, atol=1e-14)


def test_no_retrace_when_time_changes():
    traces = []

    def fn(t):
        traces.append(None)
        return jnp.sin(t) * A

    for t in (0.1, 0.2, jnp.asarray(0.3), np.float64(0.4)):
        taylor(fn, t, 4)
    assert len(traces) == 1


def test_traced_program_does_not_grow_with_order():
    fn = JET_CORPUS["sin_exp_div_cos"]
    sizes = [
        len(str(jax.make_jaxpr(lambda t, k=order: taylor(fn, t, k))(T0)))
        for order in (3, 40)
    ]
    assert abs(sizes[0] - sizes[1]) < 0.02 * sizes[0]


def test_unsupported_primitive_is_named():
    def sample(t):
        return jax.random.gamma(jax.random.key(0), 2.0 + t * V)

    with pytest.raises(NotImplementedError, match="'random_gamma'.*sample.*stop_grad"):
        taylor(sample, T0, 3)


def test_supported_primitives_listed():
    names = supported_primitives()
    for name in ("mul", "dot_general", "exp", "sin", "scan", "while", "cond"):
        assert name in names


@pytest.mark.parametrize("order", [-1, 2.0, True, "3", 10**5])
def test_bad_order(order):
    with pytest.raises((TypeError, ValueError), match="order"):
        taylor(jnp.sin, T0, order)


@pytest.mark.parametrize("t", [jnp.ones(2), "0.3", None, float("nan"), True])
def test_bad_time(t):
    with pytest.raises((TypeError, ValueError), match="t"):
        taylor(jnp.sin, t, 3)


def test_bad_function():
    with pytest.raises(TypeError, match="fn"):
        taylor(3.0, T0, 3)  # pyright: ignore[reportArgumentType]


def test_a_python_int_time_is_a_real_time():
    import hierax

    """`t = 3` (a Python int) is the real time 3.0: an integer input series made the
    series of t^2 [9, 0, 0, 0] and that of sin at 0 all zeros. Checked against
    the closed forms, and the same program as a float time."""
    np.testing.assert_allclose(
        np.asarray(hierax.taylor(lambda t: t**2, 3, order=3)), [9, 6, 1, 0], rtol=0
    )
    np.testing.assert_allclose(
        np.asarray(hierax.taylor(jnp.sin, 0, order=3)), [0, 1, 0, -1 / 6], rtol=1e-15
    )
    series = np.asarray(hierax.Gaussian().taylor(2, 2))
    np.testing.assert_allclose(
        series, np.exp(-2.0) * np.array([1, -2, 1.5]), rtol=1e-14
    )


def test_zero_base_to_a_time_dependent_power():
    """`0.0 ** f(t)` with f(t) > 0 is the constant 0, as `jax.jvp` has it: the rule
    took log(0) = -inf and returned NaN from coefficient 1 on."""
    series = np.asarray(taylor(lambda t: 0.0 ** (1 + t * t), 0.5, 4))
    np.testing.assert_array_equal(series, np.zeros(5))
    series = np.asarray(taylor(lambda t: jnp.zeros(2) ** (1 + t), 0.5, 3))
    np.testing.assert_array_equal(series, np.zeros((4, 2)))


class _SinePower(eqx.Module):
    exponent: jax.Array

    def __call__(self, t):
        return jnp.sin(t) ** self.exponent


def test_array_exponent_at_a_zero_base():
    """An exponent held in an array (closed over, or a module's field) is traced, so
    the rule cannot see it is an integer: `t ** jnp.array(2.0)` at 0 was NaN from
    coefficient 1 on. Integer exponents are exact there, as the docstring promises."""
    two = jnp.array(2.0)
    np.testing.assert_array_equal(
        np.asarray(taylor(lambda t: t**two, 0.0, 5)), [0, 0, 1, 0, 0, 0]
    )
    exact = [0, 0, 0, 1, 0, -1 / 2, 0, 13 / 120]  # sin(t)^3
    series = np.asarray(taylor(_SinePower(jnp.array(3.0)), 0.0, 7))
    np.testing.assert_allclose(series, exact, rtol=1e-14, atol=1e-15)
    # Away from the zero base and for gradients in the exponent, nothing changes.
    grad = jax.grad(lambda p: taylor(_SinePower(p), 0.3, 3)[2])(2.5)
    reference = jax.grad(
        lambda p: jax.grad(jax.grad(lambda t: jnp.sin(t) ** p))(0.3) / 2
    )(2.5)
    np.testing.assert_allclose(grad, reference, rtol=1e-12)


def _binomial(p, k):
    return np.prod([(p - i) / (i + 1) for i in range(k)], axis=0)


def test_array_exponent_of_an_array_base():
    """An exponent array of the base's shape: the rule added a `(K + 1, 1, 1)` index
    to a `(2, 3)` one, which this suite's `jax_numpy_rank_promotion = "raise"`
    refused. Against the binomial series and, at a zero base, sin(t)^2 and t^3."""
    p = jnp.array([[2.0, 2.5, 3.0], [1.0, 0.5, 4.0]])
    series = np.asarray(taylor(lambda t: (1 + t) ** p, 0.3, 4))
    pn = np.asarray(p)
    exact = [_binomial(pn, k) * 1.3 ** (pn - k) for k in range(5)]
    np.testing.assert_allclose(series, np.stack(exact), rtol=1e-14)
    q = jnp.array([[2.0, 3.0]])
    series = np.asarray(
        taylor(lambda t: jnp.stack([jnp.sin(t), t])[None, :] ** q, 0.0, 4)
    )
    np.testing.assert_allclose(series[:, 0, 0], [0, 0, 1, 0, -1 / 3], atol=1e-16)
    np.testing.assert_array_equal(series[:, 0, 1], [0, 0, 0, 1, 0])


def test_saturated_tanh_and_logistic():
    """Where tanh or the logistic rounds to 1, their slope 1 - y^2 (y - y^2) cancelled
    to 0 and every coefficient above 0 was 0: tanh at 30 has slope sech(30)^2 =
    3.5e-26. Against mpmath at 60 digits."""
    for fn, exact, t in [
        (jnp.tanh, mpmath.tanh, 30.0),
        (jnp.tanh, mpmath.tanh, -30.0),
        (jax.nn.sigmoid, lambda x: 1 / (1 + mpmath.exp(-x)), 40.0),
    ]:
        with mpmath.workdps(60):
            reference = [float(c) for c in mpmath.taylor(exact, mpmath.mpf(t), 5)]
        series = np.asarray(taylor(fn, t, 5))
        np.testing.assert_allclose(series, reference, rtol=1e-13, atol=0)
