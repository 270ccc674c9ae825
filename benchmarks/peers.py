"""The peers' code the benchmarks share: the hand-written diffrax Dopri8 on the real
and imaginary parts, and dynamiqs' solvers, built from a [`systems.System`][].

Nothing here configures JAX: each script sets 64-bit mode itself (the CPU-only
scripts turn it on at import, `bench_devices.py` from its `--precision`), and the
dtypes follow it.
"""

from typing import Any

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse
from jax.experimental import sparse as jsparse
from systems import System


def import_dynamiqs() -> dict:
    """Import dynamiqs, which sets JAX's default matmul precision for the whole
    process: that setting before and after, printed and returned (for the
    record)."""
    flag = "jax_default_matmul_precision"
    precision = {"before_dynamiqs": str(jax.config.values.get(flag))}
    import dynamiqs  # noqa: F401

    precision["after_dynamiqs"] = str(jax.config.values.get(flag))
    print(f"default matmul precision: {precision}")
    return precision


def real_embedding(g: np.ndarray) -> np.ndarray:
    """A complex matrix acting on v as one real matrix acting on (Re v, Im v)."""
    return np.block([[np.real(g), -np.imag(g)], [np.imag(g), np.real(g)]])


def _sparse_embedding(g: np.ndarray) -> jsparse.BCOO:
    """`real_embedding(g)` as a JAX sparse matrix, built without the dense one."""
    re, im = scipy.sparse.csr_matrix(np.real(g)), scipy.sparse.csr_matrix(np.imag(g))
    block = scipy.sparse.bmat([[re, -im], [im, re]], format="coo")
    return jsparse.BCOO.from_scipy_sparse(block)


def generators(system: System) -> tuple[np.ndarray, np.ndarray]:
    """G_0 and G_k of dv/dt = (G_0 + sum_k c_k(t) G_k) v: -iH for a ket, the
    Lindbladian on the row-major vec(rho) for the open system."""
    if not system.is_open:
        return -1j * system.constant, -1j * system.matrices()
    eye = np.eye(system.size)

    def commutator(h):
        return -1j * (np.kron(h, eye) - np.kron(eye, h.T))

    dissipator = sum(
        np.kron(j, j.conj())
        - 0.5 * np.kron(j.conj().T @ j, eye)
        - 0.5 * np.kron(eye, (j.conj().T @ j).T)
        for j in system.jumps
    )
    return commutator(system.constant) + dissipator, np.stack(
        [commutator(m) for m in system.matrices()]
    )


def diffrax_final(
    system: System, solver=None, sparse: bool = False, throw: bool = True
):
    """`final(start, rtol, atol, scale=1.0)`: the state at the end of the span from
    a complex `start` (a ket, or the open system's density matrix), solved with
    diffrax on the real and imaginary parts (Dopri8 by default,
    `PIDController(rtol, atol)`), every drive times `scale`. With `sparse` the real
    generators are JAX sparse matrices (the references of large chains: the dense
    ones of a 12-site chain are 0.5 GB each in float64). `throw`: diffrax's
    (`False`: no host callback in the program)."""
    solver = diffrax.Dopri8() if solver is None else solver
    g0, gk = generators(system)
    if sparse:
        s0 = _sparse_embedding(g0)
        sk = [_sparse_embedding(g) for g in gk]

        def vector_field(t, y, scale):
            c = scale * system.coefficients(t, jnp)
            return s0 @ y + sum(c[k] * (s @ y) for k, s in enumerate(sk))

    else:
        d0 = jnp.asarray(real_embedding(g0))
        dk = jnp.asarray(np.stack([real_embedding(g) for g in gk]))

        # One product per term, then the coefficients: forming G(t) first and then
        # one product was up to 5x slower (open pair: 42 against 8.5 ms at 1e-3).
        def vector_field(t, y, scale):
            return d0 @ y + scale * system.coefficients(t, jnp) @ (dk @ y)

    term = diffrax.ODETerm(vector_field)

    def final(start, rtol, atol, scale=1.0):
        half = start.size
        y0 = jnp.concatenate([jnp.real(start).ravel(), jnp.imag(start).ravel()])
        y = diffrax.diffeqsolve(
            term,
            solver,
            0.0,
            system.span,
            None,
            y0,
            args=scale,
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            max_steps=10**7,
            throw=throw,
        ).ys[-1]  # pyright: ignore[reportOptionalSubscript]
        return (y[:half] + 1j * y[half:]).reshape(start.shape)

    return final


def dynamiqs_final(system: System, method: str = "dopri8", precision: str = "double"):
    """`final(start, rtol, atol)`: dynamiqs' `sesolve` (or `mesolve` for the open
    system) with `method` ("dopri8" or "tsit5") at `precision` ("single" or
    "double", dynamiqs' `set_precision`), its drives as `dq.modulated` JAX
    functions. A ket `start` may carry leading batch dimensions (dynamiqs batches
    states itself)."""
    import dynamiqs as dq
    import dynamiqs.method as dq_method

    dq.set_precision(precision)  # pyright: ignore[reportArgumentType]
    hamiltonian = dq.constant(jnp.asarray(system.constant))
    for c, m in system.drives:
        hamiltonian = hamiltonian + dq.modulated(
            lambda t, c=c: c(t, jnp), jnp.asarray(m)
        )
    solver = {"dopri8": dq_method.Dopri8, "tsit5": dq_method.Tsit5}[method]
    tsave = jnp.asarray(system.times)
    jumps: list[Any] = [jnp.asarray(j) for j in system.jumps]

    def final(start, rtol, atol):
        options = solver(rtol=rtol, atol=atol, max_steps=10**7)
        if system.is_open:
            out = dq.mesolve(
                hamiltonian, jumps, start, tsave, method=options, progress_meter=False
            )
            return jnp.asarray(out.final_state.to_jax())
        out = dq.sesolve(
            hamiltonian, start[..., None], tsave, method=options, progress_meter=False
        )
        return jnp.asarray(out.final_state.to_jax())[..., 0]

    return final
