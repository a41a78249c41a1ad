"""A blob of several parts out of an OCI registry: parallel ranged GETs, and what goes wrong with them.

Debian's docker-registry (distribution 2.8) serves Range requests on blobs; the fault proxy in
front of it (tests/faults/fault_proxy.py) cuts, corrupts or fails single parts (`partial=True`),
or hides the Range header as a registry that ignores ranges does. A pull-through mirror that does
not hold a blob yet ignores Range for real (it streams the blob from its upstream whole): the
client falls back to one stream there, and the origin sends the blob once, not once per part.
Parts are 1 MiB here (PREBAKE_OCI_CHUNK_MB=1) so that a 4.5 MiB bundle is five of them.
"""

from __future__ import annotations

import math
import signal
import time
import uuid

import pytest

from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.ports.errors import BlobDigestMismatch, RegistryUnavailable
from tests.faults.checks import store_problems
from tests.faults.fault_proxy import Fault, fault_proxy
from tests.faults.procs import actor, killed, result, unbounded
from tests.support.oci_server import OCIServer, oci_server

ENV = {"PREBAKE_OCI_TIMEOUT_S": "2", "PREBAKE_OCI_MAX_ATTEMPTS": "3", "PREBAKE_OCI_CHUNK_MB": "1"}
PAYLOAD = (4 << 20) + (512 << 10)


@pytest.fixture
def parts(origin: OCIServer, monkeypatch, tmp_path, scenario, in_force):
    """A signed bundle of five parts in a fresh repository, and a fault proxy in front of the server."""
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings

    for name in ("PREBAKE_OCI_CA_BUNDLE", "PREBAKE_OCI_USERNAME", "DOCKER_CONFIG", "PREBAKE_OCI_PARTS"):
        monkeypatch.delenv(name, raising=False)
    repo = f"ranged/r{uuid.uuid4().hex[:10]}"
    direct = OCIRegistry(origin.address(repo), OCISettings(plain_http=(origin.host,), settle_s=0.1))
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=PAYLOAD)
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    with fault_proxy(origin.url) as proxy:
        host = proxy.url.removeprefix("http://")
        for name, value in {**ENV, "PREBAKE_OCI_PLAIN_HTTP": host}.items():
            monkeypatch.setenv(name, value)
        registry = OCIRegistry(f"oci://{host}/{repo}")
        yield _Parts(registry, bundle, proxy, math.ceil(bundle.manifest.blob.size / (1 << 20)), in_force)


class _Parts:
    def __init__(self, registry, bundle, proxy, count, in_force):
        self.registry, self.bundle, self.proxy, self.count = registry, bundle, proxy, count
        self.in_force = in_force

    @property
    def size(self) -> int:
        return self.bundle.manifest.blob.size

    def fetch(self, store):
        """prebake's fetch of the bundle under the policy in force."""
        return self.in_force.fetch(store, self.registry, self.bundle.manifest.the_key())


def _installed(store, parts: _Parts) -> None:
    got = parts.fetch(store)
    assert not isinstance(got, Miss) and store_problems(store.home) == []


def _nothing_installed(store, parts: _Parts) -> None:
    assert store.lookup("graphs", parts.bundle.manifest.key_digest) is None
    assert not list(store.home.glob("trees/*")) and not list(store.home.glob("blobs/sha256/*/*"))
    assert not list(store.home.glob("blobs/sha256/*/.tmp-*")), "the failed download's temporary is gone"


def test_a_blob_of_several_parts_comes_in_ranged_gets_each_byte_once(tmp_path, parts, scenario):
    assert parts.count == 5
    _installed(unbounded(scenario.store(tmp_path / "home")), parts)
    assert parts.proxy.statuses("GET", "/blobs/") == [206] * parts.count, "one ranged GET per part, all honoured"
    assert parts.proxy.bytes_sent("/blobs/") == parts.size, "no byte was sent twice"


def test_a_registry_that_ignores_range_is_read_in_one_stream_not_once_per_part(tmp_path, parts, scenario):
    parts.proxy.inject(Fault("GET", "/blobs/", "ignore-range"))
    _installed(unbounded(scenario.store(tmp_path / "home")), parts)
    assert parts.proxy.statuses("GET", "/blobs/") == [200], "the whole blob, asked for once"
    assert parts.proxy.bytes_sent("/blobs/") == parts.size


def test_a_part_cut_mid_way_resumes_from_the_byte_it_reached(tmp_path, parts, scenario):
    parts.proxy.inject(Fault("GET", "/blobs/", "cut", partial=True, times=2))
    _installed(unbounded(scenario.store(tmp_path / "home")), parts)
    assert parts.proxy.count("GET", "/blobs/") == parts.count + 2, "each cut part asked once more, for its rest"
    assert parts.proxy.bytes_sent("/blobs/") < parts.size + (256 << 10), "a cut part's first half was not sent again"


def test_a_part_that_keeps_breaking_off_is_an_outage_named_not_a_miss(tmp_path, parts, scenario):
    parts.proxy.inject(Fault("GET", "/blobs/", "cut", partial=True))
    store = unbounded(scenario.store(tmp_path / "home"))
    with pytest.raises(RegistryUnavailable, match=parts.registry.url):
        parts.fetch(store)
    _nothing_installed(store, parts)


def test_one_wrong_byte_in_one_part_is_refused_and_nothing_is_installed(tmp_path, parts, scenario):
    parts.proxy.inject(Fault("GET", "/blobs/", "corrupt", partial=True, times=1))
    store = unbounded(scenario.store(tmp_path / "home"))
    with pytest.raises(BlobDigestMismatch, match=parts.bundle.manifest.blob.digest[:20]):
        parts.fetch(store)
    _nothing_installed(store, parts)


def test_500s_on_parts_are_retried_and_a_registry_that_keeps_failing_is_named(tmp_path, parts, scenario):
    store = unbounded(scenario.store(tmp_path / "home"))
    parts.proxy.inject(Fault("GET", "/blobs/", "error500", times=2))
    _installed(store, parts)

    other = unbounded(scenario.store(tmp_path / "other"))
    parts.proxy.inject(Fault("GET", "/blobs/", "error500"))
    with pytest.raises(RegistryUnavailable, match="HTTP 500"):
        parts.fetch(other)
    _nothing_installed(other, parts)


@pytest.mark.parametrize("when", ["mid-parts", "parts-complete"])
def test_a_ranged_fetch_killed_9_leaves_nothing_readable_and_the_rerun_completes(tmp_path, parts, scenario, when):
    """kill -9 while parts are in flight (a real SIGKILL once a MiB has come), or once every part is in and
    checked but the blob not yet renamed into place (PREBAKE_TEST_CRASH_AT): no reader sees a part of it,
    and the next fetch removes the dead one's temporary and installs the bundle."""
    home = scenario.store(tmp_path / "home")
    host = parts.registry.url.removeprefix("oci://").split("/", 1)[0]
    env = {**ENV, "PREBAKE_OCI_PLAIN_HTTP": host}
    args = ["--home", str(home), "--registry", parts.registry.url, "--key", parts.bundle.manifest.key_digest]
    if when == "mid-parts":
        parts.proxy.inject(Fault("GET", "/blobs/", "throttle", seconds=0.01, partial=True))  # ~400 KiB/s a part
        reader = actor("fetch", *args, env=env)
        deadline = time.monotonic() + 60
        while parts.proxy.bytes_sent("/blobs/") < 1 << 20:
            assert time.monotonic() < deadline and reader.poll() is None, "the download never got going"
            time.sleep(0.01)
        reader.send_signal(signal.SIGKILL)
        killed(reader)
        assert parts.proxy.bytes_sent("/blobs/") < parts.size, "killed mid-blob, not after"
        parts.proxy.clear()
    else:
        killed(actor("fetch", *args, env={**env, "PREBAKE_TEST_CRASH_AT": "write:*.tar.zst"}))
    assert parts.proxy.count("GET", "/blobs/") >= 2, "not a ranged fetch"
    store = unbounded(home)
    assert store.lookup("graphs", parts.bundle.manifest.key_digest) is None, "a reader must see nothing"
    assert list(home.glob("blobs/sha256/*/.tmp-*")), "the dead fetch's parts are left under a temporary name"
    assert not list(home.glob("trees/[0-9a-f]*")) and store_problems(home) == []

    assert result(actor("fetch", *args, env=env))["problems"] == []
    assert not list(home.glob("blobs/sha256/*/.tmp-*")), "the rerun removed the dead fetch's temporary"


def test_a_cold_mirror_streams_the_blob_whole_and_a_warm_one_serves_parts(
    tmp_path, origin, monkeypatch, scenario, in_force
):
    """distribution 2.8's pull-through mirror ignores Range for a blob it does not hold yet."""
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings

    repo = f"ranged/m{uuid.uuid4().hex[:10]}"
    bundle = in_force.bundle(tmp_path / "bake", model="mirrored", payload_bytes=PAYLOAD)
    OCIRegistry(origin.address(repo), OCISettings(plain_http=(origin.host,), settle_s=0.1)).publish(
        bundle.manifest, bundle.blob
    )
    with (
        fault_proxy(origin.url) as origin_log,
        oci_server(tmp_path / "mirror", proxy_of=origin_log.url) as mirror,
        fault_proxy(mirror.url) as nodes_log,
    ):
        host = nodes_log.url.removeprefix("http://")
        for name, value in {**ENV, "PREBAKE_OCI_PLAIN_HTTP": host}.items():
            monkeypatch.setenv(name, value)
        through = OCIRegistry(f"oci://{host}/{repo}")
        cold = unbounded(scenario.store(tmp_path / "cold"))
        assert not isinstance(in_force.fetch(cold, through, bundle.manifest.the_key()), Miss)
        assert nodes_log.statuses("GET", "/blobs/") == [200], "the cold mirror ignored Range: one stream"
        assert store_problems(cold.home) == []

        _until_held(mirror, bundle.manifest.blob.digest)
        origin_before = origin_log.bytes_sent("/blobs/")
        warm = unbounded(scenario.store(tmp_path / "warm"))
        assert not isinstance(in_force.fetch(warm, through, bundle.manifest.the_key()), Miss)
        assert nodes_log.statuses("GET", "/blobs/")[1:] == [206] * 5, "the warm mirror serves ranged parts"
        assert origin_log.bytes_sent("/blobs/") == origin_before, "and costs the origin no blob bytes"
        assert store_problems(warm.home) == []


def _until_held(mirror: OCIServer, digest: str, timeout_s: float = 30.0) -> None:
    """Wait until the mirror has stored the blob it pulled (it stores in the background; looking in its
    storage folder asks nothing of the origin, as a probing request to a mirror still cold would)."""
    deadline = time.monotonic() + timeout_s
    while not mirror.blob_file(digest).is_file():
        if time.monotonic() > deadline:
            raise AssertionError(f"the mirror did not store {digest[:23]} within {timeout_s} s")
        time.sleep(0.05)
