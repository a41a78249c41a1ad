"""Write-backs age out: what waits in a quarantine namespace longer than its maximum age is removed.

`prebake promote --prune [--older-than 7d]`, on every backend through Maintainable.remove: the
index entry first (readers miss from then on), then its blob and side files, unless an entry
that stays names the blob. The maximum age is --older-than, else the policy's `[quarantine]
max_age_days`, else DEFAULT_MAX_AGE_DAYS, counted from the pod's `created` stamp; a stamp that
cannot be read or lies in the future by more than CLOCK_SKEW counts as expired, so a write-back
cannot keep itself waiting. Only the quarantine is pruned, never the index pods read.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from dataclasses import dataclass

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.ports.registry import Maintainable, Registry

CLOCK_SKEW = dt.timedelta(hours=1)  # pods' clocks may run this far ahead of the pruner's
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "": 86400}


@dataclass(frozen=True)
class Aged:
    """One quarantined write-back and what pruning did with it."""

    kind: str
    key_digest: str
    created: str
    outcome: str  # "removed", "would remove", "kept"
    why: str = ""  # why it expired, by the pruner's clock

    @property
    def expired(self) -> bool:
        return self.outcome != "kept"


@dataclass(frozen=True)
class Pruned:
    """What `prebake promote --prune` did to one quarantine: each write-back's outcome."""

    quarantine: str  # the quarantine's address
    max_age: dt.timedelta
    results: tuple[Aged, ...]
    dry_run: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "quarantine": self.quarantine,
            "max_age_s": self.max_age.total_seconds(),
            "results": [dataclasses.asdict(r) for r in self.results],
        }

    def render(self) -> str:
        gone = [r for r in self.results if r.expired]
        verb = "would remove" if self.dry_run else "removed"
        head = (
            f"prune {self.quarantine}: {len(gone)} of {len(self.results)} write-back(s) older than "
            f"{say_age(self.max_age)} {verb}"
        )
        return "\n".join(
            [head, *(f"  {r.kind:9} {r.key_digest[:16]}  created {r.created}  {r.outcome}: {r.why}" for r in gone)]
        )


def max_age_in_force(older_than: str | None) -> dt.timedelta:
    """The maximum age in force: `older_than` (--older-than), else the policy file's [quarantine]
    max_age_days, else DEFAULT_MAX_AGE_DAYS."""
    if older_than:
        return parse_age(older_than)
    from prebake.registry.trust.policy import policy_file_in_force
    from prebake.registry.trust.policy_file import DEFAULT_MAX_AGE_DAYS

    policy = policy_file_in_force()
    return dt.timedelta(days=policy.quarantine.max_age_days if policy else DEFAULT_MAX_AGE_DAYS)


def parse_age(text: str) -> dt.timedelta:
    """'7d', '36h', '90m', '3600s', '2w' (a bare number is days); PrebakeError saying the forms."""
    m = _DURATION.match(text)
    if m is None or float(m.group(1)) <= 0:
        raise PrebakeError(
            f"maximum age {text!r} is not a duration: write a positive number with s, m, h, d or w "
            f"(e.g. 7d, 36h; a bare number is days)"
        )
    return dt.timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])


def say_age(age: dt.timedelta) -> str:
    """A maximum age as an operator writes it: 7d, 36h, 90m, 30s."""
    seconds = age.total_seconds()
    for unit in ("d", "h", "m"):
        if seconds >= _UNIT_S[unit] and seconds % _UNIT_S[unit] == 0:
            return f"{seconds / _UNIT_S[unit]:g}{unit}"
    return f"{seconds:g}s"


def prune(
    incoming: Registry, max_age: dt.timedelta, *, now: dt.datetime | None = None, dry_run: bool = False
) -> list[Aged]:
    """Remove every entry of the quarantine `incoming` older than `max_age` (with `dry_run`, only say which)."""
    if not isinstance(incoming, Maintainable):
        raise PrebakeError(f"{incoming.url} cannot remove entries; prune a folder, S3, Hub or OCI quarantine")
    now = now or dt.datetime.now(dt.UTC)
    entries = list(incoming.list())
    why = {m.key_digest: _expired(m, now, max_age) for m in entries}
    expired = [m for m in entries if why[m.key_digest]]
    kept_blobs = {m.blob.digest for m in entries if m not in expired}
    out = [Aged(m.kind, m.key_digest, m.created, "kept") for m in entries if m not in expired]
    for m in expired:
        if not dry_run:
            shared = m.blob.digest in kept_blobs
            incoming.remove(m.kind, m.key_digest, blob_digest=None if shared else m.blob.digest)
            kept_blobs.add(m.blob.digest)  # removed once: a second entry naming it has nothing left to remove
        out.append(Aged(m.kind, m.key_digest, m.created, "would remove" if dry_run else "removed", why[m.key_digest]))
    return out


def _expired(manifest: Manifest, now: dt.datetime, max_age: dt.timedelta) -> str:
    """Why the entry has expired by the pruner's clock `now` (the clock that decides), or "" if it has not."""
    try:
        created = dt.datetime.fromisoformat(manifest.created)
    except ValueError:
        return f"its created stamp {manifest.created!r} cannot be read"
    created = created if created.tzinfo else created.replace(tzinfo=dt.UTC)
    clock = f"{now:%Y-%m-%d %H:%M} UTC by this host's clock"
    if created > now + CLOCK_SKEW:
        ahead = (created - now).total_seconds() / 3600
        return (
            f"stamped {ahead:.0f} h in the future ({clock}), more than the {say_age(CLOCK_SKEW)} allowed: counted "
            f"as expired; if most are, this host's clock is behind: set it right (NTP) before pruning"
        )
    if now - created > max_age:
        return f"{(now - created).total_seconds() / 86400:.1f} days old ({clock}), more than {say_age(max_age)}"
    return ""
