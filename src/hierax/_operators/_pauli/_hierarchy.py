"""Heisenberg levels of Pauli sums under a time-dependent Pauli Hamiltonian.

With $H(t) = \\sum_j f_j(t) H_j$ (each $H_j$ a Pauli sum) and the observable $X_0$ a
Pauli sum, every level is a Pauli sum whose coefficients are series in time: write
$X_{k-1}(t + \\tau) = \\sum_p a_p \\tau^p$ per string and
$f_j(t + \\tau) = \\sum_q f_{j,q} \\tau^q$; then

    X_k(t + tau) = sum_p tau^p ( i sum_j sum_{q <= p} f_{j,q} [H_j, a_{p-q}]
                                 + (p + 1) a_{p+1} ),

the same recursion as the dense kernel's, with each string carrying its series
(K + 1 coefficients) through the merge of `compress`. Each order p of a level's
series is divided by its own power of two (carried as an exponent per order): the
high orders of a strongly driven chain's series are many orders of magnitude
above the level's value (order p = 0), and one scale for all of them made values
of 1e10 read inf in float32. A level is scaled back once, at the end, by two
exact multiplications by powers of two, part by part, so values beyond the
floating-point range read inf (with a zero part zero), never nan; the levels run
in one `lax.scan`, so the compiled program does not grow with the order.
"""

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike

from ..._core import as_time, check_order, check_time_finite, on_backend
from ._compress import compress
from ._strings import i_power, product_phase
from ._sum import (
    PauliSum,
    PauliTimeSum,
    _live,
    _valid,
    as_time_sum,
    check_chain,
    check_int,
    check_pairs,
)


class PauliHierarchy(eqx.Module):
    """The Heisenberg hierarchy $X_k = i[H(t), X_{k-1}] + \\dot X_{k-1}$ of a Pauli
    sum under a Pauli Hamiltonian, for chains far beyond any matrix: each level a
    [`hierax.PauliSum`][] with room for `capacity` strings.

    `hamiltonian` is a [`hierax.PauliSum`][] (constant: the levels are
    $i^k (\\mathrm{ad}_H)^k X_0$) or a [`hierax.PauliTimeSum`][]
    (`hierax.Cos(w) * hx + hzz`); `observable` a constant Pauli sum. Calling the
    hierarchy at `t` gives the list of levels $X_0(t), \\dots, X_K(t)$;
    `normalised(t)` the levels divided by $k!$ (the Taylor coefficients of the
    observable in the Heisenberg picture). Every level is exact while its strings
    fit the capacity; past it the strings with the smallest series are removed
    and each level's `dropped` reports the weight removed on its way (as
    everywhere for Pauli sums). Compiled once per structure: new times and
    parameter values never recompile.

    [`hierax.HeisenbergHierarchy`][] and [`hierax.NestedCommutators`][] given Pauli
    sums run this recursion and give the same levels.
    """

    hamiltonian: PauliTimeSum
    observable: PauliSum
    order: int = eqx.field(static=True)
    capacity: int = eqx.field(static=True)

    def __init__(
        self,
        hamiltonian: PauliSum | PauliTimeSum,
        observable: PauliSum,
        order: int,
        capacity: int | None = None,
    ):
        """**Arguments:**

        - `hamiltonian`: $H(t)$, a [`hierax.PauliSum`][] or [`hierax.PauliTimeSum`][].
        - `observable`: $X_0$, a [`hierax.PauliSum`][] on the same chain.
        - `order`: the highest level $K$, a non-negative Python int.
        - `capacity`: room for strings in every level (default: the observable's
            capacity times the Hamiltonian's strings to the power K, up to 4^N and
            at most 2^16; give it explicitly for long chains).
        """
        api = "hierax.PauliHierarchy"
        h = as_time_sum(hamiltonian)
        if h is None:
            raise TypeError(
                f"`{api}`: `hamiltonian` must be a `hierax.PauliSum` or a sum of time "
                f"functions times Pauli sums, got {type(hamiltonian).__name__}."
            )
        if not isinstance(observable, PauliSum):
            raise TypeError(
                f"`{api}`: `observable` must be a `hierax.PauliSum`, got "
                f"{type(observable).__name__}."
            )
        check_chain(h, observable, api, ("hamiltonian", "observable"))
        self.hamiltonian, self.observable = h, observable
        self.order = check_order(order, api)
        if capacity is None:
            strings = sum(s.capacity for s in h.sums) + 1
            capacity = min(
                observable.capacity * strings**self.order,
                4**observable.n_qubits,
                2**16,
            )
        self.capacity = max(check_int(capacity, api, "capacity"), observable.capacity)
        slots = sum(s.capacity for s in h.sums)
        check_pairs(  # every slot of H with every slot of a level, and the level
            slots + 1,
            self.capacity,
            api,
            f"`hamiltonian`'s {slots} slots (plus one for the level's derivative) "
            f"and `capacity` = {self.capacity}",
            "lower `capacity`",
        )

    def __call__(self, t: ArrayLike = 0.0) -> list[PauliSum]:
        """The levels $X_0(t), \\dots, X_K(t)$."""
        return _levels(self, t, normalised=False)

    def normalised(self, t: ArrayLike = 0.0) -> list[PauliSum]:
        """The levels divided by $k!$: $X_k(t)/k!$."""
        return _levels(self, t, normalised=True)


def _levels(
    hierarchy: PauliHierarchy, t: ArrayLike, *, normalised: bool
) -> list[PauliSum]:
    """The levels at a checked `t`. A function, not a method: looking a method up on
    an Equinox module builds a bound-method module (tens of microseconds a call)."""
    if isinstance(t, jax.Array):  # traced ones too
        # Checked by shape and dtype here, by value in the compiled call: a time
        # already on the device is not read back to the host.
        if t.shape != () or t.dtype.kind not in "iufc":
            raise TypeError(
                f"`{_TIME_API}`: `t` must be a real or complex scalar, got an "
                f"array of shape {tuple(t.shape)} and dtype {t.dtype}."
            )
    else:
        t = jnp.asarray(as_time(t, _TIME_API))
    return _pauli_levels(hierarchy, t, normalised=normalised)


_TIME_API = "hierax.PauliHierarchy(...)(t)"


def _pow2(d: Array) -> Array:
    """$2^d$ for exponent differences $d \\le 0$; zero where $d$ is $-\\infty$ or
    nan (an empty order: $-\\infty - (-\\infty)$)."""
    ok = jnp.isfinite(d)
    return jnp.where(ok, jnp.exp2(jnp.where(ok, d, 0)), 0)


def _ldexp(x: Array, k: Array) -> Array:
    """$x 2^k$ for real `x`, as two exact multiplications (each factor in range where
    the result is): inf where it overflows, zero where `x` is zero or $k$ is
    $-\\infty$, never nan for a number `x`."""
    finite = jnp.isfinite(k)
    k = jnp.where(finite, k, 0)
    half = jnp.floor(k / 2)
    y = x * jnp.exp2(half) * jnp.exp2(k - half)
    return jnp.where((x == 0) | ~finite, jnp.zeros_like(x), y)


def _ldexp_complex(x: Array, k: Array) -> Array:
    """`_ldexp` of the real and imaginary parts (a complex product by an infinite
    scale gives nan from the zero part)."""
    return lax.complex(_ldexp(jnp.real(x), k), _ldexp(jnp.imag(x), k))


def _exponent(top: Array) -> Array:
    """$\\lfloor \\log_2 \\mathrm{top} \\rfloor$, or $-\\infty$ for zero."""
    ok = (top > 0) & jnp.isfinite(top)
    return jnp.where(ok, jnp.floor(jnp.log2(jnp.where(ok, top, 1))), -jnp.inf)


@on_backend("hierax.PauliHierarchy")
@eqx.filter_jit
def _pauli_levels(hierarchy: PauliHierarchy, t: Array, *, normalised: bool):
    h, o, order = hierarchy.hamiltonian, hierarchy.observable, hierarchy.order
    capacity, n = hierarchy.capacity, o.n_qubits
    dtype = jnp.result_type(o.dtype, *(s.dtype for s in h.sums))
    real = jnp.finfo(dtype).dtype
    size = order + 1
    t = check_time_finite(t, _TIME_API)
    # A complex time stays complex (the series of f at t, not at Re t).
    t = t if jnp.iscomplexobj(t) else t.astype(real)
    # The Hamiltonian's strings, stacked, each with the series of its function;
    # the coefficients scaled by a power of two `h_exponent`, each order q of the
    # functions' series by its own, `f_exponent[q]`.
    hx = jnp.concatenate([s.x for s in h.sums])
    hz = jnp.concatenate([s.z for s in h.sums])
    hc = jnp.concatenate([_valid(s).astype(dtype) for s in h.sums])
    live = jnp.concatenate([_live(s) for s in h.sums])
    h_exponent = _exponent(jnp.max(jnp.abs(hc)))
    hc = _ldexp_complex(hc, -h_exponent)
    h_exponent = jnp.where(jnp.isfinite(h_exponent), h_exponent, 0)
    fs = jnp.stack([f.series(t, order, None).astype(dtype) for f in h.functions])
    f_exponent = _exponent(jnp.max(jnp.abs(fs), axis=0))  # (P,)
    fs = _ldexp_complex(fs, -f_exponent[None, :])
    which = np.concatenate([np.full(s.capacity, j) for j, s in enumerate(h.sums)])
    # Lower-triangular Toeplitz matrices: (f * a)_p = sum_q f_{p-q} a_q.
    p, q = np.indices((size, size))
    lower = jnp.asarray(p >= q)
    lag = np.clip(p - q, 0, order)
    toeplitz = jnp.where(lower[None], fs[:, lag], 0)  # (terms, P, P)
    toeplitz_exponent = jnp.where(lower, f_exponent[lag], -jnp.inf)  # (P, P)
    shift = jnp.arange(1, size, dtype=real)[None, :]  # (p + 1) a_{p+1}
    empty = jnp.full((1,), -jnp.inf, real)

    ox, oz, oc, count, _ = compress(o.x, o.z, _valid(o).astype(dtype), n, capacity)
    exponent0 = _exponent(jnp.max(jnp.abs(oc)))
    series = jnp.zeros((capacity, size), dtype)
    series = series.at[:, 0].set(_ldexp_complex(oc, -exponent0))
    exponents = jnp.concatenate([exponent0[None], jnp.full(order, -jnp.inf, real)])

    def level(carry, _):
        """Level k's series (mantissas `a`, true value a_p 2^{e_p}) from level k-1's."""
        x, z, a, e = carry
        px, pz, phase, anti = product_phase(hx[:, None], hz[:, None], x[None], z[None])
        # (f * a)_p at the exponent E_p of its largest term, f_{p-q} a_q.
        terms = toeplitz_exponent + e[None, :]
        big = jnp.max(terms, axis=1)
        weight = toeplitz * _pow2(terms - big[:, None])[None]
        y = jnp.einsum("jpq,sq->jsp", weight, a)[which]  # (strings, capacity, P)
        pairs = (anti == 1) & live[:, None]
        factor = jnp.where(pairs, 2j * hc[:, None] * i_power(phase, dtype), 0)
        big = big + h_exponent
        # (p + 1) a_{p+1} at exponent e_{p+1}; both parts brought to one per order.
        derivative = jnp.zeros_like(a).at[:, :-1].set(a[:, 1:] * shift)
        derivative_exponent = jnp.concatenate([e[1:], empty])
        common = jnp.maximum(big, derivative_exponent)
        c = factor[..., None] * (y * _pow2(big - common)[None, None, :])
        derivative = derivative * _pow2(derivative_exponent - common)[None, :]
        m = px.shape[0] * px.shape[1]
        nx, nz, na, ncount, removed = compress(
            jnp.concatenate([px.reshape(m, -1), x]),
            jnp.concatenate([pz.reshape(m, -1), z]),
            jnp.concatenate([c.reshape(m, size), derivative]),
            n,
            capacity,
        )
        # Each order renormalised by a power of two (exact).
        power = _exponent(jnp.max(jnp.abs(na), axis=0))
        na = _ldexp_complex(na, -jnp.where(jnp.isfinite(power), power, 0)[None, :])
        e = jnp.where(jnp.isfinite(power), common + power, -jnp.inf)
        # The weight removed, in true units: sum_p removed_p 2^{2 common_p}.
        removed = jnp.sum(_ldexp(removed, 2 * common))
        return (nx, nz, na, e), (nx, nz, na[:, 0], ncount, removed, e[0])

    _, (xs, zs, cs, counts, removed, values) = lax.scan(
        level, (ox, oz, series, exponents), None, length=order
    )
    zero = jnp.zeros((), real)
    xs = jnp.concatenate([ox[None], xs])
    zs = jnp.concatenate([oz[None], zs])
    cs = jnp.concatenate([oc[None], cs])
    counts = jnp.concatenate([count[None], counts])
    removed = jnp.concatenate([zero[None], removed])
    values = jnp.concatenate([zero[None], values])  # level 0 is `oc` itself
    if normalised:  # k! divided out in log space, before the scale is applied
        log_factorial = jnp.cumsum(jnp.log2(jnp.maximum(jnp.arange(size), 1)))
        values = values - log_factorial.astype(real)
        removed = _ldexp(removed, -2 * log_factorial.astype(real))
    cs = _ldexp_complex(cs, values[:, None])
    # The levels as sums, split inside the program (not slice by slice after it).
    return [
        PauliSum(
            x=xs[k],
            z=zs[k],
            coefficients=cs[k],
            count=counts[k],
            dropped=removed[k],
            n_qubits=n,
        )
        for k in range(size)
    ]
