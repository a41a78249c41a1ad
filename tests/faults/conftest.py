"""The fault-injection suite: crashes, a hostile registry, a full disk (tests/support/scenarios.py
counts them and re-checks every registry and store a scenario registered)."""

from __future__ import annotations

import pytest

from prebake.registry.file import FileRegistry
from tests.support.bundles import Bundle, make_bundle
from tests.support.scenarios import Scenario


@pytest.fixture(autouse=True)
def _checked(scenario: Scenario) -> Scenario:
    """Every test here is a scenario: its registries and stores are re-verified when it ends."""
    return scenario


# -- shared pieces ---------------------------------------------------------------------------


@pytest.fixture
def published(tmp_path, scenario) -> tuple[FileRegistry, Bundle]:
    """A file registry holding one bundle (256 KiB payload), registered for re-verification."""
    registry = FileRegistry(tmp_path / "registry")
    bundle = make_bundle(tmp_path / "bake", payload_bytes=256 << 10)
    registry.publish(bundle.manifest, bundle.blob)
    scenario.registry(registry, bundle.manifest)
    return registry, bundle
