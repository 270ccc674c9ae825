"""Exactness at every scale: worst relative error per level of
`hierax.HeisenbergHierarchy` against the 30-digit SymPy/mpmath oracle of the test
suite, beside `error_estimate`, on the stress cases of the scale issue (offsets,
far-detuned spectators, a lab-frame transmon, complex64).

    python benchmarks/stress.py [--order 30]
"""

import argparse

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("stress.py")

import jax.numpy as jnp  # noqa: E402
import mpmath as mp  # noqa: E402
import numpy as np  # noqa: E402
import sympy as sp  # noqa: E402
from oracle import (  # noqa: E402
    SIGMA_X,
    SIGMA_Y,
    SIGMA_Z,
    mp_relative_errors,
    sympy_levels,
    t_sym,
)
from rows import emit, row  # noqa: E402

import hierax  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--order", type=int, default=30)
    order = parser.parse_args().order
    sx, sy = sp.Matrix([[0, 1], [1, 0]]), sp.Matrix([[0, -sp.I], [sp.I, 0]])
    seed = sympy_levels([(sp.cos(t_sym), sy)], [(sp.Integer(1), sx)], 1, order)
    eye = jnp.eye(2)
    cases = {}
    for c in (1e2, 1e4, 1e6):
        h = hierax.Cos() * SIGMA_Y + c * eye
        cases[f"offset {c:g} I"] = (h, SIGMA_X, seed)
    kron_seed = [
        mp.matrix(np.kron(np.array(m.tolist(), dtype=object), np.eye(2)).tolist())
        for m in seed
    ]
    for w in (10.0, 100.0, 1000.0):
        h = hierax.Cos() * jnp.kron(SIGMA_Y, eye) + w * jnp.kron(eye, SIGMA_Z)
        cases[f"spectator w = {w:g}"] = (h, jnp.kron(SIGMA_X, eye), kron_seed)
    print(f"worst relative error over k = 0..{order} (Frobenius), and the estimate")
    print("| case | observed | error_estimate | estimate / max(observed, 10 eps) |")
    print("|---|---|---|---|")
    eps = np.finfo(float).eps
    rows = []

    def add(name, observed, estimate, ratio, **parameters):
        rows.append(row(name, "observed", "error", observed.max(), **parameters))
        rows.append(row(name, "error_estimate", "error", estimate.max(), **parameters))
        rows.append(row(name, "estimate / observed", "ratio", ratio, **parameters))

    for name, (h, x, reference) in cases.items():
        hierarchy = hierax.HeisenbergHierarchy(h, x, order)
        observed = mp_relative_errors(hierarchy(1.0), reference)
        estimate = np.asarray(hierarchy.error_estimate(1.0))
        assert np.all(estimate >= observed)
        ratio = (estimate / np.maximum(observed, 10 * eps)).max()
        print(f"| {name} | {observed.max():.1e} | {estimate.max():.1e} | {ratio:.0f} |")
        add(name, observed, estimate, ratio, order=order)
    h32 = hierax.Cos(jnp.float32(1)) * SIGMA_Y.astype(jnp.complex64)
    hierarchy = hierax.HeisenbergHierarchy(h32, SIGMA_X.astype(jnp.float32), 12)
    observed = mp_relative_errors(hierarchy(jnp.float32(1)), seed[:13])
    estimate = np.asarray(hierarchy.error_estimate(jnp.float32(1)))
    eps32 = np.finfo(np.float32).eps
    ratio = (estimate / np.maximum(observed, 10 * eps32)).max()
    print(
        f"| seed, complex64, k <= 12 | {observed.max():.1e} | {estimate.max():.1e} "
        f"| {ratio:.0f} |"
    )
    add("seed, complex64", observed, estimate, ratio, order=12)
    emit(rows)


if __name__ == "__main__":
    main()
