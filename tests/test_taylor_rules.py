"""`hierax.taylor` on custom-JVP functions at their guard points, linear algebra,
sorting, cumulative reductions and diffrax solves, against nested `jax.jvp`, mpmath
at 60 digits, and closed forms."""

import math

import diffrax
import jax
import jax.extend.core as jex
import jax.lax as lax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest

import hierax
from hierax._taylor._core import FORMER_NAMES, RULES

from .test_taylor_jet_suite import assert_close


def nested_jvp(fn, t, order):
    """Normalised coefficients of `fn` at `t` from `order` nested `jax.jvp`s."""

    def derivative(g):
        return lambda s: jax.jvp(g, (s,), (jnp.ones_like(s),))[1]

    derivatives, g = [], fn
    for _ in range(order + 1):
        derivatives.append(g)
        g = derivative(g)

    @jax.jit
    def coefficients(t):
        values = [d(t) for d in derivatives]
        return jax.tree.map(
            lambda *v: jnp.stack([x / math.factorial(j) for j, x in enumerate(v)]),
            *values,
        )

    return coefficients(jnp.asarray(t))


# --- custom_jvp functions by their rule: the wrong answers -----------------


@jax.custom_jvp
def _softplus_self(x):
    # Primal with a max/abs branch; a rule that uses its own output (as logaddexp's).
    return jnp.maximum(x, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(x)))


@_softplus_self.defjvp
def _softplus_self_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    y = _softplus_self(x)
    return y, dx * jnp.exp(x - y)


def _scaled_sinc(x, k):
    return k * jnp.sinc(x)


GUARD_POINTS = {
    # name: (function, guard point)
    "softplus": (jax.nn.softplus, 0.0),
    "logaddexp_tie": (lambda t: jnp.logaddexp(t, 0.0), 0.0),
    "logaddexp_two_series": (lambda t: jnp.logaddexp(2 * t, jnp.sin(t)), 0.0),
    "log_sigmoid": (jax.nn.log_sigmoid, 0.0),
    "sinc": (jnp.sinc, 0.0),
    "xlogy": (lambda t: jax.scipy.special.xlogy(t, 2.0), 0.0),
    "xlog1py": (lambda t: jax.scipy.special.xlog1py(t, 1.0), 0.0),
    "user_self_recursive": (_softplus_self, 0.0),
    "nondiff_argument": (jax.custom_jvp(_scaled_sinc, nondiff_argnums=(1,)), 0.0),
    "relu_away_from_kink": (lambda t: jax.nn.relu(t) ** 2 + jax.nn.silu(t), 0.4),
}
_nondiff = GUARD_POINTS["nondiff_argument"][0]
_nondiff.defjvp(
    lambda k, primals, tangents: (
        _nondiff(primals[0], k),
        k * jax.jvp(jnp.sinc, primals, tangents)[1],
    )
)
GUARD_POINTS["nondiff_argument"] = (lambda t: _nondiff(t, 3.0), 0.0)


@pytest.mark.parametrize("name", sorted(GUARD_POINTS))
def test_custom_jvp_at_guard_point(name):
    fn, t0 = GUARD_POINTS[name]
    assert_close(hierax.taylor(fn, t0, 5), nested_jvp(fn, t0, 5))


def test_custom_jvp_known_values():
    # The values the issue quotes, and sinc's Maclaurin series.
    np.testing.assert_allclose(
        hierax.taylor(jax.nn.softplus, 0.0, 4),
        [math.log(2), 0.5, 0.125, 0.0, -1 / 192],
        rtol=1e-14,
        atol=1e-16,
    )
    pi2 = math.pi**2
    np.testing.assert_allclose(
        hierax.taylor(jnp.sinc, 0.0, 6),
        [1, 0, -pi2 / 6, 0, pi2**2 / 120, 0, -(pi2**3) / 5040],
        rtol=1e-14,
        atol=1e-16,
    )


def _program_size(jaxpr):
    size = 0
    for eqn in jaxpr.eqns:
        size += 1
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, jex.ClosedJaxpr):
                    size += _program_size(sub.jaxpr)
                elif isinstance(sub, jex.Jaxpr):
                    size += _program_size(sub)
    return size


def _traced_size(fn, order):
    return _program_size(
        jax.make_jaxpr(lambda t: hierax.taylor(fn, t, order))(0.3).jaxpr
    )


@pytest.mark.parametrize(
    "fn",
    [
        jax.nn.softplus,
        lambda t: jnp.linalg.solve(
            jnp.array([[2.0, t], [jnp.sin(t), 3.0]]), jnp.array([1.0, t])
        ),
    ],
    ids=["self_recursive_custom_jvp", "linalg_solve"],
)
def test_program_size_flat_in_order(fn):
    assert _traced_size(fn, 10) == _traced_size(fn, 100)


# --- clamp and the rule table ------------------------------------------------------


def test_clamp_lower_bound_above_upper():
    fn = lambda t: lax.clamp(1 + 2 * t, 3 * t, -1 + t)  # JAX: hi when lo > hi
    ours = hierax.taylor(fn, 0.0, 3)
    np.testing.assert_array_equal(ours, [-1.0, 1.0, 0.0, 0.0])
    assert_close(ours, nested_jvp(fn, 0.0, 3))


def _installed_primitive_names():
    import sys

    names = set()
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "") or ""
        if name.split(".")[0] not in ("jax", "jaxlib", "equinox"):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, jex.Primitive):
                names.add(value.name)
    return names


def test_every_registered_name_is_a_primitive():
    # A misspelt or renamed primitive must fail here, not register nothing.
    installed = _installed_primitive_names()
    former = {name for names in FORMER_NAMES.values() for name in names}
    assert {"mul", "custom_linear_solve", "maybe_set", "select_if_vmap"} <= installed
    assert sorted(set(RULES) - installed - former) == []
    assert all(current in installed for current in FORMER_NAMES)


def test_refusal_names_function_line_and_remedy():
    def fn(t):
        return jnp.linalg.eig(jnp.array([[1.0, t], [0.0, 2.0]]))[0].real

    with pytest.raises(NotImplementedError) as info:
        hierax.taylor(fn, 0.3, 3)
    message = str(info.value)
    assert "`jnp.linalg.eig`" in message and "'eig'" in message
    assert f"{__file__}:" in message and " in function fn" in message
    assert "eigh" in message  # what to do


def test_custom_jvp_rule_that_cannot_be_traced_is_reported():
    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    @f.defjvp
    def f_jvp(primals, tangents):
        raise RuntimeError("no derivative here")

    with pytest.raises(NotImplementedError, match="JVP rule raised RuntimeError"):
        hierax.taylor(f, 0.3, 2)


# --- linear algebra, sorting, cumulative ops --------------------------------------

# The cases (and their matrices A, B, D, V, `_hermitian`) are shared with
# `benchmarks/bench_taylor.py --check`, which runs them at higher order.
from benchmarks.taylor_cases import LINALG, A, B, D, V, hermitian, matrix  # noqa: E402


@pytest.mark.parametrize("name", sorted(LINALG))
def test_linalg_sort_cumulative_against_nested_jvp(name):
    # Order 3 keeps nested jvp cheap; order 10 is checked against mpmath below, and
    # against nested jvp in benchmarks/bench_taylor.py (`--check`).
    fn = LINALG[name]
    assert_close(hierax.taylor(fn, 0.3, 3), nested_jvp(fn, 0.3, 3), rtol=1e-12)


def test_expm_closed_form_order_10():
    # expm((t0 + s) A) = expm(t0 A) sum_j (s A)^j / j!
    order, t0 = 10, 0.3
    ours = hierax.taylor(lambda t: jax.scipy.linalg.expm(t * A), t0, order)
    term = jax.scipy.linalg.expm(t0 * A)
    reference = [term]
    for j in range(1, order + 1):
        term = term @ A / j
        reference.append(term)
    assert_close(ours, jnp.stack(reference), rtol=1e-12)


def _mp_matrix(t):
    a, b, d = (mp.matrix(np.asarray(x).tolist()) for x in (A, B, D))
    return a + mp.sin(t) * b + t**2 * d


def _mp_hermitian(t):
    a, b, d = (mp.matrix(np.asarray(x).tolist()) for x in (A, B, D))
    return a + a.T + mp.sin(t) * (b + b.T) + t**2 * d


MPMATH = {
    # name: (JAX function, mpmath function of t returning a list of mpf)
    "solve": (
        lambda t: jnp.linalg.solve(matrix(t), jnp.cos(t) * jnp.arange(1.0, 4.0)),
        lambda t: list(mp.lu_solve(_mp_matrix(t), mp.cos(t) * mp.matrix([1, 2, 3]))),
    ),
    "det": (
        lambda t: jnp.linalg.det(matrix(t))[None],
        lambda t: [mp.det(_mp_matrix(t))],
    ),
    "eigh_values": (
        lambda t: jnp.linalg.eigh(hermitian(t))[0],
        lambda t: sorted(mp.eigsy(_mp_hermitian(t), eigvals_only=True)),
    ),
    "sort_cumprod": (
        lambda t: jnp.concatenate(
            [jnp.sort(jnp.sin(t * V + V)), jnp.cumprod(jnp.sin(t * V + 1))]
        ),
        lambda t: (
            sorted(mp.sin(t * v + v) for v in np.asarray(V).tolist())
            + [
                mp.fprod(mp.sin(t * v + 1) for v in np.asarray(V)[: i + 1].tolist())
                for i in range(len(V))
            ]
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(MPMATH))
def test_linalg_sort_cumulative_order_10_against_mpmath(name):
    fn, reference_fn = MPMATH[name]
    order, t0 = 10, 0.3
    ours = np.asarray(hierax.taylor(fn, t0, order))
    with mp.workdps(60):
        count = len(reference_fn(mp.mpf(t0)))
        reference = np.array(
            [
                [
                    float(c)
                    for c in mp.taylor(
                        lambda t, i=i: reference_fn(t)[i], mp.mpf(3) / 10, order
                    )
                ]
                for i in range(count)
            ]
        ).T
    assert_close(ours, reference, rtol=1e-12)


def test_eigh_degenerate_spectrum_is_refused():
    fn = lambda t: jnp.linalg.eigh(
        jnp.eye(3) + t * jnp.diag(jnp.array([0.0, 0.0, 1.0]))
    )
    with pytest.raises(Exception, match="repeated eigenvalue"):
        jax.block_until_ready(hierax.taylor(fn, 0.3, 3))


# --- diffrax ----------------------------------------------------------------------


def _solve(t, adjoint, controller):
    term = diffrax.ODETerm(lambda s, y, a: -a * y + jnp.sin(s) * y[::-1])
    solution = diffrax.diffeqsolve(
        term,
        diffrax.Tsit5(),
        0.0,
        1.0,
        0.1,
        jnp.array([1.0, 2.0]) * jnp.cos(t),
        args=0.5 + t,
        adjoint=adjoint,
        stepsize_controller=controller,
    )
    assert solution.ys is not None
    return solution.ys[-1]


@pytest.mark.parametrize(
    ("controller", "order"),
    [
        (diffrax.ConstantStepSize(), 3),
        (diffrax.PIDController(rtol=1e-6, atol=1e-8), 2),
    ],
    ids=["constant", "adaptive"],
)
def test_diffrax_against_nested_jvp(controller, order):
    forward = lambda t: _solve(t, diffrax.ForwardMode(), controller)
    checkpointed = lambda t: _solve(t, diffrax.RecursiveCheckpointAdjoint(), controller)
    # The reference's compile doubles with each order (through the adaptive loop
    # most of all): order 3 with constant steps, order 2 with adaptive ones. Order
    # 10 is checked on a linear ODE below.
    reference = nested_jvp(forward, 0.3, order)
    assert_close(hierax.taylor(forward, 0.3, order), reference)
    assert_close(hierax.taylor(checkpointed, 0.3, order), reference)


def test_diffrax_linear_ode_order_10_closed_form():
    # y' = -lam y, y(0) = 1, lam = 0.7 + t: y(1) = exp(-lam), whose coefficients in t
    # are exp(-0.7) (-1)^j / j!. Tsit5 with step 1/200: the discretisation error of
    # y(1) is about 1e-14 here and grows with the coefficient's order like the
    # j-th lam-derivative of the local error term (lam h)^5 h; 1e-10 relative bounds
    # every coefficient to order 10.
    def fn(t):
        term = diffrax.ODETerm(lambda s, y, lam: -lam * y)
        solution = diffrax.diffeqsolve(
            term, diffrax.Tsit5(), 0.0, 1.0, 1 / 200, jnp.array(1.0), args=0.7 + t
        )
        assert solution.ys is not None
        return solution.ys[-1]

    order = 10
    ours = np.asarray(hierax.taylor(fn, 0.0, order))
    exact = np.array(
        [math.exp(-0.7) * (-1) ** j / math.factorial(j) for j in range(order + 1)]
    )
    errors = np.abs(ours - exact) / np.abs(exact)
    assert np.max(errors) < 1e-10, errors
