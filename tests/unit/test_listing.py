"""prebake.artifacts.ports.listing: the summary is a cache the listing verifies, never the source of truth."""

from __future__ import annotations

import pytest

from prebake.artifacts.bundle.manifest import Signature
from prebake.artifacts.errors import BundleError
from prebake.artifacts.ports.listing import Listed, ListingSummary, Read, SummaryRow, reconcile
from tests.support.index_seed import synthetic_manifests

ROWS = [Listed.of(m) for m in synthetic_manifests(4, files=1)]


def _reader(calls: list[list[str]], rows: dict[str, Listed | None]):
    def read(digests):
        calls.append(list(digests))
        return [Read(d, f"new-{d[:4]}", rows[d]) for d in digests]

    return read


def test_rows_follow_the_listing_and_only_unanswered_entries_are_read():
    a, b, c, d = ROWS
    cached = ListingSummary(
        kind="graphs", rows=(SummaryRow(tag="1", row=a), SummaryRow(tag="old", row=b), SummaryRow(tag="1", row=d))
    )
    present = [(c.key_digest, "1"), (a.key_digest, "1"), (b.key_digest, "2")]  # d deleted, c new, b replaced
    calls: list[list[str]] = []

    result = reconcile("graphs", present, cached, _reader(calls, {c.key_digest: c, b.key_digest: b}))

    assert result.rows == (c, a, b)
    assert calls == [[c.key_digest, b.key_digest]] and result.reads == 2 and result.stale
    assert [r.tag for r in result.summary.rows] == [f"new-{c.key_digest[:4]}", "1", f"new-{b.key_digest[:4]}"]


def test_an_entry_gone_since_the_listing_or_a_row_of_another_key_is_left_out():
    a, b, c, _ = ROWS
    present = [(a.key_digest, "1"), (b.key_digest, "1")]
    result = reconcile("graphs", present, None, _reader([], {a.key_digest: None, b.key_digest: c}))
    assert result.rows == () and result.summary.rows == ()


def test_a_summary_of_another_kind_answers_for_nothing():
    a = ROWS[0]
    cached = ListingSummary(kind="autotune", rows=(SummaryRow(tag="1", row=a),))
    calls: list[list[str]] = []
    result = reconcile("graphs", [(a.key_digest, "1")], cached, _reader(calls, {a.key_digest: a}))
    assert result.rows == (a,) and calls == [[a.key_digest]]


def test_an_up_to_date_summary_reads_nothing_and_is_not_stale():
    cached = ListingSummary(kind="graphs", rows=tuple(SummaryRow(tag="1", row=r) for r in ROWS))
    result = reconcile("graphs", [(r.key_digest, "1") for r in ROWS], cached, _reader([], {}))
    assert result.rows == tuple(ROWS) and result.reads == 0 and not result.stale
    assert ListingSummary.parse(cached.to_bytes(), "here") == cached


@pytest.mark.parametrize("raw", [b"", b"[]", b'{"kind": "graphs", "rows": [], "extra": 1}', b"{" * 100_000])
def test_a_malformed_summary_is_a_bundle_error(raw):
    with pytest.raises(BundleError, match="listing summary here"):
        ListingSummary.parse(raw, "here")


def test_signer_names_and_build_time_survive_the_summary():
    manifest = synthetic_manifests(1, files=1)[0].model_copy(
        update={"signatures": (Signature(signer="ci-key", signature="c2ln", version=2),), "build_seconds": 12.5}
    )
    row = Listed.of(manifest)
    stored = ListingSummary.parse(
        ListingSummary(kind="graphs", rows=(SummaryRow(tag="t", row=row),)).to_bytes(), "here"
    )
    assert stored.rows[0].row == row and row.signers == ("ci-key",) and row.build_seconds == 12.5
