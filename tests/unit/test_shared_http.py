"""The HTTP care the Hub and OCI backends share (registry/shared/http.py): Retry-After, the retry loop
that waits as asked, and bounded bodies; and OCI's small files as keys of the object-store port."""

from __future__ import annotations

import email.utils
import time

import pytest

from prebake.artifacts.errors import BundleError
from prebake.artifacts.layout import meta_relpath, side_relpath, summary_relpath
from prebake.artifacts.ports.errors import BlobSizeMismatch
from prebake.registry.oci.files import _keyed, _tagged
from prebake.registry.shared.http import MAX_RETRY_AFTER_S, Bound, as_asked, asked_wait, read_bounded, retry_after_s


class _Answer:
    def __init__(self, status: int, retry_after: str = "", body: bytes = b"", length: str | None = None):
        self.status_code = status
        self.headers = {"Retry-After": retry_after} if retry_after else {}
        if length is not None:
            self.headers["Content-Length"] = length
        self.body = body

    def iter_bytes(self, chunk_size: int | None = None):
        for i in range(0, len(self.body), 3):
            yield self.body[i : i + 3]


class _Refused(Exception):
    def __init__(self, response: _Answer):
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def test_retry_after_reads_seconds_and_dates_and_caps_both():
    assert retry_after_s("2") == 2.0
    assert retry_after_s("") == 0.0
    assert retry_after_s("soon") == 0.0
    assert retry_after_s("100000") == MAX_RETRY_AFTER_S
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_s(later) <= 30


def test_a_status_is_found_behind_the_wrapping_a_library_puts_around_it():
    try:
        try:
            raise _Refused(_Answer(503, "1"))
        except _Refused as inner:
            raise RuntimeError("the library's own error") from inner
    except RuntimeError as outer:
        assert asked_wait(outer) == (503, 1.0)
    assert asked_wait(_Refused(_Answer(500, "7"))) == (500, 0.0)  # only 429 and 503 ask
    assert asked_wait(ValueError("no answer")) == (0, 0.0)


def test_a_call_is_asked_again_only_when_its_answer_asks_and_only_so_often():
    calls = []

    def busy_then_fine() -> str:
        calls.append(1)
        if len(calls) < 2:
            raise _Refused(_Answer(429, "0.01"))
        return "fine"

    assert as_asked(busy_then_fine, attempts=3) == "fine"
    assert len(calls) == 2

    calls.clear()

    def always_busy() -> str:
        calls.append(1)
        raise _Refused(_Answer(503, "0.01"))

    with pytest.raises(_Refused):
        as_asked(always_busy, attempts=3)
    assert len(calls) == 3

    calls.clear()

    def refused() -> str:
        calls.append(1)
        raise _Refused(_Answer(403))

    with pytest.raises(_Refused):
        as_asked(refused, attempts=3)
    assert len(calls) == 1  # a refusal that asks nothing is not asked again


def test_a_body_is_read_to_its_bound_and_refused_past_it_in_bytes_or_in_time():
    assert read_bounded(_Answer(200, body=b"0123456789"), Bound(10, "here")) == b"0123456789"
    with pytest.raises(BundleError, match="here sent over 9 bytes"):
        read_bounded(_Answer(200, body=b"0123456789"), Bound(9, "here"))
    with pytest.raises(BundleError, match="is over 9 bytes"):
        read_bounded(_Answer(200, body=b"", length="10"), Bound(9, "here"))  # refused before a byte
    with pytest.raises(BundleError, match=r"or for over 0 s"):
        read_bounded(_Answer(200, body=b"0123"), Bound(10, "here", within_s=0.0))
    with pytest.raises(BlobSizeMismatch, match="sent over"):
        Bound(1, "blob", error=BlobSizeMismatch).add(2)


def test_oci_small_files_map_the_ports_keys_to_tags_and_back():
    digest = "sha256:" + "ab" * 32
    for key in (side_relpath(digest, "provenance.json"), meta_relpath("revoked.json"), summary_relpath("graphs")):
        tag = _tagged(key)[0]
        assert _keyed(tag) == key
    assert _tagged(side_relpath(digest, "provenance.json"))[0] == f"prebake-side.{'ab' * 32}.provenance.json"
    assert _keyed("graphs-" + "0" * 64) is None  # an index entry's tag is no small file
    with pytest.raises(Exception, match="not a small file"):
        _tagged("index/graphs/" + "0" * 64 + ".json")
