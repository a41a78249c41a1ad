"""Hostile archives that pass the per-entry checks one by one: links chained to reach outside,
entries placed through links, folders by the million, names used twice. Each is refused
because the unpacker holds every member to its manifest before writing it, and no manifest
can name such a tree (artifacts/bundle/manifest.py refuses it)."""

from pathlib import Path

import pytest

from prebake.artifacts.bundle.payload import UnpackLimits, unpack
from prebake.artifacts.errors import UnsafeArchiveError
from tests.support.archives import archive, file, folder, link


def _archive(path: Path, *entries) -> Path:
    return archive(path, *entries)


def _file(name: str, data: bytes = b"pwned"):
    return file(name, data)


_link, _folder = link, folder


def _nothing_left(tmp_path: Path) -> list[str]:
    """Whatever unpacking left outside the archive and the test's own folder."""
    return sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.name != "evil.tar.zst")


def _unpack_into(tmp_path: Path, blob: Path, **limits) -> None:
    (tmp_path / "store").mkdir(exist_ok=True)
    unpack(blob, tmp_path / "store" / "tree", (), limits=UnpackLimits(**limits))


def test_a_file_written_through_a_chain_of_links_that_each_stay_inside_is_refused(tmp_path):
    # "s" -> "." and "s/up" -> ".." each resolve inside on paper; together "s/up/x" is the tree's parent.
    blob = _archive(tmp_path / "evil.tar.zst", _link("s", "."), _link("s/up", ".."), _file("s/up/x"))
    with pytest.raises(UnsafeArchiveError):
        _unpack_into(tmp_path, blob)
    assert _nothing_left(tmp_path) == ["store"], "nothing may land beside the tree, and no partial tree may stay"


def test_a_file_placed_through_a_link_to_a_folder_inside_is_refused(tmp_path):
    blob = _archive(tmp_path / "evil.tar.zst", _folder("real"), _link("alias", "real"), _file("alias/x"))
    with pytest.raises(UnsafeArchiveError):
        _unpack_into(tmp_path, blob)
    assert _nothing_left(tmp_path) == ["store"]


def test_a_folder_or_link_placed_through_a_link_is_refused(tmp_path):
    blob = _archive(tmp_path / "evil.tar.zst", _link("s", "."), _folder("s/made-through-s"))
    with pytest.raises(UnsafeArchiveError):
        _unpack_into(tmp_path, blob)
    blob = _archive(tmp_path / "evil.tar.zst", _link("s", "."), _link("s/l", "x"))
    with pytest.raises(UnsafeArchiveError):
        _unpack_into(tmp_path, blob)
    assert _nothing_left(tmp_path) == ["store"]


def test_folders_count_towards_the_entry_cap(tmp_path):
    blob = _archive(tmp_path / "evil.tar.zst", *[_folder(f"d{i}") for i in range(10)])
    with pytest.raises(UnsafeArchiveError):
        _unpack_into(tmp_path, blob, max_entries=5)
    assert _nothing_left(tmp_path) == ["store"]


@pytest.mark.parametrize("second", [_folder("a"), _link("a", "b"), _file("a", b"again")])
def test_a_name_used_twice_is_refused(tmp_path, second):
    blob = _archive(tmp_path / "evil.tar.zst", _file("a", b"first"), second)
    with pytest.raises(UnsafeArchiveError):
        _unpack_into(tmp_path, blob)
    assert _nothing_left(tmp_path) == ["store"]


def test_a_link_replaced_by_a_folder_of_the_same_name_is_refused(tmp_path):
    blob = _archive(tmp_path / "evil.tar.zst", _link("a", "."), _folder("a"))
    with pytest.raises(UnsafeArchiveError):
        _unpack_into(tmp_path, blob)
