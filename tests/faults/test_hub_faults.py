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

from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.ports.errors import RegistryError, RegistryUnavailable
from tests.faults.checks import store_problems
from tests.faults.fault_proxy import Fault, fault_proxy
from tests.faults.procs import unbounded
from tests.support.hub_server import hub_server
from tests.support.ports import free_port


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


@pytest.mark.parametrize(
    ("method", "status"),
    [("GET", 429), ("GET", 503), ("HEAD", 503)],
    ids=["download-429", "download-503", "metadata-503"],
)
def test_a_hub_asking_to_retry_after_two_seconds_is_waited_for_then_read(
    tmp_path, in_force, hub, scenario, method, status
):
    """huggingface_hub waits for a download's 429 (Retry-After and 1 s more); prebake waits for the rest:
    a download's 503 and the metadata HEAD's answers, which huggingface_hub does not retry."""
    asked = 2.0
    hub.proxy.inject(Fault(method, "/blobs/", f"busy{status}", seconds=asked, times=1))
    store = unbounded(scenario.store(tmp_path / "home"))
    got = in_force.fetch(store, hub.registry, hub.bundle.manifest.the_key())
    statuses, answered = hub.proxy.statuses(method, "/blobs/"), hub.proxy.answered_at(method, "/blobs/")
    assert not isinstance(got, Miss), got
    assert statuses[0] == status and statuses[1] == 200, statuses
    waited = answered[1] - answered[0]
    assert waited >= asked - 0.05, f"asked to wait {asked} s, asked again after {waited:.2f} s"
    assert store_problems(store.home) == []


def test_an_index_entry_sent_without_end_is_refused_before_it_is_read_whole(tmp_path, in_force, hub, scenario):
    """The HEAD announces the entry's true size; the GET then sends a body without end (at most 1 GiB):
    the download is refused while it comes, not once huggingface_hub has written it all to the cache."""
    from prebake.artifacts.ports.errors import BlobSizeMismatch

    hub.proxy.inject(Fault("GET", "/index/", "huge200"))
    started = time.monotonic()
    with pytest.raises(BlobSizeMismatch, match="sent over"):
        hub.registry.lookup("graphs", hub.bundle.manifest.key_digest)
    assert time.monotonic() - started < 30
    # the proxy counts what it wrote into the socket, 10 MiB reads and loopback buffers ahead of the client
    assert hub.proxy.bytes_sent("/index/") < 256 << 20, "the endless body was read on past its bound (1 GiB)"
    assert not [p for p in (tmp_path / "hf-cache").rglob("*") if p.is_file() and p.stat().st_size > 32 << 20]


def test_a_blob_redirected_to_another_host_reaches_it_without_the_hub_token(
    tmp_path, in_force, hub, stand_in, scenario
):
    """The Hub sends LFS and Xet downloads to a CDN on another host: the token stays with the Hub."""
    with fault_proxy(stand_in.url) as storage:
        hub.proxy.inject(Fault("GET", "/blobs/", "redirect", to=storage.url))
        store = unbounded(scenario.store(tmp_path / "home"))
        got = in_force.fetch(store, hub.registry, hub.bundle.manifest.the_key())
        at_storage = storage.credentials("GET", "/blobs/")
    assert not isinstance(got, Miss), got
    assert any("hf_faults_token" in c for c in hub.proxy.credentials("GET", "/index/")), "the token was never sent"
    assert at_storage, "the redirect was not followed"
    assert at_storage == [""] * len(at_storage), f"the Hub token reached the storage host: {at_storage}"
    assert store_problems(store.home) == []
