"""The one on-disk and on-wire layout every registry backend and the local store share.

    <root>/
    ├── index/<kind>/<key-digest>.json          manifest naming a blob (created once, never replaced)
    ├── blobs/sha256/<aa>/<digest>.tar.zst      payload, content-addressed, immutable
    ├── side/sha256/<aa>/<digest>/<name>        small files about one blob (its provenance), created once
    ├── meta/<name>                             small files about the registry (its revocation list)
    └── summary/<kind>.json                     listing summary: a verified cache of `prebake ls` rows

Paths are posix and relative, so the same strings serve as S3 object keys and Hub repo paths.
"""

from __future__ import annotations

import re

from prebake.artifacts.errors import PrebakeError

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def index_relpath(kind: str, key_digest: str) -> str:
    _check_hex(key_digest, "key digest")
    if not kind.isidentifier():
        raise PrebakeError(f"artifact kind {kind!r} must be a plain identifier such as 'graphs'")
    return f"index/{kind}/{key_digest}.json"


def summary_relpath(kind: str) -> str:
    """Where a registry keeps the listing summary of one kind (prebake.artifacts.ports.listing): a cache, not truth."""
    if not kind.isidentifier():
        raise PrebakeError(f"artifact kind {kind!r} must be a plain identifier such as 'graphs'")
    return f"summary/{kind}.json"


def blob_relpath(digest: str) -> str:
    hexpart = digest.removeprefix("sha256:")
    _check_hex(hexpart, "blob digest")
    return f"blobs/sha256/{hexpart[:2]}/{hexpart}.tar.zst"


_SIDE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")


def side_relpath(digest: str, name: str) -> str:
    """Where a file about blob `digest` lives beside it (e.g. its provenance attestation)."""
    if not _SIDE_NAME.match(name) or ".." in name:
        raise PrebakeError(f"side file name {name!r} must be lower-case letters, digits, '.', '_' or '-'")
    return f"{side_folder_relpath(digest)}/{name}"


def side_folder_relpath(digest: str) -> str:
    """The folder of every file beside blob `digest`."""
    hexpart = digest.removeprefix("sha256:")
    _check_hex(hexpart, "blob digest")
    return f"side/sha256/{hexpart[:2]}/{hexpart}"


def meta_relpath(name: str) -> str:
    """Where a registry keeps a small file about itself (e.g. its signed revocation list)."""
    if not _SIDE_NAME.match(name) or ".." in name:
        raise PrebakeError(f"registry file name {name!r} must be lower-case letters, digits, '.', '_' or '-'")
    return f"meta/{name}"


def parse_index_relpath(relpath: str) -> tuple[str, str] | None:
    """(kind, key digest) for an index path, None for anything else."""
    parts = relpath.split("/")
    if len(parts) == 3 and parts[0] == "index" and parts[2].endswith(".json"):
        digest = parts[2][: -len(".json")]
        if _HEX64.match(digest) and parts[1].isidentifier():
            return parts[1], digest
    return None


def _check_hex(value: str, what: str) -> None:
    if not _HEX64.match(value):
        raise PrebakeError(f"{what} {value!r} must be 64 lower-case hex digits (a sha256)")
