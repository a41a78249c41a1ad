"""Where a serving pod writes back what it compiled on a miss: a quarantine namespace, by default.

    <registry>/incoming/               the quarantine namespace: a registry no serving node reads
    s3://bucket/prefix  ->  s3://bucket/prefix/incoming
    hf://ns/repo[@rev]  ->  hf://ns/repo-incoming[@rev]   (Hub repos have no sub-roots)
    a chain             ->  the quarantine of its first level (the one a chain publishes to)

PREBAKE_WRITE_BACK picks "quarantine" (the default) or "index" (single-user setups where the pod
is the builder); the embedded local registry keeps write-back in its index. Quarantined bundles
carry the signed label writeback=quarantine, refused in any index (prebake.artifacts.fetch.gate);
`prebake promote` (registry.review.promote) reviews them and registry.review.aging prunes the
rest. docs/trust.md, "Nothing a pod compiled reaches other pods unreviewed".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.errors import PrebakeError

WRITE_BACK_ENV = "PREBAKE_WRITE_BACK"
INCOMING = "incoming"
MODES = ("quarantine", "index")


@dataclass(frozen=True)
class WriteBackTarget:
    """Where write-back goes and whether it is the quarantine namespace."""

    address: str
    quarantined: bool

    def describe(self) -> str:
        return f"{self.address} ({'quarantine: awaiting `prebake promote`' if self.quarantined else 'the index'})"


def write_back_target(address: str, embedded: Path, env: Mapping[str, str] = os.environ) -> WriteBackTarget:
    """The write-back target for a node reading `address` ($PREBAKE_HOME/registry is `embedded`)."""
    mode = env.get(WRITE_BACK_ENV, "").strip().lower() or "quarantine"
    if mode not in MODES:
        raise PrebakeError(
            f"{WRITE_BACK_ENV}={mode!r} is not one of {', '.join(MODES)}; 'quarantine' (the default) writes "
            f"to the registry's incoming/ namespace for review, 'index' writes straight to the shared index"
        )
    if mode == "index" or _is_embedded(address, embedded):
        return WriteBackTarget(address, quarantined=False)
    return WriteBackTarget(quarantine_address(address), quarantined=True)


def quarantine_address(address: str) -> str:
    """The quarantine namespace of a registry address (see the module docstring)."""
    first = address.split(",")[0].strip()
    if first.startswith("hf://"):
        base, at, revision = first.partition("@")
        return f"{base.rstrip('/')}-{INCOMING}{at}{revision}"
    return f"{first.rstrip('/')}/{INCOMING}"


def _is_embedded(address: str, embedded: Path) -> bool:
    text = address.strip()
    if "," in text or "://" in text.removeprefix("file://"):
        return False
    try:
        return Path(text.removeprefix("file://")).expanduser().resolve() == embedded.expanduser().resolve()
    except OSError:
        return False
