"""Parallel ranged downloads (registry/shared/ranged.py): parts in any order, from any thread, reach the
size bound, the sha256 and the consumer in order, each byte once."""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import threading

import pytest

from prebake.artifacts.ports.errors import BlobSizeMismatch
from prebake.registry.shared.ranged import OrderedSink, part_ranges, run_parts
from prebake.registry.shared.transfer import SizedSink

_MiB = 1 << 20


@pytest.mark.parametrize("total", [1, _MiB, 5 * _MiB + 3, 4 * _MiB + (_MiB // 4)])
def test_the_ranges_cover_every_byte_once_and_a_short_remainder_rides_with_the_part_before(total):
    ranges = list(part_ranges(total, _MiB))
    assert ranges[0][0] == 0 and ranges[-1][1] == total - 1
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))
    assert all(last - first + 1 <= _MiB + _MiB // 4 for first, last in ranges)


def test_parts_written_out_of_order_from_threads_reach_the_consumer_in_order(tmp_path):
    data = os.urandom(3 * _MiB + 12345)
    fed = []
    sized = SizedSink(len(data), "sha256:" + hashlib.sha256(data).hexdigest(), "test", "test", fed.append)
    ranges = list(part_ranges(len(data), 256 << 10))
    random.Random(7).shuffle(ranges)
    with (tmp_path / "blob").open("w+b") as f:
        sink = OrderedSink(f, sized)

        def fetch(first: int, last: int) -> None:
            for at in range(first, last + 1, 64 << 10):  # in chunks, as a response body arrives
                sink.write_at(at, data[at : min(at + (64 << 10), last + 1)])

        run_parts(ranges, fetch, workers=4, name="test-part", stop=threading.Event())
    sized.finish()
    assert b"".join(fed) == data and sink.digest() == sized.digest
    assert (tmp_path / "blob").read_bytes() == data


def test_a_part_past_the_manifests_size_is_refused(tmp_path):
    sized = SizedSink(100, "sha256:" + "0" * 64, "test", "test")
    with (tmp_path / "blob").open("w+b") as f, pytest.raises(BlobSizeMismatch, match="runs past 100 bytes"):
        OrderedSink(f, sized).write_at(90, b"x" * 20)


def test_the_first_failing_part_stops_the_others_and_is_raised():
    stop, started = threading.Event(), []

    def fetch(first: int, last: int) -> None:
        started.append(first)
        if first == 0:
            raise ValueError("part 0 broke")
        stop.wait(5)
        assert stop.is_set(), "the others were told to stop"

    with pytest.raises(ValueError, match="part 0 broke"):
        run_parts(part_ranges(10 * _MiB, _MiB), fetch, workers=2, name="test-part", stop=stop)
    assert len(started) < 10, "parts not yet started were cancelled"


def test_the_hashed_front_of_a_download_leaves_the_page_cache_in_steps_and_nothing_beyond_it(tmp_path, monkeypatch):
    """The blob's front, once hashed and handed on, is never read again: the kernel is asked to drop it
    (transfer.Uncaching) every UNCACHE_STEP bytes, never past the front, and the bytes are intact."""
    from prebake.registry.shared import transfer

    advised: list[tuple[int, int, int]] = []
    real = os.posix_fadvise
    monkeypatch.setattr(
        transfer.os, "posix_fadvise", lambda fd, at, n, how: (advised.append((at, n, how)), real(fd, at, n, how))
    )
    monkeypatch.setattr(transfer, "UNCACHE_STEP", _MiB)
    data = os.urandom(5 * _MiB + 777)
    fronts: list[int] = []
    sized = SizedSink(
        len(data), "sha256:" + hashlib.sha256(data).hexdigest(), "test", "test", lambda c: fronts.append(len(c))
    )
    ranges = list(part_ranges(len(data), 256 << 10))
    random.Random(3).shuffle(ranges)
    with (tmp_path / "blob").open("w+b") as f:
        sink = OrderedSink(f, sized)
        run_parts(ranges, lambda a, b: sink.write_at(a, data[a : b + 1]), workers=3, name="t", stop=threading.Event())
    assert sink.digest() == sized.digest and (tmp_path / "blob").read_bytes() == data
    assert len(advised) >= 4, "a 5 MiB download with a 1 MiB step is dropped at least four times"
    assert all(at == 0 and how == os.POSIX_FADV_DONTNEED and n <= len(data) for at, n, how in advised)
    assert [n for _, n, _ in advised] == sorted(n for _, n, _ in advised), "the front only grows"


def test_a_copied_local_blob_leaves_the_page_cache_as_it_is_copied(tmp_path, monkeypatch):
    from prebake.registry.shared import transfer

    advised: list[int] = []
    monkeypatch.setattr(transfer.os, "posix_fadvise", lambda fd, at, n, how: advised.append(n))
    monkeypatch.setattr(transfer, "UNCACHE_STEP", _MiB)
    data = os.urandom(3 * _MiB + 5)
    (tmp_path / "src").write_bytes(data)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    transfer.copy_verified(tmp_path / "src", tmp_path / "dest", digest, where="w", registry_url="r", size=len(data))
    assert (tmp_path / "dest").read_bytes() == data
    assert advised == [_MiB, 2 * _MiB, 3 * _MiB]
