"""`prebake ls` of an S3 registry in a few requests (prebake.artifacts.ports.registry.Listable).

    s3://bucket/prefix/summary/<kind>.json     the listing summary of one kind (prebake.artifacts.ports.listing)

A listing reads the index keys with their ETag and size (ListObjectsV2: one request per
1,000 entries), then the kind's summary (one GET), and reads only the entries the summary
cannot answer for (new, or whose ETag/size differ), `concurrency` at a time. When the summary
was missing or stale it is written back (one PUT); a write that fails (read-only credentials)
is logged and changes nothing else. The index stays the truth: see artifacts/ports/listing.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import BundleError
from prebake.artifacts.layout import index_relpath, parse_index_relpath, summary_relpath
from prebake.artifacts.ports.listing import Listed, ListingSummary, Read, summarised_listing
from prebake.registry.backends.s3_parts import S3Parts

log = logging.getLogger(__name__)


class S3Listing(S3Parts):
    """Mixed into S3Registry: `listing`, through its client, settings and fault mapping."""

    def listing(self, kind: str | None = None) -> Iterator[Listed]:
        """A row for every index entry (of one kind, if given), in key order, as list() yields them."""
        yield from summarised_listing(self, self._index_objects(self._key(f"index/{kind}/" if kind else "index/")))

    def _index_objects(self, base: str) -> Iterator[tuple[str, str, str]]:
        """(kind, key digest, ETag/size) of every index entry under `base`, in key order."""
        strip = len(self._key(""))
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base)
        with self._faults(f"list {self._where(base)}"):
            for page in pages:
                for obj in page.get("Contents", ()):
                    if (parsed := parse_index_relpath(obj["Key"][strip:])) is not None:
                        yield parsed[0], parsed[1], f"{obj.get('ETag', '')}/{obj['Size']}"

    def _read_rows(self, kind: str, digests: Sequence[str]) -> Iterator[Read]:
        """The entries the summary could not answer for, read `concurrency` at a time, in order."""

        def read(digest: str) -> Read:
            key = self._key(index_relpath(kind, digest))
            with self._faults(f"read {self._where(key)}"):
                got = self._get_tagged(key)
            if got is None:  # deleted since the listing
                return Read(digest, "", None)
            return Read(digest, got[1], Listed.of(Manifest.parse(got[0], self._where(key))))

        with ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="prebake-s3-ls") as pool:
            yield from pool.map(read, digests)

    def _load_summary(self, kind: str) -> ListingSummary | None:
        key = self._key(summary_relpath(kind))
        try:
            with self._faults(f"read {self._where(key)}"):
                got = self._get_tagged(key)
            return None if got is None else ListingSummary.parse(got[0], self._where(key))
        except BundleError as exc:  # too large, or not a summary
            log.warning("%s; reading every entry instead, and rewriting it", exc)
            return None

    def _store_summary(self, summary: ListingSummary) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        key = self._key(summary_relpath(summary.kind))
        try:
            self._client.put_object(
                Bucket=self.bucket, Key=key, Body=summary.to_bytes(), ContentType="application/json"
            )
        except (ClientError, BotoCoreError) as exc:
            log.warning(
                "cannot write the listing summary %s (%s): listings stay correct but read every new entry "
                "until someone with write access lists this registry",
                self._where(key),
                exc,
            )
