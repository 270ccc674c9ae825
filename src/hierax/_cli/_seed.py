"""`hierax seed`: the seed hierarchy, exact, beside the naive nested-`jacfwd`
recursion it replaces and the popular `lax.scan` rewrite of it, so that speed and
exactness are shown in one run."""

import json
import math
import pathlib
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import hierax

from . import _reference
from ._timing import format_seconds, median_call_time, warm_up


def _print(*parts: Any) -> None:
    # Flushed so that slow rows show up as they finish, even through a pipe.
    print(*parts, flush=True)


def _format_entry(z: complex, scale: float) -> str:
    # Rounding leaves imaginary parts ~1e-16 of the matrix scale on real results;
    # showing them would hide the numbers that matter.
    if abs(z.imag) <= 1e-12 * scale:
        return f"{z.real:.15g}"
    return f"{z.real:.15g}{z.imag:+.15g}j"


def format_matrix(matrix: Any) -> str:
    """A small matrix on one line, e.g. `[[0, 1], [1, 0]]`."""
    matrix = np.asarray(matrix)
    scale = float(np.max(np.abs(matrix))) if matrix.size else 0.0
    rows = (
        "[" + ", ".join(_format_entry(complex(z), scale) for z in row) + "]"
        for row in matrix
    )
    return "[" + ", ".join(rows) + "]"


def format_levels(levels: list[int]) -> str:
    """`[2, 3, 4, 7]` -> `"2..4, 7"`; `"none"` when empty."""
    if not levels:
        return "none"
    runs: list[list[int]] = []
    for k in levels:
        if runs and k == runs[-1][1] + 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    return ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in runs)


def strict_json(value: Any) -> Any:
    """`value` with every non-finite float replaced by the string `"inf"`, `"-inf"`
    or `"nan"`, so that `json.dumps(..., allow_nan=False)` accepts it and any
    strict parser reads the result (`float("-inf")` reads the strings back)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


def run_seed(
    order: int,
    t: float,
    naive_order: int,
    x64: bool,
    json_path: pathlib.Path | None,
) -> int:
    """The seed demo; see `hierax seed --help`. Returns the exit status."""
    # The demo's narrative, printed in the order it is read: one function.
    # Before anything creates an array: the dtype of every constant follows it.
    jax.config.update("jax_enable_x64", x64)
    start = time.perf_counter()
    tolerance = _reference.default_tolerance(x64)
    precision = "x64 (complex128)" if x64 else "float32 (complex64)"
    _print(
        f"hierax seed: H(t) = cos(t) sigma_y, X_0 = sigma_x, t = {t:g}, "
        f"levels 0..{order}, {precision}, jax {jax.__version__} on "
        f"{jax.default_backend()}"
    )
    # Start the backend and the compiler before timing anything, so that neither
    # side pays the process's one-time costs.
    warm_up()

    hierarchy = hierax.HeisenbergHierarchy(
        hierax.Cos() * _reference.pauli_y(), _reference.pauli_x(), order
    )
    tick = time.perf_counter()
    levels = hierarchy(t).block_until_ready()
    hierax_first = time.perf_counter() - tick
    hierax_steady, steady_calls = median_call_time(lambda: hierarchy(t))
    levels = np.asarray(levels)
    _print(f"\nhierax.HeisenbergHierarchy: all {order + 1} levels in one call")
    _print(
        f"  first call (compile + run): {format_seconds(hierax_first)}; "
        f"steady state: {format_seconds(hierax_steady)} per call "
        f"(median of {steady_calls})"
    )

    _print("\nLevels X_k(t) (imaginary parts below 1e-12 of the matrix are not shown):")
    for k, level in enumerate(levels):
        _print(f"  X_{k} = {format_matrix(level)}")

    t_complex = jnp.asarray(t, _reference.complex_dtype())
    offered = np.asarray(_reference.make_offered_scan(order)(t_complex))
    offered_diff = [
        _reference.relative_difference(offered[k], levels[k]) for k in range(order + 1)
    ]
    # Where the exact level overflows the precision there is nothing to compare
    # with: None, not a verdict (a NaN difference would otherwise pass as "ok").
    offered_wrong: list[bool | None] = [
        None if not np.all(np.isfinite(levels[k])) else not d <= tolerance
        for k, d in enumerate(offered_diff)
    ]
    _print(
        "\nA popular fix, the recursion rewritten as a jax.lax.scan over k: fast, "
        "but inside the scan X_{k-1} is a value, not a function of t, so its d/dt "
        "term is always 0 and every level from 2 on is wrong (see 'The seed problem "
        "explained' in the docs). Top row:"
    )
    _print(
        f"  {'k':>3}  {'exact X_k[0,0]':>22}  {'exact X_k[0,1]':>22}  "
        f"{'scan [0,0]':>22}  {'scan [0,1]':>22}"
    )
    for k in range(order + 1):
        flag = {True: "WRONG", False: "ok", None: "n/a"}[offered_wrong[k]]
        cells = [levels[k][0, 0], levels[k][0, 1], offered[k][0, 0], offered[k][0, 1]]
        scale = float(np.max(np.abs(levels[k])))
        text = "  ".join(f"{_format_entry(complex(c), scale):>22}" for c in cells)
        _print(f"  {k:>3}  {text}  {flag}")
    wrong_levels = [k for k, w in enumerate(offered_wrong) if w]
    _print(f"  wrong at levels: {format_levels(wrong_levels)}")
    overflowed = [k for k, w in enumerate(offered_wrong) if w is None]
    if overflowed:
        _print(
            f"  n/a at levels {format_levels(overflowed)}: the exact level overflows "
            f"{precision}, so there is nothing to compare with"
        )

    _print(
        f"\nThe naive recursion (jit with static k, nested jacfwd), levels "
        f"0..{naive_order} called in turn, each timed compile + run. Speed-up = "
        "naive time for level k / hierax's first call, which compiles one program "
        f"for all levels 0..{order}; cumulative = naive time for levels 0..k "
        "together / the same."
    )
    _print(
        f"  {'k':>3}  {'naive k (s)':>12}  {'naive 0..k (s)':>14}  "
        f"{'speed-up':>9}  {'cumulative':>10}  {'rel. diff':>9}"
    )
    naive = _reference.make_naive_recursion()
    rows = []
    cumulative = 0.0
    for k in range(naive_order + 1):
        tick = time.perf_counter()
        value = naive(t_complex, k).block_until_ready()
        elapsed = time.perf_counter() - tick
        cumulative += elapsed
        diff = _reference.relative_difference(levels[k], value)
        row = {
            "k": k,
            "naive_seconds": elapsed,
            "naive_cumulative_seconds": cumulative,
            "speedup_per_level": elapsed / hierax_first,
            "speedup_cumulative": cumulative / hierax_first,
            "relative_difference": diff,
            "agrees": diff <= tolerance,
        }
        rows.append(row)
        _print(
            f"  {k:>3}  {elapsed:>12.3f}  {cumulative:>14.3f}  "
            f"{row['speedup_per_level']:>8.1f}x  {row['speedup_cumulative']:>9.1f}x  "
            f"{diff:>9.1e}{'' if row['agrees'] else '  DISAGREE'}"
        )

    slow = [row["k"] for row in rows if row["speedup_per_level"] < 1]
    if slow:
        _print(
            f"  Below 1x at levels {format_levels(slow)}: there the naive program is "
            "only a few nested jacfwd calls, cheaper to compile than hierax's single "
            f"program for all {order + 1} levels. Its cost grows about threefold per "
            "level while hierax's stays flat, so the ratio soon passes 1x."
        )
    agree = all(row["agrees"] for row in rows)
    worst = max(row["relative_difference"] for row in rows)
    top = rows[-1]
    _print(
        f"\nAgreement with the naive recursion at levels 0..{naive_order}: largest "
        f"relative difference {worst:.1e} (tolerance {tolerance:.0e}): "
        f"{'OK' if agree else 'FAILED'}"
    )
    _print(
        f"Speed-up at level {naive_order}: {top['speedup_per_level']:.1f}x (naive "
        f"level {naive_order} alone), {top['speedup_cumulative']:.1f}x (naive levels "
        f"0..{naive_order}), against hierax's first call for all levels 0..{order}."
    )
    total = time.perf_counter() - start
    _print(f"Total time: {total:.1f} s")

    if json_path is not None:
        record = {
            "command": "seed",
            "hierax_version": hierax.__version__,
            "order": order,
            "t": t,
            "naive_order": naive_order,
            "x64": x64,
            "tolerance": tolerance,
            "jax_version": jax.__version__,
            "backend": jax.default_backend(),
            "hierax_first_call_seconds": hierax_first,
            "hierax_steady_state_seconds": hierax_steady,
            "hierax_steady_state_calls": steady_calls,
            "levels": {
                "real": np.real(levels).tolist(),
                "imag": np.imag(levels).tolist(),
            },
            "offered_scan": {
                "levels": {
                    "real": np.real(offered).tolist(),
                    "imag": np.imag(offered).tolist(),
                },
                "relative_difference": offered_diff,
                "wrong": offered_wrong,
            },
            "naive": rows,
            "agree": agree,
            "largest_relative_difference": worst,
            "total_seconds": total,
        }
        text = json.dumps(strict_json(record), indent=2, allow_nan=False)
        try:
            json_path.write_text(text + "\n")
        except OSError as error:
            print(
                f"hierax seed: error: cannot write {json_path}: {error}",
                file=sys.stderr,
            )
            return 1
        _print(f"Wrote {json_path}")
    return 0 if agree else 1
