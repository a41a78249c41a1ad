"""Reading tar headers from a stream, bounded: the part of a tar reader unpacking needs, and no more.

Headers are 512-byte blocks with a checksum; numbers are octal (or GNU base-256 from 8 GiB);
a GNU long name ('L'), long link ('K') or pax record ('x') carries a name or size for the
member that follows. The caller bounds how much of such a record it reads (artifacts/bundle/unpack.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from prebake.artifacts.errors import BundleError

BLOCK = 512


@dataclass(frozen=True)
class Member:
    """One tar header: name, type flag, size, link target."""

    name: str
    type: bytes
    size: int
    linkname: str


def parse_header(block: bytes, what: str) -> Member:
    stored = _number(block[148:156], what)
    unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:])
    if stored != unsigned:
        raise BundleError(f"{what} holds a tar header with a wrong checksum: the archive is corrupt")
    name = _text(block[0:100])
    if block[257:263] == b"ustar\x00" and block[345] != 0:  # POSIX ustar splits long names
        name = _text(block[345:500]) + "/" + name
    return Member(name, block[156:157], _number(block[124:136], what), _text(block[157:257]))


def _number(field: bytes, what: str) -> int:
    if field[:1] == b"\x80":  # GNU base-256, for sizes of 8 GiB and up
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise BundleError(f"{what} holds a tar header with a malformed number: the archive is corrupt") from None


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def extended(kind: bytes, data: bytes, what: str) -> dict[str, str]:
    if kind == b"L":
        return {"path": _text(data)}
    if kind == b"K":
        return {"linkpath": _text(data)}
    out: dict[str, str] = {}
    while data:  # pax records: "<length> <key>=<value>\n"
        length, _, _ = data.partition(b" ")
        try:
            n = int(length)
            key, _, value = data[len(length) + 1 : n - 1].partition(b"=")
        except ValueError:
            raise BundleError(f"{what} holds a malformed pax header: the archive is corrupt") from None
        if n <= 0:
            raise BundleError(f"{what} holds a malformed pax header: the archive is corrupt")
        if key in (b"path", b"linkpath", b"size"):
            out[key.decode()] = value.decode("utf-8", "surrogateescape")
        data = data[n:]
    if "size" in out and not out["size"].isdigit():
        raise BundleError(f"{what} holds a pax size that is not a number: the archive is corrupt")
    return out
