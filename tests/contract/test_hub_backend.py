"""What only the Hub backend does: one commit per publish, repo creation, dataset repos, pinned
revisions, HF_TOKEN, offline mode, and conditional creation through parent_commit. Runs
against tests/support/hub_server.py, a local stand-in for the Hub (the real Hub was not
reachable from where this suite was written)."""

from __future__ import annotations

import uuid

import pytest

from prebake.artifacts.layout import blob_relpath, index_relpath
from prebake.artifacts.ports.errors import (
    PublishConflict,
    RegistryError,
    RegistryReadOnly,
    RegistryUnavailable,
)
from prebake.registry.backends.hf import HubRegistry
from tests.support.ports import free_port


@pytest.fixture
def repo() -> str:
    return f"team/hub-{uuid.uuid4().hex[:8]}"


def test_one_publish_is_one_commit_holding_the_blob_and_its_entry(hub, repo, bundle):
    b = bundle()
    registry = HubRegistry(f"hf://{repo}")

    registry.publish(b.manifest, b.blob)
    commits = hub.commit_shas("model", repo)
    files = hub.files("model", repo)

    assert len(commits) == 2, "the repo's initial commit, then exactly one for the publish"
    assert files[blob_relpath(b.manifest.blob.digest)] == b.blob.read_bytes()
    assert files[index_relpath(b.manifest.kind, b.manifest.key_digest)] == b.manifest.to_bytes()


def test_publishing_creates_the_repo_when_missing(hub, repo, bundle):
    b = bundle()
    registry = HubRegistry(f"hf://{repo}")
    assert registry.lookup(b.manifest.kind, b.manifest.key_digest) is None
    assert list(registry.list()) == []

    registry.publish(b.manifest, b.blob)

    assert ("model", repo) in hub.repos


def test_dataset_repos_hold_registries_too(hub, repo, bundle, tmp_path):
    b = bundle()
    registry = HubRegistry(f"hf://datasets/{repo}")

    registry.publish(b.manifest, b.blob)

    assert ("dataset", repo) in hub.repos and ("model", repo) not in hub.repos
    assert HubRegistry(f"hf://{repo}").lookup(b.manifest.kind, b.manifest.key_digest) is None
    assert registry.fetch_blob(b.manifest.blob.digest, tmp_path / "d.tar.zst").read_bytes() == b.blob.read_bytes()


def test_hf_token_is_sent_with_every_request(hub, repo, bundle):
    b = bundle()
    seen_before = len(hub.authorizations)

    registry = HubRegistry(f"hf://{repo}")
    registry.publish(b.manifest, b.blob)
    registry.lookup(b.manifest.kind, b.manifest.key_digest)

    ours = hub.authorizations[seen_before:]
    assert ours and all(a == "Bearer hf_contract_token" for a in ours), set(ours)


def test_a_commit_landing_between_head_and_commit_is_retried_on_the_new_head(hub, repo, bundle):
    mine = bundle(model="mine")
    registry = HubRegistry(f"hf://{repo}")
    registry.publish(bundle(model="seed").manifest, bundle(model="seed").blob)  # the repo exists
    landed = []

    def someone_else_commits(repo_type, repo_id):
        if not landed:
            landed.append(hub.push(repo_type, repo_id, {"README.md": b"another tool wrote this\n"}))

    hub.on_commit = someone_else_commits
    refused_before = hub.stale_commits_refused
    published = registry.publish(mine.manifest, mine.blob)

    assert landed, "the interfering commit happened"
    assert hub.stale_commits_refused == refused_before + 1, "the first commit named the old head as its parent"
    assert published.created
    assert hub.files("model", repo)["README.md"] == b"another tool wrote this\n"
    assert registry.lookup(mine.manifest.kind, mine.manifest.key_digest) == mine.manifest


def test_the_same_key_committed_in_between_is_settled_as_a_conflict(hub, repo, bundle):
    mine, theirs = bundle(build="mine"), bundle(build="theirs")
    registry = HubRegistry(f"hf://{repo}")
    registry.publish(bundle(model="seed").manifest, bundle(model="seed").blob)
    index = index_relpath(theirs.manifest.kind, theirs.manifest.key_digest)

    def another_baker_wins(repo_type, repo_id):
        if index not in hub.files(repo_type, repo_id):
            hub.push(
                repo_type,
                repo_id,
                {
                    blob_relpath(theirs.manifest.blob.digest): theirs.blob.read_bytes(),
                    index: theirs.manifest.to_bytes(),
                },
            )

    hub.on_commit = another_baker_wins
    with pytest.raises(PublishConflict) as refused:
        registry.publish(mine.manifest, mine.blob)

    assert refused.value.existing_blob == theirs.manifest.blob.digest
    assert registry.lookup(mine.manifest.kind, mine.manifest.key_digest) == theirs.manifest


def test_a_pinned_commit_reads_that_commit_and_refuses_to_publish(hub, repo, bundle):
    early, late = bundle(model="early"), bundle(model="late")
    HubRegistry(f"hf://{repo}").publish(early.manifest, early.blob)
    pinned_sha = hub.commit_shas("model", repo)[-1]
    HubRegistry(f"hf://{repo}").publish(late.manifest, late.blob)

    pinned = HubRegistry(f"hf://{repo}@{pinned_sha}")

    assert pinned.lookup(early.manifest.kind, early.manifest.key_digest) == early.manifest
    assert pinned.lookup(late.manifest.kind, late.manifest.key_digest) is None
    assert [m.key_digest for m in pinned.list()] == [early.manifest.key_digest]
    with pytest.raises(RegistryReadOnly, match="pinned to a commit"):
        pinned.publish(late.manifest, late.blob)


def test_publishing_to_a_missing_branch_says_how_to_create_it(hub, repo, bundle):
    b = bundle()
    HubRegistry(f"hf://{repo}").publish(b.manifest, b.blob)

    with pytest.raises(RegistryError, match="branch 'nightly' does not exist; create it"):
        HubRegistry(f"hf://{repo}@nightly").publish(bundle(model="other").manifest, bundle(model="other").blob)


def test_offline_mode_reads_only_the_cache_and_refuses_to_publish(hub, repo, bundle, monkeypatch, tmp_path):
    cached, never_read = bundle(model="cached"), bundle(model="never-read")
    online = HubRegistry(f"hf://{repo}")
    online.publish(cached.manifest, cached.blob)
    online.publish(never_read.manifest, never_read.blob)
    online.lookup(cached.manifest.kind, cached.manifest.key_digest)
    online.fetch_blob(cached.manifest.blob.digest, tmp_path / "warm.tar.zst")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = HubRegistry(f"hf://{repo}")

    assert offline.lookup(cached.manifest.kind, cached.manifest.key_digest) == cached.manifest
    assert offline.lookup(never_read.manifest.kind, never_read.manifest.key_digest) is None
    assert (
        offline.fetch_blob(cached.manifest.blob.digest, tmp_path / "o.tar.zst").read_bytes() == cached.blob.read_bytes()
    )
    assert [m.key_digest for m in offline.list()] == [cached.manifest.key_digest]
    with pytest.raises(RegistryUnavailable, match="not in the Hugging Face cache"):
        offline.fetch_blob(never_read.manifest.blob.digest, tmp_path / "n.tar.zst")
    with pytest.raises(RegistryReadOnly, match="HF_HUB_OFFLINE=1"):
        offline.publish(never_read.manifest, never_read.blob)


def test_an_unreachable_hub_still_serves_what_was_cached(hub, repo, bundle, monkeypatch):
    b = bundle()
    online = HubRegistry(f"hf://{repo}")
    online.publish(b.manifest, b.blob)
    online.lookup(b.manifest.kind, b.manifest.key_digest)

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    unreachable = HubRegistry(f"hf://{repo}")

    assert unreachable.lookup(b.manifest.kind, b.manifest.key_digest) == b.manifest
    with pytest.raises(RegistryUnavailable, match="did not answer"):
        unreachable.lookup("graphs", "1" * 64)
    with pytest.raises(RegistryUnavailable, match="did not answer"):
        unreachable.publish(b.manifest, b.blob)


@pytest.mark.parametrize("address", ["hf://just-a-name", "hf://a/b/c", "hf://a/b@", "s3://a/b"])
def test_a_malformed_address_is_refused_with_the_forms_it_takes(address):
    with pytest.raises(RegistryError, match=r"hf://<namespace>/<repo>\[@revision\]"):
        HubRegistry(address)
