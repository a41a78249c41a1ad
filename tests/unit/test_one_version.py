"""prebake's version, read once from its distribution's metadata, is the one every part reports:
`prebake --version`, the store's mark, the HTTP API's /version (prebake/__init__.py)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import prebake
from prebake.artifacts.store import mark
from prebake.engine.bundled.api import app
from tests.support.baking import REPO


def test_the_version_is_the_installed_distributions_and_every_part_reports_it():
    assert prebake.__version__ == metadata.version("prebake")
    assert mark.release() == f"prebake {prebake.__version__}"
    assert app._version() == prebake.__version__
    done = subprocess.run(
        [sys.executable, "-m", "prebake.engine.cli", "--version"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and prebake.__version__ in done.stdout, done.stdout + done.stderr


def test_a_checkout_never_installed_says_so_and_the_api_still_answers_a_parsable_version(monkeypatch):
    monkeypatch.setattr(prebake, "__version__", prebake.NOT_INSTALLED, raising=False)
    assert mark.release() == f"prebake {prebake.NOT_INSTALLED}"
    assert app._version() == "0+unknown"
