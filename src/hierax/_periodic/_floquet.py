"""Floquet quasienergies and modes of a periodic Hamiltonian.

For $H(t + T) = H(t)$ the one-period propagator $U = U(t_0 + T, t_0)$ (solved with
the Taylor solver, the identity as its initial state) has eigenvalues
$e^{-i\\epsilon_j T}$; the quasienergies $\\epsilon_j$ are defined modulo
$\\omega = 2\\pi/T$ and folded into $(-\\omega/2, \\omega/2]$, and the eigenvectors
are the Floquet modes at $t_0$.

$U$ is unitary, hence normal: every Hermitian combination
$M_c = \\tfrac12 (U + U^\\dagger) + \\tfrac{c}{2i} (U - U^\\dagger)$ shares its
eigenvectors. They come from `eigh` (which runs on every backend and has a
derivative, unlike a general `eig`), and each eigenvalue from $v^\\dagger U v$.
$M_c$'s eigenvalues are $\\sqrt{1 + c^2} \\cos(\\epsilon T - \\arctan c)$: two
distinct quasienergies meet in one of them whenever
$(\\epsilon + \\epsilon') T \\equiv -2 \\arctan c \\pmod{2\\pi}$. No real function of
U separates every pair on the circle, and in a sweep over a parameter the pairs'
sums move continuously, so some sweep point always comes near that condition:
`eigh` then mixes the pair's eigenvectors and $v^\\dagger U v$ averages their
quasienergies (a 1024-amplitude sweep of an 8-level system had errors up to 0.06
from one mix alone). So a second pass diagonalises $B = V^\\dagger U V$ (nearly
diagonal but in the mixed pairs) by $M_{c'}$ with $\\arctan c' = \\arctan c -
\\pi/2$: a pair at the first condition has $M_{c'}$-eigenvalues $\\pm\\sqrt{1 +
c'^2} \\sin$ of half its distance, apart unless the pair itself is (nearly)
degenerate, where any basis of it is right. Pairs that the first pass separated
are coupled in B by rounding (and the solve's error) alone, which the second
pass mixed fully where such a pair meets its own condition (quasienergies 0.3
off): the second pass keeps only the couplings of the pairs it separates better
than the first (each pair's gap in it that of its 2x2 block). A degenerate
pair of quasienergies (a symmetry) has any basis of its eigenspace as modes, as
for any eigen-solver.
"""

import dataclasses
import math
import numbers
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Complex, Float, Real

from .._core import (
    PERIOD_SOLVERS,
    VERIFIED_PERIODS,
    Failure,
    as_period,
    at_top_level,
    backend_choices,
    check_bool,
    check_order,
    complex_dtype,
    failure,
    in_blocks,
    is_int,
    is_traced,
    module_jit,
    on_backend,
    raise_if,
    returned_failure,
    run_checked,
    to_jax,
)
from .._operators import (
    AbstractTimeOperator,
    jump_times,
    merge_equal_terms,
    time_operators,
    to_operator,
)
from .._solvers import (
    TaylorOptions,
    callable_tangents,
    default_order,
    schrodinger_solve,
)
from .._time import CallableTimeFunction
from ._symmetry import NOT_PERIODIC, harmonic_gap, mirror_center, operator_frequencies


# The mixing coefficients of the two Hermitian combinations: the golden ratio's
# fractional part (far from the rationals that symmetric spectra produce) and
# -1 / it (its arctan a quarter turn away).
_MIXES = (0.6180339887498949, -1.6180339887498949)
# The largest gap between two levels of the first pass at which the second may
# still couple them: far above the gaps at which rounding and the solve's error
# mix a pair (the modes of a pair 1e-2 apart are off by that error over 1e-2).
_MIXED_GAP = 1e-2


class FloquetBasis(eqx.Module):
    """The Floquet quasienergies and modes of a periodic Hamiltonian
    ([`hierax.floquet`][]): `quasienergies` (ascending, folded into
    $(-\\omega/2, \\omega/2]$ with $\\omega = 2\\pi/T$), `modes` (the Floquet modes
    at `t0` as columns), `propagator` (the one-period propagator
    $U(t_0 + T, t_0)$) and `period`. `modes_at(t)` gives the modes at any time.
    An Equinox module: differentiate it, batch it with `jax.vmap` (over drive
    amplitudes, frequencies and periods: the period is an array, so a batch of
    periods compiles once). `failure`: with `throw=False`, the first failed check
    (a [`hierax.Failure`][], one per element under `jax.vmap`), the propagator,
    quasienergies and modes nan where one failed; `None` otherwise."""

    hamiltonian: AbstractTimeOperator
    period: Real[Array, ""]
    t0: Real[Array, ""]
    propagator: Complex[Array, "n n"]
    quasienergies: Float[Array, " n"]
    modes: Complex[Array, "n n"]
    # The one-period solve's settings, which `modes_at` solves with too.
    options: TaylorOptions
    failure: Failure | None = None

    @property
    def rtol(self) -> Real[Array, ""]:
        return self.options.rtol

    @property
    def atol(self) -> Real[Array, ""]:
        return self.options.atol

    @property
    def order(self) -> int | None:
        return self.options.order

    def modes_at(self, t: ArrayLike) -> Complex[Array, "n n"]:
        """The Floquet modes at time `t` as columns,
        $\\phi_j(t) = e^{i \\epsilon_j (t - t_0)} U(t, t_0) \\phi_j(t_0)$, periodic
        in t (t is first reduced into $(t_0, t_0 + T]$: a solve of at most one
        period).

        **Arguments:**

        - `t`: the time, a real scalar.

        **Returns:**

        The modes at `t` as the columns of an `(n, n)` array.
        """
        api = "hierax.FloquetBasis.modes_at"
        if self.failure is not None and not is_traced(self.failure.code):
            # A basis made with `throw=False` whose solve failed: its own error
            # (its modes are nan, which the solve below would name instead).
            self.failure.throw()
        # (A failed check in the program, a device time's or the steps', raised
        # as its message alone.)
        t = real_scalar(t, "t", api, self.period.dtype)
        return run_checked(_modes_at, self, t)


def _modes_at_impl(basis: FloquetBasis, t: Any) -> Array:
    t = jnp.asarray(t, basis.period.dtype)
    # A time on the device is checked here (reading it back would move it).
    t = eqx.error_if(
        t, ~jnp.isfinite(t), "`hierax.FloquetBasis.modes_at`: `t` must be finite."
    )
    local = basis.t0 + jnp.mod(t - basis.t0, basis.period)
    local = jnp.where(local <= basis.t0, local + basis.period, local)
    api = "hierax.FloquetBasis.modes_at"
    # (A failed solve raises here whatever `throw` the basis was made with: the
    # modes have no place for a failure.)
    options = _throwing(basis.options)
    evolved = schrodinger_solve(
        basis.hamiltonian,
        basis.modes,
        jnp.stack([basis.t0, local]),
        options=options,
        api=api,
        max_steps_advice=_max_steps_advice(
            "the solve from `t0`", options, basis.modes.dtype, "hierax.floquet"
        ),
    ).final_state
    phases = jnp.exp(1j * basis.quasienergies * (local - basis.t0))
    return evolved * phases[None, :].astype(evolved.dtype)


# One compiled call per basis structure (eagerly, a dozen small programs around
# the solve otherwise); a new time is a value.
_modes_at = module_jit(_modes_at_impl, api="hierax.FloquetBasis.modes_at")


@on_backend("hierax.floquet")
def floquet(
    hamiltonian: Any,
    period: ArrayLike,
    *,
    t0: ArrayLike = 0.0,
    options: Any = None,
    rtol: ArrayLike | None = None,
    atol: ArrayLike | None = None,
    order: int | None = None,
    throw: bool | None = None,
) -> FloquetBasis:
    """The Floquet quasienergies and modes of `hamiltonian`, periodic with
    `period` (a [`hierax.FloquetBasis`][]).

    **Arguments:**

    - `hamiltonian`: $H(t)$ with $H(t + T) = H(t)$, Hermitian, in any form
        [`hierax.sesolve`][] takes (e.g. `hz + hierax.Cos(w) * hx` with
        `period = 2 * pi / w`).
    - `period`: $T > 0$, a number or a traced scalar (batch it with `jax.vmap`).
    - `t0`: the time the modes refer to, a real scalar.
    - `options`: a [`hierax.TaylorOptions`][], the settings of the one-period
        solve (and of `modes_at`); by default
        `hierax.TaylorOptions(rtol=1e-12, atol=1e-14, order=16)`. The keywords
        `rtol`, `atol`, `order` and `throw` are shorthands for those fields (the
        others at these defaults); give either `options` or them, not both.
    - `rtol`, `atol`: the tolerances of the one-period solve (the quasienergies'
        error follows them: about `rtol` / T in absolute terms); values, as
        [`hierax.sesolve`][]'s: a new tolerance compiles nothing.
    - `order`: the series order of the one-period solve. The default, 16, is below
        [`hierax.sesolve`][]'s: the state is an n x n propagator, and with a
        time-dependent H each order costs a Cauchy product over all earlier ones
        (K n^2 per term, beside the n^3 of its matrix product), which batches of
        many drives make memory-bound. Measured on sweeps of 1000 amplitudes
        (driven transmons, n = 4, 6, 10, one `jax.vmap`, matched quasienergy error
        1e-9): 0.53x, 0.90x and 0.57x the time of order 28; single calls within
        noise of it. A low order takes very many short steps (a step's error
        falls as its length to the power order + 1): at the default tolerances
        orders below about 4 can run out of `max_steps`, and the error says so.
    - `throw`: `False` returns a failed check (of the values, the periodicity
        and Hermiticity checked in the program, the solve's `max_steps`) in the
        basis' `failure` instead of raising it, with the propagator,
        quasienergies and modes nan where one failed: the program then holds no
        host callback, which on an accelerator costs every call of a `jax.jit`
        that holds one about 2 ms (see [`hierax.sesolve`][]). Checks of known
        values still raise here. `modes_at` raises whatever `throw` is.

    H must be T-periodic and Hermitian. Where its time functions have closed forms
    (`Cos`, `Sin`, `Exp`, constants, their sums and products) a frequency that is
    not a harmonic of $2\\pi / T$, or a Gaussian or polynomial envelope, is refused;
    sampled pulses (`PiecewiseConstant`, `CubicSpline`, ...) and callables are taken
    as one period of a periodic drive: what they give on $[t_0, t_0 + T]$ is
    solved, and a period that leaves the samples' knots (known values) is
    refused: samples shorter than T are one period from their first knot, so
    `t0` is that knot. Hermiticity is read from the terms where they tell it (Hermitian
    matrices times real functions) and otherwise checked at a few times of the
    period. Known values are checked here (a ValueError), traced ones inside the
    compiled solve (a runtime error).

    Where H is symmetric about some time c, $H(c + s) = \\overline{H(c - s)}$ (a
    cosine drive $\\cos(\\omega t + \\varphi)$ on real matrices, about a maximum
    of the cosine, whatever its phase and `t0`; a sine drive on imaginary
    ones), half the period is solved: $U = U_h^T U_h$ with
    $U_h = U(t_0 + T/2, t_0)$ when c is the middle of the period, and otherwise
    over $[c - T/2, c]$, carried to $t_0$ by the propagator to $t_0$ saved on
    the way (which takes H's periodicity as established). The symmetry is read
    from the time functions and known parameter values (a traced period or
    frequency, or a callable H, get the whole period).
    """
    api = "hierax.floquet"
    operator = to_operator(hamiltonian, "hamiltonian", api)
    period = checked_period(period, api)
    t0 = real_scalar(t0, "t0", api, period.dtype)
    options = _options(options, rtol, atol, order, throw, api)
    rtol, atol = options.rtol, options.atol
    # Terms are merged here, where the matrices are known: inside the blocked map
    # they are arguments.
    operator = merge_equal_terms(operator)
    exact = refuse_non_periodic(operator, period, api)
    _refuse_outside_samples(operator, period, t0, api)
    hermitian = _refuse_non_hermitian(operator, period, t0, api)
    checks = _Checks(
        inputs=any(is_traced(x) for x in (period, t0, rtol, atol)),
        periodic=exact is None,
        hermitian=not hermitian,
    )
    u, found = _one_period(operator, period, t0, options, checks, exact is True)
    energies, modes = _eigen(u, period)
    if found is not None:  # nan where a check failed: never a wrong number
        u, energies, modes = (
            jnp.where(found.succeeded, x, jnp.nan) for x in (u, energies, modes)
        )
    return FloquetBasis(
        hamiltonian=operator,
        period=period,
        t0=t0,
        propagator=u,
        quasienergies=energies,
        modes=modes,
        options=options,
        failure=found,
    )


def _options(
    options: Any, rtol: Any, atol: Any, order: Any, throw: Any, api: str
) -> TaylorOptions:
    """The one-period solve's options, from `options` or the shorthands (at
    `floquet`'s defaults), with the tolerances checked here (`_tolerance`)."""
    given = [
        n
        for n, v in (("rtol", rtol), ("atol", atol), ("order", order), ("throw", throw))
        if v is not None
    ]
    if options is None:
        order = 16 if order is None else order
        if not is_int(order):
            raise TypeError(
                f"`{api}(order=...)` must be a positive int, got {order!r} of type "
                f"{type(order).__name__}."
            )
        if order < 1:
            raise ValueError(f"`{api}(order=...)` must be a positive int, got {order}.")
        return TaylorOptions(
            rtol=_tolerance(1e-12 if rtol is None else rtol, "rtol", api),
            atol=_tolerance(1e-14 if atol is None else atol, "atol", api),
            order=check_order(order, api),
            throw=True if throw is None else check_bool(throw, "throw", api),
        )
    if not isinstance(options, TaylorOptions):
        raise TypeError(
            f"`{api}`: `options` must be a `hierax.TaylorOptions`, got "
            f"{type(options).__name__}."
        )
    if given:
        raise TypeError(
            f"`{api}`: got both `options=` and `{given[0]}=`; give each setting "
            f"once: in the options (`hierax.TaylorOptions({given[0]}=...)`) or as "
            "the keyword alone."
        )
    return eqx.tree_at(
        lambda o: (o.rtol, o.atol),
        options,
        (
            _tolerance(options.rtol, "rtol", api),
            _tolerance(options.atol, "atol", api),
        ),
    )


def checked_period(period: Any, api: str) -> Array:
    """`period` as a positive, finite real scalar array (`as_period`), with errors
    that name it for every kind of bad value; a traced one is checked by the
    compiled call."""
    if period is None or isinstance(period, (bool, np.bool_, str, bytes)):
        raise TypeError(
            f"`{api}`: `period` must be a positive real number, got {period!r}."
        )
    try:
        period = as_period(period, api)
    except (TypeError, ValueError) as error:
        if str(error).startswith(f"`{api}`"):
            raise
        raise TypeError(
            f"`{api}`: `period` must be a positive real number, got "
            f"{type(period).__name__}."
        ) from None
    if not is_traced(period) and not math.isfinite(float(period)):
        raise ValueError(f"`{api}`: `period` must be finite, got {float(period)}.")
    return period


def real_scalar(x: Any, name: str, api: str, dtype: Any) -> Array:
    """A time given to `api` as a real 0-d array of `dtype`. Known NumPy and Python
    values are checked here; an array on the device only by its shape and dtype,
    its value inside the compiled call (reading it back would move it)."""
    if x is None or isinstance(x, (bool, np.bool_, str, bytes)):
        raise TypeError(f"`{api}`: `{name}` must be a real number, got {x!r}.")
    if not isinstance(x, jax.Array):  # traced values are `jax.Array`s too
        try:
            value = np.asarray(x)
        except (TypeError, ValueError):
            value = None
        if value is None or value.dtype.kind not in "iuf":
            kind = type(x).__name__ if value is None else f"dtype {value.dtype}"
            raise TypeError(f"`{api}`: `{name}` must be a real number, got {kind}.")
        if value.ndim != 0:
            raise ValueError(
                f"`{api}`: `{name}` must be a scalar, got shape {value.shape}."
            )
        if not np.isfinite(value):
            raise ValueError(f"`{api}`: `{name}` must be finite, got {x!r}.")
        return to_jax(value.astype(dtype))
    if x.ndim != 0 or not (
        jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)
    ):
        raise ValueError(
            f"`{api}`: `{name}` must be a real scalar, got {x.dtype} of shape "
            f"{tuple(x.shape)}."
        )
    return x if x.dtype == dtype else x.astype(dtype)


def _tolerance(x: Any, name: str, api: str) -> Array:
    """A tolerance as a real scalar array: known values checked here, traced ones
    (a user's jit over them) inside the compiled solve."""
    if is_traced(x):
        if jnp.ndim(x) != 0 or not jnp.issubdtype(jnp.result_type(x), jnp.floating):
            raise ValueError(
                f"`{api}`: `{name}` must be a real scalar, got {jnp.result_type(x)} "
                f"of shape {jnp.shape(x)}."
            )
        return x
    if isinstance(x, (bool, np.bool_)) or not isinstance(
        x, (numbers.Real, np.ndarray, np.generic, jax.Array)
    ):
        raise TypeError(f"`{api}`: `{name}` must be a positive real number, got {x!r}.")
    array = np.asarray(x)
    if array.ndim != 0 or array.dtype.kind not in "iuf":
        raise ValueError(f"`{api}`: `{name}` must be a real scalar, got {x!r}.")
    value = float(array)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"`{api}`: `{name}` must be positive and finite, got {x!r}.")
    # Placed once per value (`to_jax`): a second call moves nothing.
    return to_jax(value)


class _Checks(NamedTuple):
    """What the compiled one-period solve checks (values not known before it): the
    traced period, start and tolerances (`inputs`), that H's frequencies are
    harmonics of $2\\pi / T$ (`periodic`), that H is Hermitian at a few times
    (`hermitian`)."""

    inputs: bool
    periodic: bool
    hermitian: bool


# Fractions of a period at which H is checked whole (irrational, off every grid of
# the drive's harmonics).
_PROBES = (0.1234567, 0.5772157, 0.8414710)


def _tolerances(dtype: Any) -> tuple[float, float]:
    """How far from a harmonic of $2\\pi/T$ a frequency may lie (relative to the
    number of cycles) for H to count as periodic, and how far from its adjoint H
    may lie (relative to its largest entry), for values of `dtype`."""
    return (1e-9, 1e-10) if jnp.finfo(dtype).bits == 64 else (1e-4, 1e-5)


def refuse_non_periodic(
    operator: AbstractTimeOperator, period: Array, api: str
) -> bool | None:
    """Refuse an H whose closed-form time functions tell it is not T-periodic.
    Returns whether it is periodic to rounding (the shifted half-period solve may
    then take it as such), or `None` where traced values decide (the compiled
    solve checks them). Sampled pulses and callables tell nothing: False."""
    view = jax.tree.map(
        lambda x: np.asarray(x) if isinstance(x, jax.Array) and not is_traced(x) else x,
        operator,
    )
    nus = operator_frequencies(view)
    if nus is None:
        return False
    if nus is NOT_PERIODIC:
        raise ValueError(
            f"`{api}`: `hamiltonian` is not periodic: a Gaussian or polynomial time "
            "function (of degree one or more) has no period. Floquet theory needs "
            "H(t + T) = H(t); to solve one period of a pulse train, give the pulse "
            "sampled over the period (`hierax.PiecewiseConstant`, "
            "`hierax.CubicSpline`) or as a callable."
        )
    assert isinstance(nus, tuple)
    if is_traced(period) or any(is_traced(nu) for nu in nus):
        return None
    length = float(period)
    loose, _ = _tolerances(_lowest_precision(operator, period))
    for nu in nus:
        gap = float(harmonic_gap((nu,), length, np))
        if not gap <= loose:
            nu = complex(np.asarray(nu))
            cycles = nu * length / (2 * math.pi)
            raise ValueError(
                f"`{api}`: `hamiltonian` is not periodic with `period` = {length!r}: "
                f"it has the frequency {_shown(nu)} (a term e^(i nu t)), "
                f"{_shown(cycles)} cycles per period, not a whole number. Pass the "
                "period of H (2 pi / w for a drive cos(w t))."
            )
    eps = float(jnp.finfo(period.dtype).eps)
    return float(harmonic_gap(nus, length, np)) <= 16 * eps


def _refuse_outside_samples(
    operator: AbstractTimeOperator, period: Array, t0: Array, api: str
) -> None:
    """Refuse a period $[t_0, t_0 + T]$ that leaves the samples of H's sampled
    pulses, known values only: past their knots they give no drive (zero, or a
    spline's extrapolation), so that window is not one period of them, and the
    quasienergies came out of another drive (a pulse on [0, 2] with T = 2 gave
    +-0.425 from t0 = 0, +-0.436 from t0 = 0.7). Samples shorter than the period
    (a pulse, then nothing) are one period from their first knot."""
    knots = jump_times(operator)
    if knots is None or any(is_traced(x) for x in (knots, period, t0)):
        return
    knots = np.asarray(knots, np.float64)
    first, last = float(knots.min()), float(knots.max())
    start, length = float(t0), float(period)
    eps = float(jnp.finfo(period.dtype).eps)
    slack = 16 * eps * max(abs(first), abs(last), abs(start), length)
    if last - first < length - slack:
        inside = abs(start - first) <= slack
    else:
        inside = start >= first - slack and start + length <= last + slack
    if not inside:
        raise ValueError(
            f"`{api}`: `hamiltonian` has sampled pulses on [{first:.9g}, "
            f"{last:.9g}], but the period from `t0` is [{start:.9g}, "
            f"{start + length:.9g}]: past their samples they give no drive, so that "
            f"is not one period of them. Pass `t0={first:.9g}` (the quasienergies do "
            "not depend on `t0`; `modes_at(t)` gives the modes at any time)."
        )


def _shown(x: complex) -> str:
    return f"{x.real:.9g}" if x.imag == 0 else f"{x.real:.9g}{x.imag:+.9g}j"


def _lowest_precision(operator: AbstractTimeOperator, period: Array) -> Any:
    """The least precise dtype among the period and the operator's arrays (the
    rounding the periodicity check allows)."""
    leaves = [x for x in jax.tree.leaves(operator) if hasattr(x, "dtype")]
    dtypes = [jnp.finfo(complex_dtype(x.dtype)).dtype for x in (period, *leaves)]
    return min(dtypes, key=lambda d: jnp.finfo(d).bits)


def _refuse_non_hermitian(
    operator: AbstractTimeOperator, period: Array, t0: Array, api: str
) -> bool:
    """Refuse an H that is not Hermitian (to rounding): the one-period propagator
    would not be unitary, and quasienergies not real. Returns whether H is known to
    be Hermitian, with no check left for the compiled solve.

    Hermitian matrices times real functions are Hermitian by structure. Otherwise
    (sparse matrices, callables, complex functions, or non-Hermitian terms of a
    Hermitian whole such as $e^{i\\omega t} a + e^{-i\\omega t} a^\\dagger$) H is
    evaluated at a few times of the period: with known values here, once per set of
    arrays (a second call with the same arrays reads nothing back from the
    device); with traced ones inside the compiled solve (False)."""
    if _hermitian_by_structure(operator, period.dtype):
        return True
    if any(is_traced(x) for x in jax.tree.leaves((operator, period, t0))):
        return False
    key = VERIFIED_PERIODS.key(operator, period, t0)
    if key is not None and VERIFIED_PERIODS.get(key):
        return True
    gap = _hermitian_gap_compiled(operator, period, t0)
    if is_traced(gap):  # a callable that closes over traced values
        return False
    gap = float(gap)
    _, tolerance = _tolerances(_lowest_precision(operator, period))
    if not gap <= tolerance:
        raise ValueError(
            f"`{api}`: `hamiltonian` is not Hermitian (H(t) differs from its "
            f"conjugate transpose by {gap:.2e} of its largest entry at some t in the "
            "period); Floquet quasienergies are those of a Hermitian, periodic H."
        )
    if key is not None:
        VERIFIED_PERIODS.put(key)
    return True


def _hermitian_by_structure(operator: AbstractTimeOperator, dtype: Any) -> bool:
    """Whether every term is a known dense Hermitian matrix times a real function
    (read from the functions' array dtypes; a callable function may be complex)."""
    _, tolerance = _tolerances(dtype)
    parts = time_operators(operator)
    if parts is None:
        return False
    for part in parts:
        m = part.term_matrices.known_stack()
        if m is None:
            return False
        for function in part.functions:
            nodes = jax.tree.leaves(
                function, is_leaf=lambda x: isinstance(x, CallableTimeFunction)
            )
            for node in nodes:
                if isinstance(node, CallableTimeFunction):
                    return False
                if hasattr(node, "dtype") and jnp.issubdtype(
                    node.dtype, jnp.complexfloating
                ):
                    return False
        gap = np.abs(m - np.conj(np.swapaxes(m, -1, -2))).max(initial=0)
        if not gap <= tolerance * np.abs(m).max(initial=0):
            return False
    return True


def _hermitian_gap(operator: AbstractTimeOperator, period: Array, t0: Array) -> Array:
    """The largest entry of $H(t) - H(t)^\\dagger$ at the probe times of the period,
    relative to H's largest entry there."""
    hs = [
        operator.term_series(t0 + fraction * period, 0, None).full()[0]
        for fraction in _PROBES
    ]
    h = jnp.stack(hs)
    gap = jnp.abs(h - jnp.conj(jnp.swapaxes(h, -1, -2))).max()
    scale = jnp.abs(h).max()
    return gap / jnp.where(scale > 0, scale, 1)


_hermitian_gap_compiled = module_jit(_hermitian_gap, api="hierax.floquet")


def _block_bytes() -> int:
    """The bytes of the series that one block of a batch of one-period solves
    keeps, on the backend the solve runs on (`BackendChoices.period_block_bytes`).
    """
    return backend_choices().period_block_bytes


def _one_period(
    operator: AbstractTimeOperator,
    period: Array,
    t0: Array,
    options: TaylorOptions,
    checks: _Checks,
    periodic: bool,
) -> tuple[Array, Failure | None]:
    """The one-period propagator $U(t_0 + T, t_0)$, and with `options.throw`
    False the first failed check (`None` otherwise). Under `jax.vmap` (a sweep of
    drives or periods) the lanes are solved in blocks whose series fit in the
    caches, one block after another (`lax.map`): the same solves, the same
    results, each block in lockstep. Derivatives differentiate the one solve.

    Where H is symmetric about a time c in $(t_0, t_0 + T/2]$ (`_symmetry`: a
    cosine drive on real matrices about a maximum of the cosine), only half a
    period is solved, from $c - T/2$ to c (`_period_solver`); a centre other than
    the middle of the period only where H is `periodic` (to rounding)."""
    arrays, static = eqx.partition(operator, eqx.is_array)
    # The options' values (tolerances, step) are arguments, the rest structure.
    values, settings = eqx.partition(options, eqx.is_array)
    config = (static, operator.size, complex_dtype(period.dtype), settings, checks)
    shift = _mirror_shift(operator, period, t0)
    if shift is not None and shift != 0.5 and not periodic:
        shift = None  # carried to t0 by periodicity, which is not established
    # Where the centre lies is a value (a new phase or start does not recompile);
    # whether there is one, and whether it is the middle, is structure.
    where = None if shift is None else "middle" if shift == 0.5 else "shifted"
    # (Per backend: the blocks' size is its choice.)
    key = (*config, where, backend_choices())
    if not at_top_level() and callable_tangents(operator, period):
        # A callable that reads a traced value of an enclosing transformation (a
        # swept amplitude in its closure): the blocked map's batching rule takes
        # explicit arguments only, so JAX maps the solve as it is.
        solver = _period_solver(*config, where, compiled=False, blocked=False)
    else:
        try:
            solver = PERIOD_SOLVERS.get(key)
        except TypeError:  # a static part that cannot be hashed: built for this
            # call, run eagerly (compiled, it would compile again on every call)
            solver = _period_solver(*config, where, compiled=False)
        else:
            if solver is None:
                solver = PERIOD_SOLVERS.put(key, _period_solver(*config, where))
    shift = to_jax(0.5 if shift is None else shift)
    return solver(arrays, period, t0, shift, values)


def _checked(
    operator: AbstractTimeOperator,
    period: Array,
    t0: Array,
    options: TaylorOptions,
    checks: _Checks,
) -> tuple[Array, Failure | None]:
    """The period, with the checks left to the compiled solve on its value (the
    solve depends on it, so they run first): raised (`options.throw`), or
    returned as a `Failure` with a period of 1 in place of a bad one (the solve
    then runs on a valid value, its result discarded)."""
    api = "hierax.floquet"
    failed: list[Array] = []
    messages: list[str] = []
    if checks.inputs:
        for value, name, positive in (
            (period, "period", True),
            (t0, "t0", False),
            (options.rtol, "rtol", True),
            (options.atol, "atol", True),
        ):
            bad = ~jnp.isfinite(value) | ((value <= 0) if positive else False)
            what = "positive and finite" if positive else "finite"
            failed.append(bad)
            messages.append(f"`{api}`: `{name}` must be {what}.")
    if checks.periodic:
        nus = operator_frequencies(operator)
        assert isinstance(nus, tuple)
        loose, _ = _tolerances(_lowest_precision(operator, period))
        failed.append(~(harmonic_gap(nus, period, jnp) <= loose))
        messages.append(
            f"`{api}`: `hamiltonian` is not periodic with `period` (a frequency of "
            "H is not a whole number of cycles per period); pass the period of H."
        )
    if checks.hermitian:
        _, tolerance = _tolerances(_lowest_precision(operator, period))
        failed.append(~(_hermitian_gap(operator, period, t0) <= tolerance))
        messages.append(
            f"`{api}`: `hamiltonian` is not Hermitian (H(t) differs from its "
            "conjugate transpose at some t in the period); Floquet quasienergies "
            "are those of a Hermitian, periodic H."
        )
    if options.throw:
        return (raise_if(period, failed, messages) if failed else period), None
    found = returned_failure(failed, messages)
    return jnp.where(found.succeeded, period, jnp.ones_like(period)), found


def _throwing(options: TaylorOptions) -> TaylorOptions:
    """`options` with `throw=True` (its values and other settings kept)."""
    # (`TaylorOptions` takes each of its fields as a keyword.)
    return options if options.throw else dataclasses.replace(options, throw=True)


def _max_steps_advice(
    what: str, options: TaylorOptions, dtype: Any, given_to: str | None = None
) -> str:
    """The error where the one-period solve runs out of steps, in `floquet`'s
    settings (it has no `max_steps` keyword): most often a low `order`, whose
    steps shrink like rtol^(1/order) (order 1 or 2 ran out at rtol 1e-6 on a
    driven qubit, 3 at the default 1e-12). `given_to`: the call whose settings
    these are, where it is not the one that failed."""
    order = options.order or default_order(dtype)
    where = f" (given to `{given_to}`)" if given_to else ""
    # (`floquet`'s own default order; options without one solve at sesolve's.)
    default = " (16 by default)" if order < 16 else ""
    return (
        f"{what} took `max_steps` = {options.max_steps} steps without reaching its "
        f"end, at `order` = {order}{where}. Raise `order`{default}: a "
        "step's error falls as its length to the power order + 1, so a low order "
        "takes very many steps at these tolerances. Or loosen `rtol` and `atol`, "
        "or allow more steps with `options=hierax.TaylorOptions(max_steps=...)`."
    )


def _period_solver(
    static: Any,
    n: int,
    dtype: Any,
    settings: TaylorOptions,
    checks: _Checks,
    where: str | None,
    compiled: bool = True,
    blocked: bool = True,
) -> Any:
    """The one-period solve of an operator structure (its non-array part
    `static`), blocked under `jax.vmap` (`in_blocks`); kept per structure, so that
    an eager `jax.vmap` over `floquet` compiles its blocked map once. `where` H's
    mirror centre lies: `None` (none known: the whole period), `"middle"` of the
    period, or `"shifted"` to $c = t_0 + \\text{shift}\\, T$ (`shift` a value).
    `checks`: what the solve checks first (`_checked`). It returns U and, where
    `settings.throw` is False, the first failed check (a `Failure`; `None`
    otherwise). `compiled`: the single
    solve behind a jit boundary (not for a solver built for one call, which would
    compile it on every call). `blocked`: under `jax.vmap`, the lanes in blocks
    (`in_blocks`); otherwise `single` itself. `settings`: the options' structure
    (order, step control, ...); their values (the tolerances, the step) are
    arguments, as in `sesolve`."""

    def single(
        arrays: Any, period: Array, t0: Array, shift: Array, values: TaylorOptions
    ) -> tuple[Array, Failure | None]:
        operator = eqx.combine(arrays, static)
        options = eqx.combine(values, settings)
        period, found = _checked(operator, period, t0, options, checks)
        solved: list[Failure] = []

        def solve(times: list[Array], start: Array | None = None) -> Array:
            solution = schrodinger_solve(
                operator,
                jnp.eye(n, dtype=dtype) if start is None else start,
                jnp.stack(times),
                options=options,
                api="hierax.floquet",
                max_steps_advice=_max_steps_advice(
                    "the solve over the period", options, dtype
                ),
            )
            if solution.failure is not None:
                solved.append(solution.failure)
            return solution.states

        if where is None:
            u = solve([t0, t0 + period])[-1]
        elif where == "middle":  # U = U_h^T U_h from t0
            half = solve([t0, t0 + period / 2])[-1]
            u = half.T @ half
        else:
            # From a = c - T/2 to c, passing t0: W = U(t0, a), U_h = U(c, a). Then
            # U(a + T, a) = U_h^T U_h and, by periodicity,
            # U(t0 + T, t0) = W U(a + T, a) W^dagger.
            shift = shift.astype(period.dtype)
            a, c = t0 + (shift - 0.5) * period, t0 + shift * period
            if options.throw:
                w, half = solve([a, t0, c])[1:]
            else:
                # Two solves of two times each, U_h = U(c, t0) W: three save times
                # keep diffrax's own checks of them, host callbacks.
                w = solve([a, t0])[-1]
                half = solve([t0, c], start=w)[-1]
            u = w @ (half.T @ half) @ jnp.conj(w.T)
        if found is None:
            return u, None
        # The checks' failure first, then the solve's.
        return u, failure([(f.code, f.messages) for f in (found, *solved)])

    if not blocked:
        return single
    order = settings.order or default_order(dtype)
    lane = (order + 1) * 2 * n * n * jnp.finfo(dtype).bits // 8
    # Behind a jit boundary when kept per structure (`compiled`): an eager call is
    # then one compiled program, where its steps around the solve (the identity,
    # the times, U_h^T U_h) ran as eager operations, each compiling a program of
    # its own on a process's first call (28 of them for a driven qubit, 0.56 s).
    return in_blocks(
        jax.jit(single) if compiled else single, max(8, _block_bytes() // lane)
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


def fold(energies: Array, period: Array) -> Array:
    """Quasienergies folded into the zone $(-\\omega/2, \\omega/2]$,
    $\\omega = 2\\pi/T$."""
    omega = 2 * np.pi / period
    folded = energies - omega * jnp.round(energies / omega)
    return jnp.where(folded <= -omega / 2, folded + omega, folded)


def _combination(u: Array, c: float) -> Array:
    """$\\tfrac12 (U + U^\\dagger) + \\tfrac{c}{2i} (U - U^\\dagger)$, Hermitian to the
    last bit."""
    adjoint = jnp.conj(u.T)
    mixed = (u + adjoint) / 2 + c * (u - adjoint) / 2j
    return (mixed + jnp.conj(mixed.T)) / 2


@jax.jit  # one compiled call (eagerly, a dozen small ones otherwise)
def _eigen(u: Array, period: Array) -> tuple[Array, Array]:
    """Quasienergies (ascending, folded) and modes of the one-period propagator:
    `eigh` of one Hermitian combination of U, then of another of U in that basis
    (see the module's docstring)."""
    levels, first = jnp.linalg.eigh(_combination(u, _MIXES[0]))
    b = jnp.conj(first.T) @ u @ first
    # The second pass keeps only the couplings of pairs the first may have mixed
    # (levels within 1e-2) and that it separates better than the first did (each
    # pair's gap in it that of its 2x2 block): a pair the first separated is
    # coupled in B by rounding (and the solve's error) alone, directly or through
    # a third mode, and where it meets the second's condition the second mixed
    # it fully (quasienergies up to 0.3 off).
    mixed = _combination(b, _MIXES[1])
    diagonal = jnp.real(jnp.diagonal(mixed))
    second_gaps = jnp.sqrt(
        (diagonal[:, None] - diagonal[None, :]) ** 2 + 4 * jnp.abs(mixed) ** 2
    )
    first_gaps = jnp.abs(levels[:, None] - levels[None, :])
    kept = (first_gaps <= second_gaps) & (first_gaps <= _MIXED_GAP)
    _, second = jnp.linalg.eigh(jnp.where(kept, mixed, 0))
    vectors = first @ second
    values = jnp.einsum("ij,ik,kj->j", jnp.conj(vectors), u, vectors)
    # e^{-i eps T} = values: eps = -angle / T, in (-pi/T, pi/T].
    energies = fold(-jnp.angle(values) / period, period)
    order = jnp.argsort(energies)
    return energies[order], vectors[:, order]
