"""The benchmark suite's rules and its report, without running a benchmark.

Rules, read from the sources with `ast`: the registry (`benchmarks/suite.py`) covers
every script; no benchmark imports another benchmark script, a test, a private
hierax module or a private name of a shared helper; only `benchmarks/timing.py`
reads a clock (the runner aside, which times a whole child process) and only it
defines the timing helpers; every registered script hands rows to the runner.
The report (`benchmarks/report.py`) is checked on a small synthetic record.
"""

import ast
import json
import pathlib

import numpy as np
from benchmarks import report, rows, runner
from benchmarks.suite import BENCHMARKS, UNREGISTERED


BENCHMARKS_DIR = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"

# The modules that may read a clock: the one clock, and the runner (which cannot
# import JAX, and times the whole child process).
CLOCK_MODULES = {"timing.py", "runner.py"}
CLOCKS = {
    "perf_counter",
    "perf_counter_ns",
    "time",
    "time_ns",
    "monotonic",
    "monotonic_ns",
    "process_time",
    "process_time_ns",
}
TIMING_HELPERS = {
    "timed",
    "time_call",
    "call_times",
    "median_time",
    "first_call_time",
    "first_and_median",
    "alternating_times",
    "compile_phases",
}


def _sources() -> list[pathlib.Path]:
    """Every module of benchmarks/ but the scripts still being written
    (`suite.UNREGISTERED`), which the rules hold from their registration."""
    return [
        p for p in sorted(BENCHMARKS_DIR.glob("*.py")) if p.name not in UNREGISTERED
    ]


def _tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _imported(path: pathlib.Path) -> list[str]:
    """Every module `path` imports, `from m import n` giving both `m` and `m.n`."""
    names = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def _script_modules() -> set[str]:
    """The module names of the benchmark scripts (registered or not yet)."""
    scripts = {b.script for b in BENCHMARKS.values()} | set(UNREGISTERED)
    scripts |= {p.name for p in BENCHMARKS_DIR.glob("bench_*.py")}
    return {pathlib.Path(s).stem for s in scripts}


# --- the registry ------------------------------------------------------------------


def test_registry_covers_every_bench_script():
    scripts = {p.name for p in BENCHMARKS_DIR.glob("bench_*.py")}
    registered = {b.script for b in BENCHMARKS.values()}
    assert scripts, "no bench_*.py found"
    assert scripts <= registered | set(UNREGISTERED), sorted(scripts - registered)
    assert not registered & set(UNREGISTERED), "registered and unregistered"
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


# --- imports -----------------------------------------------------------------------


def test_no_benchmark_imports_private_hierax_or_tests():
    for path in _sources():
        for name in _imported(path):
            parts = name.split(".")
            private = parts[0] == "hierax" and any(p.startswith("_") for p in parts)
            assert not private, f"{path.name} imports {name}"
            assert parts[0] != "tests", f"{path.name} imports {name}"
        source = path.read_text(encoding="utf-8")
        assert 'importlib.import_module("hierax._' not in source, path.name


def test_no_benchmark_imports_another_script():
    """Shared code lives in the helper modules (timing, rows, peers, systems,
    oracle, work_precision ...), never in a script another one imports."""
    scripts = _script_modules()
    for path in _sources():
        for name in _imported(path):
            top = name.split(".")[0]
            if top != path.stem:
                assert top not in scripts, f"{path.name} imports the script {name}"


def test_no_benchmark_imports_a_private_helper_name():
    helpers = {p.stem for p in _sources()}
    for path in _sources():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module in helpers:
                for alias in node.names:
                    assert not alias.name.startswith("_"), (
                        f"{path.name} imports {node.module}.{alias.name}"
                    )


# --- one clock -----------------------------------------------------------------------


def _clock_reads(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(_tree(path)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "time"
            and node.attr in CLOCKS
        ):
            found.append(f"time.{node.attr} (line {node.lineno})")
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            found += [
                f"from time import {a.name}" for a in node.names if a.name in CLOCKS
            ]
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name == "timeit"]
    return found


def test_only_the_timing_module_reads_a_clock():
    checked = 0
    for path in _sources():
        if path.name in CLOCK_MODULES:
            continue
        assert not _clock_reads(path), (path.name, _clock_reads(path))
        checked += 1
    assert checked > 10


def test_the_clock_check_sees_a_clock(tmp_path):
    """The check above can fail: it finds every way of reading the clock."""
    script = tmp_path / "bench_x.py"
    script.write_text(
        "import time\nfrom time import perf_counter\nimport timeit\n"
        "start = time.perf_counter()\nt = time.monotonic()\n"
    )
    assert len(_clock_reads(script)) == 4


def test_timing_helpers_are_defined_once():
    for path in _sources():
        if path.name == "timing.py":
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.name not in TIMING_HELPERS, (path.name, node.name)


# --- rows for the runner -------------------------------------------------------------


def test_every_registered_script_emits_rows():
    for benchmark in BENCHMARKS.values():
        calls = [
            node
            for node in ast.walk(_tree(benchmark.path))
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "emit"
        ]
        assert calls, f"{benchmark.script} never calls rows.emit"
        assert "rows" in _imported(benchmark.path), benchmark.script


def test_row_is_plain_json():
    made = rows.row(
        "qubit", "hierax", "seconds", np.float64(0.5), n=np.int64(2), rtol=1e-8
    )
    assert made == {
        "case": "qubit",
        "method": "hierax",
        "metric": "seconds",
        "value": 0.5,
        "unit": "s",
        "parameters": {"n": 2, "rtol": 1e-8},
    }
    assert type(made["parameters"]["n"]) is int
    assert rows.row("qubit", "peer", "error", float("nan"))["value"] is None
    assert rows.row("qubit", "peer", "steps", 12)["unit"] == ""
    json.dumps(made)


def test_emit_writes_where_the_runner_reads(tmp_path, monkeypatch):
    path = tmp_path / "rows.json"
    made = [rows.row("qubit", "hierax", "seconds", 0.25)]
    monkeypatch.delenv(rows.ROWS_VARIABLE, raising=False)
    rows.emit(made)
    assert not path.exists()
    monkeypatch.setenv(rows.ROWS_VARIABLE, str(path))
    rows.emit(made)
    read = runner._read_rows(path, "demo")
    assert read == [{"benchmark": "demo", **made[0]}]
    assert runner._read_rows(tmp_path / "missing.json", "demo") is None


# --- the report ----------------------------------------------------------------------


def _record(started: str, seconds: float) -> dict:
    measured = [
        rows.row("qubit", "hierax", "seconds", seconds, n=2),
        rows.row("qubit", "diffrax Dopri8", "seconds", 4 * seconds, n=2),
        rows.row("qubit", "hierax", "error", 3e-9, n=2),
        rows.row("chain", "hierax", "seconds", 2.5, n=64),
    ]
    return {
        "benchmark": "demo",
        "script": "benchmarks/bench_demo.py",
        "quick": True,
        "started": started,
        "machine": {
            "machine": "x86_64",
            "cpu_count": 2,
            "backend": "cpu",
            "device_kind": "cpu",
        },
        "load": {"before": [1.0, 0.5, 0.25], "after": [1.5, 0.75, 0.5]},
        "versions": {"python": "3.11.7", "jax": "0.4.0", "diffrax": None},
        "commit": {"sha": "0123456789abcdef", "dirty": False},
        "seconds": 12.0,
        "returncode": 0,
        "rows": [{"benchmark": "demo", **r} for r in measured],
    }


EXPECTED = """\
### demo (`benchmarks/bench_demo.py`)

2026-12-05 10:00:00 UTC; quick; x86_64, 2 CPUs, cpu (cpu); load 1.00/0.50/0.25 \
before, 1.50/0.75/0.50 after; python 3.11.7, jax 0.4.0; commit 0123456789; 12 s

**seconds (s)**

| case | parameters | hierax | diffrax Dopri8 |
|---|---|---:|---:|
| qubit | n 2 | 2.00 ms (1.0x) | 8.00 ms (4.0x) |
| chain | n 64 | 2.50 s |  |

**error**

| case | parameters | hierax |
|---|---|---:|
| qubit | n 2 | 3.00e-09 |
"""


def test_report_renders_a_record(tmp_path):
    old = _record("2026-12-04T10:00:00+00:00", 1.0)
    new = _record("2026-12-05T10:00:00+00:00", 0.002)
    for name, record in (("demo-old.json", old), ("demo-new.json", new)):
        (tmp_path / name).write_text(json.dumps(record))
    (tmp_path / "notes.json").write_text("[1, 2]")  # not a record: skipped
    records = report.load_records([tmp_path])
    assert len(records) == 1  # the newest record of the benchmark
    assert report.render(records) == EXPECTED


def test_report_formats_values():
    assert report.format_value(None, "s") == "-"
    assert report.format_value(2.5e-5, "s") == "25.0 us"
    assert report.format_value(0.0125, "s") == "12.50 ms"
    assert report.format_value(3 * 2**20, "B") == "3.0 MiB"
    assert report.format_value(12, "") == "12"
    assert report.format_value(1.23456e-9, "") == "1.23e-09"
    assert report.format_value(0.5, "") == "0.5"


def test_report_splits_cases_without_a_shared_method():
    record = _record("2026-12-05T10:00:00+00:00", 1.0)
    record["rows"] += [rows.row("format", "scipy CSR", "seconds", 1e-5, n=2)]
    text = report.render_record(record)
    assert text.count("**seconds (s)**") == 2
    assert (
        "| case | parameters | scipy CSR |\n|---|---|---:|\n| format | n 2 | 10.0 us |"
        in text
    )


def test_report_marks_a_failed_run_and_missing_rows():
    record = {**_record("2026-12-05T10:00:00+00:00", 1.0), "returncode": 1}
    record["rows"] = None
    record["stdout"] = "Traceback (most recent call last):\nNameError: x\n\n"
    text = report.render_record(record)
    assert "**exit status 1**: `NameError: x`" in text
    assert "No result rows" in text


def test_report_replaces_the_readme_block(tmp_path):
    readme = tmp_path / "README.md"
    block = f"{report.BEGIN}\nold table\n{report.END}"
    readme.write_text(f"# Benchmarks\n\nHow to run.\n\n{block}\n\nEnd.\n")
    report.write_readme("| new | table |", readme)
    text = readme.read_text()
    assert "old table" not in text
    assert f"{report.BEGIN}\n\n| new | table |\n\n{report.END}" in text
    assert text.startswith("# Benchmarks\n\nHow to run.") and text.endswith("End.\n")


def test_the_readme_has_the_report_markers():
    text = (BENCHMARKS_DIR / "README.md").read_text(encoding="utf-8")
    assert text.count(report.BEGIN) == 1 and text.count(report.END) == 1
    assert text.index(report.BEGIN) < text.index(report.END)
