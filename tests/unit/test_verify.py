"""`prebake verify`: a real folder registry with good and broken bundles, re-hashed and moved aside."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.payload import pack
from prebake.artifacts.keys import Key
from prebake.registry.backends.file import FileRegistry
from prebake.registry.review.verify import verify_registry
from prebake.registry.trust.signing import TrustPolicy, generate_keypair, sign


def bake(registry: FileRegistry, tmp: Path, torch: str, *, signer=None) -> Manifest:
    """Pack a small tree under a key of its own and publish it; return the published manifest."""
    work = tmp / f"bake-{torch}"
    (work / "tree").mkdir(parents=True)
    (work / "tree" / "kernels.bin").write_bytes(f"kernels for torch {torch}".encode() * 50)
    packed = pack(work / "tree", work / "payload.tar.zst", threads=1)
    groups = {"software": {"torch": torch}, "platform": {"arch": "x86_64"}}
    manifest = Manifest(
        kind="graphs",
        key=groups,
        key_digest=Key.of("graphs", groups).digest,
        blob=packed.blob,
        files=packed.files,
        created="2026-01-01T00:00:00+00:00",
        builder="test",
    )
    if signer is not None:
        manifest = signer(manifest)
    return registry.publish(manifest, work / "payload.tar.zst").manifest


class Damaged:
    """A registry with one good bundle and three broken ones, each broken in its own way."""

    def __init__(self, tmp: Path):
        pem, line = generate_keypair("ci")
        key = load_pem_private_key(pem, password=None)
        self.trust = TrustPolicy.from_lines([line]).check
        self.registry = FileRegistry(tmp / "registry")
        signer = lambda m: sign(m, key, "ci")  # noqa: E731
        self.good = bake(self.registry, tmp, "2.13.0", signer=signer)
        self.corrupt = bake(self.registry, tmp, "2.14.0", signer=signer)
        self.edited = bake(self.registry, tmp, "2.15.0", signer=signer)
        self.malformed = bake(self.registry, tmp, "2.16.0", signer=signer)

        blob = self.registry.blob_path(self.corrupt.blob.digest)
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))

        entry = self.entry(self.edited)
        doc = json.loads(entry.read_text())
        doc["files"][0]["sha256"] = "sha256:" + "0" * 64  # still parses, still names a good blob
        entry.write_text(json.dumps(doc))

        self.entry(self.malformed).write_text('{"kind": "graphs", "key": ')

    def entry(self, manifest: Manifest) -> Path:
        return self.registry.root / "index" / manifest.kind / f"{manifest.key_digest}.json"


@pytest.fixture
def damaged(tmp_path) -> Damaged:
    return Damaged(tmp_path)


def test_clean_registry_verifies_with_exit_code_zero(tmp_path):
    registry = FileRegistry(tmp_path / "registry")
    bake(registry, tmp_path, "2.13.0")
    bake(registry, tmp_path, "2.14.0")
    report = verify_registry(registry, trust=None, quarantine=False)
    assert (report.entries, report.ok, report.bad, report.exit_code) == (2, 2, 0, 0)
    assert "2 entries, 2 ok, 0 bad" in report.render()
    assert "signatures were not checked" in report.render()


def test_each_broken_entry_is_one_finding_naming_its_problem(damaged):
    report = verify_registry(damaged.registry, trust=damaged.trust, quarantine=False)

    assert (report.entries, report.ok, report.bad, report.exit_code) == (4, 1, 3, 1)
    problems = {f.key_digest: f.problem for f in report.findings}
    assert set(problems) == {damaged.corrupt.key_digest, damaged.edited.key_digest, damaged.malformed.key_digest}
    assert "blob is corrupt" in problems[damaged.corrupt.key_digest]
    assert "signature by ci does not verify" in problems[damaged.edited.key_digest]
    assert "malformed" in problems[damaged.malformed.key_digest]
    text = report.render()
    assert "4 entries, 1 ok, 3 bad" in text
    assert all(f"BAD graphs {f.key_digest[:16]}" in text for f in report.findings)


def test_without_trust_an_edited_key_factor_is_still_caught(damaged):
    entry = damaged.entry(damaged.good)
    doc = json.loads(entry.read_text())
    doc["key"]["software"]["torch"] = "9.9.9"
    entry.write_text(json.dumps(doc))

    report = verify_registry(damaged.registry, trust=None, quarantine=False)

    problems = {f.key_digest: f.problem for f in report.findings}
    assert "edited after baking" in problems[damaged.good.key_digest]
    # unsigned checks cannot see a forged file digest: that is what signatures are for
    assert damaged.edited.key_digest not in problems


def test_entry_claiming_the_wrong_blob_size_is_reported(tmp_path):
    registry = FileRegistry(tmp_path / "registry")
    manifest = bake(registry, tmp_path, "2.13.0")
    entry = registry.root / "index" / "graphs" / f"{manifest.key_digest}.json"
    doc = json.loads(entry.read_text())
    doc["blob"]["size"] += 7
    entry.write_text(json.dumps(doc))
    report = verify_registry(registry, trust=None, quarantine=False)
    assert report.bad == 1
    assert (
        f"is {manifest.blob.size} bytes, but its manifest says {manifest.blob.size + 7}" in report.findings[0].problem
    )


def test_entry_whose_blob_was_deleted_is_reported(tmp_path):
    registry = FileRegistry(tmp_path / "registry")
    manifest = bake(registry, tmp_path, "2.13.0")
    registry.blob_path(manifest.blob.digest).unlink()
    report = verify_registry(registry, trust=None, quarantine=False)
    assert report.bad == 1 and "blob is unavailable" in report.findings[0].problem


def test_entry_copied_under_another_key_is_reported(tmp_path):
    registry = FileRegistry(tmp_path / "registry")
    manifest = bake(registry, tmp_path, "2.13.0")
    stolen = registry.root / "index" / "graphs" / f"{'a' * 64}.json"
    stolen.write_bytes(manifest.to_bytes())
    report = verify_registry(registry, trust=None, quarantine=False)
    assert [f.key_digest for f in report.findings] == ["a" * 64]
    assert "copied or edited" in report.findings[0].problem


def test_quarantine_moves_bad_entries_aside_and_a_second_run_is_clean(damaged):
    registry, root = damaged.registry, damaged.registry.root
    corrupt_blob = registry.blob_path(damaged.corrupt.blob.digest)

    report = verify_registry(registry, trust=damaged.trust, quarantine=True)

    assert report.bad == 3 and all(f.quarantined_to for f in report.findings)
    for bad in (damaged.corrupt, damaged.edited, damaged.malformed):
        assert not damaged.entry(bad).exists()
        assert registry.lookup(bad.kind, bad.key_digest) is None  # readers miss now
        assert (root / "quarantine" / "index" / "graphs" / f"{bad.key_digest}.json").exists()
    assert not corrupt_blob.exists()
    assert (root / "quarantine" / corrupt_blob.relative_to(root)).exists()
    # the edited entry named a good blob: the blob stays for whoever rebakes the key
    assert registry.blob_path(damaged.edited.blob.digest).exists()
    assert registry.lookup(damaged.good.kind, damaged.good.key_digest) == damaged.good

    again = verify_registry(registry, trust=damaged.trust, quarantine=True)
    assert (again.entries, again.ok, again.bad, again.exit_code) == (1, 1, 0, 0)


def test_same_key_quarantined_twice_keeps_both_copies(tmp_path):
    registry = FileRegistry(tmp_path / "registry")
    for attempt in ("first", "second"):
        manifest = bake(registry, tmp_path / attempt, "2.13.0")
        registry.blob_path(manifest.blob.digest).unlink()
        assert verify_registry(registry, trust=None, quarantine=True).bad == 1
    assert len(list((registry.root / "quarantine" / "index" / "graphs").iterdir())) == 2


class ListOnly:
    """A backend with only the protocol: no raw index access and no quarantine."""

    url = "memory://test"

    def __init__(self, inner: FileRegistry):
        self.inner = inner

    def list(self, kind: str | None = None) -> Iterator[Manifest]:
        return self.inner.list(kind)

    def fetch_blob(self, digest: str, dest: Path, *, size=None, tee=None) -> Path:
        return self.inner.fetch_blob(digest, dest, size=size, tee=tee)


def test_backend_without_quarantine_reports_that_it_left_bad_entries_in_place(damaged):
    damaged.entry(damaged.malformed).unlink()  # a protocol-only listing cannot step over a malformed entry
    report = verify_registry(ListOnly(damaged.registry), trust=damaged.trust, quarantine=True)
    assert (report.entries, report.bad) == (3, 2)
    assert "quarantine is not supported by memory://test" in report.render()
    assert damaged.entry(damaged.corrupt).exists()


def test_backend_listing_that_breaks_on_a_malformed_entry_is_a_finding_not_a_crash(damaged):
    report = verify_registry(ListOnly(damaged.registry), trust=damaged.trust, quarantine=False)
    assert report.exit_code == 1
    assert any("listing stopped" in f.problem for f in report.findings)
