"""`prebake ls` of a Hub registry without one request per entry (prebake.artifacts.ports.registry.Listable).

    <listing_dir>/hf-<digest of endpoint and repo>-<kind>.json    the listing summary

The caller names the folder (open_registry's `home`: the store's listing/ folder); without one the
summaries live as long as the registry object.

On the Hub a write is a commit, so the summary (artifacts/ports/listing.py) is kept on this machine,
not in the repo. Its tag is each entry's git blob id from the tree listing, the hash of the
entry's bytes: a row whose tag matches was read from those very bytes, at whatever commit. A
listing costs one tree listing and reads only the entries this machine has not listed before
(`_LIST_READERS` at a time); offline, it lists what the cache holds, as `list()` does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prebake.artifacts.layout import index_relpath, parse_index_relpath
from prebake.artifacts.ports.listing import Listed, ListingSummary, Read, summarised_listing
from prebake.registry.backends.hf_parts import HubParts

_READERS = 8  # index entries read in parallel, as list() reads them


class HubListing(HubParts):
    """Mixed into HubRegistry: `listing`, through its API client, cache and fault mapping."""

    def listing(self, kind: str | None = None) -> Iterator[Listed]:
        """A row for every index entry (of one kind, if given), in list() order."""
        if self.offline:
            yield from (Listed.of(m) for m in self.list(kind))
            return
        head = self._head(create=False)
        if head is None:
            return
        entries = [
            (*parsed, blob_id)
            for path, blob_id in self._index_files(f"index/{kind}" if kind else "index", head)
            if (parsed := parse_index_relpath(path)) is not None
        ]
        yield from summarised_listing(_AtCommit(self, head, {(k, d): tag for k, d, tag in entries}), entries)

    def _summary_path(self, folder: Path, kind: str) -> Path:
        repo = hashlib.sha256(f"{self.endpoint}\n{self.repo_type}\n{self.repo_id}".encode()).hexdigest()[:24]
        return folder / f"hf-{repo}-{kind}.json"

    def _load_summary(self, kind: str) -> ListingSummary | None:
        if self.listing_dir is None:
            return self._summaries.get(kind)
        return ListingSummary.load(self._summary_path(self.listing_dir, kind))

    def _store_summary(self, summary: ListingSummary) -> None:
        if self.listing_dir is None:
            self._summaries[summary.kind] = summary
        else:
            summary.store(self._summary_path(self.listing_dir, summary.kind))


class _AtCommit:
    """The Hub's listing at one commit: its summaries are the registry's, its entries read at `head`."""

    def __init__(self, hub: HubListing, head: str, tags: dict[tuple[str, str], str]):
        self.hub, self.head, self.tags = hub, head, tags

    def _load_summary(self, kind: str) -> ListingSummary | None:
        return self.hub._load_summary(kind)

    def _store_summary(self, summary: ListingSummary) -> None:
        self.hub._store_summary(summary)

    def _read_rows(self, kind: str, digests: Sequence[str]) -> Iterator[Read]:
        def read(digest: str) -> Read:
            manifest = self.hub._read_index(index_relpath(kind, digest), self.head)
            return Read(digest, self.tags[(kind, digest)], None if manifest is None else Listed.of(manifest))

        with ThreadPoolExecutor(_READERS, thread_name_prefix="prebake-hf-ls") as pool:
            yield from pool.map(read, digests)
