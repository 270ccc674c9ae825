"""What the work-precision benchmarks of `hierax.sesolve` and `hierax.mesolve`
(`bench_sesolve.py`, `bench_mesolve.py`) share: the target final errors, the
ladders of tolerances, the driven transmon and Ising chain (as plain dicts of
NumPy matrices), their drive in each library's form, and the plot."""

import jax.numpy as jnp
import numpy as np
from rows import row

import hierax


TARGETS = (1e-6, 1e-10)
LADDER = tuple(10.0 ** -(k / 2) for k in range(8, 29))
COARSE_LADDER = tuple(10.0**-k for k in range(4, 15))


def at_plateau(errors: list[float]) -> bool:
    """Whether a ladder's final errors, in the order of its tolerances, have stopped
    falling: the last two tolerances gained nothing on the best before them, below
    1e-8. (One rung's error can sit above the previous one and fall again at the
    next: hierax on the transmon read 2.1e-10 at 1e-7, 3.5e-9 at 3.2e-8, 1.7e-11 at
    1e-8; on the dephasing Ising chain 7.8e-10 at 1e-8 and 3.3e-10 at 1e-9, then
    2.1e-11 at 1e-10. A rule on one rung stopped those ladders short of 1e-10.)"""
    return (
        len(errors) >= 3
        and errors[-1] < 1e-8
        and min(errors[-2:]) > 0.7 * min(errors[:-2])
    )


# --- the systems -----------------------------------------------------------------


def transmon(quick):
    """Lab-frame transmon, time in ns, energies in rad/ns."""
    levels = 4
    omega, alpha, drive = 2 * np.pi * 5.0, -2 * np.pi * 0.3, 2 * np.pi * 0.05
    n = np.arange(levels)
    h0 = np.diag(omega * n + 0.5 * alpha * n * (n - 1)).astype(complex)
    a = np.diag(np.sqrt(np.arange(1, levels)), 1)
    h1 = drive * (a + a.T).astype(complex)
    periods = 240 if quick else 2394
    return dict(
        name=f"transmon-4 ({periods} periods)",
        h0=h0,
        h1=h1,
        f=("cos", omega, 0.0),
        state=np.eye(levels, dtype=complex)[0],
        span=periods * 2 * np.pi / omega,
    )


def ising(quick, sites=5):
    """The transverse-field Ising chain, dense."""
    sx = np.array([[0, 1], [1, 0]], complex)
    sz = np.diag([1.0, -1.0]).astype(complex)

    def at(op, k):
        out = np.eye(1)
        for j in range(sites):
            out = np.kron(out, op if j == k else np.eye(2))
        return out

    zz = np.sum([at(sz, k) @ at(sz, k + 1) for k in range(sites - 1)], axis=0)
    x = np.sum([at(sx, k) for k in range(sites)], axis=0)
    if sites <= 6:
        span, label = (5 if quick else 50) * np.pi, f"{5 if quick else 50} pi"
    else:
        span, label = np.pi / (8 if quick else 2), f"pi/{8 if quick else 2}"
    return dict(
        name=f"ising-{sites} (T = {label})",
        h0=zz.astype(complex),
        h1=x.astype(complex),
        f=("1+0.5sin", 2.0, 0.0),
        state=np.eye(2**sites, dtype=complex)[0],
        span=span,
        large=sites > 6,
    )


def coefficient_np(f):
    kind, w, _ = f
    if kind == "cos":
        return lambda t: np.cos(w * t)
    return lambda t: 1.0 + 0.5 * np.sin(w * t)


def coefficient_jnp(f):
    kind, w, _ = f
    if kind == "cos":
        return lambda t: jnp.cos(w * t)
    return lambda t: 1.0 + 0.5 * jnp.sin(w * t)


def coefficient_hierax(f):
    kind, w, _ = f
    if kind == "cos":
        return hierax.Cos(w)
    return hierax.Constant(1.0) + 0.5 * hierax.Sin(w)


STYLES = {
    "hierax Taylor": dict(color="black", marker="o", linewidth=2),
    "diffrax Dopri8": dict(color="tab:blue", marker="s"),
    "diffrax Tsit5": dict(color="tab:cyan", marker="s"),
    "QuTiP vern9": dict(color="tab:red", marker="^"),
    "QuTiP adams": dict(color="tab:orange", marker="v"),
    "dynamiqs Dopri8": dict(color="tab:green", marker="D"),
    "dynamiqs Tsit5": dict(color="tab:olive", marker="D"),
}


def plot(results, path, title):
    """Work-precision: final error against run time, one panel per system, from the
    ladders measured in this run."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(results), figsize=(4.6 * len(results), 4.0), squeeze=False
    )
    for ax, result in zip(axes[0], results):
        for name, ladder in result["ladders"].items():
            # In the ladder's order (tightening tolerance), as work-precision
            # diagrams are drawn; each point is one timed call, so under load the
            # line can step back in time.
            points = [(r["seconds"], r["error"]) for r in ladder]
            ax.loglog(
                [p[0] for p in points],
                [p[1] for p in points],
                label=name,
                markersize=4,
                **STYLES.get(name, {}),
            )
        for target in TARGETS:
            ax.axhline(target, color="gray", linewidth=0.5, linestyle=":")
        ax.set_title(result["system"], fontsize=10)
        ax.set_xlabel("run time (s)")
        ax.set_ylabel("final-state error")
        ax.grid(True, which="major", alpha=0.3)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"work-precision plot: {path}")


def ladder_rows(results: list[dict]) -> list[dict]:
    """The runner's rows of the work-precision ladders: each method's time,
    tolerance and final error at each target, and its compile time at the first
    target."""
    out = []
    for result in results:
        for r in result["rows"]:
            case = result["system"]
            target = dict(target=r["target"])
            out.append(row(case, r["method"], "seconds", r.get("seconds"), **target))
            out.append(row(case, r["method"], "tolerance", r["tol"], **target))
            out.append(row(case, r["method"], "error", r.get("error"), **target))
            if r["target"] == TARGETS[0] and r.get("compile") is not None:
                out.append(row(case, r["method"], "compile_seconds", r["compile"]))
    return out
