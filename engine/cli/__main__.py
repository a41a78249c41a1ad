"""`python -m prebake.engine.cli`: the same as the `prebake` console script."""

from prebake.engine.cli import entry

entry()
