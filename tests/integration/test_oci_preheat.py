"""`prebake preheat`: each bundle pulled through a pull-through mirror once, so nodes after cost the
origin no blob bytes. Two real docker-registry processes on loopback (an origin, and a mirror with
`proxy.remoteurl` pointing at it through the fault proxy, which counts what the origin sends)."""

from __future__ import annotations

import json
import uuid

import pytest

from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.fetch.pipeline import fetch_key
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.settings import StoreLimits
from prebake.engine.cli import main
from tests.faults.fault_proxy import fault_proxy
from tests.support.bundles import make_bundle
from tests.support.oci_server import oci_available, oci_server

pytestmark = pytest.mark.skipif(not oci_available(), reason="docker-registry is needed (apt-get; .ci/run does)")


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """(origin registry, the origin's byte counter, the mirror's address), the environment set."""
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings

    for name in ("PREBAKE_OCI_CA_BUNDLE", "PREBAKE_OCI_USERNAME", "DOCKER_CONFIG", "PREBAKE_OCI_CHUNK_MB"):
        monkeypatch.delenv(name, raising=False)
    repo = f"team/p{uuid.uuid4().hex[:10]}"
    with (
        oci_server(tmp_path / "origin") as origin,
        fault_proxy(origin.url) as counted,
        oci_server(tmp_path / "mirror", proxy_of=counted.url) as mirror,
    ):
        monkeypatch.setenv("PREBAKE_OCI_PLAIN_HTTP", mirror.host)
        monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
        direct = OCIRegistry(origin.address(repo), OCISettings(plain_http=(origin.host,), settle_s=0.1))
        yield direct, counted, mirror.address(repo)


def _preheat(mirror: str, capsys, *extra: str) -> dict:
    assert main(["preheat", "--mirror", mirror, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_after_a_preheat_a_node_through_the_mirror_costs_the_origin_no_blob_bytes(fleet, tmp_path, capsys):
    from prebake.registry.oci import OCIRegistry

    direct, counted, mirror = fleet
    bundle = make_bundle(tmp_path / "bake", payload_bytes=3 << 20)
    direct.publish(bundle.manifest, bundle.blob)
    direct.put_side(bundle.manifest.blob.digest, "provenance.json", b'{"signed": "elsewhere"}')

    (done,) = _preheat(mirror, capsys)["bundles"]
    assert done["pulled"] is True and done["side_files"] == 1 and done["key_digest"] == bundle.manifest.key_digest
    assert counted.bytes_sent("/blobs/") >= bundle.manifest.blob.size, "the preheat pulled the blob from the origin"

    before = counted.bytes_sent("/blobs/")
    node = Store(tmp_path / "node", StoreLimits())
    through = OCIRegistry(mirror)
    assert not isinstance(fetch_key(node, through, bundle.manifest.the_key()), Miss)
    assert through.get_side(bundle.manifest.blob.digest, "provenance.json") == b'{"signed": "elsewhere"}'
    assert counted.bytes_sent("/blobs/") == before, "the node's blob and side file came from the mirror alone"


def test_a_second_preheat_pulls_nothing_and_keys_pick_the_bundles(fleet, tmp_path, capsys):
    direct, counted, mirror = fleet
    one = make_bundle(tmp_path / "one", model="one", payload_bytes=64 << 10)
    two = make_bundle(tmp_path / "two", model="two", payload_bytes=64 << 10)
    for b in (one, two):
        direct.publish(b.manifest, b.blob)

    (first,) = _preheat(mirror, capsys, "--key", one.manifest.key_digest[:12])["bundles"]
    assert first["key_digest"] == one.manifest.key_digest and first["pulled"] is True
    before = counted.bytes_sent("/blobs/")
    again = _preheat(mirror, capsys)["bundles"]
    assert {b["key_digest"]: b["pulled"] for b in again} == {
        one.manifest.key_digest: False,
        two.manifest.key_digest: True,
    }
    assert counted.bytes_sent("/blobs/") - before >= two.manifest.blob.size


def test_preheat_refuses_a_mirror_that_is_not_an_oci_registry(tmp_path, capsys):
    (tmp_path / "folder").mkdir()
    assert main(["preheat", "--mirror", str(tmp_path / "folder")]) != 0
    assert "oci://HOST/NAMESPACE/REPO" in capsys.readouterr().err
