"""Registries that grow: a miss's explanation reads a bounded sample, however many entries there are.

Counted, not timed: entries read through the registry port, and HTTP requests boto3 sends to
moto's server (a real process), stay under a fixed bound for a registry of hundreds of entries.
"""

from __future__ import annotations

from artifacts.fetch import MISS_SAMPLE, Miss, nearest_miss
from artifacts.keys import Key
from artifacts.manifest import Manifest
from registry.file import FileRegistry
from registry.s3 import S3Registry, S3Settings
from tests.support.index_seed import entry_key, seed_folder, seed_s3, synthetic_manifests

ENTRIES = 150  # several times the sample: enough to show the bound, quick to seed


class CountingRegistry:
    """A real registry, with a count of the manifests its listing handed out."""

    def __init__(self, inner: FileRegistry):
        self.inner, self.url, self.listed = inner, inner.url, 0

    def list(self, kind: str | None = None):
        for manifest in self.inner.list(kind):
            self.listed += 1
            yield manifest

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _wanted() -> Key:
    """A key close to entry 0 (same model), in no registry: torch differs."""
    near = entry_key(0)
    return Key.of("graphs", {**{g: dict(f) for g, f in near.groups}, "software": {"torch": "2.99.0+cpu"}})


def test_a_miss_in_a_large_folder_registry_reads_a_bounded_sample(tmp_path):
    seed_folder(tmp_path / "registry", synthetic_manifests(ENTRIES, files=5))
    registry = CountingRegistry(FileRegistry(tmp_path / "registry"))
    miss = nearest_miss(registry, _wanted(), "no bundle for this key")
    assert isinstance(miss, Miss) and miss.nearest is not None
    assert registry.listed <= MISS_SAMPLE


def test_a_miss_in_a_large_s3_registry_sends_a_bounded_number_of_requests(s3_client, s3_bucket):
    seed_s3(s3_client, s3_bucket, "team", synthetic_manifests(ENTRIES, files=5))
    settings = S3Settings()
    registry = S3Registry(f"s3://{s3_bucket}/team", settings)
    sent: list[str] = []
    registry._client.meta.events.register("before-send.s3", lambda request, **_: sent.append(request.url))
    miss = nearest_miss(registry, _wanted(), "no bundle for this key")
    assert isinstance(miss, Miss) and miss.nearest is not None
    # one short listing page, the sample, and at most one window of reads ahead of it
    assert len(sent) <= 1 + MISS_SAMPLE + settings.concurrency, len(sent)


def test_a_hit_is_one_request_however_large_the_s3_registry(s3_client, s3_bucket):
    manifests = synthetic_manifests(ENTRIES, files=5)
    seed_s3(s3_client, s3_bucket, "team", manifests)
    registry = S3Registry(f"s3://{s3_bucket}/team", S3Settings())
    sent: list[str] = []
    registry._client.meta.events.register("before-send.s3", lambda request, **_: sent.append(request.url))
    got = registry.lookup("graphs", manifests[123].key_digest)
    assert isinstance(got, Manifest) and got.key_digest == manifests[123].key_digest
    assert len(sent) == 1


def test_listing_a_large_s3_registry_returns_every_entry_in_key_order(s3_client, s3_bucket):
    manifests = synthetic_manifests(ENTRIES, files=5)
    seed_s3(s3_client, s3_bucket, "team", manifests)
    listed = [m.key_digest for m in S3Registry(f"s3://{s3_bucket}/team", S3Settings(concurrency=4)).list("graphs")]
    assert listed == sorted(m.key_digest for m in manifests)
