"""Short-time Heisenberg evolution from the hierarchy, against exact propagation.

The levels X_k(t) are the time derivatives of the Heisenberg-picture observable, so
its Taylor series around t is

    V(tau)^dagger X(t + tau) V(tau)  =  sum_k X_k(t) tau^k / k!,

with V(tau) = U(t + tau, t) the propagator from t to t + tau. `hierarchy.normalised`
returns X_k / k! directly. We compare the truncated series (orders K = 2, 4, 8, 12)
with V computed independently: a fourth-order Magnus integrator (products of
`jax.scipy.linalg.expm` over a fine grid). The error falls like tau^(K+1) until it
reaches the accuracy of the reference.

Run: `python examples/short_time_evolution.py [--fast] [--out DIR]`; prints the
error-versus-tau table and saves `short_time_error.png` in DIR (default: a temporary
folder) when matplotlib is installed.
"""

import argparse
import pathlib
import sys
import tempfile

import jax


jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from jax.scipy.linalg import expm  # noqa: E402

import hierax  # noqa: E402


sx = jnp.array([[0, 1], [1, 0]], dtype=complex)
sy = jnp.array([[0, -1j], [1j, 0]], dtype=complex)
sz = jnp.array([[1, 0], [0, -1]], dtype=complex)

# A driven qubit with a Gaussian-envelope drive, and an observable that itself
# depends on time (a rotating-frame sigma_x).
H = (
    hierax.Gaussian(mean=0.5, width=0.4, amplitude=2.0) * hierax.Cos(3.0) * sx
    + 0.7 * sz
)
X = hierax.Cos(1.5) * sx + hierax.Sin(1.5) * sy
T0 = 0.2
ORDERS = (2, 4, 8, 12)


def exact_heisenberg(tau: jax.Array, steps: int) -> jax.Array:
    """V(tau)^dagger X(T0 + tau) V(tau), V from a 4th-order Magnus integrator."""
    h = tau / steps
    c = jnp.sqrt(3.0) / 6

    def step(v, i):
        s = T0 + i * h
        a1 = -1j * H(s + (0.5 - c) * h)
        a2 = -1j * H(s + (0.5 + c) * h)
        omega = 0.5 * h * (a1 + a2) + (jnp.sqrt(3.0) / 12) * h**2 * (a2 @ a1 - a1 @ a2)
        return expm(omega) @ v, None

    v, _ = jax.lax.scan(step, jnp.eye(2, dtype=complex), jnp.arange(steps))
    return v.conj().T @ X(T0 + tau) @ v


def series_heisenberg(coefficients: jax.Array, tau: jax.Array, order: int) -> jax.Array:
    """sum_{k <= order} (X_k / k!) tau^k, from the normalised levels."""
    powers = tau ** jnp.arange(order + 1)
    return jnp.tensordot(powers, coefficients[: order + 1], axes=1)


def save_plot(taus, errors, out: pathlib.Path) -> pathlib.Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot saved")
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for order, column in zip(ORDERS, errors.T, strict=True):
        (line,) = ax.loglog(taus, column, "o-", ms=3, label=f"K = {order}")
        # The expected slope, anchored at the largest tau.
        ax.loglog(
            taus,
            column[0] * (taus / taus[0]) ** (order + 1),
            ":",
            color=line.get_color(),
            lw=0.8,
        )
    ax.set_xlabel(r"$\tau$")
    ax.set_ylabel(r"$\| \sum_{k \leq K} X_k \tau^k / k! - X_H(\tau) \|$")
    ax.set_title(r"Short-time Heisenberg evolution (dotted: $\tau^{K+1}$)")
    ax.set_ylim(1e-17, None)
    ax.legend()
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "short_time_error.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="fewer points, for tests")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="plot folder")
    args = parser.parse_args(argv)
    points = 6 if args.fast else 12
    steps = 200 if args.fast else 600

    hierarchy = hierax.HeisenbergHierarchy(H, X, order=max(ORDERS))
    coefficients = hierarchy.normalised(T0)  # (K+1, 2, 2): X_k(T0) / k!
    taus = 0.25 * 0.5 ** jnp.arange(points)
    exact = jax.jit(jax.vmap(exact_heisenberg, in_axes=(0, None)), static_argnums=1)(
        taus, steps
    )
    errors = jnp.stack(
        [
            jnp.stack(
                [
                    jnp.linalg.norm(series_heisenberg(coefficients, tau, order) - ref)
                    for order in ORDERS
                ]
            )
            for tau, ref in zip(taus, exact, strict=True)
        ]
    )

    print(f"Heisenberg-picture observable around t = {T0}: the series to order K")
    print(f"against a Magnus-4 reference ({steps} steps); error norms:")
    print(f"{'tau':>10}" + "".join(f"{f'K = {k}':>12}" for k in ORDERS))
    for tau, row in zip(taus, errors, strict=True):
        print(f"{float(tau):>10.4g}" + "".join(f"{float(e):>12.2e}" for e in row))
    # Observed convergence order from the two largest taus (before the error floor).
    slopes = jnp.log2(errors[0] / errors[1])
    print(
        "slope log2(err(0.25) / err(0.125)): "
        + ", ".join(
            f"K = {k}: {float(s):.2f}" for k, s in zip(ORDERS, slopes, strict=True)
        )
    )

    out = args.out or pathlib.Path(tempfile.mkdtemp(prefix="hierax-"))
    path = save_plot(jnp.asarray(taus), jnp.asarray(errors), out)
    if path is not None:
        print(f"saved {path}")

    best = float(errors[-1, -1])
    ok = best < 1e-11 and all(
        abs(float(s) - (k + 1)) < 0.5 for k, s in zip(ORDERS, slopes, strict=True)
    )
    print(f"smallest error (K = {ORDERS[-1]}, tau = {float(taus[-1]):.4g}): {best:.1e}")
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
