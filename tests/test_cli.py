"""The `hierax` command and the seed problem's reference implementations.

Commands that run JAX computations run in a subprocess (`python -m hierax`), so that
their configuration (x64 on or off) cannot leak into the other tests; argument
handling is tested in-process through `main(argv)`.
"""

import json
import pathlib
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import hierax
from hierax import _cli, _seed


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hierax", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# The values the seed question's record states at t = 1 (X_k top row, x64): an
# oracle independent of both hierax and the reference implementations here.
_SEED_EXACT = {
    2: (-1.682941969615793, -1.1677063269057155),
    9: (-15540.999433741366, 9987.578125605485),
}
_SEED_OFFERED = {2: (0.0, -1.167706), 9: (2.009099, 0.0)}


def test_naive_recursion_matches_seed_record_and_hierax():
    naive = _seed.make_naive_recursion()
    t = jnp.asarray(1.0, complex)
    levels = hierax.HeisenbergHierarchy(
        hierax.Cos() * _seed.pauli_y(), _seed.pauli_x(), 9
    )(1.0)
    np.testing.assert_allclose(levels[2][0], _SEED_EXACT[2], rtol=1e-14)
    np.testing.assert_allclose(levels[9][0], _SEED_EXACT[9], rtol=1e-14)
    for k in range(5):
        np.testing.assert_allclose(naive(t, k), levels[k], rtol=1e-13, atol=1e-13)


def test_offered_scan_drops_the_derivative():
    offered = _seed.make_offered_scan(9)(jnp.asarray(1.0, complex))
    assert offered.shape == (10, 2, 2)
    np.testing.assert_allclose(offered[2][0], _SEED_OFFERED[2], atol=1e-6)
    np.testing.assert_allclose(offered[9][0], _SEED_OFFERED[9], atol=1e-6)
    # Without the derivative term every level is i[H(t), X_{k-1}] of the one below.
    h = jnp.cos(1.0) * _seed.pauli_y()
    for k in range(1, 10):
        expected = 1j * (h @ offered[k - 1] - offered[k - 1] @ h)
        np.testing.assert_allclose(offered[k], expected, rtol=1e-14, atol=1e-14)


def test_relative_difference():
    assert _seed.relative_difference(np.ones(2), np.ones(2)) == 0.0
    assert _seed.relative_difference(np.array([1.0, 3.0]), np.array([1.0, 2.0])) == 0.5
    assert _seed.relative_difference(np.array([1e-3]), np.zeros(1)) == 1e-3


def test_format_helpers():
    assert _cli.format_matrix(np.array([[0, 1], [1, 0]], complex)) == "[[0, 1], [1, 0]]"
    assert _cli.format_matrix(np.array([[1j, 0], [0, 2]])) == "[[0+1j, 0], [0, 2]]"
    assert _cli._format_levels([]) == "none"
    assert _cli._format_levels([2, 3, 4, 7]) == "2..4, 7"


def test_help(capsys):
    for argv in ([], ["seed"], ["bench"]):
        with pytest.raises(SystemExit) as exit_info:
            _cli.main([*argv, "--help"])
        assert exit_info.value.code == 0
        assert "usage: hierax" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["seed", "--order", "-1"], "non-negative integer"),
        (["seed", "--order", "abc"], "non-negative integer"),
        (["seed", "--naive-order", "2.5"], "non-negative integer"),
        (["seed", "--t", "nan"], "finite number"),
        (["seed", "--order", "3", "--naive-order", "4"], "exceeds --order"),
        (["seed", "--unknown"], "unrecognized arguments"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
        (["bench", "--quick", "extra"], "unrecognized arguments"),
    ],
)
def test_argument_errors_exit_2_with_usage(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: hierax" in err
    assert message in err


def test_path_errors_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(["seed", "--json", str(tmp_path)])
    assert exit_info.value.code == 2
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(["bench", "--out", str(file)])
    assert exit_info.value.code == 2
    assert "not a directory" in capsys.readouterr().err


def test_argument_error_in_subprocess_has_no_traceback():
    result = _run("seed", "--order", "-1")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: hierax seed")
    assert "Traceback" not in result.stderr + result.stdout


def test_console_script_is_installed():
    script = shutil.which("hierax", path=str(pathlib.Path(sys.executable).parent))
    if script is None:
        pytest.skip("the `hierax` console script is not installed in this environment")
    result = subprocess.run(
        [script, "--version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert result.stdout.startswith("hierax ")


def test_seed_quick_run_agrees_and_writes_json(tmp_path):
    path = tmp_path / "out" / "seed.json"
    result = _run("seed", "--order", "4", "--naive-order", "2", "--json", str(path))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "OK" in result.stdout
    assert "X_4 = " in result.stdout
    record = json.loads(path.read_text())
    assert record["agree"] is True
    assert record["order"] == 4 and record["naive_order"] == 2 and record["x64"]
    assert [row["k"] for row in record["naive"]] == [0, 1, 2]
    assert all(row["relative_difference"] <= 1e-12 for row in record["naive"])
    assert record["offered_scan"]["wrong"] == [False, False, True, True, True]
    levels = np.array(record["levels"]["real"]) + 1j * np.array(
        record["levels"]["imag"]
    )
    assert levels.shape == (5, 2, 2)
    np.testing.assert_allclose(levels[2][0], _SEED_EXACT[2], rtol=1e-14)
    assert record["hierax_first_call_seconds"] > 0
    assert record["hierax_steady_state_seconds"] > 0


def test_seed_float32_run_agrees(tmp_path):
    path = tmp_path / "seed32.json"
    result = _run(
        "seed", "--order", "3", "--naive-order", "3", "--no-x64", "--json", str(path)
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(path.read_text())
    assert record["x64"] is False and record["agree"] is True
    assert "complex64" in result.stdout


def test_bench_quick_writes_results(tmp_path):
    out = tmp_path / "bench"
    result = _run("bench", "--quick", "--out", str(out), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["quick"] is True
    compile_part = results["compile"]
    for method in ("naive", "jet", "hierax_closed_form", "hierax_callable"):
        assert compile_part[method], method
    # The first three orders are always measured, whatever the machine's load; the
    # rest depend on timings, so the test demands nothing of them.
    closed_orders = [r["order"] for r in compile_part["hierax_closed_form"]]
    assert closed_orders == compile_part["orders"][: len(closed_orders)]
    assert max(closed_orders) >= 10
    assert results["sizes"]["rows"]
    assert all(r["matmul_equivalents"] > 0 for r in results["sizes"]["rows"])
    assert results["memory"]["output_array_bytes"] == 33 * 256 * 256 * 16
    assert results["targets"]
    markdown = (out / "results.md").read_text()
    assert "## Compile time against the order" in markdown
    assert "| order K |" in markdown
