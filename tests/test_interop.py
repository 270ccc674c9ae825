"""QuTiP and dynamiqs objects straight in: each kind converted against the same system
built natively in hierax, QuTiP's own evaluation of its sampled coefficients, the
term structure kept, the errors for what cannot be converted, and no import of
either package by hierax itself."""

import functools
import importlib
import textwrap
import warnings

import dynamiqs as dq
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import qutip as qt
import scipy.interpolate

import hierax
from hierax._operators._interop import as_state

from .helpers import fresh_output, fresh_script, relative_error


dq.set_precision("double")  # dynamiqs defaults to single precision

TOL = 1e-13
ORDER = 6
TIMES = (0.0, 0.37, 1.0, 1.61)  # inside the knots, at knots, at the last knot
W = 1.3  # the drive's angular frequency
TLIST = np.linspace(0.0, 1.6, 9)
SAMPLES = np.sin(2.0 * TLIST) + 0.3 * TLIST**2

# The driven qubit pair: H(t) = 0.5 Z1 + 0.3 Z2 + 0.2 X1 X2 + p(t) X1 + g(t) Y2, p a
# polynomial ramp, g the cubic spline through the samples; observable X1 + Z2. (QuTiP
# refuses coefficient functions that return JAX arrays, so the ramp is written with
# Python arithmetic, which both QuTiP and JAX evaluate.)
I2, X, Y, Z = (np.eye(2), np.array([[0, 1], [1, 0]]), np.array([[0, -1j], [1j, 0]]),
               np.diag([1.0, -1.0]))  # fmt: skip
X1, Z1 = np.kron(X, I2), np.kron(Z, I2)
Y2, Z2 = np.kron(I2, Y), np.kron(I2, Z)
STATIC = 0.5 * Z1 + 0.3 * Z2 + 0.2 * np.kron(X, X)
OBSERVABLE = X1 + Z2


RAMP = (0.4, W, -0.6)  # p(t) = 0.4 + W t - 0.6 t^2


def _ramp(t, a, b, c):
    return a + b * t + c * t**2


def _native_hamiltonian():
    return hierax.TimeOperator(
        [1.0, hierax.Polynomial(np.array(RAMP)), hierax.CubicSpline(TLIST, SAMPLES)],
        [STATIC, X1, Y2],
    )


def _q(matrix):
    return qt.Qobj(matrix, dims=[[2, 2], [2, 2]])


@functools.cache
def _qutip_hamiltonian():
    drive = qt.coefficient(_ramp, args=dict(zip("abc", RAMP)))
    return qt.QobjEvo([_q(STATIC), [_q(X1), drive], [_q(Y2), SAMPLES]], tlist=TLIST)


def _jax_drive(t):
    return jnp.cos(W * t)


@functools.cache
def _dynamiqs_hamiltonian():
    static = dq.asqarray(STATIC, layout=dq.dia)
    return (
        dq.modulated(lambda t: _ramp(t, *RAMP), dq.asqarray(X1))
        + static
        + dq.modulated(hierax.CubicSpline(TLIST, SAMPLES), dq.asqarray(Y2))
    )


@eqx.filter_jit
def _series(operator, times):
    """The operator's Taylor coefficients at each time (one compiled call)."""
    return jax.vmap(lambda t: operator.taylor(t, ORDER))(times)


@eqx.filter_jit
def _values(operator, times):
    return jax.vmap(operator)(times)


PSI = np.array([0.6, 0.0, 0.8j, 0.0])  # a state of the pair


@functools.cache
def _native_derivatives():
    """The native system's propagator derivatives on PSI, computed once."""
    propagator = hierax.PropagatorDerivatives(_native_hamiltonian(), ORDER)
    return [propagator(t, PSI) for t in TIMES]


def _check_system(hamiltonian, state):
    """The propagator derivatives built from the converted Hamiltonian and state
    against the native ones (levels 0..K: the Hamiltonian's series to order K - 1
    and the state, all compared)."""
    propagator = hierax.PropagatorDerivatives(hamiltonian, ORDER)
    for t, expected in zip(TIMES, _native_derivatives()):
        assert relative_error(propagator(t, state), expected) < TOL


# ----------------------------------------------------------------------------------
# QuTiP
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["CSR", "Dense", "Dia"])
def test_qobj_operator_each_layout(layout):
    qobj = _q(STATIC + 0.7j * np.kron(X, Y)).to(layout)
    operator = hierax.as_operator(qobj)
    assert isinstance(operator, hierax.TimeOperator)
    assert operator.is_sparse == (layout != "Dense")
    np.testing.assert_array_equal(np.asarray(operator(0.4)), qobj.full())
    np.testing.assert_array_equal(
        np.asarray((hierax.Cos(2.0) * qobj)(0.4)), np.cos(0.8) * qobj.full()
    )


def test_qobjevo_matches_native():
    ket = qt.Qobj(PSI[:, None], dims=[[2, 2], [1, 1]])
    _check_system(_qutip_hamiltonian(), ket)


def test_qobjevo_keeps_one_term_per_element():
    operator = hierax.as_operator(_qutip_hamiltonian())
    assert isinstance(operator, hierax.TimeOperator)
    kinds = sorted(type(f).__name__ for f in operator.functions)
    assert kinds == ["CallableTimeFunction", "Constant", "CubicSpline"]


def _dict_style(t, args: dict):
    return args["w"] * t**3


@pytest.mark.parametrize("style", ["pythonic", "dict", "time only", "jax"])
def test_qutip_function_coefficient_arguments(style):
    if style == "pythonic":
        coefficient = qt.coefficient(lambda t, w: w * t**3, args={"w": W})
    elif style == "dict":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            coefficient = qt.coefficient(_dict_style, args={"w": W})
    elif style == "time only":
        coefficient = qt.coefficient(lambda t: W * t**3)
    else:  # built directly, as QuTiP's `coefficient` refuses JAX outputs
        function_coefficient = importlib.import_module("qutip.core.cy.coefficient")
        coefficient = function_coefficient.FunctionCoefficient(
            lambda t, w: w * jnp.asarray(t) ** 3, {"w": W}
        )
    operator = hierax.as_operator(qt.QobjEvo([_q(X1), coefficient]))
    series = operator.taylor(0.7, 4)
    expected = hierax.Polynomial(np.array([0, 0, 0, W])) * X1
    assert relative_error(series, expected.taylor(0.7, 4)) < TOL


def test_qutip_coefficient_algebra():
    """Sums, products, conjugates and norms of QuTiP coefficients (QuTiP merges the
    coefficients of one operator) against QuTiP's own evaluation."""
    f = qt.coefficient(lambda t, w: w * t**2 - 1j * t, args={"w": 0.5})
    g = qt.coefficient(SAMPLES, tlist=TLIST)
    c = qt.coefficient(0.25 - 0.5j)
    h = qt.QobjEvo([[_q(X1), f + g], [_q(X1), c * f], [_q(Y2), f.conj()]])
    h = h + qt.QobjEvo([_q(Z2), f]) * 2.0
    norm = importlib.import_module("qutip.core.coefficient").norm
    h = h + qt.QobjEvo([_q(Z1), norm(f)])
    times = np.linspace(-0.2, 1.8, 7)
    computed = _values(hierax.as_operator(h), jnp.asarray(times))
    expected = np.stack([h(t).full() for t in times])
    assert relative_error(computed, expected) < TOL


@pytest.mark.parametrize(
    "options",
    [{}, {"boundary_conditions": "natural"}, {"order": 1}, {"order": 0}],
    ids=["cubic", "natural", "linear", "step"],
)
def test_sampled_qobjevo_against_qutip(options):
    """QuTiP's own evaluation of its interpolation, inside, at and beyond the
    knots, and the derivatives of the cubic against scipy's spline."""
    h = qt.QobjEvo([_q(X1), SAMPLES], tlist=TLIST, **options)
    operator = hierax.as_operator(h)
    assert isinstance(operator, hierax.TimeOperator)
    (function,) = operator.functions
    ts = np.concatenate([np.linspace(-0.5, 2.1, 27), TLIST])
    expected = np.stack([h(t).full() for t in ts])
    assert np.max(np.abs(_values(operator, jnp.asarray(ts)) - expected)) < TOL
    if options.get("order", 3) == 3:
        bc = options.get("boundary_conditions") or "not-a-knot"
        spline = scipy.interpolate.CubicSpline(TLIST, SAMPLES, bc_type=bc)
        factorials = np.array([1.0, 1.0, 2.0, 6.0])
        ts = np.linspace(0.05, 1.55, 5)
        series = jax.jit(jax.vmap(lambda t: function.taylor(t, 3)))(jnp.asarray(ts))
        expected = np.stack([spline(ts, j) for j in range(4)], axis=1)
        np.testing.assert_allclose(
            np.asarray(series) * factorials, expected, rtol=1e-12, atol=1e-12
        )


@pytest.mark.parametrize("bc", ["not-a-knot", "natural"])
def test_sampled_qobjevo_on_a_fine_grid(bc):
    """A cubic array coefficient on a fine grid (301 samples) is QuTiP's spline
    too: QuTiP's cubic coefficients round differently from scipy's by
    eps |y| / h^3, which once failed the comparison, and the default `order=3`
    was refused with a message that asked for `order=3`."""
    tlist = np.linspace(0.0, 3.0, 301)
    samples = 0.3 * np.cos(2.0 * tlist) + 0.1 * tlist
    h = qt.QobjEvo([_q(X1), samples], tlist=tlist, boundary_conditions=bc)
    operator = hierax.as_operator(h)
    assert isinstance(operator, hierax.TimeOperator)
    (function,) = operator.functions
    assert isinstance(function, hierax.CubicSpline) and function.bc_type == bc
    ts = np.linspace(-0.1, 3.1, 23)
    expected = np.stack([h(t).full() for t in ts])
    assert np.max(np.abs(_values(operator, jnp.asarray(ts)) - expected)) < TOL


def test_qutip_density_matrices():
    ket = qt.Qobj(PSI[:, None], dims=[[2, 2], [1, 1]])
    jumps = [0.3 * qt.tensor(qt.destroy(2), qt.qeye(2))]
    converted = hierax.DensityMatrixDerivatives(_qutip_hamiltonian(), jumps, ORDER)
    expected = converted(0.37, np.outer(PSI, PSI.conj()))
    assert relative_error(converted(0.37, qt.ket2dm(ket)), expected) < TOL
    # A ket where a density matrix is meant is |psi><psi|, as in QuTiP's mesolve.
    assert relative_error(converted(0.37, ket), expected) < TOL


def test_mesolve_takes_qutip_objects_against_qutip():
    """A QuTiP Hamiltonian, jump operator, ket (read as |psi><psi|) and observable
    in `hierax.mesolve`, against QuTiP's own `mesolve` of the same system."""
    times = np.linspace(0.0, 1.5, 4)
    h = _q(STATIC) + hierax.Polynomial(np.array(RAMP)) * _q(X1)
    ket = qt.Qobj(PSI[:, None], dims=[[2, 2], [1, 1]])
    jump = 0.3 * qt.tensor(qt.destroy(2), qt.qeye(2))
    ours = hierax.mesolve(
        h, [jump], ket, times, exp_ops=[_q(OBSERVABLE)], rtol=1e-10, atol=1e-12
    )
    qutip_h = qt.QobjEvo([_q(STATIC), [_q(X1), _ramp]], args=dict(zip("abc", RAMP)))
    reference = qt.mesolve(
        qutip_h,
        ket,
        times,
        c_ops=[jump],
        e_ops=[_q(OBSERVABLE)],
        options={"atol": 1e-13, "rtol": 1e-12},
    )
    assert ours.expects is not None
    expected = np.asarray(reference.expect[0])
    np.testing.assert_allclose(np.asarray(ours.expects[0]), expected, atol=1e-8)
    with pytest.raises(TypeError, match=r"`hierax.sesolve`: `state` .* QuTiP bra"):
        hierax.sesolve(h, ket.dag(), times)


def test_state_conversions():
    """Kets to vectors, square states unchanged (read by the call: a propagator in
    PropagatorDerivatives, a density matrix in DensityMatrixDerivatives)."""
    ket = (qt.basis([2, 2], [0, 1]) + 1j * qt.basis([2, 2], [1, 1])).unit()
    psi = ket.full()[:, 0]
    unitary = np.kron(X, Y)
    cases = [
        (ket, False, psi),
        (ket, True, np.outer(psi, psi.conj())),
        (_q(unitary), False, unitary),
        (_q(unitary), True, unitary),
        (dq.asqarray(psi[:, None]), False, psi),
        (dq.asqarray(psi[:, None]), True, np.outer(psi, psi.conj())),
        (dq.asqarray(unitary), False, unitary),
        (psi, False, psi),  # arrays pass through to the caller's checks
    ]
    for state, density, expected in cases:
        out = as_state(state, "state", "test", density=density)
        np.testing.assert_array_equal(np.asarray(out), expected)


def test_nested_commutators_and_heisenberg_take_qobj():
    g, x = _q(1j * STATIC), _q(OBSERVABLE)
    native = (1j * STATIC, OBSERVABLE.astype(complex))  # QuTiP's dtype: one compile
    expected = hierax.NestedCommutators(*native, ORDER)()
    assert relative_error(hierax.NestedCommutators(g, x, ORDER)(), expected) < TOL
    # A constant Hamiltonian's Heisenberg hierarchy is (i ad_H)^k X.
    levels = hierax.HeisenbergHierarchy(_q(STATIC), x, ORDER)(0.3)
    assert relative_error(levels, expected) < TOL


# ----------------------------------------------------------------------------------
# dynamiqs
# ----------------------------------------------------------------------------------


def test_dynamiqs_propagator_derivatives_match_native():
    ket = dq.asqarray(PSI[:, None])
    _check_system(_dynamiqs_hamiltonian(), ket)


def test_dynamiqs_modulated_plus_constant_keeps_one_term_each():
    a = np.diag(np.sqrt(np.arange(1.0, 5.0)), 1)
    drive, number = a + a.T, 0.4 * a.T @ a
    dia = [dq.asqarray(m, layout=dq.dia) for m in (drive, number)]
    h = dq.modulated(_jax_drive, dia[0]) + dia[1]
    operator = hierax.as_operator(h)
    assert isinstance(operator, hierax.TimeOperator)
    assert operator.is_sparse  # DIA layout kept sparse
    assert [type(f).__name__ for f in operator.functions] == [
        "CallableTimeFunction",
        "Constant",
    ]
    for matrix, expected in zip(operator.matrices, (drive, number)):
        np.testing.assert_array_equal(np.asarray(matrix.todense()), expected)


@pytest.mark.parametrize("layout", ["dense", "dia"])
def test_qarray_operator_each_layout(layout):
    matrix = STATIC + 0.7j * np.kron(X, Y) + np.diag([0.1, 0.2, 0.3, 0.4], k=0)
    qarray = dq.asqarray(matrix, layout=dq.dense if layout == "dense" else dq.dia)
    operator = hierax.as_operator(qarray)
    assert isinstance(operator, hierax.TimeOperator)
    assert operator.is_sparse == (layout == "dia")
    np.testing.assert_array_equal(np.asarray(operator(0.0)), matrix)
    np.testing.assert_array_equal(
        np.asarray(hierax.NestedCommutators(qarray, qarray.dag(), 2)()[0]),
        matrix.conj().T,
    )


def test_every_timeqarray_kind_against_dynamiqs():
    a = dq.asqarray(np.diag(np.sqrt([1.0, 2.0]), 1) + 0j)  # dense: no DIA arithmetic
    edges, values = jnp.array([0.0, 0.5, 1.2]), jnp.array([0.7, -1.5])
    modulated = dq.modulated(lambda t: jnp.exp(-t) * jnp.sin(3 * t), a)
    kinds = {
        "constant": dq.constant(a.dag() @ a),
        "modulated": modulated,
        "pwc": dq.pwc(edges, values, a + a.dag()),
        "timecallable": dq.timecallable(
            lambda t: dq.asqarray(jnp.cos(t) * (a + a.dag()).to_jax())
        ),
        "clipped": modulated.clip(0.2, 1.2),
        "started": dq.constant(a.dag()).clip(0.3, None),
    }
    kinds["summed"] = kinds["constant"] + modulated + kinds["pwc"]
    times = jnp.array([-0.1, 0.0, 0.2, 0.3, 0.5, 1.1, 1.2, 1.5])
    # One compiled call per side for all kinds.
    expected = eqx.filter_jit(
        lambda hs: [jax.vmap(lambda t, h=h: h(t).to_jax())(times) for h in hs]
    )(list(kinds.values()))
    operators = [hierax.as_operator(h) for h in kinds.values()]
    computed = eqx.filter_jit(lambda ops: [jax.vmap(op)(times) for op in ops])(
        operators
    )
    for name, out, reference in zip(kinds, computed, expected):
        np.testing.assert_allclose(out, reference, rtol=0, atol=TOL, err_msg=name)
    summed = operators[-1]
    assert isinstance(summed, hierax.TimeOperator)
    assert [type(f).__name__ for f in summed.functions] == [
        "Constant",
        "CallableTimeFunction",
        "PiecewiseConstant",
    ]
    # The timecallable's series, through the Taylor transform, against cos'.
    series = _series(operators[3], jnp.array([0.4]))[0]
    expected = hierax.TimeOperator([hierax.Cos()], [(a + a.dag()).to_jax()])
    assert relative_error(series, expected.taylor(0.4, ORDER)) < TOL


# ----------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------


def test_untraceable_qutip_coefficients_name_the_coefficient_and_the_fix():
    def numpy_drive(t, w):
        return np.cos(w * t)

    h = qt.QobjEvo([_q(STATIC), [_q(X1), numpy_drive]], args={"w": W})
    with pytest.raises(TypeError, match=r"`hamiltonian`.*numpy_drive`.*jnp\.cos"):
        hierax.HeisenbergHierarchy(h, OBSERVABLE, 2)
    with warnings.catch_warnings():  # (no C compiler here: QuTiP falls back on eval)
        warnings.simplefilter("ignore", UserWarning)
        h = qt.QobjEvo([_q(STATIC), [_q(X1), "cos(w*t)"]], args={"w": W})
    with pytest.raises(TypeError, match=r"`hamiltonian`.*'cos\(w\*t\)'.*hierax\.Cos"):
        hierax.PropagatorDerivatives(h, 2)
    h = qt.QobjEvo(lambda t: qt.sigmax() * t)
    with pytest.raises(TypeError, match=r"`observable`.*returning a Qobj"):
        hierax.HeisenbergHierarchy(_native_hamiltonian(), h, 2)
    h = qt.QobjEvo([_q(X1), SAMPLES], tlist=TLIST, order=2)
    with pytest.raises(TypeError, match=r"`hamiltonian`.*order=3"):
        hierax.PropagatorDerivatives(h, 2)


def test_string_coefficient_message_offers_fixes_that_work():
    """The fixes the string-coefficient message offers run and give the QobjEvo's
    operator, and the message names the user's term by its string (QuTiP's
    `to_list()` reorders terms, so no index is given)."""
    with warnings.catch_warnings():  # (no C compiler here: QuTiP falls back on eval)
        warnings.simplefilter("ignore", UserWarning)
        h = qt.QobjEvo([_q(X1), [_q(STATIC), "cos(w*t)"]], args={"w": W})
    with pytest.raises(TypeError, match=r"'cos\(w\*t\)'") as info:
        hierax.as_operator(h)
    assert "element" not in str(info.value)
    want = X1 + np.cos(W * 0.3) * STATIC
    closed_form = _q(X1) + hierax.Cos(W) * _q(STATIC)
    jax_function = hierax.as_operator(_q(X1)) + hierax.CallableTimeFunction(
        lambda t: jnp.cos(W * t)
    ) * _q(STATIC)
    for operator in (closed_form, jax_function):
        np.testing.assert_allclose(operator(0.3), want, rtol=1e-14, atol=1e-14)


def test_bad_foreign_input_names_the_argument():
    with pytest.raises(ValueError, match=r"`hamiltonian` is 4x4 but `observable` is"):
        hierax.HeisenbergHierarchy(_qutip_hamiltonian(), qt.sigmax(), 2)
    with pytest.raises(ValueError, match=r"`hamiltonian` is 4x4 but `observable` is"):
        hierax.HeisenbergHierarchy(_dynamiqs_hamiltonian(), dq.sigmax(), 2)
    derivatives = hierax.PropagatorDerivatives(_qutip_hamiltonian(), 2)
    with pytest.raises(TypeError, match=r"`state` must be a ket .* QuTiP bra"):
        derivatives(0.0, qt.Qobj(PSI[None, :], dims=[[1, 1], [2, 2]]))
    with pytest.raises(TypeError, match=r"`state` must be a ket .* dynamiqs bra"):
        derivatives(0.0, dq.asqarray(PSI[None, :]))
    with pytest.raises(ValueError, match=r"`state` must have shape \(4,\)"):
        derivatives(0.0, qt.basis(2, 0))
    with pytest.raises(TypeError, match=r"`observable` must be an operator.*ket"):
        hierax.HeisenbergHierarchy(_qutip_hamiltonian(), qt.basis(4, 0), 2)
    with pytest.raises(ValueError, match=r"`hamiltonian` must be one operator"):
        hierax.PropagatorDerivatives(dq.asqarray(np.stack([X, Z])), 2)
    with pytest.raises(TypeError, match=r"`generator` must be a constant matrix"):
        hierax.NestedCommutators(_qutip_hamiltonian(), OBSERVABLE, 2)


def test_time_function_plus_matrix_names_both_and_the_fix():
    with pytest.raises(TypeError, match=r"`hierax\.Cos \+ \.\.\.`.*ArrayImpl.*\* "):
        _ = hierax.Cos(2.0) + jnp.asarray(Y)
    with pytest.raises(TypeError, match=r"`\.\.\. - hierax\.Sin`.*ndarray"):
        _ = Y - hierax.Sin(2.0)


def test_time_dependent_object_gets_a_function_error():
    class Pulse:  # callable, with a shape: a function of time, not a matrix
        shape = (2, 2)
        dtype = np.float64

        def __call__(self, t):
            return np.eye(2) * float(t)

    with pytest.raises(TypeError, match=r"calling `x` on a scalar time failed"):
        hierax.as_operator(Pulse())


# ----------------------------------------------------------------------------------
# Imports
# ----------------------------------------------------------------------------------


_NEVER_IMPORTS = fresh_script(
    "hierax never imports qutip or dynamiqs",
    textwrap.dedent(
        """
        import sys
        import jax.numpy as jnp
        import hierax

        sx = jnp.array([[0.0, 1.0], [1.0, 0.0]])
        sz = jnp.array([[1.0, 0.0], [0.0, -1.0]])
        hierax.HeisenbergHierarchy(hierax.Cos(1.0) * sx + sz, sx, 2)
        hierax.NestedCommutators(1j * sz, sx, 2)()
        loaded = sorted(
            m for m in sys.modules if m.split(".")[0] in ("qutip", "dynamiqs")
        )
        assert not loaded, loaded
        """
    ),
)


def test_hierax_never_imports_qutip_or_dynamiqs(tmp_path_factory):
    """In a fresh interpreter (no test imported them), hierax's own calls load
    neither QuTiP nor dynamiqs."""
    result = fresh_output(tmp_path_factory, _NEVER_IMPORTS)
    assert result["status"] == 0, result["stderr"]


def test_parts_built_inside_a_call_are_named_by_the_call():
    """Issue 48: the pulse or coefficient hierax builds from a dynamiqs or QuTiP
    operator is refused in the name of the call the user made and the argument."""
    pulse = dq.pwc(jnp.array([0.0, 1.0, 2.0]), jnp.array([1.0, jnp.nan]), dq.sigmax())
    with pytest.raises(ValueError) as info:
        hierax.HeisenbergHierarchy(pulse, np.eye(2), 3)
    message = str(info.value)
    assert message.startswith("`hierax.HeisenbergHierarchy`: `hamiltonian`")
    assert "must be finite" in message and "PiecewiseConstant" not in message
    evo = qt.QobjEvo([[qt.sigmax(), qt.coefficient(np.nan)]])
    with pytest.raises(ValueError) as info:
        hierax.PropagatorDerivatives(evo, 3)
    message = str(info.value)
    assert message.startswith("`hierax.PropagatorDerivatives`: `hamiltonian`")
    assert "must be finite" in message and "hierax.Constant" not in message
