"""`python -m prebake.engine.cli`: the same as the `prebake` console script."""

import sys

from prebake.engine.cli import main

sys.exit(main())
