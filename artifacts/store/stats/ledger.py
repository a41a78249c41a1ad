"""The stats folder on disk: its lock, compaction (events folded into summary.json) and reading.

Compaction renames events.jsonl to a numbered segment, writes the summary with that generation,
then deletes the segment, so a kill at any step neither loses nor double-counts an event. Writers
take the lock exclusively, readers shared; a read-only home is read without it.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from prebake.artifacts import fsutil
from prebake.artifacts.errors import StoreError
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.stats.events import Event, KindTally, ReasonTally, StatsSummary, add_tallies
from prebake.artifacts.store.stats.report import StatsReport

_SEGMENT = re.compile(r"^events-(\d+)\.jsonl$")


def read_stats(store: Store, *, zero: bool = False) -> StatsReport:
    """Fold the summary and every event into one report; with `zero`, start counting again."""
    if not zero and not _writable(store.home):  # a read-only home: read it as it is, without the lock file
        folder = store.home / "stats"
        summary = _fold(_read_summary(folder), _pending(folder)) if folder.is_dir() else StatsSummary()
        return _sized(StatsReport(str(store.home), summary, zeroed=False), store)
    folder = stats_folder(store)
    with lock(folder, shared=not zero):
        try:
            summary = _fold(_read_summary(folder), _pending(folder))
        except StoreError:
            if not zero:
                raise
            summary = StatsSummary()  # --zero is the way out of an unreadable summary
        if zero:
            _zero(folder, summary)
    return _sized(StatsReport(str(store.home), summary, zeroed=zero), store)


def compact(store: Store) -> StatsSummary:
    """Fold every event into summary.json now (writers do this on their own past COMPACT_BYTES)."""
    folder = stats_folder(store)
    with lock(folder):
        return compact_locked(folder)


def compact_locked(folder: Path) -> StatsSummary:
    """Compaction, the lock held: segment, summary, then the segment's removal."""
    summary = _read_summary(folder)
    events = folder / "events.jsonl"
    if events.exists():  # numbered past any segment a killed compaction left unfolded
        os.replace(events, folder / f"events-{max(summary.generation, _last_segment(folder)) + 1}.jsonl")
    summary = _fold(summary, _pending(folder))
    summary = summary.model_copy(update={"generation": max(summary.generation, _last_segment(folder))})
    fsutil.write_bytes(folder / "summary.json", summary.model_dump_json(indent=1).encode())
    for path in folder.glob("events-*.jsonl"):
        path.unlink(missing_ok=True)
    return summary


def lock(folder: Path, *, shared: bool = False) -> fsutil.Flock:
    """stats.lock: exclusive for writers and compaction, shared for readers."""
    taken = fsutil.Flock.acquire(folder / "stats.lock", shared=shared)
    assert taken is not None  # a waiting acquire always returns the lock
    return taken


def stats_folder(store: Store) -> Path:
    """$PREBAKE_HOME/stats/, made if missing."""
    folder = store.home / "stats"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _zero(folder: Path, summary: StatsSummary) -> None:
    fresh = StatsSummary(generation=max(summary.generation, _last_segment(folder)), since=time.time())
    fsutil.write_bytes(folder / "summary.json", fresh.model_dump_json(indent=1).encode())
    for path in [*folder.glob("events-*.jsonl"), folder / "events.jsonl"]:
        path.unlink(missing_ok=True)


def _sized(report: StatsReport, store: Store) -> StatsReport:
    """The report with the store's size and bound beside its counts."""
    used = sum(e.bytes for e in store.entries())
    return replace(report, store_bytes=used, max_bytes=store.limits.max_bytes)


def _pending(folder: Path) -> list[Path]:
    """Event files not yet in the summary: unfolded segments (oldest first), then events.jsonl."""
    generation = _read_summary(folder).generation
    segments = [(int(m[1]), p) for p in folder.glob("events-*.jsonl") if (m := _SEGMENT.match(p.name))]
    # a segment numbered at or below the generation was folded already; its compaction died before deleting it
    return [p for n, p in sorted(segments) if n > generation] + [folder / "events.jsonl"]


def _last_segment(folder: Path) -> int:
    return max((int(m[1]) for p in folder.glob("events-*.jsonl") if (m := _SEGMENT.match(p.name))), default=0)


def _read_summary(folder: Path) -> StatsSummary:
    try:
        return StatsSummary.model_validate_json((folder / "summary.json").read_bytes())
    except FileNotFoundError:
        return StatsSummary()
    except ValidationError as exc:
        raise StoreError(
            f"{folder / 'summary.json'} is unreadable ({exc.errors()[0]['msg']}); run prebake stats --zero"
        ) from exc


@dataclass
class _Fold:
    """Mutable totals while folding events in; frozen into a StatsSummary at the end."""

    base: StatsSummary
    kinds: dict[str, dict[str, Any]] = field(default_factory=dict)
    reasons: dict[str, dict[str, Any]] = field(default_factory=dict)
    factors: dict[str, int] = field(default_factory=dict)
    events: int = 0
    skipped: int = 0
    first: float = 0.0

    def add(self, e: Event) -> None:
        self.events += 1
        self.first = e.at if not self.first else min(self.first, e.at)
        t = self.kinds.setdefault(e.kind, KindTally().model_dump())
        if e.event == "hit":
            t["store_hits" if e.source == "store" else "registry_hits"] += 1
            t["seconds_saved"] += e.seconds
            t["untimed_hits"] += 0 if e.timed else 1
            t["bytes_fetched"] += e.bytes
        elif e.event == "miss":
            t["misses"] += 1
            r = self.reasons.setdefault(e.reason, {"count": 0, "kinds": {}, "example": ""})
            r["count"] += 1
            r["kinds"][e.kind] = r["kinds"].get(e.kind, 0) + 1
            r["example"] = e.detail
            for name in e.factors:
                self.factors[name] = self.factors.get(name, 0) + 1
        elif e.event == "variant-fallback":
            t["variant_fallbacks"] += 1
        else:
            t["fallback_compiles"] += 1
            t["fallback_seconds"] += e.seconds


def _fold(summary: StatsSummary, files: Iterable[Path]) -> StatsSummary:
    fold = _Fold(summary)
    for path in files:
        try:
            lines = path.read_bytes().splitlines()
        except FileNotFoundError:
            continue
        except OSError as exc:  # a folder where the file should be, no permission: name it and the fix
            raise StoreError(
                f"cannot read the stats file {path} ({exc.strerror}); remove it or fix its permissions, "
                f"or run prebake stats --zero to start counting again"
            ) from exc
        for line in lines:
            try:
                fold.add(Event.model_validate_json(line))
            except ValidationError:
                fold.skipped += 1
    return _merge(summary, fold)


def _merge(s: StatsSummary, f: _Fold) -> StatsSummary:
    kinds = dict(s.kinds)
    for name, t in f.kinds.items():
        kinds[name] = add_tallies([kinds.get(name, KindTally()), KindTally(**t)])
    reasons = dict(s.reasons)
    for name, r in f.reasons.items():
        old = reasons.get(name, ReasonTally())
        merged_kinds = {k: old.kinds.get(k, 0) + r["kinds"].get(k, 0) for k in old.kinds.keys() | r["kinds"].keys()}
        reasons[name] = ReasonTally(count=old.count + r["count"], kinds=merged_kinds, example=r["example"])
    factors = {k: s.factors.get(k, 0) + f.factors.get(k, 0) for k in s.factors.keys() | f.factors.keys()}
    since = s.since or f.first
    return StatsSummary(
        generation=s.generation,
        since=since,
        events=s.events + f.events,
        skipped=s.skipped + f.skipped,
        kinds=kinds,
        reasons=reasons,
        factors=factors,
    )


def _writable(home: Path) -> bool:
    """False when the home is there but cannot be written (a read-only mount, a folder of another user)."""
    probe = home / "stats" if (home / "stats").is_dir() else home
    return not probe.is_dir() or (os.access(probe, os.W_OK) and not _read_only_mount(probe))


def _read_only_mount(path: Path) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
