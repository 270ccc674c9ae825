"""The `hierax` command: the seed demo (the project's main job).

An application corner of its own: the library never imports it (`import hierax` does
not load this package), and each subcommand imports only what it runs, so that
`hierax seed` never loads `jax.experimental.jet`. Unlike the
library, the command sets JAX configuration (x64).

- `_main.py`: the argument parser, argument checks and dispatch.
- `_seed.py`: `hierax seed`, the demo.
- `_reference.py`: the seed question's recursion and the answer it was offered,
  written as they were, to run beside [`hierax.HeisenbergHierarchy`][].
- `_timing.py`: wall-clock helpers (the benchmarks in `benchmarks/` use them too).
"""

from ._main import main as main
