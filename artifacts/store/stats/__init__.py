"""Hit, miss and fallback counts that persist in the store, written safely by many processes at once.

    $PREBAKE_HOME/stats/
    ├── events.jsonl        one JSON object per line: appended by one O_APPEND write under stats.lock
    ├── summary.json        the totals of every event compacted so far, and their generation N
    ├── events-<N>.jsonl    a segment being compacted: only there if a compaction was killed
    └── stats.lock          flock: writers and compaction exclusive, readers shared

`record_*` (here) append events under the lock; past COMPACT_BYTES the writer that noticed
compacts (ledger.py, which also reads: `read_stats` -> report.StatsReport); events.py is the
schema. Recording never fails a start-up (an unwritable store loses the event); PREBAKE_STATS=off
turns it off. docs/operations.md, "How the counts are kept".
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any, Literal

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.stats.events import Event, EventName, classify
from prebake.artifacts.store.stats.ledger import compact_locked, lock, stats_folder
from prebake.artifacts.store.volume import warn_once

STATS_ENV = "PREBAKE_STATS"
COMPACT_BYTES = 1 << 20  # 4000 to 6000 events
_DETAIL_CHARS = 400

MissRecord = tuple[str, str, Iterable[str], str]  # kind, reason, the differing factors, key digest


def record_outcomes(
    store: Store,
    hits: Iterable[tuple[Manifest, Literal["store", "registry"]]],
    misses: Iterable[MissRecord],
) -> None:
    """Every hit and miss of one run of the fetch pipeline, in one write
    (prebake.artifacts.fetch.pipeline.record_resolution hands them over)."""
    _append(store, *(_hit(m, source) for m, source in hits), *(_miss(*miss) for miss in misses))


def record_fallback(store: Store, kind: str, seconds: float | None = None) -> None:
    """A `kind` artifact was compiled in place because its bundle missed."""
    _append(store, _event("fallback", kind, "", seconds=max(0.0, seconds or 0.0)))


def record_variant_fallback(store: Store, kind: str, variant: str, next_variant: str, reason: str) -> None:
    """A `kind` bundle's variant did not load here (`reason`); the next variant in the same tree served."""
    _append(
        store,
        _event("variant-fallback", kind, "", reason=f"{variant} -> {next_variant}", detail=reason[:_DETAIL_CHARS]),
    )


def _hit(manifest: Manifest, source: str) -> Event:
    seconds = manifest.build_seconds
    fetched = manifest.blob.size if source == "registry" else 0
    return _event(
        "hit",
        manifest.kind,
        manifest.key_digest,
        source=source,
        bytes=fetched,
        seconds=seconds or 0.0,
        timed=seconds is not None,
    )


def _miss(kind: str, reason: str, differing: Iterable[str], key: str) -> Event:
    factors = tuple(sorted(differing))
    return _event("miss", kind, key, reason=classify(reason), detail=reason[:_DETAIL_CHARS], factors=factors)


def _event(event: EventName, kind: str, key: str, **fields: Any) -> Event:
    return Event(at=time.time(), event=event, kind=kind, key=key, **fields)


def _append(store: Store, *events: Event) -> bool:
    if not events or os.environ.get(STATS_ENV, "").lower() in ("off", "0", "no", "false"):
        return False
    if store.read_only:  # said once when the command began (store/home.py): nothing is recorded there
        return False
    line = b"".join((e.model_dump_json(exclude_defaults=True) + "\n").encode() for e in events)
    try:
        folder = stats_folder(store)
        with lock(folder):
            fd = os.open(folder / "events.jsonl", os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                end = os.fstat(fd).st_size
                torn = end > 0 and os.pread(fd, 1, end - 1) != b"\n"  # a write cut short: end its line first
                os.write(fd, b"\n" + line if torn else line)
                size = end + len(line) + torn
            finally:
                os.close(fd)
            if size >= COMPACT_BYTES:
                compact_locked(folder)
    except OSError as exc:  # a full or read-only store loses the event, never the start-up: one warning
        warn_once(
            store.home,
            "stats",
            f"the store {store.home} cannot record hits and misses ({exc.strerror or exc}: read-only or full); "
            f"`prebake stats` misses them until it can",
        )
        return False
    return True
