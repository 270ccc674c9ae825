"""The process-global caches: all declared in one module (`hierax._core._cache`),
and none of them changes an answer.

The sources are read with `ast`, so that a cache added anywhere else (a
module-level dict filled at run time, an `IdentityCache`, `functools.cache`,
`weakref`) fails here until it is declared in the registry, beside its measured
saving, or named below as a registry of another kind. Then a mixed set of calls
runs, every cache is emptied (`clear()`), and the same calls give the same
answers bitwise.
"""

import ast
import pathlib

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hierax
from hierax._core import _cache


SOURCE = pathlib.Path(hierax.__file__).parent
REGISTRY = SOURCE / "_core" / "_cache.py"

# Registries filled once at import (by the rules' decorators, or by a later layer
# so that imports point one way): not caches, nothing in them depends on a call.
REGISTRIES = {
    ("_time/_time_functions.py", "_OPERATOR_PRODUCT"): "`f * M` for operators",
    ("_operators/_time_operators.py", "_FOREIGN"): "QuTiP / dynamiqs converter",
    ("_taylor/_core.py", "RULES"): "the Taylor rule of each JAX primitive",
}

_CACHE_CLASSES = {"IdentityCache", "KeyedCache", "ArraysSeen", "TermCache"}
_MUTATORS = {
    "add",
    "append",
    "clear",
    "extend",
    "insert",
    "move_to_end",
    "pop",
    "popitem",
    "put",
    "remove",
    "setdefault",
    "update",
}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _mutated(tree: ast.Module) -> set[str]:
    """Names changed in place or rebound inside a function (at run time, not
    while the module is imported): `x[k] = v`, `del x[k]`, `x += ...`,
    `x.put(...)`, `global x`."""
    names = set()
    functions = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    for node in (n for f in functions for n in ast.walk(f)):
        if isinstance(node, ast.Subscript) and isinstance(
            node.ctx, ast.Store | ast.Del
        ):
            names.add(_dotted(node.value))
        elif isinstance(node, ast.AugAssign):
            names.add(_dotted(node.target))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _MUTATORS:
                names.add(_dotted(node.func.value))
        elif isinstance(node, ast.Global):
            names.update(node.names)
    return names


def _caches_in(path: pathlib.Path) -> set[str]:
    """The process-global caches a module keeps: module-level cache objects, and
    containers filled at run time; functions cached by `functools`; `weakref`."""
    tree = ast.parse(path.read_text(), str(path))
    mutated = _mutated(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names]
            if "weakref" in modules or getattr(node, "module", None) == "weakref":
                found.add("weakref")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                if _dotted(decorator).split(".")[-1] in ("cache", "lru_cache"):
                    found.add(node.name)
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        called = _dotted(value).split(".")[-1].lstrip("_")
        cache = isinstance(value, ast.Call) and (
            called in _CACHE_CLASSES or called.endswith(("Cache", "Seen"))
        )
        # Any object made at import (a container, an instance) that functions
        # change later.
        made = isinstance(
            value,
            ast.Call | ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp,
        )
        for target in targets:
            if not isinstance(target, ast.Name):
                continue
            if cache or (made and target.id in mutated):
                found.add(target.id)
    return found


def _library_caches() -> dict[tuple[str, str], None]:
    found = {}
    for path in sorted(SOURCE.rglob("*.py")):
        if path == REGISTRY:
            continue
        relative = path.relative_to(SOURCE).as_posix()
        for name in _caches_in(path):
            found[relative, name] = None
    return found


def test_every_cache_is_declared_in_the_registry():
    found = _library_caches()
    undeclared = sorted(set(found) - set(REGISTRIES))
    assert not undeclared, (
        f"caches kept outside `hierax._core._cache`: {undeclared}; declare them "
        "there with their measured saving (tests/measure_caches.py)"
    )
    # The list above names only what is still there.
    stale = sorted(set(REGISTRIES) - set(found))
    assert not stale, f"named here but no longer in the sources: {stale}"


def test_the_registry_lists_every_cache_it_creates():
    tree = ast.parse(REGISTRY.read_text())
    created = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            if _dotted(node.value).split(".")[-1] in _CACHE_CLASSES:
                created.update(t.id for t in node.targets if isinstance(t, ast.Name))
    assert created == set(_cache.CACHES)
    # Each beside its measurement: a comment just above it.
    lines = REGISTRY.read_text().splitlines()
    for name in created:
        (index,) = [i for i, line in enumerate(lines) if line.startswith(f"{name} =")]
        above = lines[index - 1]
        assert above.startswith("#") or lines[index - 1].startswith(
            tuple(f"{n} =" for n in created)
        ), name


def test_the_scan_finds_a_new_cache(tmp_path):
    """The reading of the sources catches each kind of cache (and leaves constant
    tables alone)."""
    path = tmp_path / "module.py"
    path.write_text(
        "import functools\n"
        "from .._core import IdentityCache\n"
        "_TABLE = {'a': 1}\n"
        "_CODES = dict(a=1)\n"
        "_CODES['b'] = 2\n"
        "_ORDER = collections.OrderedDict()\n"
        "_SEEN_TOO = _ArraysSeen(2)\n"
        "_SEEN = {}\n"
        "_LIST: list = []\n"
        "_KEPT = IdentityCache(4)\n"
        "def remember(k, v):\n"
        "    _SEEN[k] = v\n"
        "    _LIST.append(v)\n"
        "    _ORDER.move_to_end(k)\n"
        "@functools.lru_cache(maxsize=8)\n"
        "def slow(x):\n"
        "    return _TABLE[x]\n"
    )
    found = _caches_in(path)
    assert found == {"_SEEN", "_LIST", "_ORDER", "_KEPT", "_SEEN_TOO", "slow"}


def _calls() -> dict:
    sx = np.array([[0.0, 1.0], [1.0, 0.0]])
    sz = np.diag([1.0, -1.0])
    sm = np.array([[0.0, 1.0], [0.0, 0.0]])
    hamiltonian = hierax.Cos(1.3) * sx + 0.5 * sz
    psi, rho = np.array([1.0, 0.0]), np.diag([0.2, 0.8]).astype(complex)
    times = np.linspace(0.0, 2.0, 3)
    options = hierax.TaylorOptions(rtol=1e-7, atol=1e-9)
    dense = hierax.sesolve(hamiltonian, psi, times, dense=True)
    return {
        "sesolve": lambda: hierax.sesolve(hamiltonian, psi, jnp.asarray(times)).states,
        "sesolve c64": lambda: (
            hierax.sesolve(
                hamiltonian, psi.astype(np.complex64), times.astype(np.float32)
            ).states
        ),
        "sesolve rebuilt": lambda: (
            hierax.sesolve(
                hierax.Cos(1.3) * sx + 0.5 * sz, psi, times, rtol=1e-6
            ).states
        ),
        "sesolve adjoint": lambda: (
            hierax.sesolve(
                hamiltonian, psi, times, adjoint=diffrax.DirectAdjoint()
            ).states
        ),
        "sesolve dt": lambda: hierax.sesolve(sz + 0.3 * sx, psi, times, dt=0.1).states,
        "mesolve": lambda: hierax.mesolve(hamiltonian, [0.6 * sm], rho, times).states,
        "mesolve stacked": lambda: (
            hierax.mesolve(
                hamiltonian, np.stack([0.6 * sm, 0.2 * sz]), rho, times, options=options
            ).states
        ),
        "evaluate": lambda: dense.evaluate(np.array([0.3, 1.7])),
        "hierarchy": lambda: hierax.HeisenbergHierarchy(hamiltonian, sx, 4)(0.3),
        "cos": lambda: hierax.Cos(1.0)(0.3),
    }


def _run(calls: dict) -> dict:
    return {
        name: np.asarray(jax.block_until_ready(call())) for name, call in calls.items()
    }


@pytest.mark.filterwarnings("ignore:Complex dtype support")
def test_clearing_every_cache_between_two_calls_gives_the_same_answer():
    calls = _calls()
    first = _run(calls)
    again = _run(calls)  # from the caches
    assert sum(len(c) for c in _cache.CACHES.values()) > 0
    _cache.clear()
    assert all(len(c) == 0 for c in _cache.CACHES.values())
    cleared = _run(calls)
    for name, value in first.items():
        assert value.dtype == again[name].dtype == cleared[name].dtype, name
        assert np.array_equal(value, again[name]), name
        assert np.array_equal(value, cleared[name]), name
