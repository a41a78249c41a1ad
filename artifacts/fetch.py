"""Fetching: find the bundle that answers a key, verify it, install it; or explain the miss.

A miss is a value. It names the key, the nearest bundle of the same kind in the
registry, and every factor that differs ("software.torch: 2.13.0+cpu here, 2.14.1 there"),
so an operator can tell at a glance why a start was cold.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

from .keys import Key
from .manifest import Manifest
from .ports import Registry
from .store import Installed, Store

# Checks a manifest before anything of it is installed; returns why it is refused, or None.
TrustCheck = Callable[[Manifest], "str | None"]

MISS_SAMPLE = 32  # index entries a miss reads at most to name the nearest bundle
MISS_BUDGET_S = 2.0  # ... and the time it spends on them


@dataclass(frozen=True)
class Miss:
    """Why nothing matched: the nearest candidate and the factors that differ."""

    key: Key
    reason: str
    nearest: Key | None = None
    differing: dict[str, tuple[str, str]] = field(default_factory=dict)  # factor -> (wanted, nearest has)

    def explain(self) -> str:
        lines = [f"miss: {self.key.kind} {self.key.digest[:16]}: {self.reason}"]
        if self.nearest is not None:
            lines.append(f"  nearest bundle {self.nearest.digest[:16]} differs in {len(self.differing)} factor(s):")
            lines += [f"    {name}: {want} here, {have} there" for name, (want, have) in self.differing.items()]
        return "\n".join(lines)


def fetch(store: Store, registry: Registry, key: Key, *, trust: TrustCheck | None = None) -> Installed | Miss:
    """The installed bundle for `key`: from the store, else from `registry` (verified), else a Miss."""
    installed = store.lookup(key.kind, key.digest)
    if installed is not None and _trusted(installed.manifest, trust) is None:
        return installed
    manifest = registry.lookup(key.kind, key.digest)
    if manifest is None:
        return nearest_miss(registry, key, "no bundle for this key in " + registry.url)
    if manifest.key_digest != key.digest or manifest.the_key() != key:
        return Miss(key, f"the registry's entry for {key.digest[:16]} carries another key; it was tampered with")
    refused = _trusted(manifest, trust)
    if refused is not None:
        return Miss(key, refused)
    return store.install(manifest, registry)


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


def _trusted(manifest: Manifest, trust: TrustCheck | None) -> str | None:
    return None if trust is None else trust(manifest)
