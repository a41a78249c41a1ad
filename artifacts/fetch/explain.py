"""The nearest miss: the bundle of the same kind in the registry that shares the most factors with
the wanted key, and the factors that differ. It only lists the registry's index, a bounded sample
in a bounded time; a failing listing explains less, it never hides the miss.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Generator

from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.keys import Key
from prebake.artifacts.ports.registry import Registry

MISS_SAMPLE = 32  # index entries a miss reads at most to name the nearest bundle
MISS_BUDGET_S = 2.0  # ... and the time it spends on them


def nearest_miss(registry: Registry, key: Key, reason: str) -> Miss:
    """A Miss naming the bundle of the same kind that shares the most factors with `key`.

    Bounded whatever the registry's size: it reads at most MISS_SAMPLE index entries of the
    kind (in listing order) and stops looking after MISS_BUDGET_S, so the start path pays the
    same for a registry of ten entries or ten thousand; the nearest is the nearest of those.
    """
    best: tuple[int, Key] | None = None
    deadline = time.monotonic() + MISS_BUDGET_S
    try:
        listing = registry.list(key.kind)
        try:
            for manifest in itertools.islice(listing, MISS_SAMPLE):
                other = manifest.the_key()
                score = len(other.diff(key))
                if best is None or score < best[0]:
                    best = (score, other)
                if time.monotonic() > deadline:
                    break
        finally:
            if isinstance(listing, Generator):  # stop a backend's read-ahead now, not when collected
                listing.close()
    except Exception as exc:  # listing is a courtesy: a failing listing must not hide the miss itself
        return Miss(key, f"{reason} (listing for the nearest bundle failed: {exc})")
    if best is None:
        return Miss(key, reason)
    return Miss(key, reason, nearest=best[1], differing=key.diff(best[1]))
