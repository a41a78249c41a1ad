"""The operations suite: prebake in the hands of operators, cron jobs and impatient clients.

Each test is one scenario, run as an operator would: real `prebake` processes on a real store
and a real registry (a folder, or S3 through moto's server and a fault proxy). It is counted in
the fault suite's summary line (tests/support/scenarios.py) as the "operations" group, and every
registry and store it registered is re-checked when it ends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.once import once_per_run
from tests.support.s3_fixtures import bucket, moto
from tests.support.scenarios import Scenario

__all__ = ["bucket", "moto"]  # shared with tests/faults


@pytest.fixture(autouse=True)
def _checked(scenario: Scenario) -> Scenario:
    return scenario


@pytest.fixture(scope="session")
def baked(tmp_path_factory):
    """A registry holding a small eager recipe's buckets and autotune, written back by a first
    `prebake serve --eager --write-back` (about a minute, once a run, whichever worker asks first:
    tests/support/once.py): later servers load them, none writes to it."""
    return Baked(once_per_run(tmp_path_factory, "operations-baked", _write_back))


def _write_back(root: Path) -> None:
    from tests.support.api_server import write_api_recipe
    from tests.support.serving import ServeProcess, serve_env

    recipes = write_api_recipe(root / "recipes", OPS_MODEL)
    (root / "registry").mkdir()
    first = ServeProcess(
        ["--model", OPS_MODEL, "--eager", "--registry", str(root / "registry"), "--write-back"],
        {**serve_env(root / "home", recipes), "PREBAKE_WRITE_BACK": "index"},  # a test's own registry: no review
    )
    try:
        first.wait_ready(600)
    finally:
        first.stop()
    assert "write-back" in first.log and "failed" not in first.log.split("write-back", 1)[1][:400], first.log


OPS_MODEL = "ops-test"


class Baked:
    def __init__(self, root: Path):
        self.registry, self.recipes = root / "registry", root / "recipes"

    def serve(self, home, *args: str, **env: str):
        """A `prebake serve --eager` of the baked recipe from a fresh store `home`, started (not yet ready)."""
        from tests.support.serving import ServeProcess, serve_env

        return ServeProcess(
            ["--model", OPS_MODEL, "--eager", "--registry", str(self.registry), "--on-miss", "fail", *args],
            serve_env(home, self.recipes, **env),
        )
