"""A Hub registry that misbehaves, as the S3 and OCI ones do in test_remote_registry_faults.py: down, 500s, cut, short and
wrong bodies, a failing commit. Real huggingface_hub talks real HTTP to the Hub stand-in
(tests/support/hub_server.py) through the fault proxy (tests/faults/fault_proxy.py).

Reading: fetch raises a RegistryError subclass naming the endpoint and the fix, or misses; it
never installs bad bytes. Publishing: a failed commit is loud and leaves no entry. Every bundle is
signed and fetched under the policy in force (tests/faults/in_force.py).
"""

from __future__ import annotations

import time
import uuid

import pytest

from prebake.artifacts.bake.fetch import Miss
from prebake.artifacts.ports.errors import RegistryError, RegistryUnavailable
from tests.faults.checks import store_problems
from tests.faults.fault_proxy import Fault, fault_proxy
from tests.faults.procs import unbounded
from tests.support.hub_server import hub_server
from tests.support.moto_server import free_port


@pytest.fixture(scope="module")
def stand_in():
    with hub_server() as hub:
        yield hub


@pytest.fixture
def hub(stand_in, monkeypatch, tmp_path, scenario, in_force):
    """A fresh repo holding one bundle, the fault proxy in front of the stand-in, HF_ENDPOINT at the proxy."""
    from prebake.registry.backends.hf import HubRegistry

    monkeypatch.setenv("HF_TOKEN", "hf_faults_token")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", stand_in.url)
    address = f"hf://team/faults-{uuid.uuid4().hex[:8]}"
    direct = HubRegistry(address, cache_dir=tmp_path / "direct-cache")
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=256 << 10)
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    with fault_proxy(stand_in.url) as proxy:
        monkeypatch.setenv("HF_ENDPOINT", proxy.url)
        yield _Hub(address, direct, bundle, proxy, HubRegistry(address, cache_dir=tmp_path / "hf-cache"))


class _Hub:
    def __init__(self, address, direct, bundle, proxy, registry):
        self.address, self.direct, self.bundle, self.proxy, self.registry = address, direct, bundle, proxy, registry


def _nothing_installed(store, bundle) -> None:
    assert store.lookup("graphs", bundle.manifest.key_digest) is None
    assert not list(store.home.glob("trees/*")) and not list(store.home.glob("blobs/sha256/*/*"))


def test_a_hub_that_is_down_is_a_clear_error_within_seconds_and_installs_nothing(
    tmp_path, in_force, hub, monkeypatch, scenario
):
    from prebake.registry.backends.hf import HubRegistry

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    store = unbounded(scenario.store(tmp_path / "home"))
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="did not answer"):
        in_force.fetch(
            store, HubRegistry(hub.address, cache_dir=tmp_path / "empty-cache"), hub.bundle.manifest.the_key()
        )
    assert time.monotonic() - started < 30
    _nothing_installed(store, hub.bundle)


def test_http_500s_on_the_blob_are_reported_and_the_next_fetch_recovers(tmp_path, in_force, hub, scenario):
    hub.proxy.inject(Fault("GET", "/blobs/", "error500"))
    store = unbounded(scenario.store(tmp_path / "home"))
    with pytest.raises(RegistryError):
        in_force.fetch(store, hub.registry, hub.bundle.manifest.the_key())
    _nothing_installed(store, hub.bundle)

    hub.proxy.clear()
    got = in_force.fetch(store, hub.registry, hub.bundle.manifest.the_key())
    assert not isinstance(got, Miss) and store_problems(store.home) == []


@pytest.mark.parametrize(
    "fault",
    ["cut", "short", "corrupt"],
    ids=["connection-cut-mid-body", "short-body", "wrong-bytes"],
)
def test_a_bad_blob_body_from_the_hub_is_refused_and_nothing_is_installed(tmp_path, in_force, hub, scenario, fault):
    hub.proxy.inject(Fault("GET", "/blobs/", fault))
    store = unbounded(scenario.store(tmp_path / "home"))
    with pytest.raises(RegistryError) as raised:
        in_force.fetch(store, hub.registry, hub.bundle.manifest.the_key())
    assert "blobs/sha256" in str(raised.value) or hub.bundle.manifest.blob.digest[:20] in str(raised.value)
    _nothing_installed(store, hub.bundle)
    assert not list(store.home.glob("blobs/sha256/*/.tmp-*")), "the failed download's temporary is gone"


def test_a_failing_commit_is_loud_and_leaves_no_entry(tmp_path, in_force, hub, scenario):
    other = in_force.bundle(tmp_path / "bake", model="other", payload_bytes=64 << 10)
    hub.proxy.inject(Fault("POST", "/commit/", "error500"))
    with pytest.raises(RegistryError, match="commit|publish"):
        hub.registry.publish(other.manifest, other.blob)
    assert hub.direct.lookup("graphs", other.manifest.key_digest) is None

    hub.proxy.clear()
    assert hub.registry.publish(other.manifest, other.blob).created is True
    scenario.registry(hub.direct, other.manifest)
