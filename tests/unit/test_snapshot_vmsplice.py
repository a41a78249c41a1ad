"""The streamed restore's pages go into CRIU's pipe by reference (engine/bundled/snapshot/vmsplice.py,
stream_wire.Lane): the pipe holds the lane's own buffers, so a buffer filled again before the reader
took its pages would change what CRIU reads. A slow reader over a real pipe gets every chunk as it
was, with the lane's eight buffers turning many times; the same reader sees the damage when buffers
are freed too early (the check can fail); a host without vmsplice gets the same bytes, written."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from prebake.engine.bundled.snapshot import stream_wire, vmsplice

CHUNKS = 3 * stream_wire.LANE_BUFFERS  # every buffer reused twice at least


def _splices() -> bool:
    """Whether this host lets vmsplice into a pipe (a libc without it, or seccomp, does not)."""
    read_end, write_end = os.pipe()
    try:
        return vmsplice.into(write_end, memoryview(bytearray(16)))
    finally:
        os.close(read_end)
        os.close(write_end)


def _stream_through_a_slow_reader() -> tuple[bytes, bytes, stream_wire.Lane]:
    """CHUNKS distinct chunks and a short last one through a Lane into a pipe whose reader takes
    64 KiB at a time, pausing now and then; (what went in, what came out, the lane)."""
    rng = random.Random(7)
    chunks = [rng.randbytes(stream_wire.CHUNK) for _ in range(CHUNKS)] + [rng.randbytes(1000)]
    read_end, write_end = os.pipe()
    got: list[bytes] = []

    def reader() -> None:
        while block := os.read(read_end, 1 << 16):
            got.append(block)
            if len(got) % 16 == 0:
                time.sleep(0.002)  # the filler runs ahead: buffers would turn under the pipe's pages

    reading = threading.Thread(target=reader)
    reading.start()
    lane = stream_wire.Lane(lambda: write_end)
    for i, chunk in enumerate(chunks):
        buffer = lane.free()
        buffer[: len(chunk)] = chunk
        lane.put(buffer, len(chunk), last=i == len(chunks) - 1)
    stream_wire.write_all(write_end, lane.finish())  # the held last chunk, as the streamer writes it
    reading.join(60)
    os.close(read_end)
    return b"".join(chunks), b"".join(got), lane


def test_a_slow_reader_gets_every_chunk_as_it_was_while_the_buffers_turn():
    sent, received, lane = _stream_through_a_slow_reader()
    assert len(received) == len(sent)
    assert received == sent
    if _splices():  # the chunks went by reference, not copied
        assert lane.by_reference == CHUNKS * stream_wire.CHUNK


def test_buffers_freed_before_the_reader_took_their_pages_change_what_it_reads(monkeypatch):
    if not _splices():
        pytest.skip("this host refuses vmsplice: nothing is held by reference")

    class TooEarly(vmsplice.Pinned):
        def add(self, buffer, size):
            self.sent += size
            return [buffer]  # freed at once: the pipe may still hold its pages

    monkeypatch.setattr(vmsplice, "Pinned", TooEarly)
    sent, received, _ = _stream_through_a_slow_reader()
    assert len(received) == len(sent)
    assert received != sent  # the check above sees a wrong reuse


def test_a_host_without_vmsplice_gets_the_same_bytes_written(monkeypatch):
    monkeypatch.setattr(vmsplice, "_vmsplice", None)
    sent, received, lane = _stream_through_a_slow_reader()
    assert received == sent
    assert lane.by_reference == 0


def test_a_buffer_is_free_again_once_a_pipes_capacity_went_in_after_it():
    pinned = vmsplice.Pinned(capacity=100)
    a, b, c = (memoryview(bytearray(1)) for _ in range(3))
    assert pinned.add(a, 60) == []
    assert pinned.add(b, 39) == []  # 39 bytes after a: the pipe may still hold a's pages
    freed = pinned.add(c, 61)  # 100 after a, 61 after b
    assert [x is a for x in freed] == [True]


def test_a_pipe_the_reader_left_is_refused_as_a_write_is():
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        if not _splices():
            pytest.skip("this host refuses vmsplice")
        with pytest.raises(BrokenPipeError):
            vmsplice.into(write_end, memoryview(bytearray(4096)))
    finally:
        os.close(write_end)
