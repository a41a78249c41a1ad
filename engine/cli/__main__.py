"""`python -m engine.cli`: the same as the `prebake` console script."""

import sys

from engine.cli import main

sys.exit(main())
