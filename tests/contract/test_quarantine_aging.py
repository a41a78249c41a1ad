"""Write-backs age out (issue 22, point 5): `prebake.registry.review.aging.prune` on the quarantine namespace of
every backend that keeps one (folder, S3 on moto, the Hub stand-in, OCI on docker-registry).

What waited longer than the maximum age goes, entry first, then its blob and the files beside it;
a blob that an entry which stays also names is kept; a stamp in the future counts as expired;
what is younger stays, whole and fetchable; the index every pod reads is never touched.
"""

from __future__ import annotations

import datetime as dt

import pytest

from prebake.artifacts.bake.provenance import SIDE_NAME
from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.keys import Key
from prebake.artifacts.store.local import Store
from prebake.registry import open_registry
from prebake.registry.review.aging import Aged, parse_age, prune, say_age
from prebake.registry.review.verify import verify_registry
from prebake.registry.review.writeback import quarantine_address
from tests.support.bundles import make_bundle

NOW = dt.datetime.now(dt.UTC)


def _aged(manifest, days: float, model: str | None = None):
    """A copy of a write-back made `days` ago (negative: in the future), under another key when `model` is given."""
    update: dict = {"created": (NOW - dt.timedelta(days=days)).isoformat(timespec="seconds")}
    update["labels"] = {**manifest.labels, "writeback": "quarantine"}
    if model is not None:
        key = Key.of(manifest.kind, {"model": {"name": model}})
        update |= {"key": {g: dict(f) for g, f in key.groups}, "key_digest": key.digest}
    return manifest.model_copy(update=update)


@pytest.mark.parametrize("backend", ["file", "s3", "hf", "oci"], indirect=True)
def test_write_backs_older_than_the_maximum_age_are_removed_and_the_rest_stay_whole(backend, tmp_path):
    index = backend.registry
    incoming = open_registry(quarantine_address(index.url))
    old, fresh, future = (make_bundle(tmp_path, model=m) for m in ("old", "fresh", "future"))
    reviewed = make_bundle(tmp_path, model="reviewed")
    index.publish(reviewed.manifest, reviewed.blob)  # the shared index: never pruned, whatever its age
    entries = {
        "old": (_aged(old.manifest, 10), old.blob),
        "fresh": (_aged(fresh.manifest, 1), fresh.blob),
        "twin": (_aged(fresh.manifest, 10, model="twin"), fresh.blob),  # old, but its blob is fresh's too
        "future": (_aged(future.manifest, -400), future.blob),
    }
    for manifest, blob in entries.values():
        incoming.publish(manifest, blob)
    incoming.put_side(old.manifest.blob.digest, SIDE_NAME, b"an attestation the pod wrote")

    planned = prune(incoming, parse_age("7d"), dry_run=True)
    assert sorted(r.outcome for r in planned) == ["kept", "would remove", "would remove", "would remove"]
    assert len(list(incoming.list())) == 4, "a dry run removes nothing"

    done = {(r.key_digest, r.outcome) for r in prune(incoming, parse_age("7d"))}
    assert done == {
        (entries["old"][0].key_digest, "removed"),
        (entries["twin"][0].key_digest, "removed"),
        (entries["future"][0].key_digest, "removed"),  # a stamp from the future cannot keep it waiting
        (entries["fresh"][0].key_digest, "kept"),
    }
    assert [m.key_digest for m in incoming.list()] == [entries["fresh"][0].key_digest]
    assert incoming.get_side(old.manifest.blob.digest, SIDE_NAME) is None, "the files beside its blob went too"
    with pytest.raises(PrebakeError):
        incoming.fetch_blob(old.manifest.blob.digest, tmp_path / "out" / "old.tar.zst")
    store = Store(tmp_path / "home")
    store.install(entries["fresh"][0], incoming)  # the twin's removal left the shared blob in place
    assert store.lookup("graphs", entries["fresh"][0].key_digest) is not None
    report = verify_registry(incoming, trust=None, quarantine=False)
    assert report.entries == 1 and report.exit_code == 0
    assert index.lookup("graphs", reviewed.manifest.key_digest) is not None


def test_a_maximum_age_is_a_positive_duration_said_plainly():
    assert parse_age("36h") == dt.timedelta(hours=36) and parse_age("2") == dt.timedelta(days=2)
    assert parse_age("90m") == dt.timedelta(minutes=90) and parse_age("1w") == dt.timedelta(days=7)
    for bad in ("", "soon", "-1d", "0", "7 days"):
        with pytest.raises(PrebakeError, match="write a positive number with s, m, h, d or w"):
            parse_age(bad)
    assert [say_age(parse_age(t)) for t in ("7d", "36h", "90m", "45s", "1.5d")] == ["7d", "36h", "90m", "45s", "36h"]
    assert Aged("graphs", "0" * 64, "", "kept").expired is False
