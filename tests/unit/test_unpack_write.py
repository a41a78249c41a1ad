"""The unpacker's writer threads and folder thread: every byte and mode lands, whatever the mix of sizes and
folders; a failure in any thread is raised by the caller, stops the rest and leaves nothing behind."""

import errno
import hashlib
import os
from pathlib import Path

import pytest

from prebake.artifacts.bundle import unpack_write
from prebake.artifacts.bundle.payload import pack, unpack
from prebake.artifacts.errors import BundleError

BUFFER = unpack_write.BUFFER


def _mixed_tree(root: Path) -> Path:
    """Runs of small files over several buffers, files across the small/large line and over several
    chunks, executables, empty files, deep and wide folders, a folder holding only folders, links."""
    sizes = [0, 1, 511, 512, 513, (1 << 20) - 512, 1 << 20, (1 << 20) + 1, 2 * BUFFER + 777, BUFFER]
    for i, size in enumerate(sizes):
        path = root / f"sizes/{i:02d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    for i in range(300):  # far more files than one run holds, in many folders
        path = root / f"triton/{i:03d}/k{i}.cubin"
        path.parent.mkdir(parents=True)
        path.write_bytes(os.urandom(i * 97 % 20000))
    deep = root / "a/b/c/d/e/f"
    deep.mkdir(parents=True)
    (deep / "leaf.json").write_text("{}")
    for name in ("sizes/03.bin", "sizes/08.bin", "a/b/c/d/e/f/leaf.json"):
        (root / name).chmod(0o755)
    os.symlink("../sizes/08.bin", root / "a/big-link")
    return root


def _snapshot(root: Path) -> dict[str, tuple[str, bool, str | None]]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = ("", False, os.readlink(path))
        elif path.is_file():
            out[rel] = (hashlib.sha256(path.read_bytes()).hexdigest(), os.access(path, os.X_OK), None)
    return out


def test_every_file_mode_and_link_lands_whatever_the_sizes_and_folders(tmp_path):
    tree = _mixed_tree(tmp_path / "tree")
    packed = pack(tree, tmp_path / "p.tar.zst")
    out = unpack(tmp_path / "p.tar.zst", tmp_path / "out", packed.files)
    assert _snapshot(out) == _snapshot(tree)


@pytest.mark.parametrize("victim", ["sizes/02.bin", "sizes/08.bin", "triton/150/k150.cubin"])
def test_a_wrong_digest_in_a_run_or_a_large_file_is_refused_and_leaves_nothing(tmp_path, victim):
    tree = _mixed_tree(tmp_path / "tree")
    packed = pack(tree, tmp_path / "p.tar.zst")
    forged = tuple(
        f.model_copy(update={"sha256": "sha256:" + "2" * 64}) if f.path == victim else f for f in packed.files
    )
    with pytest.raises(BundleError, match=f"{victim!r} does not match its manifest"):
        unpack(tmp_path / "p.tar.zst", tmp_path / "out", forged)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.*"))


def test_a_folder_that_cannot_be_made_stops_the_unpack_without_hanging_and_leaves_nothing(tmp_path, monkeypatch):
    tree = _mixed_tree(tmp_path / "tree")
    packed = pack(tree, tmp_path / "p.tar.zst")
    real_mkdir = os.mkdir

    def full_disk(path, *args, **kwargs):
        if str(path).endswith("triton/100"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(unpack_write.os, "mkdir", full_disk)
    with pytest.raises(OSError, match="No space left"):
        unpack(tmp_path / "p.tar.zst", tmp_path / "out", packed.files)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.*"))


def test_memory_is_bounded_by_the_writers_buffers(tmp_path, monkeypatch):
    """However far the writers lag, no more buffers are made than the fixed set."""
    tree = _mixed_tree(tmp_path / "tree")
    packed = pack(tree, tmp_path / "p.tar.zst")
    made = []
    real = unpack_write.Writers._take

    def counting(self):
        buf = real(self)
        made.append(id(buf))
        return buf

    monkeypatch.setattr(unpack_write, "_BUFFERS", 2)
    monkeypatch.setattr(unpack_write.Writers, "_take", counting)
    out = unpack(tmp_path / "p.tar.zst", tmp_path / "out", packed.files)
    assert _snapshot(out) == _snapshot(tree)
    assert len(set(made)) <= 2 < len(made)
