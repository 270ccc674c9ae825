"""The suite's runner: each benchmark in a process of its own, and one JSON record
of each run (the machine, its load, the versions, the commit, the command, the
script's result rows and its own files), written to `benchmarks/results/` as
`NAME-YYYYMMDDTHHMMSSZ.json`, which `python -m benchmarks report` reads.

The runner itself never imports JAX: on an accelerator only one process may hold
the device, and that process is the benchmark's.
"""

import argparse
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
from typing import Any

from . import report
from .rows import ROWS_VARIABLE
from .suite import BENCHMARKS, HERE, Benchmark


ROOT = HERE.parent
PACKAGES = ("jax", "jaxlib", "equinox", "diffrax", "hierax")

# Run in a child with the benchmark's environment, so that it reports the device
# the benchmark will see (the runner's own process never imports JAX).
_PROBE = """
import json, jax
device = jax.devices()[0]
print(json.dumps({"backend": jax.default_backend(), "device_kind": device.device_kind,
                  "device_count": jax.device_count()}))
"""


def versions() -> dict[str, str | None]:
    """Python's version and each of `PACKAGES`' installed version (None if absent)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def commit() -> dict[str, Any] | None:
    """The checkout's commit and whether its tracked files differ from it; None
    outside a git checkout."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        return {
            "sha": git("rev-parse", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        }
    except (OSError, subprocess.CalledProcessError):
        return None


def machine(env: dict[str, str]) -> dict[str, Any]:
    """The host (platform, processor, CPU count) and the device JAX sees under
    `env` (backend, device kind and count; an `error` line if JAX cannot start)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
    }
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True
    )
    try:
        info.update(json.loads(probe.stdout.strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError):
        info["error"] = (probe.stderr.strip().splitlines() or ["no output"])[-1]
    return info


def load() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _read_results(folder: pathlib.Path) -> dict[str, Any]:
    """Every JSON file a script wrote into `folder`, by file name."""
    results = {}
    for path in sorted(folder.glob("*.json")):
        try:
            results[path.name] = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            results[path.name] = {"unreadable": str(error)}
    return results


def _read_rows(path: pathlib.Path, name: str) -> list[dict[str, Any]] | None:
    """The rows the script emitted (`rows.emit`), each with `benchmark` set; None
    when it wrote none."""
    try:
        rows = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return [{"benchmark": name, **r} for r in rows]


def run_one(
    benchmark: Benchmark,
    *,
    quick: bool,
    out: pathlib.Path,
    results: pathlib.Path,
    env: dict[str, str],
    host: dict[str, Any],
    command: list[str],
) -> int:
    """Run `benchmark`'s script (its quick arguments if `quick`), its stdout echoed
    as it comes, and write its record to `results/NAME-STAMP.json`; the script's
    own files go to `out/NAME/`. Returns the script's exit status."""
    own = out / benchmark.name
    own.mkdir(parents=True, exist_ok=True)
    rows_path = own / "rows.json"
    rows_path.unlink(missing_ok=True)
    argv = [sys.executable, str(benchmark.path.relative_to(ROOT))]
    if quick:
        argv += list(benchmark.quick)
    if benchmark.out == "file":
        argv += ["--out", str(own / f"{benchmark.name}.json")]
    elif benchmark.out == "folder":
        argv += ["--out", str(own)]
    print(f"== {benchmark.name}: {' '.join(argv[1:])}", flush=True)
    started = datetime.datetime.now(datetime.UTC)
    record: dict[str, Any] = {
        "benchmark": benchmark.name,
        "script": f"benchmarks/{benchmark.script}",
        "quick": quick,
        "command": command,
        "argv": argv[1:],
        "started": started.isoformat(timespec="seconds"),
        "machine": host,
        "load": {"before": load()},
        "versions": versions(),
        "commit": commit(),
    }
    start = time.perf_counter()
    lines = []
    env = {**env, ROWS_VARIABLE: str(rows_path)}
    with subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    record["seconds"] = time.perf_counter() - start
    record["load"]["after"] = load()
    record["returncode"] = child.returncode
    record["rows"] = _read_rows(rows_path, benchmark.name)
    own_files = _read_results(own)
    own_files.pop(rows_path.name, None)
    record["results"] = own_files if benchmark.out else None
    record["stdout"] = "".join(lines)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{benchmark.name}-{started:%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    status = "ok" if child.returncode == 0 else f"exit status {child.returncode}"
    print(f"== {benchmark.name}: {status}, {record['seconds']:.1f} s -> {path}")
    return child.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run hierax's benchmarks, one JSON record per benchmark.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run benchmarks by name, or all of them")
    run.add_argument(
        "names",
        nargs="+",
        metavar="NAME",
        choices=[*BENCHMARKS, "all"],
        help=f"all, or any of: {', '.join(BENCHMARKS)}",
    )
    run.add_argument("--quick", action="store_true", help="each script's quick mode")
    run.add_argument(
        "--device",
        action="store_true",
        help="run the benchmarks that run on an accelerator (on the device JAX "
        "picks) and skip the CPU-only ones; without it every benchmark runs on "
        "the CPU",
    )
    run.add_argument(
        "--results",
        type=pathlib.Path,
        default=report.RESULTS,
        help="the folder of the records (default benchmarks/results)",
    )
    run.add_argument(
        "--out",
        type=pathlib.Path,
        default=HERE / "out",
        help="the folder of the scripts' own files: tables, plots (default "
        "benchmarks/out)",
    )
    commands.add_parser("list", help="the benchmarks' names and scripts")
    report.add_parser(commands)
    args = parser.parse_args(argv)
    if args.command == "report":
        return report.main(args)
    if args.command == "list":
        for b in BENCHMARKS.values():
            where = "accelerator" if b.device else "CPU only"
            print(f"{b.name:<18} benchmarks/{b.script} ({where})")
        return 0
    names = list(BENCHMARKS) if "all" in args.names else list(dict.fromkeys(args.names))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not args.device:
        env.setdefault("JAX_PLATFORMS", "cpu")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    command = ["python", "-m", "benchmarks", *(sys.argv[1:] if argv is None else argv)]
    host = machine(env)
    failed = []
    for name in names:
        benchmark = BENCHMARKS[name]
        if args.device and not benchmark.device:
            print(f"== {name}: skipped, CPU-only (run it without --device)")
            continue
        status = run_one(
            benchmark,
            quick=args.quick,
            out=out,
            results=args.results.resolve(),
            env=env,
            host=host,
            command=command,
        )
        if status != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
        return 1
    return 0
