"""`python -m hierax`: the same command as the `hierax` console script."""

import sys

from ._cli import main


sys.exit(main())
