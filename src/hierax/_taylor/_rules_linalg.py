"""Taylor rules of linear algebra: linear solves, triangular solves, LU, Cholesky and
Hermitian eigendecompositions.

Each is a matrix identity that holds at every order of the series, solved for one
coefficient at a time in a `fori_loop` with the factorisation of coefficient 0: for
$A(t)\\,x(t) = b(t)$,
$$x_j = A_0^{-1}\\Big(b_j - \\sum_{m=1}^{j} A_m x_{j-m}\\Big),$$
and the factorisations follow from $L U = P A$, $L L^H = A$ and $A V = V \\Lambda$
alike. Only coefficient 0 is ever factorised; the program has the same size for every
order.
"""

from typing import Any

import equinox as eqx
import jax
import jax.extend.core as jex
import jax.lax as lax
import jax.numpy as jnp

from .._data import reversed_window
from ._core import Context, Series, is_series, lift, primal, register
from ._interpreter import eval_closed
from ._rules_linear import batched


def _value(eqn: Any, invals: list[Any]) -> Any:
    return eqn.primitive.bind(*[primal(x) for x in invals], **eqn.params)


def _mT(x: Any) -> Any:
    return jnp.swapaxes(x, -1, -2)


def _mH(x: Any) -> Any:
    return jnp.conj(_mT(x))


def _without_zeroth(x: Any) -> Any:
    return x.at[0].set(0)


def _window_sum(a: Any, b: Any, j: Any, product: Any = jnp.matmul) -> Any:
    """$\\sum_{m} a_m \\cdot b_{j-m}$ over $m \\le j$ (`product` on the trailing
    axes, summed over the order axis)."""
    return jnp.sum(product(a, reversed_window(b, j)), axis=0)


# --- solves ---------------------------------------------------------------------


@register("custom_linear_solve")
def _custom_linear_solve(ctx: Context, eqn: Any, invals: list[Any]) -> list[Any]:
    # A(t) x(t) = b(t), with A given by the `matvec` jaxpr and A_0^{-1} by `solve`
    # (whose constants are taken at order 0: they factorise A_0).
    params = eqn.params
    lengths, jaxprs = params["const_lengths"], params["jaxprs"]
    n_matvec, n_vecmat = lengths.matvec, lengths.vecmat
    n_solve = lengths.solve
    n_consts = n_matvec + n_vecmat + n_solve + lengths.transpose_solve
    matvec_consts = invals[:n_matvec]
    solve_consts = [
        primal(x) for x in invals[n_matvec + n_vecmat : n_matvec + n_vecmat + n_solve]
    ]
    rhs = invals[n_consts:]
    avals = [v.aval for v in eqn.outvars]
    b = [lift(ctx.order, x, aval) for x, aval in zip(rhs, avals, strict=True)]
    solve = jex.jaxpr_as_fun(jaxprs.solve)

    def solve0(*r: Any) -> list[Any]:
        return list(solve(*solve_consts, *r))

    if not any(is_series(x) for x in matvec_consts):
        # A constant operator: the solve is linear in b, coefficient by coefficient.
        return [Series(x) for x in jax.vmap(solve0)(*b)]

    inner = ctx.inside(eqn)
    x0 = solve0(*[c[0] for c in b])
    start = [lift(ctx.order, x, aval) for x, aval in zip(x0, avals, strict=True)]

    def body(j: Any, xs: list[Any]) -> list[Any]:
        # The coefficients of x from j on are still zero, so coefficient j of
        # A(t) x(t) is the sum over m >= 1 that the recurrence subtracts.
        ax = eval_closed(inner, jaxprs.matvec, list(matvec_consts) + _as_series(xs))
        ax = [lift(ctx.order, y, aval) for y, aval in zip(ax, avals, strict=True)]
        r = [bc[j] - y[j] for bc, y in zip(b, ax, strict=True)]
        return [
            x.at[j].set(xj.astype(x.dtype))
            for x, xj in zip(xs, solve0(*r), strict=True)
        ]

    return [Series(x) for x in lax.fori_loop(1, ctx.order + 1, body, start)]


def _as_series(xs: list[Any]) -> list[Any]:
    return [Series(x) for x in xs]


def _triangle(a: Any, lower: bool, unit_diagonal: bool) -> Any:
    """The part of `a` a triangular solve reads (a unit diagonal is implicit)."""
    if lower:
        return jnp.tril(a, -1 if unit_diagonal else 0)
    return jnp.triu(a, 1 if unit_diagonal else 0)


@register("triangular_solve")
def _triangular_solve(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    a, b = invals
    params = eqn.params
    if not is_series(a):
        return Series(batched(eqn, [a, b.coeffs], [None, 0]))
    aval = eqn.outvars[0].aval
    bs = lift(ctx.order, b, eqn.invars[1].aval).astype(aval.dtype)
    # The operator op(A)_m for m >= 1, as the solve reads it.
    m = _triangle(a.coeffs, params["lower"], params["unit_diagonal"])
    if params["transpose_a"]:
        m = _mT(m)
    if params["conjugate_a"]:
        m = jnp.conj(m)
    m = _without_zeroth(m).astype(aval.dtype)
    a0 = a.coeffs[0]
    left = params["left_side"]
    solve0 = lambda r: eqn.primitive.bind(a0, r, **params)
    product = jnp.matmul if left else (lambda p, q: jnp.matmul(q, p))

    def body(j: Any, x: Any) -> Any:
        r = bs[j] - _window_sum(m, x, j, product)
        return x.at[j].set(solve0(r))

    x = jnp.zeros_like(bs).at[0].set(_value(eqn, [a, b]))
    return Series(lax.fori_loop(1, ctx.order + 1, body, x))


# --- factorisations -------------------------------------------------------------


def _solve_lower(l0: Any, r: Any, unit: bool, left: bool = True, **kw: Any) -> Any:
    return lax.linalg.triangular_solve(
        l0, r, left_side=left, lower=True, unit_diagonal=unit, **kw
    )


@register("lu")
def _lu(ctx: Context, eqn: Any, invals: list[Any]) -> list[Any]:
    # P A = L U with L unit lower: coefficient j gives
    # L_0 U_j + L_j U_0 = R_j := (P A)_j - sum_{m=1}^{j-1} L_m U_{j-m}, and
    # L_0^{-1} R_j U_0^{-1} = U_j U_0^{-1} + L_0^{-1} L_j splits into its upper and
    # strictly lower triangles.
    (a,) = invals
    shape = eqn.invars[0].aval.shape
    if shape[-1] != shape[-2]:
        raise ctx.unsupported(
            eqn,
            f"only square matrices are supported, got shape {shape}",
            hint="Factorise a square matrix, or pad it to one.",
        )
    lu0, pivots, permutation = _value(eqn, invals)
    n = shape[-1]
    eye = jnp.eye(n, dtype=lu0.dtype)
    l0 = jnp.tril(lu0, -1) + eye
    u0 = jnp.triu(lu0)
    pa = jnp.take_along_axis(a.coeffs, permutation[None, ..., :, None], axis=-2)

    def body(j: Any, lu_: Any) -> Any:
        lower, upper = lu_
        r = pa[j] - _window_sum(lower, upper, j)
        y = _solve_lower(l0, r, unit=True)
        x = lax.linalg.triangular_solve(u0, y, left_side=False, lower=False)
        lj = l0 @ jnp.tril(x, -1)
        uj = jnp.triu(x) @ u0
        return lower.at[j].set(lj), upper.at[j].set(uj)

    zero = jnp.zeros_like(pa)
    lower, upper = lax.fori_loop(1, ctx.order + 1, body, (zero, zero.at[0].set(u0)))
    out = (lower + upper).at[0].set(lu0)
    return [Series(out), pivots, permutation]


@register("cholesky")
def _cholesky(ctx: Context, eqn: Any, invals: list[Any]) -> Series:
    # L L^H = A: L_0^{-1} R_j L_0^{-H} = L_0^{-1} L_j + (L_0^{-1} L_j)^H with
    # R_j = A_j - sum_{m=1}^{j-1} L_m L_{j-m}^H, so L_0^{-1} L_j is the lower triangle
    # of the left side with its diagonal halved (as JAX's own derivative).
    (a,) = invals
    value = _value(eqn, invals)
    l0 = jnp.tril(value)
    n = l0.shape[-1]
    half = jnp.tril(jnp.ones((n, n), l0.real.dtype)) - 0.5 * jnp.eye(n)
    product = lambda p, q: jnp.matmul(p, _mH(q))

    def body(j: Any, lower: Any) -> Any:
        r = a.coeffs[j] - _window_sum(_without_zeroth(lower), lower, j, product)
        y = _solve_lower(l0, r, unit=False)
        x = _solve_lower(
            l0, y, unit=False, left=False, transpose_a=True, conjugate_a=True
        )
        return lower.at[j].set(l0 @ (x * half))

    lower = jnp.zeros_like(a.coeffs).at[0].set(l0)
    return Series(lax.fori_loop(1, ctx.order + 1, body, lower).at[0].set(value))


@register("eigh")
def _eigh(ctx: Context, eqn: Any, invals: list[Any]) -> list[Any]:
    # With Q(t) = V_0^H V(t) and B = V_0^H A V_0: B Q = Q Lambda. Coefficient j gives
    # Lambda_0 Q_j - Q_j Lambda_0 - Lambda_j = -R_j,
    # R_j = sum_{m=1}^j B_m Q_{j-m} - sum_{m=1}^{j-1} Q_m Lambda_{j-m}: the diagonal is
    # Lambda_j, the rest Q_j. The diagonal of Q_j is the gauge JAX's derivative
    # takes, diag(Q^H Q') = 0 (real Q: the normalisation).
    (a,) = invals
    params = eqn.params
    n = eqn.invars[0].aval.shape[-1]
    subset = params.get("subset_by_index")
    if subset is not None and tuple(subset) != (0, n):
        raise ctx.unsupported(
            eqn,
            "a subset of the eigenvalues is asked for",
            hint="Compute all eigenpairs and slice the result.",
        )
    v0, w0 = _value(eqn, invals)
    gap = w0[..., None, :] - w0[..., :, None]  # gap[a, b] = w_b - w_a
    off = ~jnp.eye(n, dtype=bool)
    degenerate = jnp.any(jnp.where(off, gap == 0, False))
    gap = jnp.where(off, gap, 1)
    b = _mH(v0)[None] @ a.coeffs.astype(v0.dtype) @ v0[None]
    b = _without_zeroth(b)
    weights = jnp.arange(ctx.order + 1, dtype=w0.dtype)
    diagonal = lambda x: jnp.diagonal(x, axis1=-2, axis2=-1)

    def body(j: Any, qw: Any) -> Any:
        q, w = qw
        qm = _without_zeroth(q)
        r = _window_sum(b, q, j) - jnp.sum(
            qm * reversed_window(w, j)[..., None, :], axis=0
        )
        wj = jnp.real(diagonal(r))
        # diag(Q_j) = -(1/j) sum_{m=1}^{j-1} (j - m) diag(Q_m^H Q_{j-m})
        scale = (j - weights).reshape((-1,) + (1,) * (q.ndim - 1))
        norm = jnp.sum(jnp.conj(qm) * scale * reversed_window(q, j), axis=(0, -2))
        qj = jnp.where(off, r / gap, 0) - jnp.vectorize(
            jnp.diag, signature="(n)->(n,n)"
        )(norm / j)
        return q.at[j].set(qj.astype(q.dtype)), w.at[j].set(wj)

    q = (
        jnp.zeros_like(b)
        .at[0]
        .set(jnp.broadcast_to(jnp.eye(n, dtype=b.dtype), b.shape[1:]))
    )
    w = lift(ctx.order, w0)
    q, w = lax.fori_loop(1, ctx.order + 1, body, (q, w))
    v = (v0[None] @ q).at[0].set(v0)
    v = eqx.error_if(
        v,
        degenerate,
        "hierax.taylor: a Hermitian eigendecomposition (`jnp.linalg.eigh`) met a "
        "repeated eigenvalue, where eigenvectors are not analytic. Expand the "
        "eigenvalues of a matrix with a simple spectrum, or a function of the "
        "whole eigenspace (such as a matrix function) instead.",
    )
    return [Series(v), Series(w)]
