"""Six held-back systems for the solver benchmarks, each in every form a peer takes.

A tuner that sees only `bench_sesolve.py` and `bench_mesolve.py` (one lab-frame
transmon, one Ising chain) can fit their quirks; these six are of other kinds:

1. `drag`: a transmon qubit with its second excited level (n = 3) in the frame
   rotating at the qubit frequency, one DRAG pi pulse (Gaussian in x, its scaled
   derivative in y), 20 ns.
2. `pair`: two 3-level transmons in the lab frame (n = 9), exchange coupling, a
   Gaussian pi pulse on the first at its frequency, counter-rotating terms kept.
3. `stirap`: STIRAP in a Lambda system (n = 3), rotating frame, Stokes pulse
   before the pump.
4. `xxz`: a 6-site XXZ chain (n = 64) in a driven transverse field
   h(t) = h0 + h1 cos(w t).
5. `open_pair`: the transmon pair of 2 in the frame rotating at the first
   transmon's frequency, a cross-resonance pulse (the first driven at the second's
   frequency), T1 and pure dephasing on each (4 jump operators), `mesolve`.
6. `random`: a random 16-level Hermitian H0 and 12 small terms
   eps_j cos(w_j t + phi_j) V_j (random Hermitian V_j, fixed seed).

Each system is a [`System`][]: its constant part H0, its drive terms as
(coefficient, matrix) pairs, the initial state (a ket, or a density matrix for the
open one), the span and the jump operators. A coefficient gives itself as a hierax
time function, as a NumPy or JAX function of t (for scipy, diffrax and dynamiqs)
and as a QuTiP string (compiled by Cython, QuTiP's fastest path). `System.reference`
solves the system with scipy's DOP853 on the real and imaginary parts.

Units: the transmon systems (1, 2, 5) in ns and rad/ns (frequencies quoted in
GHz are times 2 pi), STIRAP in us and rad/us, the chain and the random system
dimensionless. The parameters are in each builder's docstring.
"""

import abc
import dataclasses
import functools
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.integrate

import hierax


TWO_PI = 2 * np.pi


def _number(x: float) -> str:
    """A float as a C/Python literal that round-trips (QuTiP strings)."""
    return f"({float(x)!r})"


# --- coefficients ------------------------------------------------------------------


class Coefficient(abc.ABC):
    """A real function of time in the three forms the methods take."""

    @abc.abstractmethod
    def hierax(self) -> hierax.AbstractTimeFunction:
        """The hierax time function."""

    @abc.abstractmethod
    def __call__(self, t: Any, xp: Any = np) -> Any:
        """The value at `t`, computed with `xp` (`numpy` or `jax.numpy`)."""

    @abc.abstractmethod
    def string(self) -> str:
        """The value as a QuTiP string coefficient in `t`."""


@dataclasses.dataclass(frozen=True)
class Cosine(Coefficient):
    """amplitude * cos(frequency * t + phase)."""

    frequency: float
    phase: float = 0.0
    amplitude: float = 1.0

    def hierax(self):
        return hierax.Cos(self.frequency, self.phase, self.amplitude)

    def __call__(self, t, xp=np):
        return self.amplitude * xp.cos(self.frequency * t + self.phase)

    def string(self):
        f, p, a = map(_number, (self.frequency, self.phase, self.amplitude))
        return f"{a}*cos({f}*t+{p})"


@dataclasses.dataclass(frozen=True)
class Gaussian(Coefficient):
    """amplitude * exp(-(t - mean)^2 / (2 width^2))."""

    mean: float
    width: float
    amplitude: float = 1.0

    def hierax(self):
        return hierax.Gaussian(self.mean, self.width, self.amplitude)

    def __call__(self, t, xp=np):
        return self.amplitude * xp.exp(-((t - self.mean) ** 2) / (2 * self.width**2))

    def string(self):
        m, w, a = map(_number, (self.mean, self.width, self.amplitude))
        return f"{a}*exp(-(t-{m})*(t-{m})/(2*{w}*{w}))"


@dataclasses.dataclass(frozen=True)
class GaussianSlope(Coefficient):
    """amplitude * d/dt exp(-(t - mean)^2 / (2 width^2)), the DRAG quadrature."""

    mean: float
    width: float
    amplitude: float = 1.0

    def hierax(self):
        # -(t - mean) / width^2 as a polynomial, times the Gaussian.
        slope = hierax.Polynomial(np.array([self.mean, -1.0]) / self.width**2)
        return slope * hierax.Gaussian(self.mean, self.width, self.amplitude)

    def __call__(self, t, xp=np):
        x = t - self.mean
        return (
            -self.amplitude * x / self.width**2 * xp.exp(-(x**2) / (2 * self.width**2))
        )

    def string(self):
        m, w, a = map(_number, (self.mean, self.width, self.amplitude))
        return f"-{a}*(t-{m})/({w}*{w})*exp(-(t-{m})*(t-{m})/(2*{w}*{w}))"


@dataclasses.dataclass(frozen=True)
class Offset(Coefficient):
    """value + coefficient(t)."""

    value: float
    coefficient: Coefficient

    def hierax(self):
        return self.value + self.coefficient.hierax()

    def __call__(self, t, xp=np):
        return self.value + self.coefficient(t, xp)

    def string(self):
        return f"{_number(self.value)}+{self.coefficient.string()}"


@dataclasses.dataclass(frozen=True)
class Product(Coefficient):
    """left(t) * right(t)."""

    left: Coefficient
    right: Coefficient

    def hierax(self):
        return self.left.hierax() * self.right.hierax()

    def __call__(self, t, xp=np):
        return self.left(t, xp) * self.right(t, xp)

    def string(self):
        return f"({self.left.string()})*({self.right.string()})"


# --- systems -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class System:
    """H(t) = H0 + sum_k c_k(t) M_k, an initial state, a span [0, T] and, for an
    open system, constant jump operators (rates included)."""

    key: str
    name: str
    constant: np.ndarray
    drives: tuple[tuple[Coefficient, np.ndarray], ...]
    state: np.ndarray
    span: float
    jumps: tuple[np.ndarray, ...] = ()

    @property
    def size(self) -> int:
        return len(self.constant)

    @property
    def is_open(self) -> bool:
        return bool(self.jumps)

    @property
    def times(self) -> np.ndarray:
        return np.array([0.0, self.span])

    def hamiltonian(self, scale: Any = None, matrix: Callable = np.asarray) -> Any:
        """The hierax operator H0 + sum_k c_k(t) M_k; `scale` (a number or a traced
        scalar) multiplies every drive; `matrix` makes each matrix what is passed
        (NumPy arrays by default; `jnp.asarray` inside a `jax.jit` gives traced
        ones, whose entries hierax cannot see before compiling)."""
        terms = [
            (c.hierax() if scale is None else scale * c.hierax()) * matrix(m)
            for c, m in self.drives
        ]
        return functools.reduce(operator.add, terms) + matrix(self.constant)

    def coefficients(self, t: Any, xp: Any = np) -> Any:
        """(c_1(t), ..., c_K(t)) as one array."""
        return xp.stack([xp.asarray(c(t, xp)) for c, _ in self.drives])

    def matrices(self) -> np.ndarray:
        """The drive matrices M_k, shape (K, n, n)."""
        return np.stack([m for _, m in self.drives])

    def at(self, t: float) -> np.ndarray:
        """H(t) as a NumPy matrix."""
        return self.constant + np.tensordot(
            self.coefficients(t), self.matrices(), axes=1
        )

    def rho(self) -> np.ndarray:
        """The initial density matrix (the state itself for an open system)."""
        if self.state.ndim == 2:
            return self.state
        return np.outer(self.state, self.state.conj())

    def reference(self, rtol: float = 1e-13, atol: float = 1e-13) -> np.ndarray:
        """The final state (ket, or density matrix for an open system) from scipy's
        DOP853 on the real and imaginary parts."""
        y0 = self.rho() if self.is_open else self.state
        if self.is_open:
            jumps = np.stack(self.jumps)
            adjoints = np.conj(np.swapaxes(jumps, -1, -2))
            number = np.einsum("jab,jbc->ac", adjoints, jumps)

            def derivative(t, y):
                h = self.at(t)
                out = -1j * (h @ y - y @ h) - 0.5 * (number @ y + y @ number)
                return out + np.einsum("jab,bc,jcd->ad", jumps, y, adjoints)

        else:

            def derivative(t, y):
                return -1j * (self.at(t) @ y)

        return dop853_final(derivative, y0, self.span, rtol, atol, self.name)


def dop853_final(
    derivative: Callable[[float, np.ndarray], np.ndarray],
    start: Any,
    span: float,
    rtol: float = 1e-13,
    atol: float = 1e-15,
    name: str = "the reference",
) -> np.ndarray:
    """The state at `span` of $\\dot z = $ `derivative(t, z)` from $z(0) = $
    `start` (complex, any shape; `derivative` takes and returns that shape), by
    scipy's DOP853 on its real and imaginary parts: the references of the
    benchmarks, independent of every method they time."""
    shape = np.shape(start)
    flat = np.asarray(start, complex).reshape(-1)

    def rhs(t, y):
        z = (y[: y.size // 2] + 1j * y[y.size // 2 :]).reshape(shape)
        dz = np.asarray(derivative(t, z)).reshape(-1)
        return np.concatenate([np.real(dz), np.imag(dz)])

    solution = scipy.integrate.solve_ivp(
        rhs,
        (0.0, span),
        np.concatenate([np.real(flat), np.imag(flat)]),
        method="DOP853",
        rtol=rtol,
        atol=atol,
    )
    if not solution.success:
        raise RuntimeError(f"DOP853 failed on {name}: {solution.message}")
    y = solution.y[:, -1]
    return (y[: y.size // 2] + 1j * y[y.size // 2 :]).reshape(shape)


def _lowering(levels: int) -> np.ndarray:
    return np.diag(np.sqrt(np.arange(1, levels)), 1).astype(complex)


def _kron(*ops: Any) -> np.ndarray:
    return functools.reduce(np.kron, ops).astype(complex)


def _basis(n: int, k: int) -> np.ndarray:
    out = np.zeros(n, complex)
    out[k] = 1
    return out


def drag(quick: bool = False, span: float | None = None) -> System:
    """A transmon qubit and its leakage level (n = 3) in the frame rotating at the
    qubit frequency: H = (alpha / 2) n (n - 1) + Omega_x(t) (a + a^+) / 2
    + Omega_y(t) i (a^+ - a) / 2, anharmonicity alpha = -2 pi 0.25 rad/ns,
    Omega_x a Gaussian of width 4 ns centred at 10 ns with area pi (a pi pulse),
    Omega_y = -lambda dOmega_x/dt / alpha with lambda = 0.5 (DRAG), over 20 ns
    (quick: the same; `span` shortens it)."""
    del quick
    levels, alpha, width, centre, lam = 3, -TWO_PI * 0.25, 4.0, 10.0, 0.5
    a = _lowering(levels)
    n = a.conj().T @ a
    area = np.pi / (width * np.sqrt(2 * np.pi))
    return System(
        key="drag",
        name="DRAG pi pulse, qutrit (n = 3)",
        constant=0.5 * alpha * (n @ n - n),
        drives=(
            (Gaussian(centre, width, area), 0.5 * (a + a.conj().T)),
            (
                GaussianSlope(centre, width, -lam * area / alpha),
                0.5j * (a.conj().T - a),
            ),
        ),
        state=_basis(levels, 0),
        span=20.0 if span is None else span,
    )


def _pair_operators(levels=3):
    a = _lowering(levels)
    eye = np.eye(levels)
    a1, a2 = _kron(a, eye), _kron(eye, a)
    return a1, a2, a1.conj().T @ a1, a2.conj().T @ a2


def pair(quick: bool = False, span: float | None = None) -> System:
    """Two 3-level transmons in the lab frame (n = 9):
    H = sum_i [w_i n_i + (alpha_i / 2) n_i (n_i - 1)] + g (a_1^+ a_2 + a_1 a_2^+)
    + Omega(t) cos(w_1 t) (a_1 + a_1^+), w_1 / 2 pi = 5.0 GHz, w_2 / 2 pi = 5.2 GHz,
    alpha_i / 2 pi = -0.30 and -0.28 GHz, g / 2 pi = 5 MHz, Omega a Gaussian
    centred at T / 2 of width T / 8 and area pi, T = 40 ns (200 carrier periods;
    quick: 10 ns)."""
    w1, w2 = TWO_PI * 5.0, TWO_PI * 5.2
    alpha1, alpha2, g = -TWO_PI * 0.30, -TWO_PI * 0.28, TWO_PI * 0.005
    a1, a2, n1, n2 = _pair_operators()
    eye = np.eye(9)
    constant = (
        w1 * n1
        + w2 * n2
        + 0.5 * alpha1 * n1 @ (n1 - eye)
        + 0.5 * alpha2 * n2 @ (n2 - eye)
        + g * (a1.conj().T @ a2 + a1 @ a2.conj().T)
    )
    span = (10.0 if quick else 40.0) if span is None else span
    width = span / 8
    area = np.pi / (width * np.sqrt(2 * np.pi))
    envelope = Product(Gaussian(span / 2, width, area), Cosine(w1))
    return System(
        key="pair",
        name=f"transmon pair, lab frame (n = 9, {span:g} ns)",
        constant=constant,
        drives=((envelope, a1 + a1.conj().T),),
        state=_basis(9, 0),
        span=span,
    )


def stirap(quick: bool = False, span: float | None = None) -> System:
    """STIRAP in a Lambda system |1> - |2> - |3> (n = 3), rotating frame, two-photon
    resonance: H = Delta |2><2| + Omega_p(t) / 2 (|1><2| + h.c.)
    + Omega_s(t) / 2 (|2><3| + h.c.), time in us, Delta / 2 pi = 2 MHz, Gaussian
    pulses of peak Omega_0 / 2 pi = 10 MHz and width 1 us, the Stokes pulse 1.2 us
    before the pump, centred on T / 2, T = 8 us (quick: the same); from |1>, the
    population ends in |3>."""
    del quick
    delta, peak, width, delay = TWO_PI * 2.0, TWO_PI * 10.0, 1.0, 1.2
    total = 8.0
    k = np.eye(3, dtype=complex)
    pump = 0.5 * (np.outer(k[0], k[1]) + np.outer(k[1], k[0]))
    stokes = 0.5 * (np.outer(k[1], k[2]) + np.outer(k[2], k[1]))
    return System(
        key="stirap",
        name="STIRAP, Lambda system (n = 3)",
        constant=delta * np.outer(k[1], k[1]),
        drives=(
            (Gaussian(total / 2 + delay / 2, width, peak), pump),
            (Gaussian(total / 2 - delay / 2, width, peak), stokes),
        ),
        state=_basis(3, 0),
        span=total if span is None else span,
    )


def xxz(quick: bool = False, span: float | None = None, sites: int = 6) -> System:
    """The XXZ chain, 6 sites (n = 64), open ends, in a driven transverse field:
    H = J sum_k (X_k X_{k+1} + Y_k Y_{k+1} + Delta Z_k Z_{k+1}) + h(t) sum_k X_k,
    h(t) = h0 + h1 cos(w t), J = 1, Delta = 0.5, h0 = 0.5, h1 = 0.3, w = 2,
    dimensionless, from the Neel state |0101..>, T = 10 (quick: 3)."""
    x = np.array([[0, 1], [1, 0]], complex)
    y = np.array([[0, -1j], [1j, 0]])
    z = np.diag([1.0, -1.0]).astype(complex)

    def at(op, k, width=1):
        return _kron(np.eye(2**k), op, np.eye(2 ** (sites - k - width)))

    # Each bond as one Kronecker product of its two-site term (no n x n products:
    # they took minutes at 12 sites); the entries are the same exact numbers.
    bond = np.kron(x, x) + np.kron(y, y) + 0.5 * np.kron(z, z)
    bonds = sum(at(bond, k, 2) for k in range(sites - 1))
    field = sum(at(x, k) for k in range(sites))
    neel = int("01" * (sites // 2) + "0" * (sites % 2), 2)
    span = (3.0 if quick else 10.0) if span is None else span
    return System(
        key="xxz",
        name=f"XXZ chain, {sites} sites (n = {2**sites}, T = {span:g})",
        constant=np.asarray(bonds, complex),
        drives=((Offset(0.5, Cosine(2.0, amplitude=0.3)), np.asarray(field)),),
        state=_basis(2**sites, neel),
        span=span,
    )


def open_xxz(span: float = 3.0, sites: int = 6, rate: float = 0.1) -> System:
    """The driven XXZ chain of `xxz`, open: every site decays, with jump operators
    sqrt(rate) sigma^-_k, sigma^- = |0><1| (here |1> is the excited state of Z = -1),
    from the Neel state's density matrix."""
    closed = xxz(span=span, sites=sites)
    lower = np.array([[0, 1], [0, 0]], complex)
    jumps = tuple(
        np.sqrt(rate) * _kron(np.eye(2**k), lower, np.eye(2 ** (sites - k - 1)))
        for k in range(sites)
    )
    psi = closed.state
    return dataclasses.replace(
        closed,
        key="open_xxz",
        name=f"open XXZ chain, {sites} sites (n = {2**sites}, {sites} jumps, "
        f"T = {closed.span:g})",
        state=np.outer(psi, psi.conj()),
        jumps=jumps,
    )


def open_pair(quick: bool = False, span: float | None = None) -> System:
    """The transmon pair of `pair` (n = 9) in the frame rotating at w_1 for both,
    driven on the first transmon at the second's frequency (cross resonance):
    H = sum_i [delta_i n_i + (alpha_i / 2) n_i (n_i - 1)] + g (a_1^+ a_2 + h.c.)
    + Omega(t) [cos(D t) (a_1 + a_1^+) + sin(D t) i(a_1^+ - a_1)] / 2, delta_1 = 0,
    delta_2 = D = 2 pi 0.2 rad/ns, Omega a Gaussian of peak 2 pi 30 MHz centred at
    T / 2, width T / 6; jump operators sqrt(1/T1_i) a_i and sqrt(2/Tphi_i) n_i,
    T1 = 20 and 30 us, Tphi = 30 and 40 us; from (|0> + |1>) |0> / sqrt 2,
    T = 60 ns (quick: 20 ns)."""
    d = TWO_PI * 0.2
    alpha1, alpha2, g = -TWO_PI * 0.30, -TWO_PI * 0.28, TWO_PI * 0.005
    a1, a2, n1, n2 = _pair_operators()
    eye = np.eye(9)
    constant = (
        d * n2
        + 0.5 * alpha1 * n1 @ (n1 - eye)
        + 0.5 * alpha2 * n2 @ (n2 - eye)
        + g * (a1.conj().T @ a2 + a1 @ a2.conj().T)
    )
    span = (20.0 if quick else 60.0) if span is None else span
    envelope = Gaussian(span / 2, span / 6, TWO_PI * 0.03)
    t1, tphi = (20e3, 30e3), (30e3, 40e3)
    psi = (_kron([1, 1, 0], [1, 0, 0]) / np.sqrt(2)).ravel()
    return System(
        key="open_pair",
        name=f"open transmon pair, cross resonance (n = 9, 4 jumps, {span:g} ns)",
        constant=constant,
        drives=(
            (Product(envelope, Cosine(d)), 0.5 * (a1 + a1.conj().T)),
            (
                Product(envelope, Cosine(d, -np.pi / 2)),
                0.5j * (a1.conj().T - a1),
            ),
        ),
        state=np.outer(psi, psi.conj()),
        span=span,
        jumps=(
            np.sqrt(1 / t1[0]) * a1,
            np.sqrt(1 / t1[1]) * a2,
            np.sqrt(2 / tphi[0]) * n1,
            np.sqrt(2 / tphi[1]) * n2,
        ),
    )


def random_system(
    quick: bool = False, span: float | None = None, n: int = 16, terms: int = 12
) -> System:
    """A random Hermitian H0 (n = 16, GUE scaled to spectral radius about 2) and 12
    terms eps_j cos(w_j t + phi_j) V_j with V_j random Hermitian (spectral radius
    about 1), eps_j in [0.05, 0.2], w_j in [0.5, 3], phi_j in [0, 2 pi), seed 6,
    dimensionless, from the first basis state, T = 20 (quick: 5)."""
    rng = np.random.default_rng(6)

    def hermitian(radius):
        m = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
        m = (m + m.conj().T) / 2
        return m * radius / np.max(np.abs(np.linalg.eigvalsh(m)))

    h0 = hermitian(2.0)
    drives = tuple(
        (
            Cosine(
                rng.uniform(0.5, 3.0),
                rng.uniform(0, TWO_PI),
                rng.uniform(0.05, 0.2),
            ),
            hermitian(1.0),
        )
        for _ in range(terms)
    )
    span = (5.0 if quick else 20.0) if span is None else span
    return System(
        key="random",
        name=f"random H0 + {terms} cosines (n = {n}, T = {span:g})",
        constant=h0,
        drives=drives,
        state=_basis(n, 0),
        span=span,
    )


SYSTEMS: dict[str, Callable[..., System]] = {
    "drag": drag,
    "pair": pair,
    "stirap": stirap,
    "xxz": xxz,
    "open_pair": open_pair,
    "random": random_system,
}
