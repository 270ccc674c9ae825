"""Which recursion a hierarchy's operators ask for: Pauli sums their own (a
`PauliHierarchy`), anything else the matrix kernels (None). The one place where the
kind of a hierarchy's operators is read; the hierarchies hold the answer as their
engine."""

import functools
from typing import Any

from ._hierarchy import PauliHierarchy
from ._sum import PauliSum, PauliTimeSum, check_chain


def _refuse_mixed(api: str, pauli: str, name: str, value: Any) -> TypeError:
    return TypeError(
        f"`{api}`: `{pauli}` is a Pauli sum, so `{name}` must be one too "
        f"(a `hierax.PauliSum`), got {type(value).__name__}; for matrices "
        "give both as matrices (`PauliSum.todense()`)."
    )


@functools.singledispatch
def pauli_recursion(
    hamiltonian: Any,
    observable: Any,
    order: int,
    capacity: int | None,
    api: str,
    names: tuple[str, str],
) -> PauliHierarchy | None:
    """The recursion the structure of `hamiltonian` (or `-i` times a generator)
    asks for beside `observable`, when it is not a matrix: Pauli sums (registered
    below) run their own, a `PauliHierarchy`. Anything else answers None, and the
    hierarchy converts it to a matrix operator and runs the matrix kernels; a Pauli
    `observable` beside it, or a `capacity`, is refused here."""
    del order
    if isinstance(observable, (PauliSum, PauliTimeSum)):
        raise _refuse_mixed(api, names[1], names[0], hamiltonian)
    if capacity is not None:
        raise TypeError(
            f"`{api}`: `capacity` is the room for strings of Pauli sums; "
            "matrices take none (leave it out)."
        )
    return None


@pauli_recursion.register(PauliSum)
@pauli_recursion.register(PauliTimeSum)
def _(hamiltonian, observable, order, capacity, api, names):
    if not isinstance(observable, (PauliSum, PauliTimeSum)):
        raise _refuse_mixed(api, names[0], names[1], observable)
    if isinstance(observable, PauliTimeSum):
        raise TypeError(
            f"`{api}`: `{names[1]}` must be a constant `hierax.PauliSum`, got a "
            "time-dependent `hierax.PauliTimeSum`."
        )
    check_chain(hamiltonian, observable, api, names)
    return PauliHierarchy(hamiltonian, observable, order, capacity)


@functools.singledispatch
def commutator_recursion(
    generator: Any, operator: Any, order: int, capacity: int | None, api: str
) -> PauliHierarchy | None:
    """`pauli_recursion` for nested commutators $[G, \\cdot]$: with $H = -iG$ for a
    Pauli generator, which must be constant."""
    return pauli_recursion(
        generator, operator, order, capacity, api, ("generator", "operator")
    )


@commutator_recursion.register
def _(generator: PauliSum, operator, order, capacity, api):
    # i [H, X] = [G, X] with H = -i G.
    return pauli_recursion(
        generator * -1j, operator, order, capacity, api, ("generator", "operator")
    )


@commutator_recursion.register
def _(generator: PauliTimeSum, operator, order, capacity, api):
    del operator, order, capacity
    raise TypeError(
        f"`{api}`: `generator` must be constant (a `hierax.PauliSum`), got a "
        "time-dependent `hierax.PauliTimeSum`; its hierarchy is "
        "`hierax.HeisenbergHierarchy`."
    )
