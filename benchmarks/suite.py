"""The registry of the benchmark suite: every script the runner knows, by short name.

A script stays a plain program (`python benchmarks/bench_x.py ...`); this table says
how the runner calls it: which arguments its quick mode takes, how it writes its own
JSON (a file or a folder after `--out`, or only text on stdout), and whether it runs
on an accelerator. Every script hands its results to the runner as rows
(`rows.emit`), whatever it prints.
"""

import dataclasses
import pathlib
from typing import Literal


HERE = pathlib.Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One script of the suite.

    - `name`: the short name the runner takes (`python -m benchmarks run NAME`).
    - `script`: its file name in `benchmarks/`.
    - `quick`: the arguments of its quick mode (`--quick` where the script has one,
      smaller counts where it has not).
    - `out`: `"file"` when `--out PATH` writes one JSON file, `"folder"` when
      `--out DIR` writes its files into DIR, `None` when it only prints.
    - `device`: whether it runs on an accelerator (the others force 64-bit
      references and run on the CPU only).
    """

    name: str
    script: str
    quick: tuple[str, ...] = ()
    out: Literal["file", "folder"] | None = None
    device: bool = False

    @property
    def path(self) -> pathlib.Path:
        return HERE / self.script


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("accuracy", "accuracy.py", ("--order", "8")),
        Benchmark("contexts", "bench_contexts.py", ("--repeats", "3")),
        Benchmark("devices", "bench_devices.py", ("--quick",), "file", device=True),
        Benchmark("floquet", "bench_floquet.py", ("--quick",)),
        Benchmark("gradient_compile", "bench_gradient_compile.py", ("--repeats", "1")),
        Benchmark("hierarchies", "bench_hierarchies.py", ("--quick",), "folder"),
        Benchmark("interop", "bench_interop.py", ("--repeats", "20"), "folder"),
        Benchmark("mesolve", "bench_mesolve.py", ("--quick",), "file"),
        Benchmark("open_systems", "bench_open_systems.py", ("--quick",), "file"),
        Benchmark("open_sweeps", "bench_open_sweeps.py", ("--quick",), "file"),
        Benchmark("overhead", "bench_overhead.py", ("--calls", "30")),
        Benchmark("pauli", "bench_pauli.py", ("--quick",), "file"),
        Benchmark("pulse_gradients", "bench_pulse_gradients.py", ("--quick",), "file"),
        Benchmark("seed_calls", "bench_seed_calls.py", ("--rounds", "1")),
        Benchmark("sesolve", "bench_sesolve.py", ("--quick",), "file"),
        Benchmark("sweeps", "bench_sweeps.py", ("--quick",), "file"),
        Benchmark("short_solves", "bench_short_solves.py", ("--calls", "30")),
        Benchmark("sparse", "bench_sparse.py", ("--quick",), "folder"),
        Benchmark("stress", "stress.py", ("--order", "12")),
        Benchmark("systems", "bench_systems.py", ("--quick",), "file"),
        Benchmark("taylor", "bench_taylor.py", ("--quick",), "file"),
        Benchmark(
            "traced_parameters", "bench_traced_parameters.py", ("--repeats", "3")
        ),
    )
}


# Scripts in benchmarks/ that the suite does not run yet (a script being written):
# the registry test lets them be, and they join the suite's rules (one clock, rows
# for the runner) when they are registered above.
UNREGISTERED: dict[str, str] = {}
