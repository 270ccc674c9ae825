"""Floquet quasienergies and modes of a periodic Hamiltonian.

For $H(t + T) = H(t)$ the one-period propagator $U = U(t_0 + T, t_0)$ (solved with
the Taylor solver, the identity as its initial state) has eigenvalues
$e^{-i\\epsilon_j T}$; the quasienergies $\\epsilon_j$ are defined modulo
$\\omega = 2\\pi/T$ and folded into $(-\\omega/2, \\omega/2]$, and the eigenvectors
are the Floquet modes at $t_0$.

$U$ is unitary, hence normal: every Hermitian combination
$M = \\tfrac12 (U + U^\\dagger) + \\tfrac{c}{2i} (U - U^\\dagger)$ shares its
eigenvectors. They come from `eigh` of M (which runs on every backend and has a
derivative, unlike a general `eig`), and each eigenvalue from $v^\\dagger U v$.
M's eigenvalues are $\\sqrt{1 + c^2} \\cos(\\epsilon T - \\arctan c)$: distinct
quasienergies fold onto one of M's eigenvalues only when
$(\\epsilon + \\epsilon') T \\equiv -2 \\arctan c$, which the irrational $c$ makes an
accident of measure zero; a degenerate pair of quasienergies (a symmetry) has any
basis of its eigenspace as modes, as for any eigen-solver.
"""

import functools
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Complex, Float, Real

from ._arrays import complex_dtype, to_jax
from ._jit import in_blocks, module_jit
from ._operators import AbstractTimeOperator, OperatorSum, TimeOperator, to_operator
from ._solvers import sesolve
from ._solvers._rewrites import merge_equal_terms
from ._symmetry import mirror_center
from ._validation import as_period, is_traced


# The mixing coefficient of the Hermitian combination (the golden ratio's
# fractional part: far from the rationals that symmetric spectra produce).
_MIX = 0.6180339887498949


class FloquetBasis(eqx.Module):
    """The Floquet quasienergies and modes of a periodic Hamiltonian
    ([`hierax.floquet`][]): `quasienergies` (ascending, folded into
    $(-\\omega/2, \\omega/2]$ with $\\omega = 2\\pi/T$), `modes` (the Floquet modes
    at `t0` as columns), `propagator` (the one-period propagator
    $U(t_0 + T, t_0)$) and `period`. `modes_at(t)` gives the modes at any time.
    An Equinox module: differentiate it, batch it with `jax.vmap` (over drive
    amplitudes, frequencies and periods: the period is an array, so a batch of
    periods compiles once)."""

    hamiltonian: AbstractTimeOperator
    period: Real[Array, ""]
    t0: Real[Array, ""]
    propagator: Complex[Array, "n n"]
    quasienergies: Float[Array, " n"]
    modes: Complex[Array, "n n"]
    rtol: float = eqx.field(static=True)
    atol: float = eqx.field(static=True)
    order: int = eqx.field(static=True, default=16)

    def modes_at(self, t: ArrayLike) -> Complex[Array, "n n"]:
        """The Floquet modes at time `t` as columns,
        $\\phi_j(t) = e^{i \\epsilon_j (t - t_0)} U(t, t_0) \\phi_j(t_0)$, periodic
        in t (t is first reduced into $(t_0, t_0 + T]$: a solve of at most one
        period)."""
        return _modes_at(self, t)


def _modes_at_impl(basis: FloquetBasis, t: Any) -> Array:
    t = jnp.asarray(t, basis.period.dtype)
    local = basis.t0 + jnp.mod(t - basis.t0, basis.period)
    local = jnp.where(local <= basis.t0, local + basis.period, local)
    evolved = sesolve(
        basis.hamiltonian,
        basis.modes,
        jnp.stack([basis.t0, local]),
        rtol=basis.rtol,
        atol=basis.atol,
        order=basis.order,
    ).final_state
    phases = jnp.exp(1j * basis.quasienergies * (local - basis.t0))
    return evolved * phases[None, :].astype(evolved.dtype)


# One compiled call per basis structure (eagerly, a dozen small programs around
# the solve otherwise); a new time is a value.
_modes_at = module_jit(_modes_at_impl)


def floquet(
    hamiltonian: Any,
    period: ArrayLike,
    *,
    t0: ArrayLike = 0.0,
    rtol: float = 1e-12,
    atol: float = 1e-14,
    order: int = 16,
) -> FloquetBasis:
    """The Floquet quasienergies and modes of `hamiltonian`, periodic with
    `period` (a [`hierax.FloquetBasis`][]).

    **Arguments:**

    - `hamiltonian`: $H(t)$ with $H(t + T) = H(t)$, in any form
        [`hierax.sesolve`][] takes (e.g. `hz + hierax.Cos(w) * hx` with
        `period = 2 * pi / w`).
    - `period`: $T > 0$, a number or a traced scalar (batch it with `jax.vmap`).
    - `t0`: the time the modes refer to.
    - `rtol`, `atol`: the tolerances of the one-period solve (the quasienergies'
        error follows them: about `rtol` / T in absolute terms).
    - `order`: the series order of the one-period solve. The default, 16, is below
        [`hierax.sesolve`][]'s: the state is an n x n propagator, and with a
        time-dependent H each order costs a Cauchy product over all earlier ones
        (K n^2 per term, beside the n^3 of its matrix product), which batches of
        many drives make memory-bound. Measured on sweeps of 1000 amplitudes
        (driven transmons, n = 4, 6, 10, one `jax.vmap`, matched quasienergy error
        1e-9): 0.53x, 0.90x and 0.57x the time of order 28; single calls within
        noise of it.

    Where H is symmetric about some time c, $H(c + s) = \\overline{H(c - s)}$ (a
    cosine drive $\\cos(\\omega t + \\varphi)$ on real matrices, about a maximum
    of the cosine, whatever its phase and `t0`; a sine drive on imaginary
    ones), half the period is solved: $U = U_h^T U_h$ with
    $U_h = U(t_0 + T/2, t_0)$ when c is the middle of the period, and otherwise
    over $[c - T/2, c]$, carried to $t_0$ by the propagator to $t_0$ saved on
    the way. The symmetry is read from the time functions and known parameter
    values (a traced period or frequency, or a callable H, get the whole
    period).
    """
    api = "hierax.floquet"
    operator = to_operator(hamiltonian, "hamiltonian", api)
    period = as_period(period, api)
    t0 = to_jax(t0, period.dtype)
    _refuse_non_hermitian(operator, period, t0, api)
    u = _one_period(operator, period, t0, rtol, atol, order)
    energies, modes = _eigen(u, period)
    return FloquetBasis(
        hamiltonian=operator,
        period=period,
        t0=t0,
        propagator=u,
        quasienergies=energies,
        modes=modes,
        rtol=float(rtol),
        atol=float(atol),
        order=order,
    )


# The bytes of the series that one block of a batch of one-period solves keeps:
# each order's window sum reads every earlier coefficient of every lane, and a
# batch whose series outgrow the caches waits on memory (1000 drives of a 10-level
# transmon, order 16: 27 MB of series, read 16 times a step).
_BLOCK_BYTES = 2 * 2**20


def _one_period(
    operator: AbstractTimeOperator,
    period: Array,
    t0: Array,
    rtol: float,
    atol: float,
    order: int,
) -> Array:
    """The one-period propagator $U(t_0 + T, t_0)$. Under `jax.vmap` (a sweep of
    drives or periods) the lanes are solved in blocks whose series fit in the
    caches, one block after another (`lax.map`): the same solves, the same
    results, each block in lockstep. Derivatives differentiate the one solve.

    Where H is symmetric about a time c in $(t_0, t_0 + T/2]$ (`_symmetry`: a
    cosine drive on real matrices about a maximum of the cosine), only half a
    period is solved, from $c - T/2$ to c (`_period_solver`)."""
    # Terms are merged here, where the matrices are known: inside the blocked map
    # they are arguments.
    operator = merge_equal_terms(operator)
    arrays, static = eqx.partition(operator, eqx.is_array)
    config = (static, operator.size, complex_dtype(period.dtype), rtol, atol, order)
    shift = _mirror_shift(operator, period, t0)
    # Where the centre lies is a value (a new phase or start does not recompile);
    # whether there is one, and whether it is the middle, is structure.
    where = None if shift is None else "middle" if shift == 0.5 else "shifted"
    try:
        solver = _period_solver(*config, where)
    except TypeError:  # a static part that cannot be hashed: built for this call,
        # run eagerly (compiled, it would compile again on every call)
        solver = _period_solver.__wrapped__(*config, where, compiled=False)
    return solver(arrays, period, t0, to_jax(0.5 if shift is None else shift))


@functools.lru_cache(maxsize=32)
def _period_solver(
    static: Any,
    n: int,
    dtype: Any,
    rtol: float,
    atol: float,
    order: int,
    where: str | None,
    compiled: bool = True,
) -> Any:
    """The one-period solve of an operator structure (its non-array part
    `static`), blocked under `jax.vmap` (`in_blocks`); kept per structure, so that
    an eager `jax.vmap` over `floquet` compiles its blocked map once. `where` H's
    mirror centre lies: `None` (none known: the whole period), `"middle"` of the
    period, or `"shifted"` to $c = t_0 + \\text{shift}\\, T$ (`shift` a value).
    `compiled`: the single solve behind a jit boundary (not for a solver built for
    one call, which would compile it on every call)."""

    def single(arrays: Any, period: Array, t0: Array, shift: Array) -> Array:
        def solve(times: list[Array]) -> Array:
            return sesolve(
                eqx.combine(arrays, static),
                jnp.eye(n, dtype=dtype),
                jnp.stack(times),
                rtol=rtol,
                atol=atol,
                order=order,
            ).states

        if where is None:
            return solve([t0, t0 + period])[-1]
        if where == "middle":  # U = U_h^T U_h from t0
            u = solve([t0, t0 + period / 2])[-1]
            return u.T @ u
        # From a = c - T/2 to c, passing t0: W = U(t0, a), U_h = U(c, a). Then
        # U(a + T, a) = U_h^T U_h and, by periodicity,
        # U(t0 + T, t0) = W U(a + T, a) W^dagger.
        shift = shift.astype(period.dtype)
        states = solve([t0 + (shift - 0.5) * period, t0, t0 + shift * period])
        w, u = states[1], states[2]
        return w @ (u.T @ u) @ jnp.conj(w.T)

    lane = (order + 1) * 2 * n * n * jnp.finfo(dtype).bits // 8
    # Behind a jit boundary when kept per structure (`compiled`): an eager call is
    # then one compiled program, where its steps around the solve (the identity,
    # the times, U_h^T U_h) ran as eager operations, each compiling a program of
    # its own on a process's first call (28 of them for a driven qubit, 0.56 s).
    return in_blocks(
        jax.jit(single) if compiled else single, max(8, _BLOCK_BYTES // lane)
    )


def _mirror_shift(
    operator: AbstractTimeOperator, period: Array, t0: Array
) -> float | None:
    """Where H's mirror centre lies in $(t_0, t_0 + T/2]$, as a fraction of the
    period (see `_symmetry`); `None` where no centre is known (a traced period or
    start is not known)."""
    if is_traced(period) or is_traced(t0):
        return None
    start, length = float(t0), float(period)
    # The rounding of the known values (a period 2 pi / w formed in the period's
    # precision puts w T / 2 within a few units of pi).
    tolerance = 4 * float(jnp.finfo(period.dtype).eps)
    distance = mirror_center(operator, start, length, tolerance)
    return None if distance is None else distance / length


# Fractions of a period at which a Hamiltonian with non-Hermitian terms is checked
# whole (irrational, off every grid of the drive's harmonics).
_PROBES = (0.1234567, 0.5772157, 0.8414710)


def _refuse_non_hermitian(
    operator: AbstractTimeOperator, period: Array, t0: Array, api: str
) -> None:
    """Refuse an H that is not Hermitian (to rounding): the one-period propagator
    would not be unitary, and quasienergies not real. Each term's known dense
    matrix is checked first; a Hermitian H may still have non-Hermitian terms
    ($e^{i\\omega t} a + e^{-i\\omega t} a^\\dagger$), so where one is found and
    everything is known, H itself is checked at a few times of the period before
    refusing. (With traced parameters H cannot be evaluated here: such terms are
    refused; write the drive as `Cos`/`Sin` times Hermitian matrices.)"""
    parts = operator.operators if isinstance(operator, OperatorSum) else (operator,)
    gap = 0.0
    for part in parts:
        if not isinstance(part, TimeOperator) or isinstance(part.matrices, tuple):
            continue
        if is_traced(part.matrices):
            continue
        m = np.asarray(part.matrices)
        term_gap = float(np.abs(m - np.conj(np.swapaxes(m, -1, -2))).max(initial=0))
        if term_gap > 1e-10 * max(1.0, float(np.abs(m).max(initial=0))):
            gap = max(gap, term_gap)
    if gap == 0.0:
        return
    known = not any(is_traced(x) for x in jax.tree.leaves((operator, period, t0)))
    if known:
        for fraction in _PROBES:
            h = np.asarray(operator(t0 + fraction * period))
            gap = float(np.abs(h - np.conj(h.T)).max(initial=0))
            if gap > 1e-10 * max(1.0, float(np.abs(h).max(initial=0))):
                break
        else:
            return
    where = "H(t) differs" if known else "a term's matrix differs"
    raise ValueError(
        f"`{api}`: `hamiltonian` is not Hermitian ({where} from its conjugate "
        f"transpose by {gap:.2e}); Floquet quasienergies are those of a Hermitian, "
        "periodic H."
    )


def fold(energies: Array, period: Array) -> Array:
    """Quasienergies folded into the zone $(-\\omega/2, \\omega/2]$,
    $\\omega = 2\\pi/T$."""
    omega = 2 * np.pi / period
    folded = energies - omega * jnp.round(energies / omega)
    return jnp.where(folded <= -omega / 2, folded + omega, folded)


@jax.jit  # one compiled call (eagerly, a dozen small ones otherwise)
def _eigen(u: Array, period: Array) -> tuple[Array, Array]:
    """Quasienergies (ascending, folded) and modes of the one-period propagator."""
    adjoint = jnp.conj(u.T)
    mixed = (u + adjoint) / 2 + _MIX * (u - adjoint) / 2j
    _, vectors = jnp.linalg.eigh((mixed + jnp.conj(mixed.T)) / 2)
    values = jnp.einsum("ij,ik,kj->j", jnp.conj(vectors), u, vectors)
    # e^{-i eps T} = values: eps = -angle / T, in (-pi/T, pi/T].
    energies = fold(-jnp.angle(values) / period, period)
    order = jnp.argsort(energies)
    return energies[order], vectors[:, order]
