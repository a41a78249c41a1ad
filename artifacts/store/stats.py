"""Hit, miss and fallback counts that persist in the store, written safely by many processes at once.

    $PREBAKE_HOME/stats/
    ├── events.jsonl        one JSON object per line: appended by one O_APPEND write under stats.lock
    ├── summary.json        the totals of every event compacted so far, and their generation N
    ├── events-<N>.jsonl    a segment being compacted: only there if a compaction was killed
    └── stats.lock          flock: writers and compaction exclusive, readers shared

`record_*` append events; `read_stats` folds summary and events into a `StatsReport`. Past
COMPACT_BYTES the writer that noticed compacts (rename, write the summary, delete the segment),
so a kill neither loses nor double-counts. Recording never fails a start-up (an unwritable store
loses the event); PREBAKE_STATS=off turns it off. docs/operations.md, "How the counts are kept".
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import StoreError
from prebake.artifacts.frozen import Frozen
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.volume import warn_once

STATS_ENV = "PREBAKE_STATS"
COMPACT_BYTES = 1 << 20  # 4000 to 6000 events
_DETAIL_CHARS = 400
_SEGMENT = re.compile(r"^events-(\d+)\.jsonl$")

# The short class of a miss, from its reason text: first match wins.
REASON_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("timeout", ("did not answer within", "took longer than", "timed out")),
    ("bad-blob", ("fetching blob", "digest", "does not match")),
    ("tampered", ("carries another key", "tampered")),
    ("untrusted", ("trust policy", "unsigned", "signature", "signer")),
    ("registry-down", ("cannot be opened", "failed")),
    ("evicted", ("was evicted",)),
    ("does-not-load", ("does not load", "did not load")),
    ("no-bundle", ("no bundle for this key",)),
)


def classify(reason: str) -> str:
    """The short class of a miss reason: timeout, bad-blob, tampered, untrusted, registry-down,
    evicted, does-not-load, no-bundle, or other."""
    text = reason.lower()
    return next((name for name, needles in REASON_CLASSES if any(n in text for n in needles)), "other")


class Event(Frozen):
    """One line of events.jsonl."""

    at: float  # unix seconds
    event: Literal["hit", "miss", "fallback", "variant-fallback"]
    kind: str
    key: str = ""
    source: str = ""  # hit: store | registry
    reason: str = ""  # miss: its class (see classify); variant-fallback: "<from> -> <to>"
    detail: str = ""  # miss, variant-fallback: the reason text
    factors: tuple[str, ...] = ()  # miss: the factors in which the nearest bundle differs
    bytes: int = Field(default=0, ge=0)  # hit from the registry: blob bytes fetched
    seconds: float = Field(default=0.0, ge=0)  # hit: build seconds saved; fallback: seconds compiling
    timed: bool = True  # hit: whether its manifest recorded a build time


class KindTally(Frozen):
    store_hits: int = 0
    registry_hits: int = 0
    misses: int = 0
    fallback_compiles: int = 0
    seconds_saved: float = 0.0
    untimed_hits: int = 0  # hits whose manifest has no build time (baked before it was recorded)
    bytes_fetched: int = 0
    fallback_seconds: float = 0.0
    variant_fallbacks: int = 0  # a bundle's variant that did not load here, the next one in its tree served


class ReasonTally(Frozen):
    count: int = 0
    kinds: dict[str, int] = Field(default_factory=dict)
    example: str = ""  # the latest reason text of this class


class StatsSummary(Frozen):
    """summary.json: the totals of every compacted event."""

    generation: int = 0
    since: float = 0.0  # when counting began (the first event, or the last --zero)
    events: int = 0
    skipped: int = 0  # unreadable lines (a write cut short by a full disk)
    kinds: dict[str, KindTally] = Field(default_factory=dict)
    reasons: dict[str, ReasonTally] = Field(default_factory=dict)
    factors: dict[str, int] = Field(default_factory=dict)


# -- recording --------------------------------------------------------------------------------

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


def _event(event: Literal["hit", "miss", "fallback", "variant-fallback"], kind: str, key: str, **fields: Any) -> Event:
    return Event(at=time.time(), event=event, kind=kind, key=key, **fields)


def _append(store: Store, *events: Event) -> bool:
    if not events or os.environ.get(STATS_ENV, "").lower() in ("off", "0", "no", "false"):
        return False
    if store.read_only:  # said once when the command began (store/home.py): nothing is recorded there
        return False
    line = b"".join((e.model_dump_json(exclude_defaults=True) + "\n").encode() for e in events)
    try:
        folder = _folder(store)
        with _lock(folder):
            fd = os.open(folder / "events.jsonl", os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                end = os.fstat(fd).st_size
                torn = end > 0 and os.pread(fd, 1, end - 1) != b"\n"  # a write cut short: end its line first
                os.write(fd, b"\n" + line if torn else line)
                size = end + len(line) + torn
            finally:
                os.close(fd)
            if size >= COMPACT_BYTES:
                _compact_locked(folder)
    except OSError as exc:  # a full or read-only store loses the event, never the start-up: one warning
        warn_once(
            store.home,
            "stats",
            f"the store {store.home} cannot record hits and misses ({exc.strerror or exc}: read-only or full); "
            f"`prebake stats` misses them until it can",
        )
        return False
    return True


# -- reading and compacting -------------------------------------------------------------------


@dataclass(frozen=True)
class StatsReport:
    """What `prebake stats` prints: totals per kind, the commonest miss reasons and factors."""

    store: str
    summary: StatsSummary
    zeroed: bool = False
    store_bytes: int | None = None  # blobs/ + trees/ now: what the bound counts
    max_bytes: int | None = None  # the store's bound (PREBAKE_STORE_MAX_BYTES, else the default)

    def total(self) -> KindTally:
        return _add_tallies(self.summary.kinds.values())

    def to_json(self) -> dict[str, Any]:
        """The stable shape of `prebake stats --json` (see docs/operations.md)."""
        kinds = {k: _tally_json(t) for k, t in sorted(self.summary.kinds.items())}
        reasons = sorted(self.summary.reasons.items(), key=lambda kv: (-kv[1].count, kv[0]))
        factors = sorted(self.summary.factors.items(), key=lambda kv: (-kv[1], kv[0]))
        return {
            "store": self.store,
            "since": _iso(self.summary.since) if self.summary.since else None,
            "events": self.summary.events,
            "skipped_lines": self.summary.skipped,
            "kinds": kinds,
            "total": _tally_json(self.total()),
            "miss_reasons": [
                {"reason": r, "count": t.count, "kinds": dict(sorted(t.kinds.items())), "example": t.example}
                for r, t in reasons
            ],
            "differing_factors": [{"factor": f, "count": n} for f, n in factors],
            "zeroed": self.zeroed,
            "store_bytes": self.store_bytes,
            "max_bytes": self.max_bytes,
        }

    def render(self) -> str:
        data = self.to_json()
        since = data["since"] or "never (nothing recorded yet)"
        lines = [f"stats of {self.store} since {since}: {data['events']} event(s)"]
        if self.store_bytes is not None:
            bound = "unbounded" if self.max_bytes is None else f"bound {fsutil.human_size(self.max_bytes)}"
            lines.append(
                f"  store size {fsutil.human_size(self.store_bytes)} ({bound}; PREBAKE_STORE_MAX_BYTES sets it)"
            )
        header = f"  {'kind':<10} {'hits':>6} {'store':>6} {'registry':>8} {'misses':>6} {'hit rate':>8} {'compiled':>8} {'compile s':>9} {'saved s':>9} {'fetched':>10}"
        lines.append(header)
        for name, t in [*data["kinds"].items(), ("total", data["total"])]:
            rate = "-" if t["hit_rate"] is None else f"{t['hit_rate']:.0%}"
            lines.append(
                f"  {name:<10} {t['hits']:>6} {t['store_hits']:>6} {t['registry_hits']:>8} {t['misses']:>6} "
                f"{rate:>8} {t['fallback_compiles']:>8} {t['fallback_seconds']:>9.1f} {t['seconds_saved']:>9.1f} {fsutil.human_size(t['bytes_fetched']):>10}"
            )
        if data["total"]["variant_fallbacks"]:
            lines.append(
                f"  {data['total']['variant_fallbacks']} start(s) whose bundle's variant did not load here took the next "
                f"variant in the same tree (aoti-package -> dynamo-precompile: the log says why)"
            )
        if data["total"]["untimed_hits"]:
            lines.append(
                f"  ({data['total']['untimed_hits']} hit(s) of bundles baked without a recorded build time save 0 s here)"
            )
        for r in data["miss_reasons"][:5]:
            lines.append(f"  miss {r['reason']:<14} x{r['count']}: {r['example']}")
        if data["differing_factors"]:
            top = ", ".join(f"{f['factor']} x{f['count']}" for f in data["differing_factors"][:5])
            lines.append(f"  factors the nearest bundle differed in: {top}")
        if self.zeroed:
            lines.append("  (zeroed: counting starts again now)")
        return "\n".join(lines)


def read_stats(store: Store, *, zero: bool = False) -> StatsReport:
    """Fold the summary and every event into one report; with `zero`, start counting again."""
    if not zero and not _writable(store.home):  # a read-only home: read it as it is, without the lock file
        folder = store.home / "stats"
        summary = _fold(_read_summary(folder), _pending(folder)) if folder.is_dir() else StatsSummary()
        return _sized(StatsReport(str(store.home), summary, zeroed=False), store)
    folder = _folder(store)
    with _lock(folder, shared=not zero):
        try:
            summary = _fold(_read_summary(folder), _pending(folder))
        except StoreError:
            if not zero:
                raise
            summary = StatsSummary()  # --zero is the way out of an unreadable summary
        if zero:
            fresh = StatsSummary(generation=max(summary.generation, _last_segment(folder)), since=time.time())
            fsutil.write_bytes(folder / "summary.json", fresh.model_dump_json(indent=1).encode())
            for path in [*folder.glob("events-*.jsonl"), folder / "events.jsonl"]:
                path.unlink(missing_ok=True)
    return _sized(StatsReport(str(store.home), summary, zeroed=zero), store)


def _sized(report: StatsReport, store: Store) -> StatsReport:
    """The report with the store's size and bound beside its counts."""
    used = sum(e.bytes for e in store.inventory())
    return replace(report, store_bytes=used, max_bytes=store.limits.max_bytes)


def compact(store: Store) -> StatsSummary:
    """Fold every event into summary.json now (writers do this on their own past COMPACT_BYTES)."""
    folder = _folder(store)
    with _lock(folder):
        return _compact_locked(folder)


def _compact_locked(folder: Path) -> StatsSummary:
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
        kinds[name] = _add_tallies([kinds.get(name, KindTally()), KindTally(**t)])
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


def _add_tallies(tallies: Iterable[KindTally]) -> KindTally:
    total: dict[str, Any] = KindTally().model_dump()
    for t in tallies:
        for name, value in t.model_dump().items():
            total[name] += value
    return KindTally(**total)


def _tally_json(t: KindTally) -> dict[str, Any]:
    hits = t.store_hits + t.registry_hits
    lookups = hits + t.misses
    return {
        "hits": hits,
        "store_hits": t.store_hits,
        "registry_hits": t.registry_hits,
        "misses": t.misses,
        "hit_rate": round(hits / lookups, 4) if lookups else None,
        "fallback_compiles": t.fallback_compiles,
        "fallback_seconds": round(t.fallback_seconds, 3),
        "variant_fallbacks": t.variant_fallbacks,
        "seconds_saved": round(t.seconds_saved, 3),
        "untimed_hits": t.untimed_hits,
        "bytes_fetched": t.bytes_fetched,
    }


def _lock(folder: Path, *, shared: bool = False) -> fsutil.Flock:
    lock = fsutil.Flock.acquire(folder / "stats.lock", shared=shared)
    assert lock is not None  # a waiting acquire always returns the lock
    return lock


def _writable(home: Path) -> bool:
    """False when the home is there but cannot be written (a read-only mount, a folder of another user)."""
    probe = home / "stats" if (home / "stats").is_dir() else home
    return not probe.is_dir() or (os.access(probe, os.W_OK) and not _read_only_mount(probe))


def _read_only_mount(path: Path) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def _folder(store: Store) -> Path:
    folder = store.home / "stats"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
