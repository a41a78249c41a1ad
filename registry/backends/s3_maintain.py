"""What `prebake verify --quarantine` and `prebake promote --prune` need from an S3 registry
(prebake.artifacts.ports.registry.Maintainable).

    s3://bucket/prefix/index/<kind>/<digest>.json        -> prefix/quarantine/index/<kind>/<digest>.json
    s3://bucket/prefix/blobs/sha256/<aa>/<digest>.tar.zst -> prefix/quarantine/blobs/sha256/<aa>/<digest>.tar.zst

S3 has no rename: a move is a server-side copy, then the delete of the original, so the bytes
are never gone (the copy exists before the original goes). The index entry moves first, so
readers miss from then on; a bad blob follows. An object quarantined before keeps its copy: a
second one gets a time suffix, for whoever investigates.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prebake.artifacts.layout import blob_relpath, index_relpath, side_folder_relpath
from prebake.artifacts.ports.errors import RegistryError
from prebake.registry.backends.s3_parts import S3Parts

QUARANTINE = "quarantine"


class S3Maintenance(S3Parts):
    """Mixed into S3Registry: raw index entries and quarantine, through its client and fault mapping."""

    def index_entries(self) -> Iterator[tuple[str, bytes]]:
        """Every object under index/ as (path relative to the prefix, raw bytes), unparsed."""
        base = self._key("index/")
        strip = len(self._key(""))
        with self._faults(f"list {self._where(base)}"):
            keys = sorted(
                obj["Key"]
                for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base)
                for obj in page.get("Contents", ())
                if obj["Key"].endswith(".json")
            )
        for key in keys:
            with self._faults(f"read {self._where(key)}"):
                raw = self._get_or_none(key)
            if raw is not None:  # quarantined or removed since the listing
                yield key[strip:], raw

    def quarantine(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> str:
        """Move an index entry (then, if given, its bad blob) under <prefix>/quarantine/; return its new URL."""
        moved = self._move_aside(index_relpath(kind, key_digest))
        if moved is None:
            raise RegistryError(f"cannot quarantine {kind} {key_digest[:16]}: its index entry in {self.url} is gone")
        if blob_digest is not None:
            self._move_aside(blob_relpath(blob_digest))  # None: an earlier entry naming it moved it already
        return moved

    def remove(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> None:
        """Delete an index entry, then (if given) its blob and every object beside it (side/...)."""
        keys = [self._key(index_relpath(kind, key_digest))]
        with self._faults(f"remove {self._where(keys[0])}"):
            if blob_digest is not None:
                keys.append(self._key(blob_relpath(blob_digest)))
                beside = self._key(side_folder_relpath(blob_digest) + "/")
                pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=beside)
                keys += [obj["Key"] for page in pages for obj in page.get("Contents", ())]
            for key in keys:  # in this order: the entry first, so readers miss from then on
                self._client.delete_object(Bucket=self.bucket, Key=key)

    def _move_aside(self, relpath: str) -> str | None:
        src, dest = self._key(relpath), self._key(f"{QUARANTINE}/{relpath}")
        with self._faults(f"quarantine {self._where(src)}"):
            if self._size_or_none(src) is None:
                return None
            if self._size_or_none(dest) is not None:
                dest = f"{dest}.{time.time_ns()}"
            # the managed copy: multipart for blobs past 5 GiB, which copy_object refuses
            self._client.copy({"Bucket": self.bucket, "Key": src}, self.bucket, dest, Config=self._transfer)
            self._client.delete_object(Bucket=self.bucket, Key=src)
        return str(self._where(dest))
