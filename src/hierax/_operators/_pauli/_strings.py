"""Pauli strings as bit words, and the phases of their products.

A string on N qubits is two bit masks, `x` and `z`, each stored as
`ceil(N / 32)` unsigned 32-bit words (site `s` is bit `s % 32` of word `s // 32`),
and stands for

    P(x, z) = i^{|x & z|} X^x Z^z,

so that I, X, Z, Y are (0, 0), (1, 0), (0, 1), (1, 1) on a site (Y = iXZ). Then

    P(x1, z1) P(x2, z2) = i^{|x1 & z1| + |x2 & z2| + 2 |z1 & x2| - |x3 & z3|} P(x3, z3)

with x3 = x1 ^ x2, z3 = z1 ^ z2 (moving Z^{z1} past X^{x2} gives (-1)^{|z1 & x2|}),
and the two strings anticommute exactly when |x1 & z2| + |z1 & x2| is odd. Words
are 32-bit so that the same code runs without x64.
"""

from collections.abc import Sequence

import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, UInt32

from ..._core import is_int


WORD = 32


def words(n_qubits: int) -> int:
    """How many 32-bit words hold one mask of `n_qubits` sites."""
    return max(1, -(-n_qubits // WORD))


_CODES = {"I": (0, 0), "X": (1, 0), "Y": (1, 1), "Z": (0, 1)}


def parse(strings: Sequence[str], api: str) -> tuple[np.ndarray, np.ndarray, int]:
    """The masks of `strings` ("XZIY...", site 0 first), as NumPy words (vectorised:
    2^18 strings of 30 sites in a fraction of a second); errors name `api`."""
    name = f"{api}`: `strings"
    if isinstance(strings, str):
        strings = [strings]
    strings = [str(s).upper() for s in strings]
    if not strings:
        raise ValueError(f"`{name}`: expected at least one Pauli string, got none.")
    n_qubits = len(strings[0])
    if n_qubits == 0:
        raise ValueError(f"`{name}`: a Pauli string needs at least one site, got ''.")
    lengths = np.fromiter((len(s) for s in strings), int, len(strings))
    if np.any(lengths != n_qubits):
        row = int(np.argmax(lengths != n_qubits))
        raise ValueError(
            f"`{name}`: every string must have {n_qubits} sites (the first "
            f"one's), string {row} {strings[row]!r} has {lengths[row]}."
        )
    try:
        chars = np.frombuffer("".join(strings).encode("ascii"), np.uint8)
    except UnicodeEncodeError:
        chars = None
    if chars is None or np.any(_CODE[chars] < 0):
        row = next(r for r, s in enumerate(strings) if set(s) - set(_CODES))
        bad = set(strings[row]) - set(_CODES)
        raise ValueError(
            f"`{name}`: string {row} {strings[row]!r} has characters "
            f"{sorted(bad)}; expected only I, X, Y, Z."
        )
    code = _CODE[chars].reshape(len(strings), n_qubits)
    return _pack(code & 1, n_qubits), _pack(code >> 1, n_qubits), n_qubits


# Character -> 2-bit code (bit 0: X part, bit 1: Z part), -1 for anything else.
_CODE = np.full(256, -1, np.int64)
for _char, (_x, _z) in _CODES.items():
    _CODE[ord(_char)] = _x | (_z << 1)


def _pack(bits: np.ndarray, n_qubits: int) -> np.ndarray:
    """`(rows, n_qubits)` 0/1 bits as `(rows, words)` uint32 words (site s is bit
    s % 32 of word s // 32)."""
    padded = np.zeros((bits.shape[0], words(n_qubits) * WORD), np.uint64)
    padded[:, :n_qubits] = bits
    shifts = np.arange(WORD, dtype=np.uint64)
    blocks = padded.reshape(bits.shape[0], -1, WORD) << shifts
    return blocks.sum(axis=2).astype(np.uint32)


def site_masks(
    ops: Sequence[tuple[str, int]], n_qubits: int, api: str
) -> tuple[np.ndarray, np.ndarray]:
    """The masks of the product of single-site Paulis `[(op, site), ...]` (each site
    at most once), as NumPy words; errors name `api` and `terms`."""
    name = f"{api}`: `terms"
    x = np.zeros(words(n_qubits), np.uint32)
    z = np.zeros_like(x)
    seen = set()
    if isinstance(ops, (str, bytes)) or not isinstance(ops, (Sequence, np.ndarray)):
        raise TypeError(
            f"`{name}`: a term's operators must be a sequence of `(op, site)` pairs, "
            f"got {ops!r}."
        )
    for pair in ops:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(
                f"`{name}`: each operator must be a pair `(op, site)`, got {pair!r}."
            )
        op, site = pair
        if not isinstance(op, str) or op.upper() not in _CODES:
            raise ValueError(f"`{name}`: operator {op!r} is not one of I, X, Y, Z.")
        op = op.upper()
        if not is_int(site):
            raise TypeError(
                f"`{name}`: a site must be an int, got {site!r} of type "
                f"{type(site).__name__}."
            )
        site = int(site)
        if not 0 <= site < n_qubits:
            raise ValueError(
                f"`{name}`: site {site} is outside the chain of {n_qubits} qubits "
                f"(sites 0..{n_qubits - 1})."
            )
        if site in seen:
            raise ValueError(
                f"`{name}`: site {site} appears twice in one term; give each site "
                "once (the product of the two Paulis on it)."
            )
        seen.add(site)
        bx, bz = _CODES[op]
        word, bit = divmod(int(site), WORD)
        x[word] |= np.uint32(bx << bit)
        z[word] |= np.uint32(bz << bit)
    return x, z


def to_strings(x: np.ndarray, z: np.ndarray, n_qubits: int) -> list[str]:
    """The strings ("XZIY...") of NumPy masks, one per row."""
    chars = np.array(["I", "X", "Z", "Y"])
    sites = np.arange(n_qubits)
    word, bit = sites // WORD, (sites % WORD).astype(np.uint32)
    xb = (x[:, word] >> bit) & 1
    zb = (z[:, word] >> bit) & 1
    return ["".join(row) for row in chars[xb + 2 * zb]]


def popcount(w: UInt32[Array, "... words"]) -> Int[Array, "..."]:
    """The number of set bits over the last axis."""
    return jnp.sum(lax.population_count(w).astype(jnp.int32), axis=-1)


def product_phase(
    x1: UInt32[Array, "... words"],
    z1: UInt32[Array, "... words"],
    x2: UInt32[Array, "... words"],
    z2: UInt32[Array, "... words"],
) -> tuple[Array, Array, Int[Array, "..."], Int[Array, "..."]]:
    """`(x3, z3, e, anti)`: P1 P2 = i^e P3 and whether P1, P2 anticommute (0 or 1)."""
    x3, z3 = x1 ^ x2, z1 ^ z2
    e = popcount(x1 & z1) + popcount(x2 & z2) + 2 * popcount(z1 & x2)
    e = (e - popcount(x3 & z3)) % 4
    anti = (popcount(x1 & z2) + popcount(z1 & x2)) % 2
    return x3, z3, e, anti


def i_power(e: Int[Array, "..."], dtype) -> Array:
    """i^e for integer `e` (mod 4), exactly."""
    return jnp.asarray(np.array([1, 1j, -1, -1j]), dtype)[e % 4]
