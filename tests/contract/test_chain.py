"""Registry chains: nearest first, first hit wins, far hits backfilled on fetch, outages told apart
from misses. The far registry is S3 on moto's server (a real process on loopback)."""

from __future__ import annotations

import logging

import pytest

from prebake.artifacts.ports.errors import RegistryError
from prebake.registry.backends.file import FileRegistry
from prebake.registry.backends.s3 import S3Registry
from prebake.registry.backends.s3_client import S3Settings
from prebake.registry.chain import ChainRegistry
from tests.support.ports import free_port


@pytest.fixture
def far(s3_bucket) -> S3Registry:
    return S3Registry(f"s3://{s3_bucket}/team")


def test_a_remote_hit_is_backfilled_into_the_local_registry(far, bundle, tmp_path):
    b = bundle()
    far.publish(b.manifest, b.blob)
    local = FileRegistry(tmp_path / "local")
    chain = ChainRegistry([local, far])

    found = chain.lookup(b.manifest.kind, b.manifest.key_digest)
    assert found == b.manifest and local.lookup(b.manifest.kind, b.manifest.key_digest) is None
    fetched = chain.fetch_blob(b.manifest.blob.digest, tmp_path / "fetched.tar.zst")

    assert fetched.read_bytes() == b.blob.read_bytes()
    assert local.lookup(b.manifest.kind, b.manifest.key_digest) == b.manifest
    assert local.blob_path(b.manifest.blob.digest).read_bytes() == b.blob.read_bytes()


def test_after_backfill_the_local_registry_answers_alone(far, bundle, tmp_path, monkeypatch):
    b = bundle()
    far.publish(b.manifest, b.blob)
    local = FileRegistry(tmp_path / "local")
    chain = ChainRegistry([local, far])
    chain.lookup(b.manifest.kind, b.manifest.key_digest)
    chain.fetch_blob(b.manifest.blob.digest, tmp_path / "first.tar.zst")

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    cut_off = ChainRegistry([local, S3Registry(far.url, S3Settings(max_attempts=1, timeout_s=1))])

    assert cut_off.lookup(b.manifest.kind, b.manifest.key_digest) == b.manifest
    assert cut_off.fetch_blob(b.manifest.blob.digest, tmp_path / "again.tar.zst").read_bytes() == b.blob.read_bytes()


def test_the_nearest_hit_wins(far, bundle, tmp_path):
    near_build, far_build = bundle(build="near"), bundle(build="far")
    far.publish(far_build.manifest, far_build.blob)
    local = FileRegistry(tmp_path / "local")
    local.publish(near_build.manifest, near_build.blob)

    found = ChainRegistry([local, far]).lookup(near_build.manifest.kind, near_build.manifest.key_digest)

    assert found == near_build.manifest


def test_a_failed_backfill_is_logged_and_the_fetch_still_succeeds(far, bundle, tmp_path, caplog):
    b = bundle()
    far.publish(b.manifest, b.blob)
    blocked = tmp_path / "near"
    blocked.mkdir()
    (blocked / "blobs").write_text("a file where the near registry's blobs/ should be: it answers, cannot take a blob")
    chain = ChainRegistry([FileRegistry(blocked), far])

    with caplog.at_level(logging.WARNING, logger="prebake.registry.chain"):
        assert chain.lookup(b.manifest.kind, b.manifest.key_digest) == b.manifest
        fetched = chain.fetch_blob(b.manifest.blob.digest, tmp_path / "fetched.tar.zst")

    assert fetched.read_bytes() == b.blob.read_bytes()
    assert "could not backfill" in caplog.text


def test_a_member_that_faulted_is_neither_asked_again_nor_backfilled(far, bundle, tmp_path, caplog):
    first, second = bundle(), bundle(model="other-model")
    for b in (first, second):
        far.publish(b.manifest, b.blob)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the near registry's folder should be")
    chain = ChainRegistry([FileRegistry(blocked), far])

    with caplog.at_level(logging.WARNING, logger="prebake.registry.chain"):
        for b in (first, second):
            assert chain.lookup(b.manifest.kind, b.manifest.key_digest) == b.manifest
            chain.fetch_blob(b.manifest.blob.digest, tmp_path / f"{b.manifest.key_digest}.tar.zst")

    assert caplog.text.count("skipped for the rest of this run") == 1 and "could not backfill" not in caplog.text
    [fault] = chain.faults
    assert fault.url == f"file://{blocked}" and fault.cause == "error" and "RegistryUnavailable" in fault.detail


def test_a_down_registry_is_skipped_when_a_farther_one_answers(s3_client, bundle, tmp_path, monkeypatch, caplog):
    b = bundle()
    behind = FileRegistry(tmp_path / "behind")
    behind.publish(b.manifest, b.blob)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    down = S3Registry("s3://team-cache/prebake", S3Settings(max_attempts=1, timeout_s=1))

    with caplog.at_level(logging.WARNING, logger="prebake.registry.chain"):
        found = ChainRegistry([down, behind]).lookup(b.manifest.kind, b.manifest.key_digest)

    assert found == b.manifest
    assert "skipped" in caplog.text and "team-cache" in caplog.text


def test_publish_goes_to_the_first_registry_only(far, bundle, tmp_path):
    b = bundle()
    local = FileRegistry(tmp_path / "local")

    published = ChainRegistry([local, far]).publish(b.manifest, b.blob)

    assert published.created
    assert local.lookup(b.manifest.kind, b.manifest.key_digest) == b.manifest
    assert far.lookup(b.manifest.kind, b.manifest.key_digest) is None


def test_list_merges_registries_nearest_first(far, bundle, tmp_path):
    shared_near, shared_far, only_far = bundle(build="near"), bundle(build="far"), bundle(model="only-far")
    local = FileRegistry(tmp_path / "local")
    local.publish(shared_near.manifest, shared_near.blob)
    far.publish(shared_far.manifest, shared_far.blob)
    far.publish(only_far.manifest, only_far.blob)

    listed = list(ChainRegistry([local, far]).list())

    by_key = lambda manifests: sorted(manifests, key=lambda m: m.key_digest)  # noqa: E731
    assert by_key(listed) == by_key([shared_near.manifest, only_far.manifest])


def test_a_blob_nobody_has_is_an_error_naming_every_attempt(far, tmp_path):
    chain = ChainRegistry([FileRegistry(tmp_path / "local"), far])

    with pytest.raises(RegistryError, match="missing") as missing:
        chain.fetch_blob("sha256:" + "a" * 64, tmp_path / "x.tar.zst")

    assert any("also tried" in note and far.url in note for note in missing.value.__notes__)


def test_an_empty_chain_is_refused():
    with pytest.raises(RegistryError, match="at least one"):
        ChainRegistry([])
