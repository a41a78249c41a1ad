"""The registry contract: every backend (file, s3, s3 without conditional writes, hf, a chain
of file then s3) behaves the same, against real servers on loopback (see conftest.py)."""

from __future__ import annotations

import threading

import pytest

from prebake.artifacts.ports.errors import BlobDigestMismatch, PublishConflict, RegistryUnavailable


def test_published_bundle_is_found_and_fetched_byte_for_byte(backend, bundle, tmp_path):
    b = bundle(payload_bytes=64 << 10)

    published = backend.registry.publish(b.manifest, b.blob)
    found = backend.registry.lookup(b.manifest.kind, b.manifest.key_digest)
    fetched = backend.registry.fetch_blob(b.manifest.blob.digest, tmp_path / "out" / "payload.tar.zst")

    assert published.created and published.manifest == b.manifest
    assert found == b.manifest
    assert fetched.read_bytes() == b.blob.read_bytes()


def test_another_client_sees_what_one_published(backend, bundle, tmp_path):
    b = bundle()
    backend.registry.publish(b.manifest, b.blob)

    other = backend.second_client()

    assert other.lookup(b.manifest.kind, b.manifest.key_digest) == b.manifest
    assert other.fetch_blob(b.manifest.blob.digest, tmp_path / "other.tar.zst").read_bytes() == b.blob.read_bytes()


def test_list_yields_every_manifest_or_one_kind(backend, bundle):
    graphs, autotune = bundle(kind="graphs"), bundle(kind="autotune")
    for b in (graphs, autotune):
        backend.registry.publish(b.manifest, b.blob)

    everything = {(m.kind, m.key_digest) for m in backend.registry.list()}
    only_graphs = list(backend.registry.list("graphs"))

    assert everything == {(b.manifest.kind, b.manifest.key_digest) for b in (graphs, autotune)}
    assert only_graphs == [graphs.manifest]
    assert list(backend.registry.list("buckets")) == []


def test_republishing_the_same_bundle_is_a_noop(backend, bundle):
    b = bundle()
    backend.registry.publish(b.manifest, b.blob)

    again = backend.registry.publish(b.manifest, b.blob)

    assert not again.created
    assert again.manifest == b.manifest


def test_a_different_build_of_a_published_key_is_refused(backend, bundle):
    first, second = bundle(build="first"), bundle(build="second")
    assert first.manifest.key_digest == second.manifest.key_digest
    backend.registry.publish(first.manifest, first.blob)

    with pytest.raises(PublishConflict, match="different build of the same key") as refused:
        backend.registry.publish(second.manifest, second.blob)

    assert refused.value.existing_blob == first.manifest.blob.digest
    assert backend.registry.lookup(first.manifest.kind, first.manifest.key_digest) == first.manifest


def test_a_missing_key_is_a_miss(backend, bundle):
    present, absent = bundle(model="present"), bundle(model="absent")
    backend.registry.publish(present.manifest, present.blob)

    assert backend.registry.lookup(absent.manifest.kind, absent.manifest.key_digest) is None
    assert backend.registry.lookup("buckets", present.manifest.key_digest) is None


def test_a_blob_whose_bytes_do_not_match_its_digest_is_an_error(backend, bundle, tmp_path):
    b = bundle()
    backend.registry.publish(b.manifest, b.blob)
    backend.corrupt_blob(b.manifest.blob.digest, b"not the bundle you are looking for")
    dest = tmp_path / "fetched" / "payload.tar.zst"

    with pytest.raises(BlobDigestMismatch, match="corrupt"):
        backend.registry.fetch_blob(b.manifest.blob.digest, dest)

    assert not dest.exists()
    assert not any(dest.parent.iterdir()), "a refused download leaves no temporary file behind"


def test_publishing_a_blob_that_does_not_match_its_manifest_is_refused(backend, bundle):
    b, other = bundle(model="a"), bundle(model="b")

    with pytest.raises(BlobDigestMismatch, match="repack"):
        backend.registry.publish(b.manifest, other.blob)

    assert backend.registry.lookup(b.manifest.kind, b.manifest.key_digest) is None


def test_two_bakers_racing_on_one_key_leave_exactly_one_winner(backend, bundle):
    if backend.name == "s3-unconditional":
        pytest.skip("without conditional writes both racers may win: the documented fallback race")
    builds = [bundle(build="left", payload_bytes=1 << 20), bundle(build="right", payload_bytes=1 << 20)]
    clients = [backend.registry, backend.second_client()]
    outcomes = _race([lambda c=c, b=b: c.publish(b.manifest, b.blob) for c, b in zip(clients, builds, strict=True)])

    winners = [i for i, o in enumerate(outcomes) if not isinstance(o, BaseException) and o.created]
    losers = [i for i, o in enumerate(outcomes) if isinstance(o, PublishConflict)]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    stored = backend.registry.lookup(builds[0].manifest.kind, builds[0].manifest.key_digest)
    assert stored == builds[winners[0]].manifest


def test_bakers_racing_on_different_keys_both_land(backend, bundle):
    builds = [bundle(model="left"), bundle(model="right")]
    clients = [backend.registry, backend.second_client()]
    outcomes = _race([lambda c=c, b=b: c.publish(b.manifest, b.blob) for c, b in zip(clients, builds, strict=True)])

    assert all(not isinstance(o, BaseException) and o.created for o in outcomes), outcomes
    for b in builds:
        assert backend.registry.lookup(b.manifest.kind, b.manifest.key_digest) == b.manifest


def test_an_unreachable_registry_is_reported_not_missed(down_registry, bundle):
    b = bundle()

    with pytest.raises(RegistryUnavailable, match="127.0.0.1"):
        down_registry.lookup(b.manifest.kind, b.manifest.key_digest)


def _race(calls):
    """Run the calls in threads released together; return each result or exception, in order."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[object] = [None] * len(calls)

    def run(i, call):
        barrier.wait()
        try:
            outcomes[i] = call()
        except BaseException as exc:  # the test inspects it
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return outcomes


def test_a_side_file_beside_a_blob_is_created_once_and_read_back(backend, bundle):
    from prebake.artifacts.ports.registry import SideFiles

    b = bundle()
    backend.registry.publish(b.manifest, b.blob)
    registry = backend.registry
    assert isinstance(registry, SideFiles)
    assert registry.get_side(b.manifest.blob.digest, "provenance.intoto.dsse.json") is None  # a miss, not an error
    assert registry.put_side(b.manifest.blob.digest, "provenance.intoto.dsse.json", b'{"first": 1}') is True
    assert registry.put_side(b.manifest.blob.digest, "provenance.intoto.dsse.json", b'{"second": 2}') is False
    other = backend.second_client()
    assert isinstance(other, SideFiles)
    assert other.get_side(b.manifest.blob.digest, "provenance.intoto.dsse.json") == b'{"first": 1}'
    assert [m.key_digest for m in other.list()] == [b.manifest.key_digest]  # a side file is not an index entry


def test_a_registry_file_is_replaced_whole_and_read_back_by_another_client(backend):
    registry = backend.registry
    assert registry.get_meta("revocations.json") is None  # type: ignore[attr-defined]
    registry.put_meta("revocations.json", b'{"serial": 1}')  # type: ignore[attr-defined]
    registry.put_meta("revocations.json", b'{"serial": 2}')  # type: ignore[attr-defined]
    assert backend.second_client().get_meta("revocations.json") == b'{"serial": 2}'  # type: ignore[attr-defined]
    assert list(backend.second_client().list()) == []  # not an index entry
