"""Registries that grow: a miss's explanation reads a bounded sample, however many entries there
are, and `prebake ls` reads no entry its listing summary answers for (a cache the listing verifies).

Counted, not timed: entries read through the registry port, and HTTP requests boto3 sends to
moto's server (a real process), stay under a fixed bound for a registry of hundreds of entries.
"""

from __future__ import annotations

import json

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.fetch.explain import MISS_SAMPLE, nearest_miss
from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.keys import Key
from prebake.artifacts.layout import index_relpath, summary_relpath
from prebake.artifacts.ports.listing import SUMMARY_MIN_ROWS, Listed, ListingSummary
from prebake.engine.cli import main
from prebake.registry.backends.file import FileRegistry
from prebake.registry.backends.hf import HubRegistry
from prebake.registry.backends.s3 import S3Registry
from prebake.registry.backends.s3_client import S3Settings
from prebake.registry.shared.transfer import listed
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
    registry.s3._client.meta.events.register("before-send.s3", lambda request, **_: sent.append(request.url))
    miss = nearest_miss(registry, _wanted(), "no bundle for this key")
    assert isinstance(miss, Miss) and miss.nearest is not None
    # one short listing page, the sample, and at most one window of reads ahead of it
    assert len(sent) <= 1 + MISS_SAMPLE + settings.concurrency, len(sent)


def test_a_hit_is_one_request_however_large_the_s3_registry(s3_client, s3_bucket):
    manifests = synthetic_manifests(ENTRIES, files=5)
    seed_s3(s3_client, s3_bucket, "team", manifests)
    registry = S3Registry(f"s3://{s3_bucket}/team", S3Settings())
    sent: list[str] = []
    registry.s3._client.meta.events.register("before-send.s3", lambda request, **_: sent.append(request.url))
    got = registry.lookup("graphs", manifests[123].key_digest)
    assert isinstance(got, Manifest) and got.key_digest == manifests[123].key_digest
    assert len(sent) == 1


def test_listing_a_large_s3_registry_returns_every_entry_in_key_order(s3_client, s3_bucket):
    manifests = synthetic_manifests(ENTRIES, files=5)
    seed_s3(s3_client, s3_bucket, "team", manifests)
    listed = [m.key_digest for m in S3Registry(f"s3://{s3_bucket}/team", S3Settings(concurrency=4)).list("graphs")]
    assert listed == sorted(m.key_digest for m in manifests)


# -- prebake ls: the listing summary, a verified cache -------------------------------------------


class CountingFolder(FileRegistry):
    """A real folder registry, with a count of the index entries read through its store."""

    reads = 0

    def __init__(self, root):
        super().__init__(root)
        get = self.store.get

        def counted(key, limit):
            self.reads += key.startswith("index/")
            return get(key, limit)

        self.store.get = counted  # type: ignore[method-assign]


def _requests(registry: S3Registry) -> list[tuple[str, str]]:
    """(method, url) of every HTTP request the registry's boto3 client sends from now on."""
    sent: list[tuple[str, str]] = []
    registry.s3._client.meta.events.register(
        "before-send.s3", lambda request, **_: sent.append((request.method, request.url))
    )
    return sent


def _entry_reads(sent: list[tuple[str, str]]) -> int:
    return sum(1 for method, url in sent if method == "GET" and "/index/graphs/" in url)


def test_listing_a_large_s3_registry_again_sends_no_request_per_entry(s3_client, s3_bucket):
    seed_s3(s3_client, s3_bucket, "team", synthetic_manifests(ENTRIES, files=5))
    first = S3Registry(f"s3://{s3_bucket}/team", S3Settings())
    expected = [Listed.of(m) for m in first.list("graphs")]
    assert list(first.listing("graphs")) == expected  # reads every entry once, writes the summary

    other = S3Registry(f"s3://{s3_bucket}/team", S3Settings())  # another process, nothing remembered
    sent = _requests(other)
    assert list(listed(other, "graphs")) == expected
    # one listing page (1,000 keys a page) and the summary: no entry read, nothing written
    assert [method for method, _ in sent] == ["GET", "GET"], sent
    assert _entry_reads(sent) == 0


def test_a_stale_or_broken_s3_summary_costs_reads_never_a_wrong_row(s3_client, s3_bucket):
    manifests = synthetic_manifests(ENTRIES + 10, files=5)
    seed_s3(s3_client, s3_bucket, "team", manifests[:ENTRIES])
    registry = S3Registry(f"s3://{s3_bucket}/team", S3Settings(concurrency=4))
    list(registry.listing("graphs"))  # the summary now describes the first ENTRIES entries
    # behind the summary's back: one entry deleted, ten published, one replaced by another build
    s3_client.delete_object(Bucket=s3_bucket, Key=f"team/{index_relpath('graphs', manifests[0].key_digest)}")
    seed_s3(s3_client, s3_bucket, "team", manifests[ENTRIES:])
    replaced = manifests[1].model_copy(update={"labels": {**manifests[1].labels, "model": "replaced"}})
    seed_s3(s3_client, s3_bucket, "team", [replaced])
    expected = [Listed.of(m) for m in registry.list("graphs")]

    sent = _requests(registry)
    rows = list(registry.listing("graphs"))
    assert rows == expected and len(rows) == ENTRIES + 9
    assert next(r for r in rows if r.key_digest == replaced.key_digest).labels["model"] == "replaced"
    assert _entry_reads(sent) == 11  # the ten new entries and the replaced one

    summary = f"team/{summary_relpath('graphs')}"
    s3_client.put_object(Bucket=s3_bucket, Key=summary, Body=b'{"not": "a summary"')
    assert list(registry.listing("graphs")) == expected  # read entry by entry, and rewritten
    stored = s3_client.get_object(Bucket=s3_bucket, Key=summary)["Body"].read()
    assert [r.row for r in ListingSummary.parse(stored, summary).rows] == expected


def test_listing_a_large_folder_registry_again_reads_no_entry(tmp_path):
    manifests = synthetic_manifests(ENTRIES + 1, files=5)
    seed_folder(tmp_path / "registry", manifests[:ENTRIES])
    registry = CountingFolder(tmp_path / "registry")
    expected = [Listed.of(m) for m in registry.list("graphs")]
    assert list(registry.listing("graphs")) == expected

    registry.reads = 0
    assert list(listed(registry)) == expected
    assert registry.reads == 0
    (tmp_path / "registry" / index_relpath("graphs", manifests[2].key_digest)).unlink()
    seed_folder(tmp_path / "registry", manifests[ENTRIES:])
    assert list(registry.listing("graphs")) == [Listed.of(m) for m in registry.list("graphs")]
    assert registry.reads == 1 + ENTRIES  # the new entry, then list() read them all


def test_a_small_registry_keeps_no_summary(tmp_path):
    seed_folder(tmp_path / "registry", synthetic_manifests(SUMMARY_MIN_ROWS - 1, files=5))
    registry = FileRegistry(tmp_path / "registry")
    assert len(list(registry.listing())) == SUMMARY_MIN_ROWS - 1
    assert not (tmp_path / "registry" / "summary").exists()


class CountingHub(HubRegistry):
    """A real Hub registry (the stand-in server), with a count of the index entries read through its store."""

    reads = 0

    def __init__(self, address):
        super().__init__(address)
        get = self.store.get

        def counted(key, limit):
            self.reads += key.startswith("index/")
            return get(key, limit)

        self.store.get = counted  # type: ignore[method-assign]


def test_listing_a_large_hub_registry_again_reads_only_new_entries(hub, monkeypatch, tmp_path):
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))  # where this machine keeps Hub summaries
    manifests = synthetic_manifests(ENTRIES + 1, files=5)
    hub.create_repo("model", "team/scale")
    hub.push("model", "team/scale", {index_relpath(m.kind, m.key_digest): m.to_bytes() for m in manifests[:ENTRIES]})
    registry = CountingHub("hf://team/scale")
    assert list(registry.listing("graphs")) == [Listed.of(m) for m in registry.list("graphs")]

    registry.reads = 0
    new, gone = manifests[-1], index_relpath("graphs", manifests[3].key_digest)
    hub.push("model", "team/scale", {index_relpath("graphs", new.key_digest): new.to_bytes(), gone: None})  # type: ignore[dict-item]
    rows = list(registry.listing("graphs"))
    assert registry.reads == 1  # the new entry only: the others' blob ids are in the summary
    assert rows == [Listed.of(m) for m in CountingHub("hf://team/scale").list("graphs")] and len(rows) == ENTRIES


def test_prebake_ls_json_is_the_same_from_the_entries_and_from_the_summary(
    s3_client, s3_bucket, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
    seed_s3(s3_client, s3_bucket, "team", synthetic_manifests(ENTRIES, files=5))
    address = f"s3://{s3_bucket}/team"

    outputs = []
    for _ in range(2):  # the first reads every entry and writes the summary; the second reads the summary
        assert main(["ls", "--json", "--registry", address]) == 0
        outputs.append(json.loads(capsys.readouterr().out))

    assert outputs[0] == outputs[1]
    assert [b["key"] for b in outputs[0]["bundles"]] == sorted(
        m.key_digest for m in synthetic_manifests(ENTRIES, files=5)
    )
    assert s3_client.head_object(Bucket=s3_bucket, Key=f"team/{summary_relpath('graphs')}")["ContentLength"] > 0
