"""The 30-digit SymPy/mpmath oracle of `accuracy.py` and `stress.py`: SymPy
differentiates each scalar time function symbolically, the values are taken with 30
digits, and the hierarchy runs as the direct Taylor recursion on truncated series in
mpmath, independent of hierax. The test suite imports it from here
(`tests/helpers.py`); benchmarks never import the tests."""

import math
from typing import Any

import jax.numpy as jnp
import mpmath as mp
import numpy as np
import sympy as sp

import hierax


t_sym = sp.Symbol("t", real=True)
SIGMA_X = jnp.array([[0.0, 1.0], [1.0, 0.0]])
SIGMA_Y = jnp.array([[0.0, -1j], [1j, 0.0]])
SIGMA_Z = jnp.array([[1.0, 0.0], [0.0, -1.0]])


def _mp_matrix(m: sp.Matrix, dps: int) -> Any:
    out = mp.matrix(m.rows, m.cols)
    for i in range(m.rows):
        for j in range(m.cols):
            v = sp.N(m[i, j], dps)
            out[i, j] = mp.mpc(str(sp.re(v)), str(sp.im(v)))
    return out


def mp_series(terms, t0, order, dps):
    n = terms[0][1].rows
    coeffs = [mp.matrix(n, n) for _ in range(order + 1)]
    for f, m in terms:
        mm = _mp_matrix(m, dps)
        d = sp.sympify(f)
        for j in range(order + 1):
            v = sp.N(d.subs(t_sym, t0), dps)
            c = mp.mpc(str(sp.re(v)), str(sp.im(v))) / math.factorial(j)
            coeffs[j] = coeffs[j] + c * mm
            d = sp.diff(d, t_sym)
    return coeffs


def sympy_levels(h_terms, x_terms, t0, order, dps=30) -> list:
    """X_0(t0), ..., X_order(t0) as mpmath matrices.

    `h_terms`, `x_terms`: lists of (sympy expression in `t_sym`, sympy Matrix).
    """
    mp.mp.dps = dps
    h = mp_series(h_terms, sp.Rational(t0), order, dps)
    x = mp_series(x_terms, sp.Rational(t0), order, dps)
    levels = [x[0]]
    for k in range(1, order + 1):
        width = order - k  # coefficients 0..width of level k are exact
        new = []
        for j in range(width + 1):
            acc = (j + 1) * x[j + 1]
            for m in range(j + 1):
                acc = acc + 1j * (h[m] * x[j - m] - x[j - m] * h[m])
            new.append(acc)
        x = new
        levels.append(x[0])
    return levels


def mp_to_numpy(levels) -> np.ndarray:
    return np.array([[[complex(v) for v in row] for row in m.tolist()] for m in levels])


def mp_relative_errors(computed, levels) -> np.ndarray:
    """Relative errors against the mpmath reference, in high precision."""
    out = []
    for c, ref in zip(np.asarray(computed), levels):
        # mpmath's `norm` of a matrix is the entrywise 2-norm: Frobenius.
        diff = mp.norm(ref - mp.matrix(c.tolist()))
        out.append(float(diff / max(mp.norm(ref), mp.mpf("1e-300"))))
    return np.array(out)


# ----------------------------------------------------------------------------------
# Test systems: each gives the SymPy description and the hierax objects.
# ----------------------------------------------------------------------------------

R = sp.Rational


def _np(m: sp.Matrix) -> np.ndarray:
    return np.array(m.evalf(20).tolist(), dtype=complex)


def seed_system():
    sx = sp.Matrix([[0, 1], [1, 0]])
    sy = sp.Matrix([[0, -sp.I], [sp.I, 0]])
    h_terms = [(sp.cos(t_sym), sy)]
    x_terms = [(sp.Integer(1), sx)]
    hamiltonian = hierax.Cos() * jnp.asarray(_np(sy))
    observable = jnp.asarray([[0, 1], [1, 0]])  # an integer matrix: promoted
    return dict(
        name="seed",
        t0=R(1),
        h_terms=h_terms,
        x_terms=x_terms,
        hamiltonian=hamiltonian,
        observable=observable,
    )


def qutrit_system():
    h1 = sp.Matrix(
        [[1, R(1, 2), 0], [R(1, 2), -1, R(1, 3) * sp.I], [0, -R(1, 3) * sp.I, R(1, 4)]]
    )
    h2 = sp.Matrix([[0, 1, R(1, 5)], [1, R(1, 2), 0], [R(1, 5), 0, -R(1, 2)]])
    a = sp.Matrix([[1, 0, 0], [0, 0, 0], [0, 0, -1]])
    b = sp.Matrix([[0, 1, 0], [1, 0, 1], [0, 1, 0]])
    poly = R(3, 10) + R(1, 2) * t_sym - R(1, 5) * t_sym**2
    cos = sp.cos(R(13, 10) * t_sym + R(1, 4))
    h_terms = [(poly, h1), (cos, h2)]
    x_terms = [(sp.sin(R(7, 10) * t_sym), a), (sp.Integer(1), b)]
    hamiltonian = hierax.Polynomial(jnp.array([0.3, 0.5, -0.2])) * jnp.asarray(
        _np(h1)
    ) + hierax.Cos(1.3, 0.25) * jnp.asarray(_np(h2))
    observable = hierax.Sin(0.7) * jnp.asarray(_np(a)) + jnp.asarray(_np(b))
    return dict(
        name="qutrit",
        t0=R(3, 5),
        h_terms=h_terms,
        x_terms=x_terms,
        hamiltonian=hamiltonian,
        observable=observable,
    )


def oscillator_system(n: int = 4):
    a = sp.zeros(n)
    for i in range(1, n):
        a[i - 1, i] = sp.sqrt(i)
    number = a.T * a
    gauss = R(1, 2) * sp.exp(-((t_sym - R(1, 2)) ** 2) / (2 * R(3, 5) ** 2))
    h_terms = [(sp.Integer(1), number), (gauss, a + a.T)]
    x_terms = [(sp.Integer(1), a)]  # not Hermitian
    hamiltonian = jnp.asarray(_np(number)) + hierax.Gaussian(
        0.5, 0.6, 0.5
    ) * jnp.asarray(_np(a + a.T))
    observable = jnp.asarray(_np(a))
    return dict(
        name="oscillator",
        t0=R(3, 10),
        h_terms=h_terms,
        x_terms=x_terms,
        hamiltonian=hamiltonian,
        observable=observable,
    )


SYSTEMS = [seed_system, qutrit_system, oscillator_system]
