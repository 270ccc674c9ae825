"""The suite's report: Markdown tables generated from the runner's JSON records.

    python -m benchmarks report [RESULTS ...] [--write-readme] [--output FILE]

RESULTS are record files or folders of them; by default the newest record of each
benchmark in `benchmarks/results/`. Each benchmark gets a heading, a line saying
when, where and from what it ran (date, machine, load, versions, commit), and one
table per metric (or several, where parts of a script share no method): a row per
case and parameters, a column per method, and where a row has several methods
timed, each time beside the best of them (`1.0x` is the best). `--write-readme`
puts the report between the markers of `benchmarks/README.md`.

Like the runner, this module never imports JAX or a benchmark script.
"""

import argparse
import json
import pathlib
import re
from collections.abc import Iterable
from typing import Any

from .suite import HERE


RESULTS = HERE / "results"
README = HERE / "README.md"
BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"

# Units read as times: their rows are set beside the fastest method.
TIME_UNITS = {"s"}


def load_records(paths: Iterable[pathlib.Path]) -> list[dict[str, Any]]:
    """The records in `paths` (files, or folders of `*.json` files), the newest of
    each benchmark (by its start time), ordered by benchmark name."""
    files: list[pathlib.Path] = []
    for path in paths:
        files += sorted(path.glob("*.json")) if path.is_dir() else [path]
    newest: dict[str, dict[str, Any]] = {}
    for file in files:
        record = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(record, dict) or "benchmark" not in record:
            continue
        name = record["benchmark"]
        if name not in newest or record.get("started", "") > newest[name].get(
            "started", ""
        ):
            newest[name] = record
    return [newest[name] for name in sorted(newest)]


def format_value(value: Any, unit: str) -> str:
    """A number for a table: times and bytes in a unit that suits them, others to
    three significant digits with their unit; `-` for None."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if unit == "s":
        if value == 0:
            return "0 s"
        if abs(value) < 1e-3:
            return f"{value * 1e6:.1f} us"
        if abs(value) < 1:
            return f"{value * 1e3:.2f} ms"
        return f"{value:.2f} s"
    if unit == "B":
        return f"{value / 2**20:.1f} MiB"
    if isinstance(value, int):
        text = str(value)
    elif value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        text = f"{value:.2e}"
    else:
        text = f"{value:.3g}"
    return f"{text} {unit}" if unit else text


def _parameters(parameters: dict[str, Any]) -> str:
    def show(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)

    return ", ".join(f"{k} {show(v)}" for k, v in parameters.items())


def heading(record: dict[str, Any]) -> str:
    """The line under a benchmark's title: date, mode, machine, load, versions,
    commit, and the exit status where it failed."""
    machine = record.get("machine") or {}
    host = f"{machine.get('machine', '?')}, {machine.get('cpu_count', '?')} CPUs"
    if "backend" in machine:
        host += f", {machine['backend']} ({machine.get('device_kind', '?')})"
    load = record.get("load") or {}

    def loads(values: list[float] | None) -> str:
        return "/".join(f"{v:.2f}" for v in values) if values else "?"

    versions = record.get("versions") or {}
    commit = record.get("commit") or {}
    sha = (commit.get("sha") or "?")[:10]
    parts = [
        (record.get("started") or "?").replace("T", " ").replace("+00:00", " UTC"),
        "quick" if record.get("quick") else "full",
        host,
        f"load {loads(load.get('before'))} before, {loads(load.get('after'))} after",
        ", ".join(f"{k} {v}" for k, v in versions.items() if v),
        f"commit {sha}{' (with local changes)' if commit.get('dirty') else ''}",
    ]
    if record.get("seconds") is not None:
        parts.append(f"{record['seconds']:.0f} s")
    if record.get("returncode"):
        lines = [line for line in (record.get("stdout") or "").splitlines() if line]
        last = f": `{lines[-1].strip()[:200]}`" if lines else ""
        parts.append(f"**exit status {record['returncode']}**{last}")
    return "; ".join(parts)


def table(rows: list[dict[str, Any]]) -> list[str]:
    """One metric's rows as a Markdown table: a line per case and parameters, a
    column per method; times beside the row's fastest (`(1.0x)` is the best)."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lines: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        key = (r["case"], _parameters(r.get("parameters") or {}))
        lines.setdefault(key, {})[r["method"]] = r
    with_parameters = any(p for _, p in lines)
    head = ["case", *(["parameters"] if with_parameters else []), *methods]
    out = [
        "| " + " | ".join(head) + " |",
        "|---|" + ("---|" if with_parameters else "") + "---:|" * len(methods),
    ]
    for (case, parameters), by_method in lines.items():
        timed = [
            r["value"]
            for r in by_method.values()
            if r["unit"] in TIME_UNITS and isinstance(r["value"], (int, float))
        ]
        best = min(timed) if len(timed) > 1 and min(timed) > 0 else None
        cells = [case, *([parameters] if with_parameters else [])]
        for method in methods:
            r = by_method.get(method)
            if r is None:
                cells.append("")
                continue
            cell = format_value(r["value"], r["unit"])
            if best is not None and isinstance(r["value"], (int, float)):
                cell += f" ({r['value'] / best:.1f}x)"
            cells.append(cell)
        out.append("| " + " | ".join(cells) + " |")
    return out


def render_record(record: dict[str, Any], level: int = 3) -> str:
    """A benchmark's section: its title, heading line and one table per metric."""
    title = "#" * level + f" {record['benchmark']} (`{record.get('script', '?')}`)"
    lines = [title, "", heading(record), ""]
    rows = record.get("rows")
    if not rows:
        lines += ["No result rows in this record.", ""]
        return "\n".join(lines)
    metrics: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        metrics.setdefault((r["metric"], r["unit"]), []).append(r)
    for (metric, unit), selected in metrics.items():
        label = metric.replace("_", " ") + (f" ({unit})" if unit else "")
        for group in _by_methods(selected):
            lines += [f"**{label}**", "", *table(group), ""]
    return "\n".join(lines)


def _by_methods(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """`rows` split into tables by the methods their cases share: a case joins the
    first table that has one of its methods, so that cases measured by unrelated
    methods (one part of a script against another) get tables of their own rather
    than one wide table of empty cells."""
    cases: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        cases.setdefault(r["case"], []).append(r)
    groups: list[tuple[set[str], list[dict[str, Any]]]] = []
    for case_rows in cases.values():
        methods = {r["method"] for r in case_rows}
        for shared, group in groups:
            if shared & methods:
                shared |= methods
                group += case_rows
                break
        else:
            groups.append((methods, list(case_rows)))
    return [group for _, group in groups]


def render(records: list[dict[str, Any]], level: int = 3) -> str:
    """The report of `records`, one section each."""
    if not records:
        return "No benchmark records found.\n"
    return "\n".join(render_record(r, level) for r in records)


def write_readme(markdown: str, readme: pathlib.Path = README) -> None:
    """Replace what lies between `BEGIN` and `END` in `readme` by `markdown`."""
    text = readme.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} markers")
    block = f"{BEGIN}\n\n{markdown.strip()}\n\n{END}"
    readme.write_text(pattern.sub(lambda _: block, text), encoding="utf-8")


def add_parser(commands: Any) -> None:
    """The `report` command's arguments, on the runner's subcommands."""
    parser = commands.add_parser(
        "report", help="Markdown tables from the records (the newest of each)"
    )
    parser.add_argument(
        "paths",
        nargs="*",
        type=pathlib.Path,
        metavar="RESULTS",
        help="record files or folders (default benchmarks/results)",
    )
    parser.add_argument(
        "--write-readme",
        action="store_true",
        help="put the report between the markers of benchmarks/README.md",
    )
    parser.add_argument(
        "--output", type=pathlib.Path, help="write the report to a file"
    )


def main(args: argparse.Namespace) -> int:
    records = load_records(args.paths or [RESULTS])
    markdown = render(records)
    if args.write_readme:
        write_readme(markdown)
        print(f"{len(records)} benchmarks -> {README}")
    if args.output:
        args.output.write_text(markdown, encoding="utf-8")
    if not args.write_readme and not args.output:
        print(markdown)
    return 0
