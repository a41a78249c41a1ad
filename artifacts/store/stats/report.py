"""What `prebake store stats` prints: a StatsReport renders itself, as text or as its stable JSON
shape (docs/operations.md). Reads nothing: the ledger folds the counts it is made of."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from prebake.artifacts import fsutil
from prebake.artifacts.store.stats.events import KindTally, StatsSummary, add_tallies

_COLUMNS = (
    f"  {'kind':<10} {'hits':>6} {'store':>6} {'registry':>8} {'misses':>6} {'hit rate':>8} {'compiled':>8} "
    f"{'compile s':>9} {'saved s':>9} {'fetched':>10}"
)


@dataclass(frozen=True)
class StatsReport:
    """Totals per kind, the commonest miss reasons and factors, the store's size and bound."""

    store: str
    summary: StatsSummary
    zeroed: bool = False
    store_bytes: int | None = None  # blobs/ + trees/ now: what the bound counts
    max_bytes: int | None = None  # the store's bound (PREBAKE_STORE_MAX_BYTES, else the default)

    def total(self) -> KindTally:
        return add_tallies(self.summary.kinds.values())

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
        lines = [f"stats of {self.store} since {since}: {data['events']} event(s)", *self._size_line(), _COLUMNS]
        lines += [_tally_row(name, t) for name, t in [*data["kinds"].items(), ("total", data["total"])]]
        lines += _notes(data["total"])
        lines += [f"  miss {r['reason']:<14} x{r['count']}: {r['example']}" for r in data["miss_reasons"][:5]]
        if data["differing_factors"]:
            top = ", ".join(f"{f['factor']} x{f['count']}" for f in data["differing_factors"][:5])
            lines.append(f"  factors the nearest bundle differed in: {top}")
        if self.zeroed:
            lines.append("  (zeroed: counting starts again now)")
        return "\n".join(lines)

    def _size_line(self) -> list[str]:
        if self.store_bytes is None:
            return []
        bound = "unbounded" if self.max_bytes is None else f"bound {fsutil.human_size(self.max_bytes)}"
        return [f"  store size {fsutil.human_size(self.store_bytes)} ({bound}; PREBAKE_STORE_MAX_BYTES sets it)"]


def _tally_row(name: str, t: dict[str, Any]) -> str:
    rate = "-" if t["hit_rate"] is None else f"{t['hit_rate']:.0%}"
    return (
        f"  {name:<10} {t['hits']:>6} {t['store_hits']:>6} {t['registry_hits']:>8} {t['misses']:>6} "
        f"{rate:>8} {t['fallback_compiles']:>8} {t['fallback_seconds']:>9.1f} {t['seconds_saved']:>9.1f} "
        f"{fsutil.human_size(t['bytes_fetched']):>10}"
    )


def _notes(total: dict[str, Any]) -> list[str]:
    """The lines under the table: variant fallbacks and hits that saved no measured time."""
    notes = []
    if total["variant_fallbacks"]:
        notes.append(
            f"  {total['variant_fallbacks']} start(s) whose bundle's variant did not load here took the next "
            f"variant in the same tree (the log says which and why)"
        )
    if total["untimed_hits"]:
        notes.append(f"  ({total['untimed_hits']} hit(s) of bundles baked without a recorded build time save 0 s here)")
    return notes


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


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
