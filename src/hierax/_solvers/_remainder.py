"""What a step's series of the generator leaves out over the whole step, where the
series at the step's start cannot show it: the part of the error estimate that
keeps a step from passing over a `Gaussian` pulse it does not see.

The step's own estimate reads the state's last terms, made from the time
functions' series at the step's start. Far in a Gaussian's tail those series are
vanishingly small, and so is the estimate, whatever lies ahead: a pi pulse at 25
widths from the start of a free evolution was passed over in one step. Each
function that may hide its peak (`hides_its_peak`) is bounded over the step
instead (`remainder_bound`), and the generator's part
$\\sup_s \\|H(s) - H_K(s)\\| \\le \\sum_a R_a \\|M_a\\|$ over the step $h$ moves the
state by at most $h \\sum_a R_a \\|M_a\\|\\, |y|$ (the propagator of a Hermitian
generator, or the Lindblad semigroup, does not grow). The solver counts that as
an error (`TaylorSolver`); the controller then shortens the step until the pulse
is inside the series' reach. Where the series already shows the pulse, the bound
is below the state's own estimate and costs nothing.
"""

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array

from .._data import real_dtype
from .._operators import operator_bound
from .._time import AbstractTimeFunction, Constant, hides_its_peak, remainder_bound


def _is_function(x: Any) -> bool:
    return isinstance(x, AbstractTimeFunction)


def may_hide_a_peak(operator: Any) -> bool:
    """Whether any time function of `operator` may hide its peak (known from its
    structure)."""
    leaves = jax.tree.leaves(operator, is_leaf=_is_function)
    return any(_is_function(x) and hides_its_peak(x) for x in leaves)


def remainder_operator(operator: Any, t: Array, step: Array, order: int) -> Any:
    """`operator` with each of its time functions replaced by a constant: the bound
    of its series' remainder over the step where it may hide its peak, else 0.
    `None` where none may (nothing to bound: no cost in the program)."""
    if not may_hide_a_peak(operator):
        return None
    rdtype = real_dtype(jnp.result_type(t, step, 1.0))

    def swap(x: Any) -> Any:
        if not _is_function(x):
            return x
        bound = remainder_bound(x, t, step, order) if hides_its_peak(x) else None
        return Constant(jnp.zeros((), rdtype) if bound is None else bound)

    return jax.tree.map(swap, operator, is_leaf=_is_function)


def remainder_size(operator: Any, t: Array, step: Array, order: int, norms: Any):
    """$\\sum_a R_a \\|M_a\\|$ (infinity norms; `norms`: the operator's `term_norms`,
    or `None`), or `None` where no function may hide its peak."""
    swapped = remainder_operator(operator, t, step, order)
    if swapped is None:
        return None
    return operator_bound(swapped, t, norms)
