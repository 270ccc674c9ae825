"""The `hierax` command: the seed demo (the project's main job) and the benchmarks.

An application corner of its own: the library never imports it (`import hierax` does
not load this package), and each subcommand imports only what it runs, so that
`hierax seed` never loads the benchmarks or `jax.experimental.jet`. Unlike the
library, the command sets JAX configuration (x64).

- `_main.py`: the argument parser, argument checks and dispatch.
- `_seed.py`: `hierax seed`, the demo.
- `_reference.py`: the seed question's recursion and the answer it was offered,
  written as they were, to run beside [`hierax.HeisenbergHierarchy`][].
- `_timing.py`: wall-clock helpers shared by both subcommands.
- `_bench.py`, `_memory.py`: `hierax bench`, loaded only when it runs.
"""

from ._main import main as main
