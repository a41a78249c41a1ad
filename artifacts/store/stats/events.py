"""The stats' schema: one event as events.jsonl holds it, the tallies summary.json keeps, and the
short class of a miss reason. Pure data: reads and writes nothing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import Field

from prebake.artifacts.frozen import Frozen

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
EventName = Literal["hit", "miss", "fallback", "variant-fallback"]


def classify(reason: str) -> str:
    """The short class of a miss reason: timeout, bad-blob, tampered, untrusted, registry-down,
    evicted, does-not-load, no-bundle, or other."""
    text = reason.lower()
    return next((name for name, needles in REASON_CLASSES if any(n in text for n in needles)), "other")


class Event(Frozen):
    """One line of events.jsonl."""

    at: float  # unix seconds
    event: EventName
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
    """The counts of one kind (or of all kinds: their sum)."""

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
    """The misses of one reason class: how many, of which kinds, the latest reason text."""

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


def add_tallies(tallies: Iterable[KindTally]) -> KindTally:
    """The sum of tallies, field by field."""
    total: dict[str, Any] = KindTally().model_dump()
    for t in tallies:
        for name, value in t.model_dump().items():
            total[name] += value
    return KindTally(**total)
