"""High-frequency expansions of a periodic Hamiltonian: the van Vleck effective
Hamiltonian with its kick operator, and the Floquet-Magnus (stroboscopic) one.

With $\\omega = 2\\pi/T$, $\\tau = \\omega t$ and $\\epsilon = 1/\\omega$, write
$H(t) = \\tilde H(\\tau)$ and seek $U(t, t_0) = e^{-iK(t)} e^{-i H_{eff} (t - t_0)}
e^{iK(t_0)}$ with $K$ periodic of zero mean. Inserting it into
$i \\partial_\\tau U = \\epsilon \\tilde H U$ gives

    eps H~ = sum_n (-i)^n / (n+1)! ad_K^n(dK/dtau) + sum_n (-i)^n / n! ad_K^n(H_eff),

and with $K = \\sum_{j \\ge 1} \\epsilon^j K_j$, $H_{eff} = \\sum_{j \\ge 0}
\\epsilon^j E_j$ the coefficient of $\\epsilon^{k+1}$ reads
$\\partial_\\tau K_{k+1} = \\delta_{k0} \\tilde H - E_k - R_k$, where $R_k$ holds
nested commutators of $K_1 .. K_k$ with $E_{<k}$ and $\\partial_\\tau K_{\\le k}$.
Its mean over a period fixes $E_k$ (K is periodic), its oscillating part integrates
to $K_{k+1}$. The tables of nested commutators $[ad_K^n(\\cdot)]_p$ are kept and
extended by one order at a time, so order K costs about $K^3/3$ commutators.

Everything is represented by its values on a uniform grid of $2L + 1$ phases,
$L = (K + 1) M$ for drive harmonics up to $M$: a term of order p has harmonics up to
$pM$, so every product formed is exact on the grid (no aliasing), means are grid
averages, integration divides harmonic m by im, and values between grid points are
the Fourier interpolant. The Floquet-Magnus Hamiltonian of start $t_0$ is
$H_F[t_0] = e^{-iK(t_0)} H_{eff} e^{iK(t_0)}$: its terms order by order come from the
same tables. The recursion runs in units of the largest $\\lVert H(t) \\rVert_\\infty$
(so high orders neither overflow nor underflow), with the powers of $\\epsilon$
applied at the end.
"""

import math
from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Complex, Float, Real

from .._core import Time, check_order, complex_dtype, is_traced, module_jit, on_backend
from .._operators import AbstractTimeOperator, to_operator
from ._floquet import (
    FloquetBasis,
    checked_period,
    fold,
    real_scalar,
    refuse_non_periodic,
)


# Fractions of a period off every grid, where H is compared with the Fourier
# interpolant of its grid values (harmonics beyond the grid would alias there).
_PROBES = (0.1234567, 0.5772157, 0.8414710)


class HighFrequencyExpansion(eqx.Module):
    """The high-frequency expansion of a periodic Hamiltonian in powers of
    $1/\\omega$ ([`hierax.high_frequency_expansion`][]).

    `terms[k]` is the van Vleck term $H_{eff}^{(k)} \\propto \\omega^{-k}$ of the
    effective Hamiltonian (so `effective()` = `terms.sum(0)`), which is independent
    of the start time; `kick(t)` is the kick operator $K(t)$ (periodic, zero mean)
    with $U(t, t_0) = e^{-iK(t)} e^{-iH_{eff}(t - t_0)} e^{iK(t_0)}$;
    `stroboscopic_terms(t0)` are the Floquet-Magnus terms of
    $H_F[t_0] = (i/T) \\log U(t_0 + T, t_0)$. Every method takes an `order` (at
    most the expansion's) to truncate at. An Equinox module: batch it with
    `jax.vmap`, differentiate it."""

    period: Real[Array, ""]
    terms: Complex[Array, "k n n"]
    kicks: Complex[Array, "k g n n"]
    stroboscopic_grid: Complex[Array, "k g n n"]

    @property
    def order(self) -> int:
        """The highest power of $1/\\omega$ kept."""
        return self.terms.shape[0] - 1

    def _order(self, order: Any, api: str) -> int:
        if order is None:
            return self.order
        order = check_order(order, api)
        if order > self.order:
            raise ValueError(
                f"`{api}(order=...)` must be at most the expansion's order "
                f"{self.order}, got {order}."
            )
        return order

    def effective(self, order: int | None = None) -> Complex[Array, "n n"]:
        """The van Vleck effective Hamiltonian $\\sum_{k \\le order}
        H_{eff}^{(k)}$."""
        k = self._order(order, "hierax.HighFrequencyExpansion.effective")
        return _effective(self, order=k)

    def quasienergies(self, order: int | None = None) -> Float[Array, " n"]:
        """The eigenvalues of the effective Hamiltonian truncated at `order`,
        folded into $(-\\omega/2, \\omega/2]$ and sorted, as
        [`hierax.FloquetBasis`][]'s."""
        k = self._order(order, "hierax.HighFrequencyExpansion.quasienergies")
        return _truncated_quasienergies(self, order=k)

    def kick(self, t: ArrayLike, order: int | None = None) -> Complex[Array, "n n"]:
        """The kick operator $K(t) = \\sum_{j=1}^{order+1} K^{(j)}(t)$, with
        $K^{(j)} \\propto \\omega^{-j}$ (order + 1 terms go with the effective
        Hamiltonian's order + 1: both enter the propagator at the same power)."""
        api = "hierax.HighFrequencyExpansion.kick"
        k = self._order(order, api)
        return _kick(self, self._time(t, "t", api), order=k, api=api)

    def stroboscopic_terms(self, t0: ArrayLike) -> Complex[Array, "k n n"]:
        """The Floquet-Magnus terms of $H_F[t_0]$, one per power of $1/\\omega$
        (shape `(order + 1, n, n)`): the series of
        $e^{-iK(t_0)} H_{eff} e^{iK(t_0)}$, which depends on the start $t_0$ and
        has the same quasienergies."""
        api = "hierax.HighFrequencyExpansion.stroboscopic_terms"
        return _stroboscopic_terms(self, self._time(t0, "t0", api), api=api)

    def stroboscopic(
        self, t0: ArrayLike, order: int | None = None
    ) -> Complex[Array, "n n"]:
        """The Floquet-Magnus Hamiltonian $H_F[t_0]$ truncated at `order`, with
        $U(t_0 + T, t_0) \\approx e^{-i H_F[t_0] T}$."""
        api = "hierax.HighFrequencyExpansion.stroboscopic"
        k = self._order(order, api)
        return _stroboscopic(self, self._time(t0, "t0", api), order=k, api=api)

    def propagator(
        self, t: ArrayLike, t0: ArrayLike, order: int | None = None
    ) -> Complex[Array, "n n"]:
        """$U(t, t_0) \\approx e^{-iK(t)} e^{-i H_{eff} (t - t_0)} e^{iK(t_0)}$,
        accurate to $\\omega^{-(order+1)}$ at any times (not only stroboscopic
        ones), with matrix exponentials."""
        api = "hierax.HighFrequencyExpansion.propagator"
        k = self._order(order, api)
        t, t0 = self._time(t, "t", api), self._time(t0, "t0", api)
        return _propagator(self, t, t0, order=k, api=api)

    def convergence(self, exact: FloquetBasis) -> Float[Array, " k"]:
        """The largest distance (modulo $\\omega$) of the quasienergies at each
        order $0 .. K$ from `exact`'s (a [`hierax.FloquetBasis`][] of the same H
        and period): the expansion's error order by order."""
        api = "hierax.HighFrequencyExpansion.convergence"
        if not isinstance(exact, FloquetBasis):
            raise TypeError(
                f"`{api}`: `exact` must be a `hierax.FloquetBasis` (from "
                f"`hierax.floquet`), got {type(exact).__name__}."
            )
        n = self.terms.shape[-1]
        if exact.quasienergies.shape != (n,):
            raise ValueError(
                f"`{api}`: `exact` has {exact.quasienergies.shape[0]} quasienergies "
                f"but the expansion's H is {n}x{n}; pass the Floquet basis of the same "
                "H."
            )
        periods = (self.period, exact.period)
        if not any(is_traced(x) or np.ndim(x) != 0 for x in periods):
            mine, theirs = float(self.period), float(exact.period)
            # Quasienergies of different periods fold into different zones: the
            # distances read as errors of order omega (1.78 where the expansion's
            # error was 0.09). The same period formed in another precision passes.
            if abs(mine - theirs) > 1e-6 * abs(mine):
                raise ValueError(
                    f"`{api}`: `exact` has period {theirs!r} but the expansion "
                    f"{mine!r}; pass the Floquet basis of the same H and period."
                )
        return _convergence(self, exact.quasienergies)

    def _time(self, t: Any, name: str, api: str) -> Array:
        """A time argument as a real scalar of the period's dtype (a value on the
        device is checked for finiteness inside the compiled call)."""
        return real_scalar(t, name, api, self.period.dtype)

    def _weights(self, t: Time, name: str, api: str) -> Array:
        """Fourier-interpolation weights of the grid at time t (checked finite at
        run time: the error names the argument `name` of `api`)."""
        t = eqx.error_if(t, ~jnp.isfinite(t), f"`{api}`: `{name}` must be finite.")
        g = self.kicks.shape[1]
        phase = 2 * jnp.pi * (t / self.period - jnp.arange(g) / g)
        m = jnp.arange(1, (g - 1) // 2 + 1)
        return (1 + 2 * jnp.cos(phase[:, None] * m[None, :]).sum(1)) / g


@on_backend("hierax.high_frequency_expansion")
def high_frequency_expansion(
    hamiltonian: Any,
    period: ArrayLike,
    *,
    order: int,
    harmonics: int = 1,
) -> HighFrequencyExpansion:
    """The high-frequency expansion of a periodic `hamiltonian` in powers of
    $1/\\omega$, $\\omega = 2\\pi/T$, to `order` (a
    [`hierax.HighFrequencyExpansion`][]: the van Vleck effective Hamiltonian term
    by term, the kick operator, and the Floquet-Magnus Hamiltonian of any start).

    **Arguments:**

    - `hamiltonian`: $H(t) = \\sum_{|m| \\le M} H_m e^{i m \\omega t}$, Hermitian, in
        any form [`hierax.sesolve`][] takes (e.g. `hz + hierax.Cos(w) * hx`).
    - `period`: $T > 0$, a number or a traced scalar (batch it with `jax.vmap`).
    - `order`: the highest power of $1/\\omega$, a non-negative int.
    - `harmonics`: $M$, the highest harmonic of $\\omega$ in H (1 for
        $\\cos \\omega t$ drives; 2 if $\\cos 2\\omega t$ appears, ...).

    H is sampled on a grid of $2(order + 1)M + 1$ times over a period and its
    Fourier components taken from there; an H that is not periodic with `period`,
    has harmonics above `harmonics` or is not Hermitian is refused (eagerly with a
    ValueError; inside `jax.jit`/`jax.vmap` by a runtime error).
    """
    api = "hierax.high_frequency_expansion"
    operator = to_operator(hamiltonian, "hamiltonian", api)
    order = check_order(order, api)
    if isinstance(harmonics, bool) or not isinstance(harmonics, (int, np.integer)):
        raise TypeError(
            f"`{api}(harmonics=...)` must be a positive int, got {harmonics!r}."
        )
    if harmonics < 1:
        raise ValueError(f"`{api}(harmonics=...)` must be positive, got {harmonics}.")
    period = checked_period(period, api)
    if is_traced(period):  # checked before H is sampled at multiples of it
        period = cast(
            Array,
            eqx.error_if(
                period,
                ~(jnp.isfinite(period) & (period > 0)),
                f"`{api}`: `period` must be positive and finite.",
            ),
        )
    # Closed-form time functions tell their frequencies, as `floquet` reads them:
    # a drive nearly constant over the period (cos(1e-4 t) over 0.52) passed the
    # sampled check below, its values within 7e-11 of a Fourier series.
    refuse_non_periodic(operator, period, api)
    expansion, leak, asymmetry = _expand(
        operator, period, order=order, harmonics=int(harmonics)
    )
    tolerance = 2e-10 if jnp.finfo(period.dtype).bits == 64 else 2e-4
    periodic = (
        f"`{api}`: `hamiltonian` is not periodic with `period` or has harmonics "
        f"above `harmonics` = {harmonics} (its sampled values differ from their "
        "Fourier series by {gap:.2e} of its norm); pass the period of H and the "
        "highest harmonic of 2 pi / period in it."
    )
    hermitian = (
        f"`{api}`: `hamiltonian` is not Hermitian (H(t) - H(t)^dagger reaches "
        "{gap:.2e} of its norm); the expansion is that of a Hermitian, periodic H."
    )
    # (Written so that a nan gap, from a non-finite H, fails too.)
    for gap, message in ((leak, periodic), (asymmetry, hermitian)):
        if is_traced(gap):
            expansion = eqx.error_if(
                expansion,
                ~(gap <= tolerance),
                message.replace("{gap:.2e}", "more than"),
            )
        elif not float(gap) <= tolerance:
            raise ValueError(message.format(gap=float(gap)))
    return expansion


def _quasienergies(h: Array, period: Array) -> Array:
    energies = jnp.linalg.eigvalsh((h + jnp.conj(h.T)) / 2)
    return jnp.sort(fold(energies, period))


# The expansion's methods, each one compiled call per structure and order (run
# eagerly, each was a dozen small programs, each compiled on its first use); times
# are values.


def _effective_to(expansion: HighFrequencyExpansion, order: int) -> Array:
    return expansion.terms[: order + 1].sum(0)


_effective = module_jit(_effective_to, api="hierax.HighFrequencyExpansion")


@module_jit
def _truncated_quasienergies(expansion: HighFrequencyExpansion, *, order: int) -> Array:
    return _quasienergies(_effective_to(expansion, order), expansion.period)


def _kick_at(
    expansion: HighFrequencyExpansion, t: Any, order: int, api: str, name: str = "t"
) -> Array:
    weights = expansion._weights(t, name, api)
    return jnp.einsum("g,kgab->ab", weights, expansion.kicks[: order + 1])


def _stroboscopic_terms_at(
    expansion: HighFrequencyExpansion, t0: Any, api: str
) -> Array:
    weights = expansion._weights(t0, "t0", api)
    return jnp.einsum("g,kgab->kab", weights, expansion.stroboscopic_grid)


_kick = module_jit(_kick_at, api="hierax.HighFrequencyExpansion.kick")
_stroboscopic_terms = module_jit(
    _stroboscopic_terms_at, api="hierax.HighFrequencyExpansion"
)


@module_jit
def _stroboscopic(
    expansion: HighFrequencyExpansion, t0: Any, *, order: int, api: str
) -> Array:
    return _stroboscopic_terms_at(expansion, t0, api)[: order + 1].sum(0)


@module_jit
def _propagator(
    expansion: HighFrequencyExpansion, t: Any, t0: Any, *, order: int, api: str
) -> Array:
    expm = jax.scipy.linalg.expm
    kick, back = (
        _kick_at(expansion, t, order, api),
        _kick_at(expansion, t0, order, api, "t0"),
    )
    middle = expm(-1j * _effective_to(expansion, order) * (t - t0))
    return expm(-1j * kick) @ middle @ expm(1j * back)


@module_jit
def _convergence(expansion: HighFrequencyExpansion, exact: Array) -> Array:
    omega = 2 * jnp.pi / expansion.period
    errors = []
    for k in range(expansion.order + 1):
        energies = _quasienergies(_effective_to(expansion, k), expansion.period)
        gap = energies[:, None] - exact[None, :]
        gap = jnp.abs(jnp.mod(gap + omega / 2, omega) - omega / 2)
        errors.append(gap.min(1).max())
    return jnp.stack(errors)


@module_jit
def _expand(
    operator: AbstractTimeOperator, period: Array, *, order: int, harmonics: int
) -> tuple[HighFrequencyExpansion, Array, Array]:
    g = 2 * (order + 1) * harmonics + 1
    dtype = complex_dtype(period.dtype)
    times = period * jnp.arange(g, dtype=period.dtype) / g
    samples = jax.vmap(operator)(times).astype(dtype)
    scale = jnp.abs(samples).sum(-1).max()
    scale = jnp.where(scale > 0, scale, 1.0)
    h = samples / scale
    asymmetry = jnp.abs(h - _adjoint(h)).max()
    leak = _leak(operator, h, scale, period, harmonics)
    h = (h + _adjoint(h)) / 2
    e, k, f = _recursion(h, order)
    # Units: E_k(H) = s^{k+1} E_k(H / s), K_k(H) = s^k K_k(H / s), with s = scale,
    # and the physical terms carry eps^k: eps s is the expansion's small number.
    small = (period / (2 * np.pi) * scale).astype(dtype)
    powers = small ** jnp.arange(order + 2)
    expansion = HighFrequencyExpansion(
        period=period,
        terms=scale * powers[: order + 1, None, None] * e,
        kicks=powers[1:, None, None, None] * k,
        stroboscopic_grid=scale * powers[: order + 1, None, None, None] * f,
    )
    return expansion, leak, asymmetry


def _leak(
    operator: AbstractTimeOperator,
    h: Array,
    scale: Array,
    period: Array,
    harmonics: int,
) -> Array:
    """How far H (in units of `scale`) is from a Fourier series with harmonics up
    to `harmonics`: its grid harmonics above them, and its values at probe times
    against the grid's interpolant."""
    g = h.shape[0]
    m = np.fft.fftfreq(g, 1 / g)
    coefficients = jnp.fft.fft(h, axis=0) / g
    high = jnp.abs(jnp.where((np.abs(m) > harmonics)[:, None, None], coefficients, 0))
    probes = jnp.asarray(_PROBES, period.dtype)
    values = jax.vmap(operator)(probes * period).astype(h.dtype) / scale
    phases = jnp.exp(2j * jnp.pi * probes[:, None] * m[None, :]).astype(h.dtype)
    interpolant = jnp.einsum("pm,mab->pab", phases, coefficients)
    return jnp.maximum(high.max(), jnp.abs(values - interpolant).max())


def _adjoint(x: Array) -> Array:
    return jnp.conj(jnp.swapaxes(x, -1, -2))


def _recursion(h: Array, order: int) -> tuple[Array, Array, Array]:
    """The van Vleck terms E_0..E_K, the kick terms K_1..K_{K+1} on the grid and the
    Floquet-Magnus terms F_0..F_K on the grid (start phase = grid phase), of
    h(tau) on the grid, without the powers of eps (module docstring)."""
    g = h.shape[0]
    # Integration of the zero-mean part along the grid: harmonic m divided by im,
    # as a real g x g matrix (2/g) sum_{m=1}^{L} sin(m (tau_i - tau_j)) / m.
    tau = 2 * np.pi * np.arange(g) / g
    m = np.arange(1, (g - 1) // 2 + 1)
    difference = tau[:, None, None] - tau[None, :, None]
    integral = jnp.asarray(
        (2 / g) * (np.sin(m * difference) / m).sum(-1), dtype=h.dtype
    )

    def integrate(x: Array) -> Array:
        return jnp.einsum("ij,jab->iab", integral, x)

    def commutators(
        ks: list[Array], ys: list[Array], zs: list[Array], sign: int
    ) -> tuple[Array, Array]:
        """sum_j [K_j, Y_j] and sum_j [K_j, Z_j] for Hermitian K_j and
        Y_j^dagger = sign Y_j (and Z_j): [K, Y] = P - sign P^dagger with P = K Y
        (one product per pair)."""
        # One product of the side-by-side K_j with the stacked [Y_j | Z_j]: a
        # single dot per table level keeps the program (and its compile) small.
        right = jnp.concatenate(
            [jnp.concatenate([a, b], axis=-1) for a, b in zip(ys, zs)], axis=-2
        )
        p = jnp.concatenate(ks, axis=-1) @ right
        c = p[..., : h.shape[-1]], p[..., h.shape[-1] :]
        return c[0] - sign * _adjoint(c[0]), c[1] - sign * _adjoint(c[1])

    # y[n][p] = [ad_K^n(H_eff)]_p, z[n][p] = [ad_K^n(dK/dtau)]_p (grid values);
    # y[0][p] = E_p (a constant matrix), z[0][p] = dK_p/dtau. ad_K^n keeps
    # Hermitian (n even) or anti-Hermitian (n odd) parts: sign (-1)^n.
    y: dict[tuple[int, int], Array] = {}
    z: dict[tuple[int, int], Array] = {}
    kicks: list[Array] = []
    energies: list[Array] = []
    stroboscopic: list[Array] = []
    for k in range(order + 1):
        for n in range(1, k + 1):
            # y[n, k] and z[n, k + 1] take the same kicks K_1 .. K_{k-n+1}.
            js = range(1, k - n + 2)
            y[n, k], z[n, k + 1] = commutators(
                [kicks[j - 1] for j in js],
                [y[n - 1, k - j] for j in js],
                [z[n - 1, k + 1 - j] for j in js],
                (-1) ** (n - 1),
            )
        rest = sum(
            ((-1j) ** n / math.factorial(n + 1)) * z[n, k + 1]
            + ((-1j) ** n / math.factorial(n)) * y[n, k]
            for n in range(1, k + 1)
        )
        source = h if k == 0 else -rest
        energy = jnp.mean(source, axis=0)
        energy = (energy + _adjoint(energy)) / 2
        derivative = source - energy[None]
        y[0, k] = jnp.broadcast_to(energy, h.shape)
        z[0, k + 1] = derivative
        kicks.append(integrate(derivative))
        energies.append(energy)
        # F_k = [e^{-iK} H_eff e^{iK}]_k on the grid.
        stroboscopic.append(
            sum(
                (((-1j) ** n / math.factorial(n)) * y[n, k] for n in range(k + 1)),
                start=jnp.zeros_like(h),
            )
        )
    return jnp.stack(energies), jnp.stack(kicks), jnp.stack(stroboscopic)
