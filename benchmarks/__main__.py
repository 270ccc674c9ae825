"""`python -m benchmarks`: the suite's runner (see `benchmarks/runner.py`)."""

import sys

from .runner import main


if __name__ == "__main__":
    sys.exit(main())
