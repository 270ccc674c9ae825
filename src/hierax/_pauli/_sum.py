"""Sums of Pauli strings with a fixed capacity: operators on 30-128 qubits."""

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Inexact, Int, Real, UInt32

from .._arrays import complex_dtype, float_dtype, is_traced, to_jax
from .._jit import module_jit
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
    n_qubits: int = eqx.field(static=True)

    __array_ufunc__ = None
    not_a_matrix: ClassVar[str] = _NOT_A_MATRIX

    def __check_init__(self):
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

        - `coefficients`: one per string (default: all 1).
        - `capacity`: the number of slots (default: the number of strings).
        """
        if isinstance(strings, Mapping):
            if coefficients is not None:
                raise ValueError(
                    "`hierax.PauliSum.from_strings`: give the coefficients either "
                    "in the mapping or as `coefficients`, not both."
                )
            strings, coefficients = list(strings), list(strings.values())
        x, z, n_qubits = parse(strings, "strings")
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
        if int(n_qubits) < 1:
            raise ValueError(f"`n_qubits`: expected at least 1, got {n_qubits}.")
        if not terms:
            raise ValueError("`terms`: expected at least one term, got none.")
        masks = [site_masks(ops, n_qubits, "terms") for _, ops in terms]
        x = np.stack([m[0] for m in masks])
        z = np.stack([m[1] for m in masks])
        coefficients = [coefficient for coefficient, _ in terms]
        return cls._build(x, z, int(n_qubits), coefficients, capacity, "from_terms")

    @classmethod
    def zeros(cls, n_qubits: int, capacity: int, dtype: Any = None) -> "PauliSum":
        """The zero operator with room for `capacity` strings."""
        w = words(n_qubits)
        dtype = complex_dtype(dtype or float_dtype())
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
        coupling: float = 1.0,
        hx: float = 0.0,
        hz: float = 0.0,
        *,
        periodic: bool = False,
        capacity: int | None = None,
    ) -> "PauliSum":
        """$J \\sum_j Z_j Z_{j+1} + h_x \\sum_j X_j + h_z \\sum_j Z_j$ (the chaotic
        Ising chain of operator-growth studies: $J = 1$, $h_x = 1.05$,
        $h_z = 0.5$)."""
        return cls.xxz_chain(
            n_qubits, 0.0, coupling, hx, hz, periodic=periodic, capacity=capacity
        )

    @classmethod
    def xxz_chain(
        cls,
        n_qubits: int,
        jxy: float = 1.0,
        jz: float = 1.0,
        hx: float = 0.0,
        hz: float = 0.0,
        *,
        periodic: bool = False,
        capacity: int | None = None,
    ) -> "PauliSum":
        """$J_{xy} \\sum_j (X_j X_{j+1} + Y_j Y_{j+1}) + J_z \\sum_j Z_j Z_{j+1}
        + h_x \\sum_j X_j + h_z \\sum_j Z_j$ (open, or closed with `periodic`);
        terms with a zero coefficient are left out."""
        n = int(n_qubits)
        if n < 2:
            raise ValueError(f"`n_qubits`: a chain needs at least 2 sites, got {n}.")
        bonds = [(j, (j + 1) % n) for j in range(n if periodic and n > 2 else n - 1)]
        terms: list[tuple[Any, list[tuple[str, int]]]] = []
        for coefficient, ops in ((jxy, "XX"), (jxy, "YY"), (jz, "ZZ")):
            if coefficient != 0:
                terms += [(coefficient, [(ops[0], a), (ops[1], b)]) for a, b in bonds]
        for coefficient, op in ((hx, "X"), (hz, "Z")):
            if coefficient != 0:
                terms += [(coefficient, [(op, j)]) for j in range(n)]
        if not terms:
            return cls.zeros(n, capacity or 1)
        return cls.from_terms(terms, n, capacity=capacity)

    @classmethod
    def _build(cls, x, z, n_qubits, coefficients, capacity, name) -> "PauliSum":
        rows = x.shape[0]
        if coefficients is None:
            coefficients = np.ones(rows)
        c = to_jax(coefficients)
        if c.shape != (rows,):
            raise ValueError(
                f"`hierax.PauliSum.{name}`: expected {rows} coefficients (one per "
                f"string), got shape {tuple(c.shape)}."
            )
        c = to_jax(c, complex_dtype(c.dtype))
        capacity = rows if capacity is None else _capacity(capacity)
        if not is_traced(c) and capacity < rows:
            distinct = len({(a.tobytes(), b.tobytes()) for a, b in zip(x, z)})
            if capacity < distinct:
                raise ValueError(
                    f"`capacity`: {capacity} slots cannot hold the {distinct} "
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
        self, capacity: int | None = None, threshold: float | Array = 0.0
    ) -> "PauliSum":
        """The sum merged (equal strings summed), strings with $|c| \\le$
        `threshold` removed, and at most `capacity` (default: this capacity) kept,
        the largest; `dropped` is the weight the capacity removed."""
        capacity = self.capacity if capacity is None else _capacity(capacity)
        return _truncate(self, threshold, capacity=capacity)

    def __add__(self, other: Any) -> "PauliSum":
        if not isinstance(other, PauliSum):
            return NotImplemented
        self._same_chain(other, "+")
        return _sum(
            self,
            other,
            jnp.ones(()),
            capacity=self._bound(self.capacity + other.capacity),
        )

    def __sub__(self, other: Any) -> "PauliSum":
        if not isinstance(other, PauliSum):
            return NotImplemented
        self._same_chain(other, "-")
        return _sum(
            self,
            other,
            -jnp.ones(()),
            capacity=self._bound(self.capacity + other.capacity),
        )

    def __neg__(self) -> "PauliSum":
        return self * -1

    def times_function(self, function: Any) -> Any:
        """`f * self` for a time function f: a [`hierax.PauliTimeSum`][]."""
        from ._hierarchy import times_function

        return times_function(self, function)

    def __mul__(self, other: Any) -> "PauliSum":
        if isinstance(other, PauliSum) or not _is_number(other):
            return NotImplemented
        return eqx.tree_at(lambda s: s.coefficients, self, self.coefficients * other)

    def __rmul__(self, other: Any) -> "PauliSum":
        return self.__mul__(other)

    def __truediv__(self, other: Any) -> "PauliSum":
        if isinstance(other, PauliSum) or not _is_number(other):
            return NotImplemented
        return self * (1 / other)

    def __matmul__(self, other: Any) -> "PauliSum":
        if not isinstance(other, PauliSum):
            return NotImplemented
        return self.product(other)

    def product(self, other: "PauliSum", capacity: int | None = None) -> "PauliSum":
        """The operator product `self @ other`, with room for `capacity` strings
        (default: the product of the two capacities, room for every pair: exact)."""
        self._same_chain(other, "@")
        if capacity is None:
            capacity = self._bound(self.capacity * other.capacity)
        return _product(self, other, capacity=_capacity(capacity), commutator=False)

    def commutator(self, other: "PauliSum", capacity: int | None = None) -> "PauliSum":
        """$[A, B] = AB - BA$ for `self` = A and `other` = B, with room for
        `capacity` strings (default: the product of the two capacities, room for
        every pair: exact; pass a capacity for large sums). Only
        anticommuting pairs of strings contribute, each $2 P_a P_b$."""
        self._same_chain(other, "commutator")
        if capacity is None:
            capacity = self._bound(self.capacity * other.capacity)
        return _product(self, other, capacity=_capacity(capacity), commutator=True)

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
        from .._sparse import SparseMatrix

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

    def _same_chain(self, other: "PauliSum", op: str) -> None:
        if not isinstance(other, PauliSum):
            raise TypeError(
                f"`hierax.PauliSum.{op}`: expected a `hierax.PauliSum`, got "
                f"{type(other).__name__}."
            )
        check_chain(self, other, f"hierax.PauliSum.{op}", ("self", "other"))


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


def _capacity(capacity: Any) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
        raise ValueError(f"`capacity`: expected a positive integer, got {capacity!r}.")
    if capacity < 1:
        raise ValueError(f"`capacity`: expected a positive integer, got {capacity}.")
    return int(capacity)


def _is_number(x: Any) -> bool:
    if isinstance(x, (int, float, complex, np.number)):
        return True
    return isinstance(x, (jax.Array, np.ndarray)) and x.ndim == 0


def _valid(s: PauliSum) -> Array:
    """The coefficients with padding slots zeroed (slots past `count`)."""
    return jnp.where(jnp.arange(s.capacity) < s.count, s.coefficients, 0)


def _rebuilt(s: PauliSum, parts: tuple, dropped: Array) -> PauliSum:
    x, z, c, count, removed = parts
    return PauliSum(
        x=x,
        z=z,
        coefficients=c,
        count=count,
        dropped=dropped + removed,
        n_qubits=s.n_qubits,
    )


# One compiled program per chain and capacity for each of these (op by op, a
# first `todense` compiled some twenty small programs).


@module_jit
def _norm(s: PauliSum) -> Array:
    return jnp.sqrt(jnp.sum(jnp.abs(s.coefficients) ** 2))


@module_jit
def _trace(s: PauliSum) -> Array:
    identity = jnp.all((s.x == 0) & (s.z == 0), axis=1)
    return jnp.sum(jnp.where(identity, s.coefficients, 0))


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
    parts = compress(s.x, s.z, _valid(s), s.n_qubits, capacity, threshold)
    return _rebuilt(s, parts, jnp.zeros_like(s.dropped))


@eqx.filter_jit
def _sum(a: PauliSum, b: PauliSum, sign: Array, *, capacity: int) -> PauliSum:
    dtype = jnp.result_type(a.dtype, b.dtype)
    x = jnp.concatenate([a.x, b.x])
    z = jnp.concatenate([a.z, b.z])
    c = jnp.concatenate([_valid(a).astype(dtype), sign * _valid(b).astype(dtype)])
    parts = compress(x, z, c, a.n_qubits, capacity)
    return _rebuilt(a, parts, jnp.zeros((), jnp.finfo(dtype).dtype))


@eqx.filter_jit
def _product(a: PauliSum, b: PauliSum, *, capacity: int, commutator: bool) -> PauliSum:
    """Every pair of strings multiplied (for a commutator, only anticommuting pairs,
    twice), then merged."""
    dtype = jnp.result_type(a.dtype, b.dtype)
    x, z, e, anti = product_phase(
        a.x[:, None], a.z[:, None], b.x[None, :], b.z[None, :]
    )
    c = _valid(a)[:, None].astype(dtype) * _valid(b)[None, :].astype(dtype)
    c = c * i_power(e, dtype)
    if commutator:
        c = jnp.where(anti == 1, 2 * c, 0)
    m = a.capacity * b.capacity
    parts = compress(
        x.reshape(m, -1), z.reshape(m, -1), c.reshape(m), a.n_qubits, capacity
    )
    return _rebuilt(a, parts, jnp.zeros((), jnp.finfo(dtype).dtype))


@eqx.filter_jit
def _inner(a: PauliSum, b: PauliSum) -> Array:
    """Each of A's strings looked up in B (whose strings are sorted)."""
    found = lookup(b.x, b.z, _valid(b), b.count, a.x, a.z)
    return jnp.sum(jnp.conj(_valid(a)) * found)
