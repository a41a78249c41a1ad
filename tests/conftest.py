"""Hooks for the whole suite: the scenario tally of tests/faults and tests/operations
(tests/support/scenarios.py), the grouping of tests onto pytest-xdist workers
(tests/support/xdist_groups.py), and no silent skip under CI=true (tests/support/ci_skips.py)."""

from tests.support.ci_skips import pytest_runtest_makereport
from tests.support.scenarios import pytest_configure, scenario
from tests.support.xdist_groups import (
    pytest_collection_modifyitems,
    pytest_xdist_auto_num_workers,
    pytest_xdist_make_scheduler,
)

__all__ = [
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_runtest_makereport",
    "pytest_xdist_auto_num_workers",
    "pytest_xdist_make_scheduler",
    "scenario",
]
