"""Hostile content on an OCI registry: index entries a hostile or broken pusher left under a bundle's
tag, and blobs that are not what their manifest says. Each is a clean BundleError (or blob
mismatch) in bounded time, verify reports it, and nothing is installed. The bundles are signed and
read under the policy in force (tests/faults/in_force.py): the tampering is what must be refused."""

from __future__ import annotations

import json
import time
import uuid
from typing import ClassVar

import pytest

from prebake.artifacts.errors import BundleError
from prebake.artifacts.ports.errors import BlobSizeMismatch
from prebake.registry.oci.artifact import build, canonical, tag_for
from prebake.registry.review.verify import verify_registry
from tests.faults.procs import unbounded


@pytest.fixture
def registry(origin):
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings

    return OCIRegistry(
        origin.address(f"hostile/r{uuid.uuid4().hex[:10]}"), OCISettings(plain_http=(origin.host,), settle_s=0)
    )


def _tamper(document: dict, case: str, other) -> dict:
    notes = dict(document["annotations"])
    if case == "not-prebake":
        return {**document, "artifactType": "application/vnd.example.other"}
    if case == "inline-edited":
        notes["org.prebake.manifest"] = notes["org.prebake.manifest"].replace("tiny-llama", "tiny-llamb")
    elif case == "another-keys-manifest":
        raw = other.manifest.to_bytes()
        notes["org.prebake.manifest"] = raw.decode()
        from prebake.registry.oci.artifact import sha256

        notes["org.prebake.manifest.digest"] = sha256(raw)
    elif case == "two-layers":
        return {**document, "layers": document["layers"] * 2}
    return {**document, "annotations": notes}


@pytest.mark.parametrize("case", ["not-prebake", "inline-edited", "another-keys-manifest", "two-layers"])
def test_a_hostile_oci_entry_is_a_clean_error_in_bounded_time_and_verify_reports_it(
    registry, tmp_path, scenario, in_force, case
):
    b = in_force.bundle(tmp_path / "b")
    other = in_force.bundle(tmp_path / "o", model="other")
    registry.publish(b.manifest, b.blob)
    registry.publish(other.manifest, other.blob)
    tag = tag_for("graphs", b.manifest.key_digest)
    got = registry.read_manifest(tag)
    assert got is not None
    registry.put_manifest(tag, canonical(_tamper(json.loads(got[0]), case, other)))

    started = time.monotonic()
    with pytest.raises(BundleError):
        registry.lookup("graphs", b.manifest.key_digest)
    with pytest.raises(BundleError):
        in_force.fetch(unbounded(scenario.store(tmp_path / "home")), registry, b.manifest.the_key())
    assert time.monotonic() - started < 20
    report = verify_registry(registry, trust=in_force.trust(registry), quarantine=False)
    assert report.exit_code == 1 and [f.key_digest for f in report.findings] == [b.manifest.key_digest]


def test_an_oci_blob_larger_than_its_manifest_says_is_refused_before_downloading(
    registry, origin, tmp_path, scenario, in_force
):
    b = in_force.bundle(tmp_path, payload_bytes=64 << 10)
    registry.publish(b.manifest, b.blob)
    path = origin.blob_file(b.manifest.blob.digest)
    path.write_bytes(path.read_bytes() + b"\0" * (1 << 20))

    with pytest.raises(BlobSizeMismatch, match="is .* bytes, but its manifest says"):
        registry.fetch_blob(b.manifest.blob.digest, tmp_path / "out" / "x.tar.zst", size=b.manifest.blob.size)
    assert not list((tmp_path / "out").iterdir())


def test_a_kind_that_cannot_name_a_tag_is_refused_with_the_rule(registry):
    from prebake.artifacts.errors import PrebakeError

    for kind in ("sha256", "x" * 57, "gräphs"):
        with pytest.raises(PrebakeError, match="plain ASCII identifiers of at most 56"):
            tag_for(kind, "0" * 64)
    assert len(tag_for("x" * 56, "0" * 64)) <= 128


def test_a_manifest_over_the_registrys_limit_is_refused_by_the_registry_and_by_prebake(registry, tmp_path, in_force):
    """distribution refuses manifests over 4 MiB on push; prebake refuses to read one (a registry that
    does not) past the same bound, without reading on."""
    from prebake.artifacts.ports.errors import RegistryError
    from prebake.registry.shared.http import Bound, read_bounded

    b = in_force.bundle(tmp_path)
    document = json.loads(build(b.manifest, "sha256:" + "0" * 64).manifest)
    document["annotations"]["padding"] = "x" * (5 << 20)
    with pytest.raises(RegistryError, match="HTTP 400|MANIFEST_INVALID|too large|SIZE"):
        registry.put_manifest(tag_for("graphs", b.manifest.key_digest), canonical(document))

    class _Huge:
        headers: ClassVar[dict[str, str]] = {"Content-Length": str(5 << 20)}

        def iter_bytes(self, n):
            raise AssertionError("read on past the announced size")

    with pytest.raises(BundleError, match="over"):
        read_bounded(_Huge(), Bound(4 << 20, "a hostile registry"))
