"""The held-back benchmark systems (`benchmarks/systems.py`): each coefficient's
four forms agree, and hierax's final state agrees with scipy's DOP853 on a short
span of each system; and the suite's registry (`benchmarks/suite.py`) covers every
script, none of which imports a private hierax module or a test."""

import ast
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from benchmarks.suite import BENCHMARKS
from benchmarks.systems import SYSTEMS

import hierax

from .helpers import relative_error


BENCHMARKS_DIR = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


# Spans short enough for a few steps of each system (the benchmark's are longer).
SPANS = {
    "drag": 20.0,
    "pair": 2.0,
    "stirap": 8.0,
    "xxz": 1.0,
    "open_pair": 5.0,
    "random": 2.0,
}


def test_every_system_has_a_span():
    assert set(SPANS) == set(SYSTEMS)


@pytest.mark.parametrize("key", sorted(SYSTEMS))
def test_coefficient_forms_agree(key):
    """hierax's time function, the NumPy and JAX functions and the QuTiP string
    (read by Python with NumPy's functions) give the same value."""
    system = SYSTEMS[key](span=SPANS[key])
    functions = {"cos": np.cos, "exp": np.exp}
    for coefficient, _ in system.drives:
        for t in (0.3 * system.span, 0.55 * system.span):
            values = [
                coefficient(t),
                float(coefficient(jnp.asarray(t), jnp)),
                float(coefficient.hierax()(t)),
                eval(coefficient.string(), {**functions, "t": t}),
            ]
            np.testing.assert_allclose(values, values[0], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("key", sorted(SYSTEMS))
def test_hierax_agrees_with_dop853(key):
    system = SYSTEMS[key](span=SPANS[key])
    times = jnp.asarray(system.times)
    if system.is_open:
        out = hierax.mesolve(
            system.hamiltonian(),
            [jnp.asarray(j) for j in system.jumps],
            jnp.asarray(system.rho()),
            times,
            rtol=1e-6,
            atol=1e-8,
        )
    else:
        out = hierax.sesolve(
            system.hamiltonian(), jnp.asarray(system.state), times, rtol=1e-6, atol=1e-8
        )
    reference = system.reference(rtol=1e-11, atol=1e-12)
    assert relative_error(out.states[-1], reference) < 1e-5


# --- the suite's registry (`benchmarks/suite.py`): no benchmark is run here ---


def _benchmark_scripts() -> list[pathlib.Path]:
    return sorted(BENCHMARKS_DIR.glob("*.py"))


def test_registry_covers_every_bench_script():
    scripts = {p.name for p in BENCHMARKS_DIR.glob("bench_*.py")}
    registered = {b.script for b in BENCHMARKS.values()}
    assert scripts, "no bench_*.py found"
    assert scripts <= registered, sorted(scripts - registered)
    for benchmark in BENCHMARKS.values():
        assert benchmark.path.is_file(), benchmark.script


def test_registry_arguments_are_the_scripts_own():
    """Every flag the runner passes (quick mode, `--out`) is one the script parses."""
    for benchmark in BENCHMARKS.values():
        source = benchmark.path.read_text(encoding="utf-8")
        flags = [a for a in benchmark.quick if a.startswith("--")]
        flags += ["--out"] if benchmark.out else []
        for flag in flags:
            assert f'"{flag}"' in source, (benchmark.name, flag)


def _imported(path: pathlib.Path) -> list[str]:
    """Every module `path` imports, `from m import n` giving both `m` and `m.n`."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_no_benchmark_imports_private_hierax_or_tests():
    for path in _benchmark_scripts():
        for name in _imported(path):
            parts = name.split(".")
            private = parts[0] == "hierax" and any(p.startswith("_") for p in parts)
            assert not private, f"{path.name} imports {name}"
            assert parts[0] != "tests", f"{path.name} imports {name}"
        source = path.read_text(encoding="utf-8")
        assert 'importlib.import_module("hierax._' not in source, path.name
