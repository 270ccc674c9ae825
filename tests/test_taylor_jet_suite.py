"""The cases of JAX's own `jax.experimental.jet` test suite (tests/jet_test.py),
rewritten as one table and run through `hierax._taylor.expand`.

Every case pushes random input series through a function and compares the output
series, at 1e-12 relative (x64), with nested `jax.jvp` along the polynomial curve the
series describe, and with `jet` where `jet` has rules. Integer- and boolean-valued
cases must return their value with vanishing higher coefficients.
"""

import math
import zlib
from functools import partial

import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.jet import jet

from hierax._taylor import expand


ORDER = 3
SHAPE = (2, 3)


def nested_jvp_coefficients(fn, coefficients, order):
    """Normalised coefficients of $s \\mapsto$ `fn(x(s))`, $x(s) = \\sum_j c_j s^j$,
    from `order` nested `jax.jvp`s (integer inputs are held at their value)."""

    def curve(s):
        args = []
        for c in coefficients:
            if jnp.issubdtype(c.dtype, jnp.inexact):
                x = c[-1]
                for coefficient in c[-2::-1]:  # Horner: smooth at s = 0
                    x = coefficient + s.astype(c.dtype) * x
                args.append(x)
            else:
                args.append(c[0])
        return fn(*args)

    def derivative(g):
        return lambda s: jax.jvp(g, (s,), (jnp.ones_like(s),))[1]

    derivatives, g = [], curve
    for _ in range(order + 1):
        derivatives.append(g)
        g = derivative(g)
    values = [d(jnp.zeros(())) for d in derivatives]
    return jax.tree.map(
        lambda *v: jnp.stack([x / math.factorial(j) for j, x in enumerate(v)]),
        *values,
    )


def jet_coefficients(fn, coefficients):
    """The same coefficients from `jet`, which takes and returns derivatives."""
    factorial = [math.factorial(j) for j in range(1, ORDER + 1)]
    primals = [c[0] for c in coefficients]
    series = [
        [c[j] * factorial[j - 1] for j in range(1, ORDER + 1)] for c in coefficients
    ]
    out, terms = jet(fn, primals, series)
    structure = jax.tree.structure(out)
    stacked = [
        jnp.stack([y] + [d / f for d, f in zip(t, factorial)])
        for y, t in zip(jax.tree.leaves(out), structure.flatten_up_to(terms))
    ]
    return jax.tree.unflatten(structure, stacked)


def assert_close(ours, reference, rtol=1e-12):
    ours_leaves, ref_leaves = jax.tree.leaves(ours), jax.tree.leaves(reference)
    assert jax.tree.structure(ours) == jax.tree.structure(reference)
    for a, b in zip(ours_leaves, ref_leaves):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, (a.shape, b.shape)
        finite = np.isfinite(b)
        np.testing.assert_array_equal(np.isfinite(a), finite)
        scale = max(np.max(np.abs(b[finite]), initial=0.0), 1e-300)
        error = np.max(np.abs(a[finite] - b[finite]), initial=0.0) / scale
        assert error <= rtol, (error, a, b)


# --- the inputs -----------------------------------------------------------------


def _rng(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


def _series(rng, lims=(-2.0, 2.0), dtype=np.float64, shape=SHAPE):
    """A primal uniform in `lims`, higher coefficients standard normal (jet_test's
    choice), as one `(ORDER + 1, *shape)` array."""
    lo, hi = lims
    primal = lo + (hi - lo) * rng.random(shape)
    rest = rng.standard_normal((ORDER,) + shape)
    if np.issubdtype(dtype, np.complexfloating):
        primal = primal + 1j * (lo + (hi - lo) * rng.random(shape))
        rest = rest + 1j * rng.standard_normal((ORDER,) + shape)
    return jnp.asarray(np.concatenate([primal[None], rest]), dtype)


def _constant(value):
    """A non-differentiable input (bool, int) as a series array."""
    value = jnp.asarray(value)
    return jnp.broadcast_to(value, (ORDER + 1,) + value.shape)


# Each case: name -> (function, input builder taking an rng). Names follow
# jet_test.py's test methods.
def _unary(lims=(-2.0, 2.0), dtype: type = np.float64):
    return lambda rng: [_series(rng, lims, dtype)]


def _binary(lims=(-2.0, 2.0), ylims=None):
    return lambda rng: [_series(rng, lims), _series(rng, ylims or lims)]


def _conv(w, b, x):
    out = lax.conv_general_dilated(
        x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return out + b.reshape(1, 1, 1, -1)


def _select_inputs(rng):
    return [_constant(rng.random(SHAPE) < 0.5), _series(rng), _series(rng)]


def _add_any(eps):
    f = lambda x, eps: x * eps + eps + x
    return jax.grad(f)(jnp.asarray(1.0), eps)


def _scatter_add(eps):
    x = jnp.array([1.0, 1.0])

    def F(t):
        y = x + t * eps * x
        return (y[0] ** 5 + y[1] ** 5).sum()

    return jax.grad(jax.jacfwd(F))(0.0)


def _scalar(rng):
    return [_series(rng, shape=())]


def _dot_inputs(rng):
    return [_series(rng, shape=(2, 3)), _series(rng, shape=(3, 4))]


def _conv_inputs(rng):
    return [
        _series(rng, shape=(2, 2, 1, 3)),
        _series(rng, shape=(3,)),
        _series(rng, shape=(1, 5, 5, 1)),
    ]


def _three(lims):
    return lambda rng: [_series(rng, lims) for _ in range(3)]


def _int_inputs(dtype, count, lims=(-2, 2)):
    def build(rng):
        values = [rng.integers(lims[0], lims[1] + 1, SHAPE) for _ in range(count)]
        return [_constant(jnp.asarray(v, dtype)) for v in values]

    return build


CASES = {
    **{f"int_pow_{p}": (lambda x, p=p: x**p, _unary()) for p in range(6)},
    "int_pow_10_at_0": (lambda x: x**10, _unary((0.0, 0.0))),
    "exp": (jnp.exp, _unary()),
    "neg": (jnp.negative, _unary()),
    "floor": (jnp.floor, _unary()),
    "ceil": (jnp.ceil, _unary()),
    "trunc": (jnp.trunc, _unary()),
    "round": (lax.round, _unary()),
    "sign": (lax.sign, _unary()),
    "real": (lax.real, _unary(dtype=np.complex128)),
    "conj": (lax.conj, _unary(dtype=np.complex128)),
    "imag": (lax.imag, _unary(dtype=np.complex128)),
    "log": (jnp.log, _unary((0.8, 4.0))),
    "gather": (lambda x: x[1:], _unary()),
    "reduce_max": (lambda x: x.max(axis=1), _unary()),
    "reduce_min": (lambda x: x.min(axis=1), _unary()),
    "all_max": (jnp.max, _unary()),
    "all_min": (jnp.min, _unary()),
    "stopgrad": (lax.stop_gradient, _unary()),
    "abs": (jnp.abs, _unary()),
    "fft": (jnp.fft.fft, _unary()),
    "log1p": (jnp.log1p, _unary((0.0, 4.0))),
    "expm1": (jnp.expm1, _unary()),
    "sin": (jnp.sin, _unary()),
    "cos": (jnp.cos, _unary()),
    "sinh": (jnp.sinh, _unary()),
    "cosh": (jnp.cosh, _unary()),
    "tanh": (jnp.tanh, _unary((-500.0, 500.0))),
    "logistic": (lax.logistic, _unary((-100.0, 100.0))),
    "expit": (jax.scipy.special.expit, _unary((-500.0, 500.0))),
    "sqrt": (jnp.sqrt, _unary((0.0, 5.0))),
    "rsqrt": (lax.rsqrt, _unary((0.0, 5000.0))),
    "asinh": (lax.asinh, _unary((-100.0, 100.0))),
    "acosh": (lax.acosh, _unary((-100.0, 100.0))),
    "atanh": (lax.atanh, _unary((-1.0, 1.0))),
    "erf": (lax.erf, _unary()),
    "erfc": (lax.erfc, _unary()),
    "erf_inv": (lax.erf_inv, _unary((-1.0, 1.0))),
    "cumsum": (jnp.cumsum, _unary()),
    "cumprod": (jnp.cumprod, _unary()),
    "cummax": (partial(lax.cummax, axis=0), _unary()),
    "cummin": (partial(lax.cummin, axis=0), _unary()),
    "dynamic_slice": (
        partial(lax.dynamic_slice, start_indices=(1, 2), slice_sizes=(1, 1)),
        _unary(),
    ),
    "dynamic_update_slice": (
        partial(
            lax.dynamic_update_slice,
            start_indices=(1, 2),
            update=np.arange(6.0).reshape(2, 3),
        ),
        _unary(),
    ),
    "copy": (jnp.array, _unary()),
    "div": (lambda x, y: x / y, _binary((0.8, 4.0))),
    "rem": (lax.rem, _binary((0.8, 4.0))),
    "complex": (lax.complex, _binary()),
    "sub": (lambda x, y: x - y, _binary()),
    "add": (lambda x, y: x + y, _binary()),
    "mul": (lambda x, y: x * y, _binary()),
    "max": (lax.max, _binary()),
    "min": (lax.min, _binary()),
    "pow": (lambda x, y: x**y, _binary((0.2, 500.0), (-500.0, 500.0))),
    "atan2": (lax.atan2, _binary((-40.0, 40.0))),
    "dot": (jnp.dot, _dot_inputs),
    "conv": (_conv, _conv_inputs),
    "clamp": (lax.clamp, _three((-1.0, 1.0))),
    "process_call": (lambda x: jax.jit(lambda x: x * x)(x), _unary()),
    "post_process_call": (lambda x: jax.jit(lambda y: x * y)(2.0), _unary()),
    "select": (jnp.where, _select_inputs),
    "inst_zero": (lambda x: jnp.full_like(x, 2.0), _unary()),
    "inst_zero_mul": (lambda x: 2.0 + 0 * x, _unary()),
    "add_any": (_add_any, _scalar),
    "scatter_add": (_scatter_add, _scalar),
    **{
        f"stack_axis_{a}": (lambda *xs, a=a: jnp.stack(xs, axis=a), _three((-2.0, 2.0)))
        for a in (0, 1, -1)
    },
    **{
        f"unstack_axis_{a}": (lambda x, a=a: lax.unstack(x, axis=a), _unary())
        for a in (0, 1, -1)
    },
}

# Integer- and boolean-valued functions (jet_test.py skips them: jet has no float0).
INTEGER_CASES = {
    "is_finite": (lax.is_finite, _unary()),
    "and": (lax.bitwise_and, _int_inputs(jnp.bool_, 2, (0, 1))),
    "or": (lax.bitwise_or, _int_inputs(jnp.bool_, 2, (0, 1))),
    "xor": (jnp.bitwise_xor, _int_inputs(jnp.bool_, 2, (0, 1))),
    "shift_left": (lax.shift_left, _int_inputs(jnp.int32, 2, (0, 4))),
    "shift_right_a": (lax.shift_right_arithmetic, _int_inputs(jnp.int32, 2, (0, 4))),
    "shift_right_l": (lax.shift_right_logical, _int_inputs(jnp.int32, 2, (0, 4))),
    "le": (lambda x, y: x <= y, _binary()),
    "gt": (lambda x, y: x > y, _binary()),
    "lt": (lambda x, y: x < y, _binary()),
    "ge": (lambda x, y: x >= y, _binary()),
    "eq": (lambda x, y: x == y, _binary()),
    "ne": (lambda x, y: x != y, _binary()),
    "not": (lax.bitwise_not, _int_inputs(jnp.bool_, 1, (0, 1))),
    "floor_to_int": (lambda x: jnp.floor(x).astype(jnp.int32), _unary()),
}

# Cases `jet` has no rule for, and `clamp`, where jet's answer differs from nested
# jvp's (and ours) wherever the lower bound exceeds the upper one.
JET_SKIPS = {"cumprod", "cummax", "cummin", "scatter_add", "add_any", "sign", "clamp"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_jet_suite_case(name):
    fn, build = CASES[name]
    inputs = build(_rng(name))
    with_jet = name not in JET_SKIPS

    # Ours and both references in one program: one compile instead of three, and
    # none of the op-by-op dispatch of evaluating `expand` or `jet` eagerly.
    @jax.jit
    def expansions(*inputs):
        return (
            expand(fn, *inputs),
            nested_jvp_coefficients(fn, inputs, ORDER),
            jet_coefficients(fn, inputs) if with_jet else None,
        )

    ours, nested, jetted = expansions(*inputs)
    assert_close(ours, nested)
    if with_jet:
        assert_close(ours, jetted)


@pytest.mark.parametrize("name", sorted(INTEGER_CASES))
def test_jet_suite_integer_case(name):
    fn, build = INTEGER_CASES[name]
    inputs = build(_rng(name))
    ours, value = jax.jit(
        lambda *inputs: (expand(fn, *inputs), fn(*[c[0] for c in inputs]))
    )(*inputs)
    assert ours.dtype == value.dtype
    np.testing.assert_array_equal(ours[0], value)
    np.testing.assert_array_equal(ours[1:], np.zeros_like(ours[1:]))
