"""The seed problem: the Heisenberg hierarchy of a driven two-level system.

    X_0 = sigma_x,   X_k = i [H(t), X_{k-1}] + d/dt X_{k-1},   H(t) = cos(t) sigma_y

Three ways to compute it, side by side at t = 1:

1. hierax: one compiled call for all levels, whose compile time does not grow with
   the order.
2. The naive recursion from the original question: `jit` per level with a nested
   `jax.jacfwd` for the time derivative. Exact, but each level re-traces the whole
   tree below it, so the compile time grows about threefold per level.
3. The `lax.scan` rewrite that was offered as the answer: fast, but it
   differentiates a constant (the carry does not depend on `t`), so every level from
   k = 2 on is wrong.

Run: `python examples/seed_problem.py`. The naive recursion runs through k = 7 by
default (a few seconds); `--naive-order 9` runs it through k = 9 as the question did
(about a minute more), `--fast` stops it at k = 4.
"""

import argparse
import functools
import sys
import time

import jax


jax.config.update("jax_enable_x64", True)

import jax.lax as lax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import hierax  # noqa: E402


sx = jnp.array([[0, 1], [1, 0]], dtype=complex)
sy = jnp.array([[0, -1j], [1j, 0]], dtype=complex)


def commutator_herm(a, b):
    """[A, B] for Hermitian A and B, as written in the original question."""
    ab = a @ b
    return ab - ab.conj().T


def hamiltonian(t):
    return jnp.cos(t) * sy


@functools.partial(jax.jit, static_argnames="k")
def naive_level(t, k):
    """Level k by nested forward-mode autodiff (t complex, as in the question)."""
    if k == 0:
        return sx
    previous = lambda t: naive_level(t, k - 1)
    derivative = jax.jacfwd(previous, holomorphic=True)(t)
    return 1j * commutator_herm(hamiltonian(t), previous(t)) + derivative


@functools.partial(jax.jit, static_argnames="order")
def scan_answer(t, order):
    """The offered rewrite: the derivative of the carry w.r.t. t is always zero."""

    def step(x, _):
        derivative = jax.jacfwd(lambda t: x, holomorphic=True)(t)
        x = 1j * commutator_herm(hamiltonian(t), x) + derivative
        return x, x

    _, levels = lax.scan(step, sx, None, length=order)
    return jnp.concatenate([sx[None], levels])


def timed(fn, *args):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="small sizes, for tests")
    parser.add_argument("--order", type=int, default=9, help="highest level K")
    parser.add_argument(
        "--naive-order",
        type=int,
        default=None,
        help="run the naive recursion through this level (default 7; 4 with --fast)",
    )
    args = parser.parse_args(argv)
    order = args.order
    naive_default = 4 if args.fast else 7
    naive_max = min(
        order, naive_default if args.naive_order is None else args.naive_order
    )
    t = 1.0

    print(f"Seed hierarchy: H(t) = cos(t) sigma_y, X_0 = sigma_x, t = {t}, K = {order}")
    hierarchy = hierax.HeisenbergHierarchy(hierax.Cos() * sy, sx, order=order)
    levels, seconds = timed(hierarchy, t)
    print(f"hierax: all {order + 1} levels, compile + run {seconds:.2f} s")
    _, seconds = timed(hierarchy, 2.0)
    print(f"hierax: again at t = 2.0 (no retrace), {1e3 * seconds:.2f} ms")
    for big in [20, 40] if not args.fast else [20]:
        deep = hierax.HeisenbergHierarchy(hierax.Cos() * sy, sx, order=big)
        _, seconds = timed(deep.normalised, t)
        print(f"hierax: K = {big}, compile + run {seconds:.2f} s")

    print(f"\nNaive nested-jacfwd recursion, one jit per level, k = 0..{naive_max}:")
    tc = jnp.asarray(t, dtype=complex)
    worst = 0.0
    for k in range(naive_max + 1):
        value, seconds = timed(naive_level, tc, k)
        error = float(jnp.max(jnp.abs(value - levels[k])))
        worst = max(worst, error)
        print(
            f"  k = {k}: compile + run {seconds:7.3f} s, |naive - hierax| = {error:.1e}"
        )
    print(f"naive recursion agrees with hierax: max |difference| = {worst:.1e}")

    wrong = scan_answer(tc, order)
    print('\nThe "scan" answer against the exact levels (entries [0, 0] and [0, 1]):')
    print(
        f"{'k':>3} {'exact X_k[0,0]':>22} {'exact X_k[0,1]':>22} {'scan [0,0]':>12} "
        f"{'scan [0,1]':>12}"
    )
    first_wrong = None
    for k in range(order + 1):
        exact = levels[k]
        bad = wrong[k]
        if first_wrong is None and not jnp.allclose(bad, exact, rtol=1e-8, atol=1e-8):
            first_wrong = k
        print(
            f"{k:>3} {exact[0, 0].real:>22.15g} {exact[0, 1].real:>22.15g} "
            f"{bad[0, 0].real:>12.6g} {bad[0, 1].real:>12.6g}"
        )
    print(f"scan answer is wrong from k = {first_wrong} on")

    ok = worst < 1e-9 and first_wrong == 2
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
