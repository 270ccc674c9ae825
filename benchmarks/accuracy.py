"""Relative error per level of `hierax.HeisenbergHierarchy` against the SymPy oracle
of the test suite, on its three systems, in complex128 and complex64.

    python benchmarks/accuracy.py [--order 12]
"""

import argparse

import jax


jax.config.update("jax_enable_x64", True)

from device import require_cpu  # noqa: E402


require_cpu("accuracy.py")

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from oracle import SYSTEMS, mp_relative_errors, sympy_levels  # noqa: E402
from rows import emit, row  # noqa: E402

import hierax  # noqa: E402


def _single(tree):
    def cast(a):
        if not eqx.is_array(a):
            return a
        return a.astype(jnp.complex64 if jnp.iscomplexobj(a) else jnp.float32)

    return jax.tree_util.tree_map(cast, tree)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--order", type=int, default=12)
    order = parser.parse_args().order
    print(f"relative error (Frobenius) per level k = 0..{order} against SymPy/mpmath")
    rows = []
    for make in SYSTEMS:
        system = make()
        t0 = float(system["t0"])
        reference = sympy_levels(
            system["h_terms"], system["x_terms"], system["t0"], order
        )
        h = hierax.HeisenbergHierarchy(
            system["hamiltonian"], system["observable"], order
        )
        h32 = hierax.HeisenbergHierarchy(
            _single(system["hamiltonian"]), _single(system["observable"]), order
        )
        e64 = mp_relative_errors(h(t0), reference)
        e32 = mp_relative_errors(h32(jnp.float32(t0)), reference)
        print(f"\n{system['name']} (t = {system['t0']})")
        print("  k  complex128  complex64")
        for k in range(order + 1):
            print(f"{k:3d}  {e64[k]:10.1e}  {e32[k]:9.1e}")
            for dtype, errors in (("complex128", e64), ("complex64", e32)):
                rows.append(row(system["name"], dtype, "error", errors[k], level=k))
    emit(rows)


if __name__ == "__main__":
    main()
