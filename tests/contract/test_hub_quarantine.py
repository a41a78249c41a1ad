"""`prebake verify --quarantine` on the Hub stand-in: bad entries move under quarantine/ in one commit each."""

from __future__ import annotations

import uuid

from prebake.artifacts.layout import blob_relpath, index_relpath
from prebake.artifacts.ports.registry import Maintainable
from prebake.registry.backends.hf import HubRegistry
from prebake.registry.review.verify import verify_registry
from tests.support.bundles import make_bundle


def test_hub_quarantine_moves_a_corrupt_bundle_aside_and_keeps_the_bytes(hub, tmp_path):
    repo = f"team/registry-{uuid.uuid4().hex[:8]}"
    registry = HubRegistry(f"hf://{repo}")
    assert isinstance(registry, Maintainable)
    good, bad = make_bundle(tmp_path, model="good"), make_bundle(tmp_path, model="bad")
    for b in (good, bad):
        registry.publish(b.manifest, b.blob)
    hub.overwrite("model", repo, blob_relpath(bad.manifest.blob.digest), b"not the bytes that were published")

    report = verify_registry(
        HubRegistry(f"hf://{repo}", cache_dir=tmp_path / "fresh-cache"), trust=None, quarantine=True
    )

    assert report.exit_code == 1 and len(report.findings) == 1
    assert "quarantine/index/graphs/" in report.findings[0].quarantined_to
    files = hub.files("model", repo)
    assert index_relpath("graphs", bad.manifest.key_digest) not in files
    assert f"quarantine/{index_relpath('graphs', bad.manifest.key_digest)}" in files
    assert files[f"quarantine/{blob_relpath(bad.manifest.blob.digest)}"] == b"not the bytes that were published"
    fresh = HubRegistry(f"hf://{repo}", cache_dir=tmp_path / "after")
    assert fresh.lookup("graphs", bad.manifest.key_digest) is None
    assert fresh.lookup("graphs", good.manifest.key_digest) is not None
    assert verify_registry(fresh, trust=None, quarantine=True).exit_code == 0
