"""`hierax.sesolve`: the Schrodinger equation, solved with the Taylor method on
diffrax."""

from collections.abc import Callable
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ScalarLike

from .._core import (
    SESOLVE_TERMS,
    check_finite,
    on_backend,
    to_jax,
    typechecked,
)
from .._data import AbstractSparseMatrix
from .._operators import (
    AbstractTimeOperator,
    as_matrices,
    as_state,
    to_operator,
    uniform_products,
)
from ._integrate import (
    check_no_foreign_keywords,
    keywords_checked,
    per_precision,
    read_state,
    resolve_options,
    solve,
)
from ._options import TaylorOptions
from ._solution import Solution
from ._term import SchrodingerTerm, known_embedded_parts, with_parts


_API = "hierax.sesolve"


@on_backend(_API)
@keywords_checked(_API)
@typechecked
def sesolve(
    hamiltonian: Any,
    state: Any,
    times: Any,
    *,
    options: Any = None,
    # (`Any`: `check_exp_ops` says what a wrong one is, a single QuTiP operator
    # included, where the annotation's report read "an array or a number".)
    exp_ops: Any = None,
    progress: bool = False,
    dense: bool = False,
    rtol: ScalarLike | None = None,
    atol: ScalarLike | None = None,
    order: int | np.integer | None = None,
    dt: ScalarLike | None = None,
    max_steps: int | np.integer | None = None,
    adjoint: diffrax.AbstractAdjoint | None = None,
    throw: bool | None = None,
    **unknown: Any,
) -> Solution:
    """Solve the Schrödinger equation $\\dot\\psi = -i H(t)\\,\\psi$ with the Taylor
    method: each step sums the exact series of the state to order $K$, and the step
    size comes from the size of the series' tail, estimated from its last terms.

    Built on `diffrax.diffeqsolve` with [`hierax.TaylorSolver`][] and
    [`hierax.SchrodingerTerm`][], so it composes with `jax.jit`, `jax.grad`
    (through the steps: reverse mode by default, forward mode with
    `adjoint=diffrax.ForwardMode()`) and `jax.vmap`. Changing `times`, the state
    or the values of the Hamiltonian's parameters never recompiles.

    **Arguments:**

    - `hamiltonian`: $H(t)$, an `(n, n)` matrix, a callable `t -> (n, n)`, or an
        operator such as `hierax.Cos(w) * sx + sz`.
    - `state`: the initial state: a vector `(n,)`, several vectors as columns
        `(n, m)`, or a propagator `(n, n)` (a square state is a propagator, never
        a density matrix: use `mesolve` for those); QuTiP and dynamiqs kets too.
    - `times`: the times at which to save the state, finite and strictly
        increasing, shape `(T,)` with T >= 2 (an array, a list or a NumPy array);
        the solve runs from `times[0]` to `times[-1]`. (QuTiP's `tlist`, dynamiqs'
        `tsave`.) Values held on the host (lists, NumPy arrays; the state's too)
        are checked before compiling; those of JAX arrays inside the compiled
        solve, which then stops with an error naming them (no transfer back to
        the host).
    - `options`: a [`hierax.TaylorOptions`][], all the settings of the steps in one
        object (tolerances, order, fixed step, the step control's gains,
        `max_steps`, adjoint, throw). The keywords `rtol`, `atol`, `order`, `dt`,
        `max_steps`, `adjoint` and `throw` below are shorthands for its fields, each
        `None` for the default; give either `options` or those, not both.
    - `rtol`, `atol`: (defaults 1e-8 and 1e-10) tolerances on each step's
        truncation error, elementwise
        `atol + rtol * |psi|` as in diffrax and QuTiP. For unitary dynamics the
        final error is typically below `rtol` (see the how-to on tolerances).
    - `order`: the order K of the series; by default 28 in float64 and 16 in
        float32, whatever the tolerance, so that a new `rtol` or `atol` never
        recompiles (the step size follows the tolerance).
    - `dt`: a fixed step: the span is cut into equal steps no longer than `dt`,
        which also stop at the knots of sampled pulses (as adaptive steps do).
        `rtol` and `atol` then set no step; they bound each step's error
        estimate, far above which (1000 times) the step cannot converge, and the
        solve stops with an error that asks for a smaller `dt` (inside a
        `jax.jit` too).
    - `exp_ops`: observables whose expectation values to return, a sequence of
        `(n, n)` matrices or an `(E, n, n)` array. Not for a propagator. (QuTiP's
        `e_ops`; QuTiP's and dynamiqs' other names are refused with the hierax
        spelling, see "Coming from QuTiP".)
    - `progress`: print diffrax's text progress meter while solving.
    - `dense`: keep every step's series, for [`hierax.Solution.evaluate`][]. This
        stores `max_steps * (K + 1)` copies of the state: lower `max_steps` for big
        states.
    - `max_steps`: the most steps the solve may take (default 100,000); it fails
        past that.
    - `adjoint`: how to differentiate, `diffrax.RecursiveCheckpointAdjoint()` (the
        default), `diffrax.DirectAdjoint()` or `diffrax.ForwardMode()`.
    - `throw`: `False` returns a failed check (of the values, `max_steps`, a
        fixed step too long) in the solution's `failure` instead of raising it,
        the states nan there; the compiled program then holds no host callback
        (about 2 ms a call inside a `jax.jit` on a TPU). Default `True`.

    **Returns:**

    A [`hierax.Solution`][]: `times`, `states` of shape `(T, *state.shape)`,
    `final_state` (the last of them), `expects` of shape `(E, T)` (or
    `(E, T, m)` for m states), `stats`.

    **Under `jax.vmap`:** a batch of vector states whose Hamiltonians share their
    matrices and time-dependent functions (they may differ in constant
    coefficients: detunings, couplings, offsets, and in the amplitudes of `Cos`,
    `Sin`, `Exp` and `Gaussian` drives), with shared times, tolerances and
    observables, is stepped in lockstep: one step size for the whole batch
    (the smallest any element needs) and the elements as the columns of one state.
    Each element then agrees with its solve alone to the tolerance, not to the last
    digit, and `stats` counts the batch's steps. Any other batch, and any
    derivative, goes element by element.

    !!! example

        ```python
        sx = jnp.array([[0, 1], [1, 0]])
        sz = jnp.array([[1, 0], [0, -1]])
        hamiltonian = 0.5 * sz + hierax.Cos(1.0) * sx
        solution = hierax.sesolve(
            hamiltonian, jnp.array([1.0, 0.0]), jnp.linspace(0, 10, 101),
            exp_ops=[sz],
        )
        solution.expects[0]                      # <sigma_z>(t), shape (101,)
        ```
    """
    check_no_foreign_keywords(unknown, _API)
    options = resolve_options(
        options,
        _API,
        rtol=rtol,
        atol=atol,
        order=order,
        dt=dt,
        max_steps=max_steps,
        adjoint=adjoint,
        throw=throw,
    )
    return schrodinger_solve(
        hamiltonian,
        state,
        times,
        options=options,
        api=_API,
        exp_ops=exp_ops,
        progress=progress,
        dense=dense,
    )


def schrodinger_solve(
    hamiltonian: Any,
    state: Any,
    times: Any,
    *,
    options: TaylorOptions,
    api: str,
    exp_ops: Any = None,
    progress: bool = False,
    dense: bool = False,
    max_steps_advice: str | None = None,
) -> Solution:
    """`sesolve` with resolved `options`, its errors naming `api`: a call built on
    it (`floquet`) names itself, and says what to change in its own settings where
    the steps run out (`max_steps_advice`, see `solve`)."""
    term, with_known_parts = _term(hamiltonian)
    n = term.size
    state, checked = read_state(as_state(state, "state", api), "state", api)
    _check_state(state, n, api)
    exp_ops, exp_checked = check_exp_ops(
        as_matrices(exp_ops, "exp_ops", api), state, n, api
    )
    return solve(
        with_known_parts,
        state,
        times,
        options=options,
        exp_ops=exp_ops,
        progress=progress,
        dense=dense,
        api=api,
        expectation=_ket_expectations,
        state_name="state",
        state_checked=checked,
        exp_ops_checked=exp_checked,
        max_steps_advice=max_steps_advice,
    )


def _term(
    hamiltonian: Any,
) -> tuple[SchrodingerTerm, Callable[[Any], SchrodingerTerm]]:
    """The term, and the term with its step's parts assembled before compiling,
    per precision (the same object for the same dtype), kept for the operator
    (`SESOLVE_TERMS`)."""

    def build(kept: tuple[Any, ...]) -> tuple[SchrodingerTerm, Any]:
        term = SchrodingerTerm(to_operator(kept[0], "hamiltonian", _API))
        # Sparse matrices with all entries equal, read as one value by the products.
        term = eqx.tree_at(
            lambda t: t.hamiltonian, term, uniform_products(term.hamiltonian)
        )
        return term, per_precision(
            lambda d: with_parts(term, known_embedded_parts(term.hamiltonian, d))
        )

    return SESOLVE_TERMS.get((hamiltonian,), build)


def _ket_expectations(exp_ops: Array, states: Array) -> Array:
    """<psi|E|psi> for each observable and saved state (or column of states)."""
    return jnp.einsum(
        "tn...,enm,tm...->et...", states.conj(), exp_ops.astype(states.dtype), states
    )


def _check_state(state: Array, n: int, api: str) -> None:
    if state.ndim not in (1, 2):
        raise ValueError(
            f"`{api}`: `state` must be a numeric array of shape ({n},), ({n}, m) or "
            f"({n}, {n}), got {state.dtype} of shape {tuple(state.shape)}."
        )
    if state.shape[0] != n:
        raise ValueError(
            f"`{api}`: `state` has shape {tuple(state.shape)} but the `hamiltonian` "
            f"is {n}x{n}; the state's first axis must have size {n}."
        )
    if state.size == 0:
        # (n, 0): no column to solve for (it failed inside the kernels).
        raise ValueError(
            f"`{api}`: `state` must hold at least one column, got shape "
            f"{tuple(state.shape)}."
        )


def check_exp_ops(
    exp_ops: Any, state: Array | None, n: int, api: str
) -> tuple[Array | None, bool]:
    """The observables as an `(E, n, n)` array (`state` None for a density
    matrix), and whether their values were checked here (finite): NumPy ones are,
    JAX arrays inside the compiled solve."""
    if exp_ops is None:
        return None, True
    if state is not None and state.ndim == 2 and state.shape[1] == n:
        raise ValueError(
            f"`{api}`: `exp_ops` needs a state vector `(n,)` or states as columns "
            f"`(n, m)`; a square `state` of shape {tuple(state.shape)} is a "
            "propagator, which has no expectation values."
        )
    if getattr(exp_ops, "ndim", None) == 2:
        # One matrix: iterating would take its rows for observables.
        raise TypeError(
            f"`{api}`: `exp_ops` must be a list of operators (or an (E, n, n) "
            f"array), got one matrix of shape {tuple(exp_ops.shape)}; pass "
            "`[exp_ops]`."
        )
    if not (isinstance(exp_ops, list | tuple) or getattr(exp_ops, "ndim", None) == 3):
        raise TypeError(
            f"`{api}`: `exp_ops` must be a list of ({n}, {n}) operators (or an "
            f"(E, {n}, {n}) array), got {type(exp_ops).__name__}"
            + (
                f" of shape {tuple(exp_ops.shape)}."
                if hasattr(exp_ops, "shape")
                else "."
            )
        )
    checked = []
    for i, op in enumerate(exp_ops):
        given = type(op).__name__
        if isinstance(op, AbstractTimeOperator):
            # (NumPy read one as a 0-d object array: "has shape ()".)
            if not op.is_constant:
                raise TypeError(
                    f"`{api}`: `exp_ops[{i}]` must be a constant matrix, got a "
                    f"time-dependent {type(op).__name__} (time-dependent "
                    "observables are not supported)."
                )
            op = op(0.0)
        if isinstance(op, AbstractSparseMatrix):
            op = op.todense()
        op = op if isinstance(op, jax.Array) else np.asarray(op)
        if not (np.issubdtype(op.dtype, np.number) or op.dtype == bool):
            raise TypeError(
                f"`{api}`: `exp_ops[{i}]` must be a numeric ({n}, {n}) matrix, got "
                f"{given}."
            )
        if op.shape != (n, n):
            raise ValueError(
                f"`{api}`: `exp_ops[{i}]` has shape {tuple(op.shape)} but the "
                f"`hamiltonian` is {n}x{n}; each observable must be ({n}, {n})."
            )
        check_finite(op, f"exp_ops[{i}]", api, in_program=True)  # JAX ones: inside
        checked.append(op)
    if not checked:
        return None, True
    if any(isinstance(op, jax.Array) for op in checked):
        return jnp.stack(checked), False
    # NumPy observables (and lists) stacked in NumPy and placed once per value (an
    # eager `jnp.stack` compiles a program per shape and costs a dispatch a call).
    return to_jax(np.stack(checked)), True
