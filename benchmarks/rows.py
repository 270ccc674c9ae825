"""The one shape of every benchmark's results: rows, each one measured number.

A row is `{"case", "method", "metric", "value", "unit", "parameters"}`: the problem
(a system, a size, a program), who solved it (hierax, a peer, a variant), what was
measured (`seconds`, `first_call_seconds`, `error`, `steps`, `matmul_equivalents`
...), the number (None where the method did not get there), its unit, and the
settings that tell rows of one case apart (`n`, `order`, `rtol` ...). The runner
adds the benchmark's name. Rows with the same case, metric and parameters and
several methods are peers: the report sets each beside the best of them.

A script builds its rows with `row` and hands them over with `emit`: under the
runner (`python -m benchmarks run ...`) they go to the file the runner names in
`HIERAX_BENCHMARK_ROWS`; run alone, set that variable to keep them
(`HIERAX_BENCHMARK_ROWS=rows.json python benchmarks/bench_x.py`).
"""

import json
import math
import os
from typing import Any


ROWS_VARIABLE = "HIERAX_BENCHMARK_ROWS"

# The units of the usual metrics, so that scripts spell them alike.
UNITS = {
    "seconds": "s",
    "first_call_seconds": "s",
    "compile_seconds": "s",
    "error": "",
    "bytes": "B",
}


def _plain(value: Any) -> Any:
    """A JSON-able copy of `value`: NumPy and JAX scalars as Python numbers,
    NaN and infinities as None."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if isinstance(value, int) or (hasattr(value, "dtype") and value.dtype.kind in "iu"):
        return int(value)
    return number if math.isfinite(number) else None


def row(
    case: str,
    method: str,
    metric: str,
    value: Any,
    unit: str | None = None,
    **parameters: Any,
) -> dict[str, Any]:
    """One measured number; `unit` defaults to the metric's usual one (`UNITS`),
    else none."""
    return {
        "case": str(case),
        "method": str(method),
        "metric": metric,
        "value": _plain(value),
        "unit": UNITS.get(metric, "") if unit is None else unit,
        "parameters": {k: _plain(v) for k, v in parameters.items()},
    }


def emit(rows: list[dict[str, Any]]) -> None:
    """Hand `rows` to the runner: written as JSON to the file named by
    `HIERAX_BENCHMARK_ROWS`, if set (else the script's printed report is all)."""
    path = os.environ.get(ROWS_VARIABLE)
    if path:
        with open(path, "w", encoding="utf-8") as file:
            json.dump(rows, file, indent=1)
        print(f"{len(rows)} result rows -> {path}")


def save(results: dict[str, Any], out: str | None) -> None:
    """The end of a script's run: the load after it (`results["load"]`, a list the
    script filled) printed, and `results` written as JSON to `out` when given."""
    print(f"load after: {results['load'][-1]}")
    if out:
        with open(out, "w", encoding="utf-8") as file:
            json.dump(results, file, indent=1, default=float)
