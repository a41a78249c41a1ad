"""Hooks for the whole suite: the scenario tally of tests/faults and tests/operations."""

from tests.support.scenarios import pytest_runtest_makereport, pytest_terminal_summary, scenario

__all__ = ["pytest_runtest_makereport", "pytest_terminal_summary", "scenario"]
