"""What `prebake ls` shows of each bundle, and the listing summary that spares reading every entry.

    Listed           one index entry as a listing shows it: the manifest without its file list
    ListingSummary   per kind, the Listed rows of a registry's entries, each tagged with the version of
                     the entry it was read from (S3: ETag and size; a folder: size, mtime, inode)
    reconcile        the rows of the entries a listing names now: from the summary where the tag matches

The summary is a cache, never the source of truth: the index listing decides which entries
exist, and any entry whose tag differs is read. A missing, stale, racing or malformed summary
costs reads, never a wrong row; entries are created once, so a matching tag means the same bytes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, Protocol

from pydantic import Field, ValidationError

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES, BlobRef, Manifest
from prebake.artifacts.errors import BundleError
from prebake.artifacts.frozen import Frozen
from prebake.artifacts.tables import table

log = logging.getLogger(__name__)

SUMMARY_VERSION: Literal["1"] = "1"
SUMMARY_MIN_ROWS = 64  # a kind with fewer entries lists in a moment: no summary is written for it


class Listed(Frozen):
    """One bundle as a listing shows it: everything of its manifest but the file list and inputs."""

    kind: str
    key_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    labels: dict[str, str] = Field(default_factory=dict)
    blob: BlobRef
    created: str
    builder: str
    build_seconds: float | None = Field(default=None, ge=0)
    signers: tuple[str, ...] = Field(default=(), max_length=64)

    @classmethod
    def of(cls, manifest: Manifest) -> Listed:
        return cls(
            kind=manifest.kind,
            key_digest=manifest.key_digest,
            labels=dict(manifest.labels),
            blob=manifest.blob,
            created=manifest.created,
            builder=manifest.builder,
            build_seconds=manifest.build_seconds,
            signers=tuple(s.signer for s in manifest.signatures),
        )

    def to_json(self) -> dict[str, object]:
        """One row of `prebake ls --json`."""
        return {
            "kind": self.kind,
            "key": self.key_digest,
            "model": self.labels.get("model"),
            "labels": dict(self.labels),
            "blob": self.blob.digest,
            "bytes": self.blob.size,
            "created": self.created,
            "builder": self.builder,
            "build_seconds": self.build_seconds,
            "signers": list(self.signers),
        }

    def row(self) -> tuple[str, ...]:
        """Its row of `prebake ls`."""
        labels = self.labels
        return (
            labels.get("model", "?"),
            self.kind,
            labels.get("platform", "?"),
            labels.get("precision", "-"),
            labels.get("tp", "-"),
            fsutil.human_size(self.blob.size),
            self.created,
            self.key_digest[:16],
        )


@dataclass(frozen=True)
class RegistryListing:
    """What `prebake ls` shows of one registry: its address and a row per bundle."""

    registry: str
    bundles: tuple[Listed, ...]

    def to_json(self) -> dict[str, object]:
        return {"registry": self.registry, "bundles": [b.to_json() for b in self.bundles]}

    def render(self) -> str:
        """`prebake ls`: a row per bundle."""
        if not self.bundles:
            return f"no bundles in {self.registry}"
        return table(
            ("MODEL", "KIND", "PLATFORM", "PRECISION", "TP", "SIZE", "CREATED", "KEY"), [b.row() for b in self.bundles]
        )


class SummaryRow(Frozen):
    tag: str = Field(max_length=512)  # the version of the index entry `row` was read from
    row: Listed


class ListingSummary(Frozen):
    """The rows of one kind's index entries, as a lister last saw them."""

    summary_version: Literal["1"] = SUMMARY_VERSION
    kind: str
    rows: tuple[SummaryRow, ...]

    @classmethod
    def parse(cls, raw: bytes, source: str) -> ListingSummary:
        """Read a summary, bounded like a manifest; any problem is a BundleError naming the source."""
        if len(raw) > MAX_MANIFEST_BYTES:
            raise BundleError(f"listing summary {source} is over {MAX_MANIFEST_BYTES} bytes")
        try:
            return cls.model_validate(json.loads(raw))
        except (ValueError, TypeError, ValidationError, RecursionError) as exc:
            raise BundleError(f"listing summary {source} is malformed: {str(exc)[:200]}") from exc

    def to_bytes(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), separators=(",", ":"), sort_keys=True).encode() + b"\n"

    @classmethod
    def load(cls, path: Path, within: Path | None = None) -> ListingSummary | None:
        """The summary stored at `path`; None when there is none or it cannot be read (a listing
        then reads every entry, and rewrites it)."""
        try:
            return cls.parse(fsutil.read_bounded(path, MAX_MANIFEST_BYTES, within=within), str(path))
        except FileNotFoundError:
            return None
        except (BundleError, OSError) as exc:
            log.warning("listing summary %s is unreadable (%s); reading every entry instead", path, exc)
            return None

    def store(self, path: Path) -> None:
        """Write the summary to `path`; a failure is logged (listings stay correct, but slower)."""
        try:
            fsutil.write_bytes(path, self.to_bytes())
        except OSError as exc:
            log.warning("cannot write the listing summary %s (%s): listings stay correct, but slower", path, exc)


@dataclass(frozen=True)
class Read:
    """An index entry read because the summary could not answer for it: its tag as read, and its
    row (None when it was deleted since the listing)."""

    key_digest: str
    tag: str
    row: Listed | None


@dataclass(frozen=True)
class Reconciled:
    rows: tuple[Listed, ...]  # in the listing's order, one per entry that still exists
    summary: ListingSummary  # what the summary should now say
    reads: int  # entries read because the summary could not answer for them
    stale: bool  # whether the stored summary differs from `summary`

    @property
    def worth_storing(self) -> bool:
        """Whether a lister should write `summary` back: it changed, and the kind is large enough."""
        return self.stale and len(self.rows) >= SUMMARY_MIN_ROWS


def reconcile(
    kind: str,
    present: Sequence[tuple[str, str]],
    cached: ListingSummary | None,
    read: Callable[[Sequence[str]], Iterable[Read]],
) -> Reconciled:
    """The rows of the entries `present` names ((key digest, tag) in listing order): from `cached`
    where its row carries the same tag, else from `read`, which is given every other key digest."""
    known = {}
    if cached is not None and cached.kind == kind:
        known = {r.row.key_digest: r for r in cached.rows if r.row.kind == kind}
    chosen: dict[str, SummaryRow] = {}
    missing = []
    for digest, tag in present:
        hit = known.get(digest)
        if hit is not None and hit.tag == tag:
            chosen[digest] = hit
        else:
            missing.append(digest)
    for got in read(missing) if missing else ():
        if got.row is not None and got.row.kind == kind and got.row.key_digest == got.key_digest:
            chosen[got.key_digest] = SummaryRow(tag=got.tag, row=got.row)
    ordered = tuple(chosen[digest] for digest, _ in present if digest in chosen)
    summary = ListingSummary(kind=kind, rows=ordered)
    stale = cached is None or cached.kind != kind or cached.rows != ordered
    return Reconciled(tuple(r.row for r in ordered), summary, len(missing), stale)


class SummaryStore(Protocol):
    """Where a registry keeps its listing summaries, and how it reads the entries they do not
    answer for: what every backend's `listing` gives `summarised_listing`."""

    def _load_summary(self, kind: str) -> ListingSummary | None: ...

    def _store_summary(self, summary: ListingSummary) -> None: ...

    def _read_rows(self, kind: str, digests: Sequence[str]) -> Iterable[Read]: ...


def summarised_listing(backend: SummaryStore, entries: Iterable[tuple[str, str, str]]) -> Iterator[Listed]:
    """Every row of `entries` ((kind, key digest, tag) as the index lists them, kinds in order):
    from the kind's summary where its tag still holds, else read; the summary written back when
    it was stale. The skeleton of every backend's `prebake ls`."""
    by_kind: dict[str, list[tuple[str, str]]] = {}
    for kind, digest, tag in entries:
        by_kind.setdefault(kind, []).append((digest, tag))
    for kind, present in sorted(by_kind.items()):
        result = reconcile(kind, present, backend._load_summary(kind), partial(backend._read_rows, kind))
        if result.worth_storing:
            backend._store_summary(result.summary)
        yield from result.rows
