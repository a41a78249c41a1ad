"""huggingface_hub's LFS paths against the stand-in: a blob goes up through the batch API, comes down
with the Hub's X-Linked headers, and the index entry stays a regular file, as on the Hub."""

from __future__ import annotations

import hashlib
import uuid

from prebake.artifacts.layout import blob_relpath, index_relpath
from prebake.registry.backends.hf import HubRegistry
from tests.support.bundles import make_bundle


def test_a_published_blob_travels_through_lfs_and_its_entry_does_not(hub_lfs, tmp_path):
    repo = f"team/lfs-{uuid.uuid4().hex[:8]}"
    bundle = make_bundle(tmp_path, payload_bytes=64 << 10)
    uploads = hub_lfs.lfs.uploads
    assert HubRegistry(f"hf://{repo}").publish(bundle.manifest, bundle.blob).created is True
    oid = hashlib.sha256(bundle.blob.read_bytes()).hexdigest()
    assert hub_lfs.lfs.uploads == uploads + 1 and oid in hub_lfs.lfs.objects
    index = index_relpath("graphs", bundle.manifest.key_digest)
    assert hashlib.sha256(hub_lfs.files("model", repo)[index]).hexdigest() not in hub_lfs.lfs.objects

    downloads = hub_lfs.lfs.downloads
    reader = HubRegistry(f"hf://{repo}", cache_dir=tmp_path / "reader")
    got = reader.fetch_blob(bundle.manifest.blob.digest, tmp_path / "blob.tar.zst")
    assert got.read_bytes() == bundle.blob.read_bytes() and hub_lfs.lfs.downloads == downloads + 1
    assert blob_relpath(bundle.manifest.blob.digest) in hub_lfs.files("model", repo)


def test_republishing_an_object_the_hub_has_uploads_nothing(hub_lfs, tmp_path):
    bundle = make_bundle(tmp_path, payload_bytes=32 << 10, model="twice")
    HubRegistry(f"hf://team/lfs-{uuid.uuid4().hex[:8]}").publish(bundle.manifest, bundle.blob)
    uploads = hub_lfs.lfs.uploads
    HubRegistry(f"hf://team/lfs-{uuid.uuid4().hex[:8]}").publish(bundle.manifest, bundle.blob)
    assert hub_lfs.lfs.uploads == uploads  # the batch answer had no actions: already stored
