"""The `hierax` command and the seed problem's reference implementations.

Commands that run JAX computations run in a subprocess (`python -m hierax`), so that
their configuration (x64 on or off) cannot leak into the other tests; argument
handling is tested in-process through `main(argv)`. No test here looks at how long
anything took: timings are the benchmarks' business.
"""

import json
import math
import pathlib
import re
import shutil
import subprocess
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest

import hierax
from hierax._cli import _main, _reference, _seed, main

from .helpers import SEED_EXACT, once_per_session, session_folder


ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hierax", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


# What the answer offered to the seed question gives at t = 1 (top row, x64).
_SEED_OFFERED = {2: (0.0, -1.167706), 9: (2.009099, 0.0)}


def test_naive_recursion_matches_seed_record_and_hierax():
    naive = _reference.make_naive_recursion()
    t = jnp.asarray(1.0, complex)
    levels = hierax.HeisenbergHierarchy(
        hierax.Cos() * _reference.pauli_y(), _reference.pauli_x(), 9
    )(1.0)
    np.testing.assert_allclose(levels[2][0], SEED_EXACT[2], rtol=1e-14)
    np.testing.assert_allclose(levels[9][0], SEED_EXACT[9], rtol=1e-14)
    for k in range(5):
        np.testing.assert_allclose(naive(t, k), levels[k], rtol=1e-13, atol=1e-13)


def test_offered_scan_drops_the_derivative():
    offered = _reference.make_offered_scan(9)(jnp.asarray(1.0, complex))
    assert offered.shape == (10, 2, 2)
    np.testing.assert_allclose(offered[2][0], _SEED_OFFERED[2], atol=1e-6)
    np.testing.assert_allclose(offered[9][0], _SEED_OFFERED[9], atol=1e-6)
    # Without the derivative term every level is i[H(t), X_{k-1}] of the one below.
    h = jnp.cos(1.0) * _reference.pauli_y()
    for k in range(1, 10):
        expected = 1j * (h @ offered[k - 1] - offered[k - 1] @ h)
        np.testing.assert_allclose(offered[k], expected, rtol=1e-14, atol=1e-14)


def test_relative_difference():
    difference = _reference.relative_difference
    assert difference(np.ones(2), np.ones(2)) == 0.0
    assert difference(np.array([1.0, 3.0]), np.array([1.0, 2.0])) == 0.5
    assert difference(np.array([1e-3]), np.zeros(1)) == 1e-3


def test_format_helpers():
    assert _seed.format_matrix(np.array([[0, 1], [1, 0]], complex)) == (
        "[[0, 1], [1, 0]]"
    )
    assert _seed.format_matrix(np.array([[1j, 0], [0, 2]])) == "[[0+1j, 0], [0, 2]]"
    assert _seed.format_levels([]) == "none"
    assert _seed.format_levels([2, 3, 4, 7]) == "2..4, 7"


def test_strict_json_writes_non_finite_numbers_as_strings():
    record = {"a": [1.5, -math.inf, [math.nan]], "b": (math.inf, None, True, "x")}
    converted = _seed.strict_json(record)
    assert converted == {"a": [1.5, "-inf", ["nan"]], "b": ["inf", None, True, "x"]}
    text = json.dumps(converted, allow_nan=False)  # raises on any non-finite float
    assert float(json.loads(text)["a"][1]) == -math.inf


def test_help(capsys):
    for argv in ([], ["seed"]):
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "--help"])
        assert exit_info.value.code == 0
        assert "usage: hierax" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["seed", "--order", "-1"], "non-negative integer"),
        (["seed", "--order", "abc"], "non-negative integer"),
        (["seed", "--order", "10001"], "at most 10,000, got 10001"),
        (["seed", "--naive-order", "2.5"], "non-negative integer"),
        (["seed", "--t", "nan"], "finite number"),
        (["seed", "--t", "1e39", "--no-x64"], "does not fit in float32"),
        (["seed", "--order", "3", "--naive-order", "4"], "exceeds --order"),
        (["seed", "--json", ""], "argument --json: expected a path, got ''"),
        (["seed", "--unknown"], "unrecognized arguments"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
        (["bench"], "invalid choice"),  # the benchmarks live in benchmarks/
    ],
)
def test_argument_errors_exit_2_with_usage(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: hierax" in err
    assert message in err


def _path_cases(tmp: pathlib.Path) -> list[tuple[list[str], str]]:
    file = tmp / "file"
    file.write_text("")
    cases = [
        (["seed", "--json", str(tmp)], "is a directory"),
        (["seed", "--json", str(file / "sub.json")], "is not a directory"),
    ]
    if pathlib.Path("/proc/self").is_dir():  # Linux: /proc takes no new entries
        cases += [
            (["seed", "--json", "/proc/hierax-test/x.json"], "cannot be created"),
        ]
    return cases


def test_path_errors_exit_2_with_usage(tmp_path, capsys):
    for argv, message in _path_cases(tmp_path):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"usage: hierax {argv[0]}"), argv
        assert message in err, (argv, err)


def test_output_checks_leave_nothing_behind(tmp_path):
    path = tmp_path / "new" / "seed.json"
    assert _main._file_problem(path) is None
    assert path.parent.is_dir() and not path.exists()
    assert _main._directory_problem(tmp_path / "a" / "b") is None
    assert list((tmp_path / "a" / "b").iterdir()) == []


def test_argument_error_in_subprocess_has_no_traceback():
    """In a real process, an argument error is a usage message and exit status 2
    (every such error is checked in-process above)."""
    result = _run("seed", "--t", "1e39", "--no-x64")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: hierax seed")
    assert "Traceback" not in result.stderr + result.stdout


def test_import_hierax_never_loads_the_cli(seed_run):
    result, _ = seed_run
    assert result.returncode == 0, result.stderr
    assert "IMPORTED []\n" in result.stdout
    # Nor does any library module import it later, lazily.
    library = ROOT / "src" / "hierax"
    for path in library.rglob("*.py"):
        if "_cli" not in path.relative_to(library).parts and path.name != "__main__.py":
            assert not re.search(r"\b_cli\b", path.read_text(encoding="utf-8")), path


def test_console_script_is_installed():
    script = shutil.which("hierax", path=str(pathlib.Path(sys.executable).parent))
    if script is None:
        pytest.skip("the `hierax` console script is not installed in this environment")
    result = subprocess.run(
        [script, "--version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert result.stdout.startswith("hierax ")


# In a fresh process: reports which CLI modules `import hierax` loaded (none), then
# runs `hierax seed` and reports which of the modules it has no use for it loaded.
_SEED_IN_PROCESS = """
import contextlib, io, sys
import hierax
print("IMPORTED", sorted(m for m in sys.modules if m.startswith("hierax._cli")))
from hierax._cli import main
split = sys.argv.index("::")
argv, float32_argv = sys.argv[1:split], sys.argv[split + 1 :]
status = main(argv)
unwanted = ("jax.experimental.jet",)
print("LOADED", sorted(m for m in sys.modules if m in unwanted))
# Then the float32 run (--no-x64) in the same process, its output kept apart.
single = io.StringIO()
with contextlib.redirect_stdout(single):
    float32_status = main(["seed", *float32_argv])
print("FLOAT32", float32_status, repr(single.getvalue()))
sys.exit(status)
"""


@pytest.fixture(scope="session")
def seed_run(tmp_path_factory) -> tuple[types.SimpleNamespace, pathlib.Path]:
    """`_SEED_IN_PROCESS` run once per test session: the finished process
    (`returncode`, `stdout`, `stderr`) and its JSON path (the float32 run's beside
    it, `seed32.json`)."""
    # Order 230 reaches past float64's range: levels from 221 on overflow.
    shared = session_folder(tmp_path_factory)
    path = shared / "seed" / "out" / "seed.json"
    float32 = ("--order", "3", "--naive-order", "3", "--no-x64", "--json")

    def run() -> dict:
        result = _python(
            _SEED_IN_PROCESS,
            *("seed", "--order", "230", "--naive-order", "2", "--json", str(path)),
            "::",
            *float32,
            str(path.with_name("seed32.json")),
        )
        return dict(
            returncode=result.returncode, stdout=result.stdout, stderr=result.stderr
        )

    return types.SimpleNamespace(**once_per_session(shared, "seed-run", run, 300)), path


def test_seed_run_agrees_writes_strict_json_and_loads_no_benchmark(seed_run):
    result, path = seed_run
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "LOADED []" in result.stdout
    assert "OK" in result.stdout
    assert "X_4 = " in result.stdout

    def refuse(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    record = json.loads(path.read_text(), parse_constant=refuse)
    assert record["agree"] is True
    assert record["order"] == 230 and record["naive_order"] == 2 and record["x64"]
    assert [row["k"] for row in record["naive"]] == [0, 1, 2]
    assert all(row["relative_difference"] <= 1e-12 for row in record["naive"])
    levels = np.array(record["levels"]["real"], float) + 1j * np.array(
        record["levels"]["imag"], float
    )
    assert levels.shape == (231, 2, 2)
    np.testing.assert_allclose(levels[2][0], SEED_EXACT[2], rtol=1e-14)
    np.testing.assert_allclose(levels[9][0], SEED_EXACT[9], rtol=1e-14)
    # Where the exact level is finite the offered answer is judged, right at levels
    # 0 and 1 only; where it overflows there is no verdict, and no row says "ok".
    finite = np.all(np.isfinite(levels), axis=(1, 2))
    assert finite[:221].all() and not finite.all()
    wrong = record["offered_scan"]["wrong"]
    assert wrong[:10] == [False, False] + [True] * 8
    assert all((w is None) == (not f) for w, f in zip(wrong, finite, strict=True))
    table = [line.split() for line in result.stdout.splitlines()]
    verdicts = {
        int(row[0]): row[-1]
        for row in table
        if len(row) == 6 and row[0].isdigit() and row[-1] in ("ok", "WRONG", "n/a")
    }
    assert len(verdicts) == 231
    assert all(verdicts[int(k)] == "n/a" for k in np.flatnonzero(~finite))
    assert [k for k, v in verdicts.items() if v == "ok"] == [0, 1]
    assert isinstance(record["hierax_first_call_seconds"], float)


def test_seed_float32_run_agrees(seed_run):
    """`hierax seed --no-x64` (run after the x64 one, in its process)."""
    result, path = seed_run
    assert result.returncode == 0, result.stderr
    [line] = [x for x in result.stdout.splitlines() if x.startswith("FLOAT32 ")]
    status, output = line.removeprefix("FLOAT32 ").split(" ", 1)
    assert status == "0"
    record = json.loads(path.with_name("seed32.json").read_text())
    assert record["x64"] is False and record["agree"] is True
    assert "complex64" in output
