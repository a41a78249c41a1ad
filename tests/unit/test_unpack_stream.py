"""The streamed unpack: a blob unpacked while it arrives, in chunks of any size, through a bounded pipe."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from prebake.artifacts.bundle.payload import pack
from prebake.artifacts.bundle.unpack import UnpackLimits, tree_problems, unpack_streamed
from prebake.artifacts.errors import BundleError


def _packed(tmp_path: Path):
    tree = tmp_path / "tree"
    for i in range(300):
        path = tree / f"d{i % 7}" / f"f{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(i * 97))
    (tree / "big.bin").write_bytes(os.urandom(3 << 20))  # hashed in the worker thread
    packed = pack(tree, tmp_path / "p.tar.zst", level=1)
    return packed, (tmp_path / "p.tar.zst").read_bytes()


@pytest.mark.parametrize("chunk", [1, 4096, 1 << 20])
def test_a_blob_fed_in_chunks_of_any_size_unpacks_whole(tmp_path, chunk):
    packed, data = _packed(tmp_path)
    if chunk == 1:
        data_chunks = [data[i : i + 1] for i in range(0, 20000)] + [data[20000:]]
    else:
        data_chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]

    def download(tee):
        for piece in data_chunks:  # faster than the unpacker can go: the pipe must hold, never drop
            tee(piece)

    out = unpack_streamed(download, tmp_path / "out", packed.files, UnpackLimits(), "test blob")
    assert tree_problems(out, packed.files) == []


def test_a_failing_download_leaves_nothing_and_stops_the_unpacker(tmp_path):
    packed, data = _packed(tmp_path)
    before = set(threading.enumerate())  # other tests' daemon threads may still be winding down

    def download(tee):
        tee(data[: len(data) // 2])
        raise ConnectionError("the network went away")

    with pytest.raises(ConnectionError):
        unpack_streamed(download, tmp_path / "out", packed.files, UnpackLimits(), "test blob")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.tar.zst", "tree"]
    deadline = time.monotonic() + 10
    while (left := set(threading.enumerate()) - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"the unpacker left threads running: {left}"


def test_the_unpackers_refusal_is_the_answer_for_a_blob_that_downloaded_whole(tmp_path):
    packed, data = _packed(tmp_path)
    lying = tuple(f.model_copy(update={"size": f.size + 1}) if f.path == "big.bin" else f for f in packed.files)
    fed = []

    def download(tee):
        for i in range(0, len(data), 4096):
            tee(data[i : i + 4096])
            fed.append(i)

    with pytest.raises(BundleError, match="big.bin"):
        unpack_streamed(download, tmp_path / "out", lying, UnpackLimits(), "test blob")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_a_wrong_download_is_the_answer_even_when_the_unpacker_refused_first(tmp_path):
    packed, data = _packed(tmp_path)
    corrupt = bytearray(data)
    corrupt[200] ^= 0xFF

    class WrongDigest(BundleError):
        pass

    def download(tee):
        for i in range(0, len(corrupt), 4096):
            tee(bytes(corrupt[i : i + 4096]))  # the unpacker refuses early; the rest is only hashed
        raise WrongDigest("the blob does not hash to its digest")

    with pytest.raises(WrongDigest):
        unpack_streamed(download, tmp_path / "out", packed.files, UnpackLimits(), "test blob")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
