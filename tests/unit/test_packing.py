"""Packing: the bytes tarfile would write, every file hashed on the way, large files streamed, nothing left on failure."""

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest
import zstandard

from prebake.artifacts.bundle import pack as packing
from prebake.artifacts.bundle import pack_read
from prebake.artifacts.bundle.pack import pack
from prebake.artifacts.errors import BundleError, UnsafeArchiveError

LONG = "d" * 60 + "/" + "n" * 80  # past the 100 bytes of a tar header's name field: a GNU long-name entry


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "small.bin").write_bytes(os.urandom(3000))
    (root / "empty").write_bytes(b"")
    run = root / "run.sh"
    run.write_text("#!/bin/sh\n")
    run.chmod(0o755)
    (root / LONG).parent.mkdir(parents=True)
    (root / LONG).write_text("long name")
    os.symlink("sub/small.bin", root / "link")
    os.symlink("sub/" + "x" * 110, root / ("l" * 120))  # a long link name and target; dangling is fine
    (root / "big.bin").write_bytes(os.urandom(packing._SMALL + 12345))  # streamed, not batched
    return root


def _tarfile_stream(tree: Path) -> bytes:
    """What the packer before this one wrote: tarfile in GNU format, sorted entries, 0:0, mtime 0."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        for rel, name, st in packing._walk(tree):
            path = Path(name)
            info = tarfile.TarInfo(rel)
            info.uid = info.gid = info.mtime = 0
            info.uname = info.gname = ""
            if path.is_symlink():
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(path), 0o777
                tar.addfile(info)
            else:
                info.size, info.mode = st.st_size, 0o755 if st.st_mode & 0o111 else 0o644
                with path.open("rb") as f:
                    tar.addfile(info, f)
    return out.getvalue()


def test_the_payload_is_byte_for_byte_what_tarfile_writes(tmp_path):
    tree = _tree(tmp_path / "tree")
    pack(tree, tmp_path / "p.tar.zst", threads=2)
    with (tmp_path / "p.tar.zst").open("rb") as f:
        payload = zstandard.ZstdDecompressor().stream_reader(f).read()
    assert payload == _tarfile_stream(tree)


def test_every_file_is_hashed_including_streamed_large_ones(tmp_path):
    tree = _tree(tmp_path / "tree")
    packed = pack(tree, tmp_path / "p.tar.zst")
    for entry in packed.files:
        path = tree / entry.path
        data = os.readlink(path).encode() if entry.link else path.read_bytes()
        assert entry.sha256 == "sha256:" + hashlib.sha256(data).hexdigest(), entry.path
    assert packed.blob.digest == "sha256:" + hashlib.sha256((tmp_path / "p.tar.zst").read_bytes()).hexdigest()
    assert [e.path for e in packed.files] == sorted(e.path for e in packed.files)


def test_the_tree_is_listed_in_the_order_of_its_relative_paths(tmp_path):
    """Listed folder by folder as packing goes, and still in the order of the sorted full paths:
    names that sort before "/" ("a-b", "a.txt", "a!") beside a folder "a", links to folders, deep trees."""
    tree = tmp_path / "tree"
    for rel in ("a/b", "a/c/d", "a-b", "a.txt", "a!", "a0/x", "ab", "b/a/a/a/a", "b.x/y", " space", "é/z", "a/b0"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(rel)
    (tree / "a" / "c" / "empty").mkdir()
    os.symlink("a", tree / "a.link")
    os.symlink("c", tree / "a" / "c.l")
    listed = [rel for rel, _, _ in packing._walk(tree)]
    expected = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_symlink() or not p.is_dir())
    assert listed == expected
    assert "a.link" in listed and "a/c/empty" not in listed


def test_a_folder_that_cannot_be_listed_is_refused_by_name(tmp_path, monkeypatch):
    """As root (CI) chmod 0 does not stop a listing, so the refusal the kernel gives a user is handed in."""
    tree = _tree(tmp_path / "tree")
    real_scandir = os.scandir

    def refuse_sub(path):
        if str(path).endswith("/sub"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(packing.os, "scandir", refuse_sub)
    with pytest.raises(BundleError, match="sub: Permission denied; make it readable"):
        pack(tree, tmp_path / "p.tar.zst")
    assert not (tmp_path / "p.tar.zst").exists()


@pytest.mark.parametrize("gone", ["sub/small.bin", "big.bin"])
def test_a_file_removed_while_packed_is_refused_by_name(tmp_path, monkeypatch, gone):
    """Listed, then deleted before it is read: a small file read by a reader thread, or a large one streamed."""
    tree = _tree(tmp_path / "tree")
    real_walk = packing._walk

    def walk_then_remove(root):
        found = list(real_walk(root))
        (root / gone).unlink()
        return iter(found)

    monkeypatch.setattr(packing, "_walk", walk_then_remove)
    with pytest.raises(BundleError, match=f"cannot read .*{gone} while packing it .*No such file"):
        pack(tree, tmp_path / "p.tar.zst")
    assert not (tmp_path / "p.tar.zst").exists()


def test_a_refused_pack_leaves_no_blob_behind(tmp_path):
    tree = _tree(tmp_path / "tree")
    os.symlink("../../outside", tree / "sub" / "escape")
    with pytest.raises(UnsafeArchiveError, match="leaves its folder"):
        pack(tree, tmp_path / "p.tar.zst")
    assert not (tmp_path / "p.tar.zst").exists()


def test_several_large_files_share_the_read_ahead_buffers_byte_for_byte(tmp_path):
    """Large files one after another (the last not a whole chunk), runs of small files between them:
    the read-ahead buffers are reused from file to file and the payload is still what tarfile writes."""
    tree = _tree(tmp_path / "tree")
    chunk = pack_read._CHUNK
    for i, size in enumerate([packing._SMALL + 1, 3 * chunk, 2 * chunk + 4097]):
        (tree / f"lib{i}.so").write_bytes(os.urandom(size))
        for j in range(40):
            (tree / f"lib{i}.so.d{j:02d}").write_bytes(os.urandom(j * 211))
    packed = pack(tree, tmp_path / "p.tar.zst", threads=2)
    with (tmp_path / "p.tar.zst").open("rb") as f:
        payload = zstandard.ZstdDecompressor().stream_reader(f).read()
    assert payload == _tarfile_stream(tree)
    big = next(e for e in packed.files if e.path == "lib2.so")
    assert big.sha256 == "sha256:" + hashlib.sha256((tree / "lib2.so").read_bytes()).hexdigest()


def test_a_large_file_that_grows_while_packed_is_refused(tmp_path, monkeypatch):
    tree = _tree(tmp_path / "tree")
    real_walk = packing._walk

    def walk_then_grow(root):
        found = list(real_walk(root))  # listed whole first, so the size read is the old one
        with (root / "big.bin").open("ab") as f:
            f.write(b"more")
        return found

    monkeypatch.setattr(packing, "_walk", walk_then_grow)
    with pytest.raises(BundleError, match="changed size"):
        pack(tree, tmp_path / "p.tar.zst")
    assert not (tmp_path / "p.tar.zst").exists()
