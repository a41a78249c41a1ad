"""Preheating a pull-through mirror: every bundle pulled through it once, before the fleet asks.

    report = preheat(OCIRegistry("oci://mirror.local:5000/team/prebake"))   # `prebake preheat --mirror ...`

May touch the mirror only, through the OCI client. A mirror does not coalesce simultaneous first
pulls, so N nodes starting on a new bundle cost the origin N + 1 copies; pulled once ahead, they
cost it none. Per entry: its manifest, image config and side files, then its layer: a one-byte
Range first (206: the mirror holds it already), else the whole answer read through the manifest's
size bound and sha256, and the mirror asked again until it serves the blob itself, within `wait_s`.
Idempotent: a second preheat costs the origin only the manifest requests.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.fsutil import human_size
from prebake.artifacts.layout import side_folder_relpath
from prebake.artifacts.ports.errors import BlobDigestMismatch, RegistryUnavailable
from prebake.artifacts.ports.objects import Stored
from prebake.artifacts.ports.registry import MAX_SIDE_FILE_BYTES
from prebake.registry.oci import OCIRegistry
from prebake.registry.oci.blob import held, pull_through
from prebake.registry.shared.transfer import SizedSink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Preheated:
    """What the preheat did for one bundle."""

    kind: str
    key_digest: str
    blob: str
    size: int
    pulled: bool  # the mirror had to fetch the blob (False: it held it already)
    side_files: int
    seconds: float

    def render(self) -> str:
        """Its progress line of `prebake preheat`."""
        state = "pulled through" if self.pulled else "already held"
        return f"{self.kind:9s} {self.key_digest[:16]}  {human_size(self.size):>9s}  {state}  ({self.seconds:.1f} s)"


@dataclass(frozen=True)
class PreheatReport:
    """What `prebake preheat` did through one mirror: a row per bundle."""

    mirror: str
    bundles: tuple[Preheated, ...]

    def to_json(self) -> dict[str, object]:
        return {"mirror": self.mirror, "bundles": [dataclasses.asdict(b) for b in self.bundles]}

    def render(self) -> str:
        """The closing line of `prebake preheat` (each bundle's line went out as it was done)."""
        pulled = sum(b.pulled for b in self.bundles)
        return f"{len(self.bundles)} bundles through {self.mirror}: {pulled} pulled, {len(self.bundles) - pulled} already held"


def preheat(
    mirror: OCIRegistry, *, kind: str | None = None, keys: tuple[str, ...] = (), wait_s: float = 120.0
) -> Iterator[Preheated]:
    """Pull every index entry (of `kind`, or with a key digest in `keys`) through `mirror`, one by one."""
    sides = list(mirror.files.list("side/"))
    for entry_kind, key_digest, _ in mirror.entry_tags(kind):
        if keys and key_digest not in keys and not any(key_digest.startswith(k) for k in keys):
            continue
        manifest = mirror.lookup(entry_kind, key_digest)
        if manifest is None:  # deleted since it was listed
            continue
        yield _preheat_one(mirror, manifest, sides, wait_s)


def _preheat_one(mirror: OCIRegistry, manifest: Manifest, sides: list[Stored], wait_s: float) -> Preheated:
    started = time.monotonic()
    got = mirror.read_manifest(f"{manifest.kind}-{manifest.key_digest}")
    if got is not None:  # the image config: what a container runtime or an image volume reads first
        config = _config_digest(got[0])
        if config:
            mirror.read_small_blob(config, f"{mirror.url}:{manifest.kind}-{manifest.key_digest}")
    mine = [s for s in sides if s.key.startswith(side_folder_relpath(manifest.blob.digest) + "/")]
    for side in mine:
        mirror.files.get(side.key, MAX_SIDE_FILE_BYTES)
    pulled = _pull_blob(mirror, manifest, wait_s)
    took = time.monotonic() - started
    log.info(
        "preheated %s %s (%s) in %.1f s", manifest.kind, manifest.key_digest[:16], "pulled" if pulled else "held", took
    )
    return Preheated(
        manifest.kind, manifest.key_digest, manifest.blob.digest, manifest.blob.size, pulled, len(mine), took
    )


def _pull_blob(mirror: OCIRegistry, manifest: Manifest, wait_s: float) -> bool:
    digest, where = manifest.blob.digest, f"{mirror.url}@{manifest.blob.digest}"
    sized = SizedSink(manifest.blob.size, digest, where, mirror.url)
    with tempfile.TemporaryFile(prefix="prebake-preheat-") as f:
        got = pull_through(mirror.client, digest, f, sized)
    if got is None:
        return False
    sized.finish()
    if got != digest:
        raise BlobDigestMismatch(
            f"blob {where} hashes to {got}, not {digest}: the mirror, or its origin, holds corrupt bytes; "
            f"run `prebake verify --quarantine --registry <origin>` and clear the mirror's copy"
        )
    deadline, pause = time.monotonic() + wait_s, 0.2  # the mirror stores its copy as it streams ours
    time.sleep(pause)
    while not held(mirror.client, digest):
        if time.monotonic() > deadline:
            raise RegistryUnavailable(
                f"{mirror.url} streamed blob {digest[:23]} but did not serve it from its own storage within "
                f"{wait_s:g} s; check the mirror's storage and log (is it a caching mirror?), then preheat again"
            )
        time.sleep(pause)
        pause = min(pause * 2, 2.0)
    return True


def _config_digest(body: bytes) -> str:
    import json

    try:
        return str(json.loads(body)["config"]["digest"])
    except (ValueError, KeyError, TypeError):
        return ""


__all__ = ["Preheated", "preheat"]
