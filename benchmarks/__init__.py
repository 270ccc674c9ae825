"""hierax's benchmark suite: `python -m benchmarks run NAME|all [--quick] [--device]`.

Every script also runs on its own (`python benchmarks/bench_x.py`) and imports its
siblings by their plain names (`from timing import ...`); the runner starts each in a
process of its own, so the package never imports a script.
"""
