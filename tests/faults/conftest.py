"""The fault-injection suite: crashes, a hostile registry, a full disk (tests/support/scenarios.py
counts them and re-checks every registry and store a scenario registered).

Every scenario here runs under a trust policy (tests/faults/in_force.py): its bundles are signed
with the fleet key, PREBAKE_POLICY names a policy file that trusts only that key (for this process
and, through procs.child_env, every actor and `prebake` child it starts), and the registries it
registers are re-verified under the policy when it ends.
"""

from __future__ import annotations

import pytest

from prebake.registry.backends.file import FileRegistry
from tests.faults.in_force import FleetKey, InForce
from tests.support.bundles import Bundle
from tests.support.s3_fixtures import bucket, moto
from tests.support.scenarios import Scenario

__all__ = ["bucket", "moto"]  # shared with tests/operations


@pytest.fixture(scope="session")
def fleet_key(tmp_path_factory) -> FleetKey:
    return FleetKey.write(tmp_path_factory.mktemp("fleet-key"))


@pytest.fixture(autouse=True)
def in_force(fleet_key, tmp_path_factory, monkeypatch, scenario: Scenario) -> InForce:
    """The policy in force for this scenario (autouse: every scenario here runs under it)."""
    folder = tmp_path_factory.mktemp("policy")
    policy = InForce(fleet_key.policy_file(folder), fleet_key, folder / "home")
    for name, value in policy.env.items():
        monkeypatch.setenv(name, value)
    scenario.under(policy.trust)
    return policy


# -- shared pieces ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    """Debian's docker-registry on plain HTTP, one per test module that asks for it."""
    from tests.support.oci_server import oci_available, oci_server

    if not oci_available():
        pytest.skip("docker-registry is not installed (apt-get install docker-registry; .ci/run does)")
    with oci_server(tmp_path_factory.mktemp("oci")) as server:
        yield server


@pytest.fixture
def published(tmp_path, scenario, in_force) -> tuple[FileRegistry, Bundle]:
    """A file registry holding one signed bundle (256 KiB payload), registered for re-verification."""
    registry = FileRegistry(tmp_path / "registry")
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=256 << 10)
    registry.publish(bundle.manifest, bundle.blob)
    scenario.registry(registry, bundle.manifest)
    return registry, bundle
