"""`hierax.mesolve`: the Lindblad master equation, solved with the Taylor method on
diffrax (the solve of `hierax.sesolve`, with a `LindbladTerm`)."""

from collections.abc import Callable
from typing import Any

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ScalarLike

from .._core import (
    MESOLVE_STACKED_TERMS,
    MESOLVE_TERMS,
    on_backend,
    typechecked,
)
from .._operators import (
    as_matrices,
    as_state,
    check_jump_operators,
    jump_list,
    to_operator,
)
from ._density import known_density_parts
from ._integrate import (
    check_no_foreign_keywords,
    keywords_checked,
    per_precision,
    read_state,
    resolve_options,
    solve,
)
from ._sesolve import check_exp_ops
from ._solution import Solution
from ._term import LindbladTerm, with_parts


_API = "hierax.mesolve"


@on_backend(_API)
@keywords_checked(_API)
@typechecked
def mesolve(
    hamiltonian: Any,
    jump_operators: Any,
    rho: Any,
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
    """Solve the Lindblad master equation

    $$\\dot\\rho = -i[H(t), \\rho] + \\sum_j \\Big(L_j(t) \\rho L_j(t)^\\dagger
      - \\tfrac12 \\{L_j(t)^\\dagger L_j(t), \\rho\\}\\Big)$$

    with the Taylor method of [`hierax.sesolve`][]: each step sums the exact series
    of $\\rho$ to order $K$ (as [`hierax.DensityMatrixDerivatives`][] computes it,
    in the step's own time scale), and the step size comes from the size of the
    series' tail, estimated from its last terms.

    Built on `diffrax.diffeqsolve` with [`hierax.TaylorSolver`][] and
    [`hierax.LindbladTerm`][], so it composes with `jax.jit`, `jax.grad` (through
    the steps), and `jax.vmap`. Changing `times`, `rho` or the values of the
    operators' parameters (a decay rate, a drive amplitude) never recompiles.

    **Arguments:**

    - `hamiltonian`: $H(t)$, an `(n, n)` matrix, a callable `t -> (n, n)`, or an
        operator such as `hierax.Cos(w) * sx + sz`.
    - `jump_operators`: a list (or tuple) of the $L_j(t)$, in the same forms, rates
        included in the operators (`jnp.sqrt(gamma) * sm`,
        `hierax.Polynomial(c) * sm`); `[]` for a closed system. One operator
        given alone (an `(n, n)` matrix, an operator) is one jump operator, and
        an `(J, n, n)` array is J of them.
    - `rho`: the initial density matrix, shape `(n, n)` (any matrix works: the
        equation is linear), or a QuTiP or dynamiqs density matrix or ket (a ket
        $|\\psi\\rangle$ is read as $|\\psi\\rangle\\langle\\psi|$).
    - `times`: the times at which to save $\\rho$, finite and strictly increasing,
        shape `(T,)` with T >= 2 (an array, a list or a NumPy array; checked as
        in [`hierax.sesolve`][]); the solve runs from
        `times[0]` to `times[-1]`. The order of the arguments is dynamiqs':
        QuTiP's `mesolve(H, rho0, tlist, c_ops)` is refused with a message.
    - `options`: a [`hierax.TaylorOptions`][], all the settings of the steps in one
        object (tolerances, order, fixed step, the step control's gains,
        `max_steps`, adjoint, throw). The keywords `rtol`, `atol`, `order`, `dt`,
        `max_steps`, `adjoint` and `throw` below are shorthands for its fields, each
        `None` for the default; give either `options` or those, not both.
    - `rtol`, `atol`: (defaults 1e-8 and 1e-10) tolerances on each step's
        truncation error, elementwise
        `atol + rtol * |rho|`.
    - `order`: the order K of the series; by default 28 in float64 and 16 in
        float32, whatever the tolerance, so that a new `rtol` or `atol` never
        recompiles (the step size follows the tolerance).
    - `dt`: a fixed step: the span is cut into equal steps no longer than `dt`,
        which also stop at the knots of sampled pulses (as adaptive steps do).
        `rtol` and `atol` then set no step; they bound each step's error
        estimate, far above which (1000 times) the step cannot converge, and the
        solve stops with an error that asks for a smaller `dt` (inside a
        `jax.jit` too).
    - `exp_ops`: observables whose expectation values $\\mathrm{tr}(E\\rho)$ to
        return, a sequence of `(n, n)` matrices or an `(E, n, n)` array.
    - `progress`: print diffrax's text progress meter while solving.
    - `dense`: keep every step's series, for [`hierax.Solution.evaluate`][].
    - `max_steps`: the most steps the solve may take (default 100,000); it fails
        past that.
    - `adjoint`: how to differentiate, `diffrax.RecursiveCheckpointAdjoint()` (the
        default), `diffrax.DirectAdjoint()` or `diffrax.ForwardMode()`.
    - `throw`: `False` returns a failed check (of the values, `max_steps`, a
        fixed step too long) in the solution's `failure` instead of raising it,
        the states nan there; the compiled program then holds no host callback
        (about 2 ms a call inside a `jax.jit` on a TPU). Default `True`.

    **Returns:**

    A [`hierax.Solution`][]: `times`, `states` of shape `(T, n, n)`, `final_state`
    (the last of them), `expects` of shape `(E, T)`, `stats`.

    !!! example

        ```python
        sz = jnp.array([[1.0, 0], [0, -1]])
        sm = jnp.array([[0.0, 1], [0, 0]])
        rho = jnp.array([[0.0, 0], [0, 1]])     # the excited state
        solution = hierax.mesolve(
            0.5 * sz, [jnp.sqrt(0.1) * sm], rho, jnp.linspace(0, 10, 101),
            exp_ops=[sz],
        )
        solution.expects[0]                      # <sigma_z>(t), shape (101,)
        ```
    """
    check_no_foreign_keywords(unknown, _API)
    if _qutip_order(jump_operators, rho, times):
        raise TypeError(
            f"`{_API}`: the arguments look like QuTiP's order `mesolve(H, rho0, tlist, "
            "c_ops)`; hierax's is `hierax.mesolve(H, jump_operators, rho0, times)` "
            "(dynamiqs' order), with the jump operators as a list."
        )
    term, with_known_parts = _term(hamiltonian, jump_operators)
    n = term.size
    rho, checked = read_state(as_state(rho, "rho", _API, density=True), "rho", _API)
    _check_rho(rho, n)
    exp_ops, exp_checked = check_exp_ops(
        as_matrices(exp_ops, "exp_ops", _API), None, n, _API
    )
    return solve(
        with_known_parts,
        rho,
        times,
        options=resolve_options(
            options,
            _API,
            rtol=rtol,
            atol=atol,
            order=order,
            dt=dt,
            max_steps=max_steps,
            adjoint=adjoint,
            throw=throw,
        ),
        exp_ops=exp_ops,
        progress=progress,
        dense=dense,
        api=_API,
        expectation=_density_expectations,
        state_name="rho",
        state_checked=checked,
        exp_ops_checked=exp_checked,
    )


def _term(
    hamiltonian: Any, jump_operators: Any
) -> tuple[LindbladTerm, Callable[[Any], LindbladTerm]]:
    """The term, and the term with its step's parts per precision, kept for the
    operators (`MESOLVE_TERMS`; a `(J, n, n)` stack of jump operators in
    `MESOLVE_STACKED_TERMS`), built from what the cache keeps and keyed by all of
    it: the Hamiltonian and every jump operator."""
    if jump_operators is None:
        raise TypeError(
            f"`{_API}`: `jump_operators` must be a list of operators (e.g. "
            "`[jnp.sqrt(gamma) * sigma_minus]`), or `[]` for a closed system, got "
            "None."
        )
    stacked = not isinstance(jump_operators, list | tuple) and (
        getattr(jump_operators, "ndim", None) == 3
    )

    def build(kept: tuple[Any, ...]) -> tuple[LindbladTerm, Any]:
        hamiltonian = to_operator(kept[0], "hamiltonian", _API)
        jumps = list(kept[1]) if stacked else list(kept[1:])
        jumps = check_jump_operators(jumps, hamiltonian.size, _API)
        term = LindbladTerm(hamiltonian, jumps)
        operators = (term.hamiltonian, term.jump_operators)
        return term, per_precision(
            lambda d: with_parts(term, known_density_parts(*operators, d))
        )

    if stacked:
        return MESOLVE_STACKED_TERMS.get((hamiltonian, jump_operators), build)
    return MESOLVE_TERMS.get((hamiltonian, *jump_list(jump_operators, _API)), build)


def _qutip_order(jump_operators: Any, rho: Any, times: Any) -> bool:
    """Whether `mesolve(H, rho0, tlist, c_ops)` was passed in QuTiP's order: the
    last argument a list of operators (or empty), never of times, and the jump
    operators not a list."""
    if isinstance(jump_operators, list | tuple) or not isinstance(times, list | tuple):
        return False
    return not times or any(
        jnp.ndim(t) != 0 if isinstance(t, jax.Array | np.ndarray) else _operator(t)
        for t in times
    )


def _operator(x: Any) -> bool:
    return not isinstance(x, int | float | np.number)


def _density_expectations(exp_ops: Array, states: Array) -> Array:
    """tr(E rho) for each observable and saved state."""
    return jnp.einsum("enm,tmn->et", exp_ops.astype(states.dtype), states)


def _check_rho(rho: Array, n: int) -> None:
    if rho.shape != (n, n):
        raise ValueError(
            f"`{_API}`: `rho` must be a square matrix of shape ({n}, {n}) to match the "
            f"{n}x{n} `hamiltonian`, got shape {tuple(rho.shape)}."
        )
