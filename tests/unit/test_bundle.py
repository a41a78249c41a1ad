"""Bundles: deterministic packing, and unpacking that refuses anything unsafe and leaves nothing behind."""

import io
import os
import tarfile
from pathlib import Path

import pytest
import zstandard

from prebake.artifacts.bundle.manifest import FileEntry
from prebake.artifacts.bundle.payload import UnpackLimits, file_digest, pack, unpack
from prebake.artifacts.errors import BundleError, UnsafeArchiveError
from tests.support.archives import archive, file


def _tree(root: Path) -> Path:
    (root / "fxgraph" / "ab").mkdir(parents=True)
    (root / "fxgraph" / "ab" / "entry").write_bytes(os.urandom(4096))
    (root / "kernels").mkdir()
    so = root / "kernels" / "k.so"
    so.write_bytes(b"\x7fELF" + os.urandom(1000))
    so.chmod(0o755)
    (root / "buckets.json").write_text('{"prompt": []}')
    os.symlink("kernels/k.so", root / "latest.so")
    return root


def _tar_zst(path: Path, entries) -> Path:
    return archive(path, *entries)


def _file(name: str, data: bytes = b"x"):
    return file(name, data)


def file_digest_of(data: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_same_tree_gives_the_same_blob_digest_whatever_the_thread_count(tmp_path):
    tree = _tree(tmp_path / "tree")
    a = pack(tree, tmp_path / "a.tar.zst", threads=1)
    b = pack(tree, tmp_path / "b.tar.zst", threads=4)
    assert a.blob == b.blob
    assert (tmp_path / "a.tar.zst").read_bytes() == (tmp_path / "b.tar.zst").read_bytes()


def test_mtimes_and_owners_do_not_change_the_digest(tmp_path):
    tree = _tree(tmp_path / "tree")
    before = pack(tree, tmp_path / "a.tar.zst").blob
    for path in tree.rglob("*"):
        if not path.is_symlink():
            os.utime(path, (1, 1))
    assert pack(tree, tmp_path / "b.tar.zst").blob == before


def test_a_changed_byte_changes_the_digest(tmp_path):
    tree = _tree(tmp_path / "tree")
    before = pack(tree, tmp_path / "a.tar.zst").blob
    (tree / "buckets.json").write_text('{"prompt": [1]}')
    assert pack(tree, tmp_path / "b.tar.zst").blob != before


def test_round_trip_restores_files_modes_and_links(tmp_path):
    tree = _tree(tmp_path / "tree")
    packed = pack(tree, tmp_path / "p.tar.zst")
    assert packed.blob.digest == file_digest(tmp_path / "p.tar.zst")
    out = unpack(tmp_path / "p.tar.zst", tmp_path / "out", packed.files)
    assert (out / "fxgraph/ab/entry").read_bytes() == (tree / "fxgraph/ab/entry").read_bytes()
    assert os.access(out / "kernels/k.so", os.X_OK)
    assert os.readlink(out / "latest.so") == "kernels/k.so"


def test_files_that_do_not_match_the_manifest_are_refused(tmp_path):
    tree = _tree(tmp_path / "tree")
    packed = pack(tree, tmp_path / "p.tar.zst")
    forged = tuple(
        f.model_copy(update={"sha256": "sha256:" + "1" * 64}) if f.path == "buckets.json" else f for f in packed.files
    )
    with pytest.raises(BundleError, match="does not match its manifest"):
        unpack(tmp_path / "p.tar.zst", tmp_path / "out", forged)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.*"))


@pytest.mark.parametrize("name", ["/etc/passwd", "../escape", "a/../../escape"])
def test_entries_that_escape_the_folder_are_refused(tmp_path, name):
    blob = _tar_zst(tmp_path / "evil.tar.zst", [_file("ok.txt"), _file(name)])
    with pytest.raises(UnsafeArchiveError, match="does not name|more entries"):
        unpack(blob, tmp_path / "out", ())
    with pytest.raises(ValueError, match="must be relative|'..'"):
        FileEntry(path=name, size=1, sha256="sha256:" + "0" * 64)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize("target", ["/etc/shadow", "../../outside", "sub/../../x"])
def test_symlinks_that_leave_the_folder_are_refused(tmp_path, target):
    link = tarfile.TarInfo("link")
    link.type, link.linkname = tarfile.SYMTYPE, target
    blob = _tar_zst(tmp_path / "evil.tar.zst", [(link, None)])
    with pytest.raises(UnsafeArchiveError):
        unpack(blob, tmp_path / "out", ())
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="leaves its tree"):
        FileEntry(path="link", size=0, sha256="sha256:" + "0" * 64, link=target)


def test_a_symlink_in_the_tree_that_leaves_it_cannot_be_packed(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    os.symlink("/etc/passwd", tree / "bad")
    with pytest.raises(UnsafeArchiveError):
        pack(tree, tmp_path / "p.tar.zst")


@pytest.mark.parametrize("kind", [tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_hard_links_and_device_files_are_refused(tmp_path, kind):
    special = tarfile.TarInfo("special")
    special.type = kind
    special.linkname = "ok.txt" if kind == tarfile.LNKTYPE else ""
    blob = _tar_zst(tmp_path / "evil.tar.zst", [_file("ok.txt"), (special, None)])
    with pytest.raises(UnsafeArchiveError):
        unpack(blob, tmp_path / "out", ())
    assert not (tmp_path / "out").exists()


def test_archives_past_the_size_cap_are_refused(tmp_path):
    blob = _tar_zst(tmp_path / "big.tar.zst", [_file("a", b"\0" * 10_000), _file("b", b"\0" * 10_000)])
    files = tuple(FileEntry(path=n, size=10_000, sha256=file_digest_of(b"\0" * 10_000)) for n in "ab")
    with pytest.raises(UnsafeArchiveError, match="20000 bytes of files, over the cap of 15000"):
        unpack(blob, tmp_path / "out", files, limits=UnpackLimits(max_bytes=15_000))
    assert not (tmp_path / "out").exists()


def test_archives_past_the_entry_cap_are_refused(tmp_path):
    blob = _tar_zst(tmp_path / "many.tar.zst", [_file(f"f{i}") for i in range(5)])
    files = tuple(FileEntry(path=f"f{i}", size=1, sha256=file_digest_of(b"x")) for i in range(5))
    with pytest.raises(UnsafeArchiveError, match="declares 5 files, over the cap of 3"):
        unpack(blob, tmp_path / "out", files, limits=UnpackLimits(max_entries=3))


def test_a_zstd_window_past_the_cap_is_refused(tmp_path):
    data = os.urandom(1 << 16)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info, _ = _file("a", data)
        tar.addfile(info, io.BytesIO(data))
    params = zstandard.ZstdCompressionParameters.from_level(19, window_log=24)
    with (tmp_path / "wide.tar.zst").open("wb") as f:  # streamed: the size is unknown, so the window stays 2^24
        with zstandard.ZstdCompressor(compression_params=params).stream_writer(f) as zw:
            zw.write(raw.getvalue())
    with pytest.raises(UnsafeArchiveError, match="window"):
        unpack(tmp_path / "wide.tar.zst", tmp_path / "out", (), limits=UnpackLimits(max_window_log=20))
    assert not (tmp_path / "out").exists()


def test_a_truncated_blob_is_refused_and_leaves_nothing(tmp_path):
    tree = _tree(tmp_path / "tree")
    packed = pack(tree, tmp_path / "p.tar.zst")
    data = (tmp_path / "p.tar.zst").read_bytes()
    (tmp_path / "p.tar.zst").write_bytes(data[: len(data) // 2])
    with pytest.raises(BundleError):
        unpack(tmp_path / "p.tar.zst", tmp_path / "out", packed.files)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_unpack_never_overwrites_an_existing_folder(tmp_path):
    tree = _tree(tmp_path / "tree")
    packed = pack(tree, tmp_path / "p.tar.zst")
    (tmp_path / "out").mkdir()
    with pytest.raises(BundleError, match="already exists"):
        unpack(tmp_path / "p.tar.zst", tmp_path / "out", packed.files)


def test_file_entries_must_carry_real_digests():
    with pytest.raises(ValueError):
        FileEntry(path="a", size=1, sha256="md5:abc")
