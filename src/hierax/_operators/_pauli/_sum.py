"""Sums of Pauli strings with a fixed capacity (operators on 30-128 qubits), and
time-dependent sums of them (`f * sum`)."""

import numbers
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NoReturn

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Inexact, Int, Real, ScalarLike, UInt32

from ..._core import (
    check_bool,
    complex_dtype,
    float_dtype,
    int_as_float,
    is_int,
    is_traced,
    module_jit,
    on_backend,
    to_jax,
)
from ..._time import AbstractTimeFunction, Constant, as_time_function
from ._compress import compress, lookup
from ._strings import i_power, parse, product_phase, site_masks, to_strings, words


# The largest chain `todense`/`to_sparse` build (a 2^14 x 2^14 complex matrix is
# 4 GiB dense).
_DENSE_QUBITS = 14


# What the matrix-based calls say when given a Pauli sum.
_NOT_A_MATRIX = (
    "Pauli sums have hierarchies of their own, `hierax.HeisenbergHierarchy` and "
    "`hierax.NestedCommutators` (levels as Pauli sums), `hierax.lanczos` and "
    "`hierax.moments`; for a matrix (N <= 14) pass `.todense()` or `.to_sparse()`."
)


def _qubit_count(n_qubits: Any) -> int:
    """`PauliSum`'s `n_qubits` checked as it is set: before equinox sees a bad
    value in a static field (and warns about it ahead of the error)."""
    return check_int(n_qubits, "hierax.PauliSum", "n_qubits")


# The most pairs of slots one product forms: its merge indexes them in int32.
_MAX_PAIRS = 2**31 - 1


class PauliSum(eqx.Module):
    """A sum of Pauli strings on `n_qubits` qubits, $\\sum_j c_j P_j$, with room for
    `capacity` strings: the operators of chains far beyond any matrix (30-128
    sites), as used for operator growth and Lanczos coefficients
    ([`hierax.lanczos`][]).

    Each string is two bit masks (X and Z parts) in 32-bit words, so every
    operation (`+`, `-`, multiplication by numbers, products `@` and
    [`commutator`][hierax.PauliSum.commutator], [`truncate`][hierax.PauliSum.truncate],
    inner products) has fixed shapes: it compiles once per capacity and runs
    unchanged on a GPU. The first `count` slots hold distinct strings with nonzero
    coefficients, in a sorted order; the rest are padding. An operation whose
    result has more strings than its capacity keeps the largest coefficients and
    reports the weight it removed, $\\sum |c|^2$ over the removed strings (the
    squared norm $\\mathrm{Tr}(A^\\dagger A)/2^N$ of what is missing), in
    `dropped`; nothing is removed silently.

    `dropped` is carried through arithmetic as a bound on what is missing: with
    $\\|R\\|$ the normalised Frobenius norm of what is missing (so `dropped`
    $= \\|R\\|^2$), a result's $\\|R\\|$ is at most $|s|\\,\\|R_A\\|$ for $sA$
    (and $-A$, $A^\\dagger$ keep it), $\\|R_A\\| + \\|R_B\\|$ for $A \\pm B$,
    $\\|R_A\\|\\,|B|_1 + |A|_1\\,\\|R_B\\| + 2^{N/2}\\|R_A\\|\\,\\|R_B\\|$ for $AB$
    ($|A|_1 = \\sum_j |a_j|$ bounds the operator norm) and twice that for $[A, B]$,
    each plus what the operation's own truncation removes. It is exact for one
    truncation (as for `2 * A` and `A + A`: four times `A`'s), an upper bound after
    several, and zero only when nothing was removed on the way.

    Build one from strings ([`from_strings`][hierax.PauliSum.from_strings], site 0
    first: `"XZI"` is $X \\otimes Z \\otimes I$), from site operators
    ([`from_terms`][hierax.PauliSum.from_terms]) or as a chain Hamiltonian
    ([`ising_chain`][hierax.PauliSum.ising_chain],
    [`xxz_chain`][hierax.PauliSum.xxz_chain]).
    """

    x: UInt32[Array, "capacity words"]
    z: UInt32[Array, "capacity words"]
    coefficients: Inexact[Array, " capacity"]
    count: Int[Array, ""]
    dropped: Real[Array, ""]
    n_qubits: int = eqx.field(static=True, converter=_qubit_count)

    __array_ufunc__ = None
    not_a_matrix: ClassVar[str] = _NOT_A_MATRIX

    def __check_init__(self):
        for name in ("x", "z"):
            if getattr(self, name).dtype != jnp.uint32:
                raise TypeError(
                    f"`hierax.PauliSum`: `{name}` must be uint32 words, got "
                    f"{getattr(self, name).dtype}."
                )
        w = words(self.n_qubits)
        if self.x.shape != self.z.shape or self.x.ndim != 2 or self.x.shape[1] != w:
            raise ValueError(
                "`hierax.PauliSum`: `x` and `z` must both have shape (capacity, "
                f"{w}) for {self.n_qubits} qubits, got {tuple(self.x.shape)} and "
                f"{tuple(self.z.shape)}."
            )
        if self.coefficients.shape != self.x.shape[:1]:
            raise ValueError(
                "`hierax.PauliSum`: `coefficients` must have shape (capacity,) = "
                f"{self.x.shape[:1]}, got {tuple(self.coefficients.shape)}."
            )

    # --- construction ---------------------------------------------------------

    @classmethod
    def from_strings(
        cls,
        strings: str | Sequence[str] | Mapping[str, Any],
        coefficients: ArrayLike | Sequence[Any] | None = None,
        *,
        capacity: int | None = None,
    ) -> "PauliSum":
        """The sum $\\sum_j c_j P_j$ of the strings (`"XZIY..."`, site 0 first; a
        mapping from strings to coefficients also works); equal strings are merged.

        - `coefficients`: one per string (default: all 1), finite numbers.
        - `capacity`: the number of slots (default: the number of strings).
        """
        api = "hierax.PauliSum.from_strings"
        if isinstance(strings, Mapping):
            if coefficients is not None:
                raise ValueError(
                    "`hierax.PauliSum.from_strings`: give the coefficients either "
                    "in the mapping or as `coefficients`, not both."
                )
            strings, coefficients = list(strings), list(strings.values())
        items: list[Any]
        try:
            items = [strings] if isinstance(strings, str) else list(strings)
        except TypeError:
            items = [None]
        if not all(isinstance(item, str) for item in items):
            raise TypeError(
                f'`{api}`: `strings` must be a Pauli string ("XZIY..."), a sequence '
                f"of them or a mapping from them to coefficients, got {strings!r}."
            )
        x, z, n_qubits = parse(items, api)
        return cls._build(x, z, n_qubits, coefficients, capacity, "from_strings")

    @classmethod
    def from_terms(
        cls,
        terms: Sequence[tuple[Any, Sequence[tuple[str, int]]]],
        n_qubits: int,
        *,
        capacity: int | None = None,
    ) -> "PauliSum":
        """The sum of `terms`, each `(coefficient, [(op, site), ...])` with `op` one
        of `"I"`, `"X"`, `"Y"`, `"Z"`: `(0.5, [("Z", 0), ("Z", 1)])` is
        $\\tfrac12 Z_0 Z_1$ on a chain of `n_qubits`."""
        return cls._from_terms(terms, n_qubits, capacity, "from_terms")

    @classmethod
    def _from_terms(cls, terms, n_qubits, capacity, name) -> "PauliSum":
        api = f"hierax.PauliSum.{name}"
        n_qubits = check_int(n_qubits, api, "n_qubits")
        if isinstance(terms, (str, Mapping)) or not isinstance(terms, Sequence):
            raise TypeError(
                f"`{api}`: `terms` must be a sequence of `(coefficient, [(op, site), "
                f"...])` pairs, got {type(terms).__name__}."
            )
        if not terms:
            raise ValueError(f"`{api}`: `terms` must hold at least one term, got none.")
        for term in terms:
            if not isinstance(term, (tuple, list)) or len(term) != 2:
                raise TypeError(
                    f"`{api}`: each of `terms` must be a pair `(coefficient, [(op, "
                    f"site), ...])`, got {term!r}."
                )
        masks = [site_masks(ops, n_qubits, api) for _, ops in terms]
        x = np.stack([m[0] for m in masks])
        z = np.stack([m[1] for m in masks])
        coefficients = [coefficient for coefficient, _ in terms]
        return cls._build(x, z, n_qubits, coefficients, capacity, name)

    @classmethod
    def zeros(cls, n_qubits: int, capacity: int, dtype: Any = None) -> "PauliSum":
        """The zero operator with room for `capacity` strings (`dtype`: the
        precision, a floating or complex dtype; default: JAX's default float)."""
        api = "hierax.PauliSum.zeros"
        n_qubits = check_int(n_qubits, api, "n_qubits")
        capacity = check_int(capacity, api, "capacity")
        w = words(n_qubits)
        dtype = _precision(dtype, api)
        return cls(
            x=jnp.zeros((capacity, w), jnp.uint32),
            z=jnp.zeros((capacity, w), jnp.uint32),
            coefficients=jnp.zeros(capacity, dtype),
            count=jnp.zeros((), jnp.int32),
            dropped=jnp.zeros((), jnp.finfo(dtype).dtype),
            n_qubits=int(n_qubits),
        )

    @classmethod
    def ising_chain(
        cls,
        n_qubits: int,
        coupling: ScalarLike = 1.0,
        hx: ScalarLike = 0.0,
        hz: ScalarLike = 0.0,
        *,
        periodic: bool = False,
        capacity: int | None = None,
    ) -> "PauliSum":
        """$J \\sum_j Z_j Z_{j+1} + h_x \\sum_j X_j + h_z \\sum_j Z_j$ (the chaotic
        Ising chain of operator-growth studies: $J = 1$, $h_x = 1.05$,
        $h_z = 0.5$)."""
        return cls._chain(
            n_qubits, 0.0, coupling, hx, hz, periodic, capacity, "ising_chain"
        )

    @classmethod
    def xxz_chain(
        cls,
        n_qubits: int,
        jxy: ScalarLike = 1.0,
        jz: ScalarLike = 1.0,
        hx: ScalarLike = 0.0,
        hz: ScalarLike = 0.0,
        *,
        periodic: bool = False,
        capacity: int | None = None,
    ) -> "PauliSum":
        """$J_{xy} \\sum_j (X_j X_{j+1} + Y_j Y_{j+1}) + J_z \\sum_j Z_j Z_{j+1}
        + h_x \\sum_j X_j + h_z \\sum_j Z_j$ (open, or closed with `periodic`);
        terms with a zero coefficient are left out."""
        return cls._chain(n_qubits, jxy, jz, hx, hz, periodic, capacity, "xxz_chain")

    @classmethod
    def _chain(cls, n_qubits, jxy, jz, hx, hz, periodic, capacity, name) -> "PauliSum":
        api = f"hierax.PauliSum.{name}"
        n = check_int(n_qubits, api, "n_qubits", minimum=2)
        periodic = check_bool(periodic, "periodic", api)
        if capacity is not None:
            capacity = check_int(capacity, api, "capacity")
        bonds = [(j, (j + 1) % n) for j in range(n if periodic and n > 2 else n - 1)]
        terms: list[tuple[Any, list[tuple[str, int]]]] = []
        for coefficient, ops in ((jxy, "XX"), (jxy, "YY"), (jz, "ZZ")):
            if not _is_zero(coefficient):
                terms += [(coefficient, [(ops[0], a), (ops[1], b)]) for a, b in bonds]
        for coefficient, op in ((hx, "X"), (hz, "Z")):
            if not _is_zero(coefficient):
                terms += [(coefficient, [(op, j)]) for j in range(n)]
        if not terms:
            return cls.zeros(n, capacity or 1)
        return cls._from_terms(terms, n, capacity, name)

    @classmethod
    def _build(cls, x, z, n_qubits, coefficients, capacity, name) -> "PauliSum":
        api = f"hierax.PauliSum.{name}"
        rows = x.shape[0]
        c = _coefficients(coefficients, rows, api)
        capacity = rows if capacity is None else check_int(capacity, api, "capacity")
        if not is_traced(c) and capacity < rows:
            distinct = len({(a.tobytes(), b.tobytes()) for a, b in zip(x, z)})
            if capacity < distinct:
                raise ValueError(
                    f"`{api}`: `capacity` {capacity} cannot hold the {distinct} "
                    "distinct strings given; raise it, or truncate explicitly "
                    "(`PauliSum.truncate`)."
                )
        # Placed without eager JAX operations (each kind compiles a small program
        # on a process's first use).
        raw = cls(
            x=to_jax(x),
            z=to_jax(z),
            coefficients=c,
            count=to_jax(np.asarray(rows, np.int32)),
            dropped=to_jax(np.zeros((), jnp.finfo(c.dtype).dtype)),
            n_qubits=n_qubits,
        )
        return raw.truncate(capacity)

    # --- properties -----------------------------------------------------------

    @property
    def capacity(self) -> int:
        """How many strings the sum has room for."""
        return self.x.shape[0]

    @property
    def dtype(self) -> Any:
        return self.coefficients.dtype

    def terms(self) -> dict[str, complex]:
        """The strings and their coefficients, `{"XZI": c, ...}` (on the host: for
        display and checks, not inside a jit)."""
        n = int(self.count)
        # Sliced on the host (an eager slice of a JAX array compiles a program).
        x, z = np.asarray(self.x)[:n], np.asarray(self.z)[:n]
        strings = to_strings(x, z, self.n_qubits)
        return dict(zip(strings, np.asarray(self.coefficients)[:n].tolist()))

    # --- arithmetic -----------------------------------------------------------

    def truncate(
        self, capacity: int | None = None, threshold: ScalarLike = 0.0
    ) -> "PauliSum":
        """The sum merged (equal strings summed), strings with $|c| \\le$
        `threshold` removed, and at most `capacity` (default: this capacity) kept,
        the largest; `dropped` adds the weight the capacity removed (what the
        threshold removes is asked for, and not counted).

        - `capacity`: a positive int.
        - `threshold`: a real number or 0-d real array, not nan (a negative one
            removes nothing, `inf` everything); a traced nan is an error at run
            time. Padding never becomes a string.
        """
        api = "hierax.PauliSum.truncate"
        capacity = (
            self.capacity if capacity is None else check_int(capacity, api, "capacity")
        )
        return _truncate(self, _threshold(threshold, api), capacity=capacity)

    def __add__(self, other: Any) -> "PauliSum":
        if not isinstance(other, PauliSum):
            return NotImplemented
        self._same_chain(other, "+")
        return _sum(
            self,
            other,
            subtract=False,
            capacity=self._bound(self.capacity + other.capacity),
        )

    def __sub__(self, other: Any) -> "PauliSum":
        if not isinstance(other, PauliSum):
            return NotImplemented
        self._same_chain(other, "-")
        return _sum(
            self,
            other,
            subtract=True,
            capacity=self._bound(self.capacity + other.capacity),
        )

    def __neg__(self) -> "PauliSum":
        return self * -1

    def times_function(self, function: Any) -> Any:
        """`f * self` for a time function f: a [`hierax.PauliTimeSum`][]."""
        return PauliTimeSum((function,), (self,))

    def __mul__(self, other: Any) -> "PauliSum":
        if isinstance(other, PauliSum) or not _is_number(other):
            return NotImplemented
        other = _finite_number(other, "hierax.PauliSum * number", "the number")
        return _scale(self, other)

    def __rmul__(self, other: Any) -> "PauliSum":
        return self.__mul__(other)

    def __truediv__(self, other: Any) -> "PauliSum":
        if isinstance(other, PauliSum) or not _is_number(other):
            return NotImplemented
        api = "hierax.PauliSum / number"
        other = _finite_number(other, api, "the divisor")
        if not is_traced(other) and other == 0:
            raise ValueError(f"`{api}`: division by zero.")
        return _scale(self, 1 / other)

    def __matmul__(self, other: Any) -> "PauliSum":
        if not isinstance(other, PauliSum):
            return NotImplemented
        return self.product(other)

    def product(self, other: "PauliSum", capacity: int | None = None) -> "PauliSum":
        """The operator product `self @ other`, with room for `capacity` strings
        (default: the product of the two capacities, room for every pair: exact)."""
        self._same_chain(other, "@")
        self._check_pairs(other, "product")
        if capacity is None:
            capacity = self._bound(self.capacity * other.capacity)
        capacity = check_int(capacity, "hierax.PauliSum.product", "capacity")
        return _product(self, other, capacity=capacity, commutator=False)

    def commutator(self, other: "PauliSum", capacity: int | None = None) -> "PauliSum":
        """$[A, B] = AB - BA$ for `self` = A and `other` = B, with room for
        `capacity` strings (default: the product of the two capacities, room for
        every pair: exact; pass a capacity for large sums). Only
        anticommuting pairs of strings contribute, each $2 P_a P_b$."""
        self._same_chain(other, "commutator")
        self._check_pairs(other, "commutator")
        if capacity is None:
            capacity = self._bound(self.capacity * other.capacity)
        capacity = check_int(capacity, "hierax.PauliSum.commutator", "capacity")
        return _product(self, other, capacity=capacity, commutator=True)

    def adjoint(self) -> "PauliSum":
        """$A^\\dagger$: Pauli strings are Hermitian, so the conjugate coefficients."""
        return eqx.tree_at(lambda s: s.coefficients, self, jnp.conj(self.coefficients))

    def inner(self, other: "PauliSum") -> Array:
        """$(A|B) = \\mathrm{Tr}(A^\\dagger B)/2^N = \\sum_P \\bar a_P b_P$ for
        `self` = A and `other` = B."""
        self._same_chain(other, "inner")
        return _inner(self, other)

    def norm(self) -> Array:
        """$\\sqrt{(A|A)}$, the normalised Frobenius norm
        $\\sqrt{\\mathrm{Tr}(A^\\dagger A)/2^N}$."""
        return _norm(self)

    def trace(self) -> Array:
        """$\\mathrm{Tr}(A)/2^N$: the coefficient of the identity string."""
        return _trace(self)

    # --- into matrices --------------------------------------------------------

    def todense(self) -> Array:
        """The $2^N \\times 2^N$ matrix (site 0 the most significant qubit, as
        [`hierax.site_operator`][] and `kron` order them), for N <= 14."""
        self._check_dense("todense")
        return _dense(self)

    def to_sparse(self):
        """The matrix as a [`hierax.SparseMatrix`][] (one entry per string and row),
        a way into the hierarchies and solvers for N <= 14."""
        from ..._data import SparseMatrix

        self._check_dense("to_sparse")
        return SparseMatrix(*_rows(self)[::-1])

    def _check_dense(self, name: str) -> None:
        if self.n_qubits > _DENSE_QUBITS:
            raise ValueError(
                f"`hierax.PauliSum.{name}`: {self.n_qubits} qubits is a "
                f"2^{self.n_qubits}-dimensional matrix; matrices are built for at "
                f"most {_DENSE_QUBITS} qubits."
            )

    def _bound(self, slots: int) -> int:
        """`slots`, or fewer where the chain has fewer strings (4^N)."""
        return min(slots, 4**self.n_qubits)

    def _check_pairs(self, other: "PauliSum", op: str) -> None:
        check_pairs(
            self.capacity,
            other.capacity,
            f"hierax.PauliSum.{op}",
            f"the capacities {self.capacity} and {other.capacity}",
            "truncate the sums first (`PauliSum.truncate(capacity)`), or form the "
            "product from parts of them",
        )

    def _same_chain(self, other: "PauliSum", op: str) -> None:
        if not isinstance(other, PauliSum):
            raise TypeError(
                f"`hierax.PauliSum.{op}`: expected a `hierax.PauliSum`, got "
                f"{type(other).__name__}."
            )
        check_chain(self, other, f"hierax.PauliSum.{op}", ("self", "other"))


class PauliTimeSum(eqx.Module):
    """A time-dependent Pauli Hamiltonian $H(t) = \\sum_j f_j(t) H_j$: time functions
    ([`hierax.Cos`][], [`hierax.Gaussian`][], ...) times [`hierax.PauliSum`][]s,
    built with `*` and `+` (`hierax.Cos(w) * hx + hzz`); the Hamiltonian of a
    [`hierax.PauliHierarchy`][]. Calling it at `t` gives the Pauli sum $H(t)$.

    It takes `+` and `-` with Pauli sums and other Pauli time sums (and `0`, so
    that `sum(...)` works), and `*` and `/` by numbers and `*` by time functions,
    which scale its functions (`2 * (f * hx)` is `(2 * f) * hx`)."""

    functions: tuple[AbstractTimeFunction, ...]
    sums: tuple[PauliSum, ...]
    not_a_matrix: ClassVar[str] = _NOT_A_MATRIX

    # Let NumPy hand `ndarray + H` to us (refused, with the reason) instead of
    # broadcasting over the array's entries.
    __array_ufunc__ = None

    def __init__(self, functions: Sequence[Any], sums: Sequence[PauliSum]):
        """**Arguments:**

        - `functions`: the time functions $f_j$, a sequence of
            [`hierax.AbstractTimeFunction`][]s (numbers are constants).
        - `sums`: the Pauli sums $H_j$, a sequence of [`hierax.PauliSum`][]s on one
            chain, one per function.
        """
        api = "hierax.PauliTimeSum"
        for name, value in (("functions", functions), ("sums", sums)):
            if not isinstance(value, (tuple, list)):
                raise TypeError(
                    f"`{api}`: `{name}` must be a tuple or list, got "
                    f"{type(value).__name__}; build one with `f * h` and `+`."
                )
        if len(functions) != len(sums) or not sums:
            raise ValueError(
                f"`{api}`: expected one time function per Pauli sum (and at least "
                f"one), got {len(functions)} and {len(sums)}."
            )
        for i, h in enumerate(sums):
            if not isinstance(h, PauliSum):
                raise TypeError(
                    f"`{api}`: `sums[{i}]` must be a `hierax.PauliSum`, got "
                    f"{type(h).__name__}."
                )
        self.functions = tuple(
            as_time_function(f, f"functions[{i}]", api) for i, f in enumerate(functions)
        )
        self.sums = tuple(sums)

    def __check_init__(self):
        n = self.sums[0].n_qubits
        if any(s.n_qubits != n for s in self.sums):
            raise ValueError(
                "`hierax.PauliTimeSum`: every term must act on the same chain, got "
                f"{[s.n_qubits for s in self.sums]} qubits."
            )

    @property
    def n_qubits(self) -> int:
        return self.sums[0].n_qubits

    def __add__(self, other: Any) -> "PauliTimeSum":
        term = _operand(other, "+", "add")
        if term is None:
            return self
        return PauliTimeSum(self.functions + term.functions, self.sums + term.sums)

    def __radd__(self, other: Any) -> "PauliTimeSum":
        term = _operand(other, "+", "add", reflected=True)
        return self if term is None else term + self  # `sum(...)` starts from 0

    def __neg__(self) -> "PauliTimeSum":
        return self._scaled(-1.0)

    def __sub__(self, other: Any) -> "PauliTimeSum":
        term = _operand(other, "-", "subtract")
        return self if term is None else self + (-term)

    def __rsub__(self, other: Any) -> "PauliTimeSum":
        term = _operand(other, "-", "subtract", reflected=True)
        return -self if term is None else term + (-self)

    def __mul__(self, other: Any) -> "PauliTimeSum":
        if isinstance(other, AbstractTimeFunction):
            return PauliTimeSum(tuple(f * other for f in self.functions), self.sums)
        if _is_number(other):
            api = "hierax.PauliTimeSum * number"
            return self._scaled(_finite_number(other, api, "the number"))
        _refuse_factor(other, "hierax.PauliTimeSum * ...")

    def __rmul__(self, other: Any) -> "PauliTimeSum":
        if isinstance(other, AbstractTimeFunction):
            return self.times_function(other)
        if _is_number(other):
            api = "number * hierax.PauliTimeSum"
            return self._scaled(_finite_number(other, api, "the number"))
        _refuse_factor(other, "... * hierax.PauliTimeSum")

    def __truediv__(self, other: Any) -> "PauliTimeSum":
        api = "hierax.PauliTimeSum / number"
        if not _is_number(other):
            raise TypeError(
                f"`{api}`: the divisor must be a number, got {type(other).__name__}."
            )
        other = _finite_number(other, api, "the divisor")
        if not is_traced(other) and other == 0:
            raise ValueError(f"`{api}`: division by zero.")
        return self._scaled(1 / other)

    def __matmul__(self, other: Any) -> Any:
        _refuse_product("hierax.PauliTimeSum @ ...")

    def __rmatmul__(self, other: Any) -> Any:
        _refuse_product("... @ hierax.PauliTimeSum")

    def times_function(self, function: AbstractTimeFunction) -> "PauliTimeSum":
        """`f * self` for a time function f: each of its functions times f."""
        return PauliTimeSum(tuple(function * f for f in self.functions), self.sums)

    def _scaled(self, factor: Any) -> "PauliTimeSum":
        """`factor * self` for a number: folded into the functions (their
        amplitudes, where they have one), the Pauli sums untouched (no program
        runs)."""
        return PauliTimeSum(tuple(f * factor for f in self.functions), self.sums)

    def __call__(self, t: ArrayLike) -> PauliSum:
        """$H(t)$ as one Pauli sum (room for all the terms' strings)."""
        total = None
        for f, s in zip(self.functions, self.sums):
            term = s * f(t)
            total = term if total is None else total + term
        assert total is not None
        return total


def _is_zero_number(x: Any) -> bool:
    """A concrete number 0 (what `sum(...)` starts from)."""
    return isinstance(x, (int, float, complex)) and not isinstance(x, bool) and x == 0


def _operand(
    other: Any, sign: str, verb: str, reflected: bool = False
) -> PauliTimeSum | None:
    """The other side of `H + x` or `H - x` as a Pauli time sum; `None` for a
    number 0 (what `sum(...)` starts from); anything else refused."""
    if _is_zero_number(other):
        return None
    term = as_time_sum(other)
    if term is None:
        _refuse_term(other, sign, verb, reflected)
    return term


def _refuse_term(other: Any, sign: str, verb: str, reflected: bool = False) -> NoReturn:
    """The error for `H + x` and `H - x` with x no Pauli sum: what to do instead."""
    api = (
        f"... {sign} hierax.PauliTimeSum"
        if reflected
        else f"hierax.PauliTimeSum {sign} ..."
    )
    kind = type(other).__name__
    if isinstance(other, AbstractTimeFunction):
        hint = (
            "a time function alone is no operator; multiply it by a Pauli sum "
            f"first (`hierax.{kind}(...) * h`)"
        )
    elif _is_number(other):
        hint = (
            "a number alone is no operator; for c times the identity add "
            '`c * hierax.PauliSum.from_strings("I" * n_qubits)`'
        )
    elif hasattr(other, "shape"):
        hint = (
            "Pauli sums and matrices do not mix; for a matrix (N <= 14) use the "
            "Pauli sums' `.todense()` and `hierax.TimeOperator`"
        )
    else:
        hint = "it takes `hierax.PauliSum`s and `hierax.PauliTimeSum`s"
    raise TypeError(f"`{api}`: cannot {verb} a value of type {kind}: {hint}.")


def _refuse_factor(other: Any, api: str) -> NoReturn:
    """The error for `H * x` with x neither a number nor a time function."""
    kind = type(other).__name__
    if isinstance(other, (PauliSum, PauliTimeSum)):
        _refuse_product(api)
    raise TypeError(
        f"`{api}`: a Pauli time sum is multiplied by numbers and time functions, "
        f"got {kind}."
        + (
            " Pauli sums and matrices do not mix; for a matrix (N <= 14) use the "
            "Pauli sums' `.todense()`."
            if hasattr(other, "shape")
            else ""
        )
    )


def _refuse_product(api: str) -> NoReturn:
    raise TypeError(
        f"`{api}`: a Pauli time sum has no operator product; multiply the Pauli "
        "sums first (`f * (a @ b)`, with `hierax.PauliSum.product`), or use its "
        "value at a time (`H(t) @ b`)."
    )


def as_time_sum(x: Any) -> PauliTimeSum | None:
    if isinstance(x, PauliTimeSum):
        return x
    if isinstance(x, PauliSum):
        return PauliTimeSum((Constant(1.0),), (x,))
    return None


def check_chain(first: Any, second: Any, api: str, names: tuple[str, str]) -> None:
    """Both Pauli sums (a Pauli Hamiltonian may stand first), on one chain."""
    for name, value in zip(names, (first, second)):
        if not hasattr(value, "n_qubits"):
            raise TypeError(
                f"`{api}`: `{name}` must be a `hierax.PauliSum`, got "
                f"{type(value).__name__}."
            )
    if first.n_qubits != second.n_qubits:
        raise ValueError(
            f"`{api}`: `{names[0]}` acts on {first.n_qubits} qubits and "
            f"`{names[1]}` on {second.n_qubits}; both must be on one chain."
        )


def check_pairs(first: int, second: int, api: str, what: str, advice: str) -> None:
    """Refuse a product of sums whose pairs of slots (every pair is formed, then
    merged) outnumber the 32-bit indices of the merge, where JAX raised a bare
    OverflowError while tracing (two sums of 50000 slots; a Liouvillian of 120
    strings at a capacity of 2^25), whatever the result's capacity."""
    pairs = first * second
    if pairs > _MAX_PAIRS:
        raise ValueError(
            f"`{api}`: {what} make {pairs} pairs of slots, more than the "
            f"{_MAX_PAIRS} one product can form (every pair is formed before the "
            f"merge, whatever the result's capacity); {advice}."
        )


def check_int(value: Any, api: str, name: str, minimum: int = 1) -> int:
    """`value` as an int, or a `TypeError` (not an int: a float, a bool, a string)
    or `ValueError` (below `minimum`) naming `api` and `name`."""
    kind = "positive" if minimum == 1 else "non-negative" if minimum == 0 else ""
    wanted = f"a {kind} int" if kind else f"an int of at least {minimum}"
    if not is_int(value):
        raise TypeError(
            f"`{api}`: `{name}` must be {wanted}, got {value!r} of type "
            f"{type(value).__name__}."
        )
    if value < minimum:
        raise ValueError(f"`{api}`: `{name}` must be {wanted}, got {value}.")
    return int(value)


def _precision(dtype: Any, api: str) -> Any:
    """The complex dtype of a floating or complex `dtype` (default: JAX's float)."""
    if dtype is None:
        return complex_dtype(float_dtype())
    try:
        kind = np.dtype(dtype).kind
    except TypeError:
        kind = None
    if kind not in ("f", "c"):
        raise TypeError(
            f"`{api}`: `dtype` must be a floating or complex dtype, got {dtype!r}."
        )
    return complex_dtype(jnp.dtype(dtype))


def _coefficients(coefficients: Any, rows: int, api: str) -> Array:
    """One finite number per string, as a complex JAX array."""
    if coefficients is None:
        return to_jax(np.ones(rows), complex_dtype(float_dtype()))
    if isinstance(coefficients, (str, bytes)):
        raise TypeError(
            f"`{api}`: `coefficients` must be numbers, got {coefficients!r}."
        )
    if is_traced(coefficients) or isinstance(coefficients, jax.Array):
        c = coefficients
    else:
        try:
            value = np.asarray(coefficients)
        except (TypeError, ValueError):
            value = None
        if value is None or value.dtype == object:
            try:  # a list holding JAX values (traced ones included)
                c = jnp.asarray(coefficients)
            except TypeError:
                c = None
        else:
            c = value
        if c is None:
            raise TypeError(
                f"`{api}`: `coefficients` must be numbers, got {coefficients!r}."
            )
    if c.dtype.kind not in "iufc":
        raise TypeError(
            f"`{api}`: `coefficients` must be numbers (int, float or complex), got "
            f"dtype {c.dtype}."
        )
    if c.shape != (rows,):
        raise ValueError(
            f"`{api}`: expected {rows} coefficients (one per string), got shape "
            f"{tuple(c.shape)}."
        )
    if is_traced(c):
        finite = jnp.all(jnp.isfinite(c))
        c = eqx.error_if(c, ~finite, f"`{api}`: `coefficients` must be finite.")
    elif not np.all(np.isfinite(np.asarray(c))):
        bad = np.asarray(c)[~np.isfinite(np.asarray(c))][0]
        raise ValueError(f"`{api}`: `coefficients` must be finite, got {bad}.")
    c = to_jax(c)  # canonical first (float64 is float32 without x64)
    return to_jax(c, complex_dtype(c.dtype))


def _threshold(threshold: Any, api: str) -> Any:
    """A real scalar that is not nan: a Python float when concrete (one compiled
    program for every value), else the traced array (nan refused at run time)."""
    if isinstance(threshold, (jax.Array, np.ndarray)):
        if threshold.shape != () or threshold.dtype.kind not in "iuf":
            raise TypeError(
                f"`{api}`: `threshold` must be a real scalar, got an array of shape "
                f"{tuple(threshold.shape)} and dtype {threshold.dtype}."
            )
        if is_traced(threshold):
            return threshold
        threshold = threshold.item()  # a concrete scalar: one word, read here
    if isinstance(threshold, (bool, np.bool_)) or not isinstance(
        threshold, (numbers.Real, np.integer, np.floating)
    ):
        raise TypeError(
            f"`{api}`: `threshold` must be a real number, got {threshold!r} of type "
            f"{type(threshold).__name__}."
        )
    value = float(threshold)
    if np.isnan(value):
        raise ValueError(f"`{api}`: `threshold` must be a number, got nan.")
    return value


def _finite_number(x: Any, api: str, name: str) -> Any:
    """`x`, a number checked to be finite where it is known (a traced one is
    checked at run time, in `_scale`); a Python int as the float it equals (an int
    past int64 made the compiled product raise JAX's overflow error)."""
    if isinstance(x, (bool, np.bool_)) or (
        hasattr(x, "dtype") and np.dtype(x.dtype).kind == "b"
    ):
        raise TypeError(f"`{api}`: {name} must be numeric, got the boolean {x!r}.")
    if is_traced(x):
        return x
    if isinstance(x, int):
        return int_as_float(x, api, name)
    if not np.isfinite(x):
        raise ValueError(f"`{api}`: {name} must be finite, got {x}.")
    return x


def _is_zero(x: Any) -> bool:
    """Whether a chain's coupling is a concrete zero (a traced one may not be)."""
    if is_traced(x):
        return False
    try:
        return bool(np.all(np.asarray(x) == 0))
    except (TypeError, ValueError):
        return False


def _is_number(x: Any) -> bool:
    if isinstance(x, (int, float, complex, np.number)):
        return True
    return (
        isinstance(x, (jax.Array, np.ndarray))
        and x.ndim == 0
        and (np.dtype(x.dtype).kind in "biufc")
    )


def _live(s: PauliSum) -> Array:
    """Which slots hold strings (the first `count`)."""
    return jnp.arange(s.capacity) < s.count


def _valid(s: PauliSum) -> Array:
    """The coefficients with padding slots zeroed (slots past `count`)."""
    return jnp.where(_live(s), s.coefficients, 0)


def _one_norm(s: PauliSum) -> Array:
    """$\\sum_j |c_j|$, which bounds the operator norm (each string's is 1)."""
    return jnp.sum(jnp.abs(_valid(s)))


def _times(factor: Array, root: Array) -> Array:
    """`factor * root` for non-negative parts, zero where `root` is (inf * 0 is
    nan: a factor that overflows times nothing missing is nothing missing)."""
    return jnp.where(root == 0, 0, factor * root)


def _rebuilt(s: PauliSum, parts: tuple, missing: Array) -> PauliSum:
    """A sum from `compress`'s parts; `missing` bounds the norm of what was missing
    before this merge, which adds the norm of what it removed (see `PauliSum`)."""
    x, z, c, count, removed = parts
    return PauliSum(
        x=x,
        z=z,
        coefficients=c,
        count=count,
        dropped=(missing + jnp.sqrt(removed)) ** 2,
        n_qubits=s.n_qubits,
    )


# One compiled program per chain and capacity for each of these (op by op, a
# first `todense` compiled some twenty small programs).


@module_jit
def _norm(s: PauliSum) -> Array:
    # Scaled by the largest |c|: |c|^2 underflows (1e-25 in float32) or overflows.
    a = jnp.abs(_valid(s))
    top = jnp.max(a)
    ok = (top > 0) & jnp.isfinite(top)
    scale = jnp.where(ok, top, 1)
    return jnp.where(ok, scale * jnp.sqrt(jnp.sum((a / scale) ** 2)), top)


@module_jit
def _trace(s: PauliSum) -> Array:
    identity = jnp.all((s.x == 0) & (s.z == 0), axis=1)
    return jnp.sum(jnp.where(identity & _live(s), s.coefficients, 0))


@module_jit
def _scale(s: PauliSum, factor: Array) -> PauliSum:
    """`factor * s`: padding stays zero, and `dropped` scales by |factor|^2."""
    factor = eqx.error_if(
        factor,
        ~jnp.isfinite(factor),
        "`hierax.PauliSum * number`: the number must be finite.",
    )
    if jnp.iscomplexobj(factor):
        c = s.coefficients * factor
    else:  # part by part: (inf + 0j) * 2 is inf + nan j as a complex product
        c = s.coefficients
        c = jax.lax.complex(jnp.real(c) * factor, jnp.imag(c) * factor)
    c = jnp.where(_live(s), c, 0)
    real = jnp.finfo(c.dtype).dtype
    root = _times(jnp.abs(factor).astype(real), jnp.sqrt(s.dropped).astype(real))
    return PauliSum(
        x=s.x,
        z=s.z,
        coefficients=c,
        # Times zero, no string is left (the first `count` slots hold nonzero
        # coefficients).
        count=jnp.where(factor == 0, 0, s.count).astype(s.count.dtype),
        dropped=root**2,
        n_qubits=s.n_qubits,
    )


@module_jit
def _rows(s: PauliSum) -> tuple[Array, Array]:
    """`(columns, values)`, each `(2^N, capacity)`: row r of string j's matrix
    has its one entry at column b = r ^ x_j, with value
    i^{|x&z|} (-1)^{|z&b|} (P(x, z)|b> = i^{|x&z|} (-1)^{|z&b|} |b ^ x>)."""
    n = s.n_qubits
    # Masks as integers with site 0 the most significant bit.
    sites = jnp.arange(n, dtype=jnp.uint32)
    weights = jnp.asarray(2 ** (n - 1 - np.arange(n)), jnp.int32)
    bits = (sites % 32)[None, :]
    xb = ((s.x[:, sites // 32] >> bits) & 1).astype(jnp.int32)
    zb = ((s.z[:, sites // 32] >> bits) & 1).astype(jnp.int32)
    xi, zi = xb @ weights, zb @ weights
    columns = jnp.arange(2**n, dtype=jnp.int32)[:, None] ^ xi[None, :]
    sign = jax.lax.population_count(columns & zi[None, :]) % 2
    phase = i_power(jnp.sum(xb & zb, axis=1), s.dtype) * _valid(s)
    return columns, phase[None, :] * (1 - 2 * sign).astype(s.dtype)


@module_jit
def _dense(s: PauliSum) -> Array:
    columns, values = _rows(s)
    n = 2**s.n_qubits
    rows = jnp.broadcast_to(jnp.arange(n)[:, None], columns.shape)
    return jnp.zeros((n, n), s.dtype).at[rows, columns].add(values)


@module_jit
def _truncate(s: PauliSum, threshold: Array, *, capacity: int) -> PauliSum:
    threshold = eqx.error_if(
        threshold,
        jnp.isnan(threshold),
        "`hierax.PauliSum.truncate`: `threshold` must be a number, got nan.",
    )
    threshold = jnp.asarray(threshold, jnp.finfo(s.dtype).dtype)
    parts = compress(s.x, s.z, _valid(s), s.n_qubits, capacity, threshold)
    return _rebuilt(s, parts, jnp.sqrt(s.dropped))


@on_backend("hierax.PauliSum")
@eqx.filter_jit
def _sum(a: PauliSum, b: PauliSum, *, subtract: bool, capacity: int) -> PauliSum:
    dtype = jnp.result_type(a.dtype, b.dtype)
    x = jnp.concatenate([a.x, b.x])
    z = jnp.concatenate([a.z, b.z])
    # Negated, not multiplied by -1 (as a complex product, (inf + 0j) * 1 has a nan).
    cb = _valid(b).astype(dtype)
    c = jnp.concatenate([_valid(a).astype(dtype), -cb if subtract else cb])
    parts = compress(x, z, c, a.n_qubits, capacity)
    real = jnp.finfo(dtype).dtype
    missing = jnp.sqrt(a.dropped).astype(real) + jnp.sqrt(b.dropped).astype(real)
    return _rebuilt(a, parts, missing)


@on_backend("hierax.PauliSum")
@eqx.filter_jit
def _product(a: PauliSum, b: PauliSum, *, capacity: int, commutator: bool) -> PauliSum:
    """Every pair of strings multiplied (for a commutator, only anticommuting pairs,
    twice), then merged."""
    dtype = jnp.result_type(a.dtype, b.dtype)
    real = jnp.finfo(dtype).dtype
    x, z, e, anti = product_phase(
        a.x[:, None], a.z[:, None], b.x[None, :], b.z[None, :]
    )
    # Pairs with a padding slot are exact zeros (a masked product: inf * 0 is nan).
    pairs = _live(a)[:, None] & _live(b)[None, :]
    if commutator:
        pairs = pairs & (anti == 1)
    c = a.coefficients[:, None].astype(dtype) * b.coefficients[None, :].astype(dtype)
    c = jnp.where(pairs, (2 if commutator else 1) * c * i_power(e, dtype), 0)
    m = a.capacity * b.capacity
    parts = compress(
        x.reshape(m, -1), z.reshape(m, -1), c.reshape(m), a.n_qubits, capacity
    )
    # What was missing from A and B, through the product (see `PauliSum`).
    ra, rb = jnp.sqrt(a.dropped).astype(real), jnp.sqrt(b.dropped).astype(real)
    cross = _times(jnp.exp2(jnp.asarray(a.n_qubits / 2, real)), ra * rb)
    missing = _times(_one_norm(b).astype(real), ra)
    missing = missing + _times(_one_norm(a).astype(real), rb) + cross
    return _rebuilt(a, parts, (2 if commutator else 1) * missing)


@on_backend("hierax.PauliSum")
@eqx.filter_jit
def _inner(a: PauliSum, b: PauliSum) -> Array:
    """Each of A's strings looked up in B (whose strings are sorted)."""
    found = lookup(b.x, b.z, _valid(b), b.count, a.x, a.z)
    return jnp.sum(jnp.conj(_valid(a)) * found)
