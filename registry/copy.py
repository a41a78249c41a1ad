"""`prebake copy SRC DST`: bundles from one registry into another, verified, create-only, resumable.

Over the Registry port only (prebake.artifacts.ports.registry), so any two backends pair. It
copies the source's revocation list first (never over a higher serial), then each bundle,
upstream kinds first: one already there is left alone, a different one of the same key is
reported; otherwise the trust check (the composition root's policy bound to the source's
address) lets it through, its blob comes down verified, its side files go up, then `publish`
writes the blob and, last, the index entry, so a kill leaves at most a blob a rerun reuses.
Kernel-cache images are not a registry: `prebake kernel-cache` writes them. docs/registries.md.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from prebake.artifacts.bake.provenance import SIDE_NAME
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.ports.errors import PublishConflict
from prebake.artifacts.ports.registry import Registry, SideFiles, TrustCheck
from prebake.registry.trust.model_signatures import SIDE_NAME as MODEL_SIGNATURE

# The files kept beside a blob that travel with it: the provenance attestation, and the OpenSSF model
# signature a signed bake writes (registry/trust/model_signatures.py).
SIDE_NAMES: tuple[str, ...] = (SIDE_NAME, MODEL_SIGNATURE)


@dataclass(frozen=True)
class Selection:
    """Which bundles to copy: every field that is set must match (labels model, platform, precision)."""

    kind: str | None = None
    model: str | None = None
    platform: str | None = None
    precision: str | None = None
    key_prefix: str = ""

    def __call__(self, manifest: Manifest) -> bool:
        labels = manifest.labels
        return (
            manifest.key_digest.startswith(self.key_prefix)
            and (self.model is None or labels.get("model") == self.model)
            and (self.platform is None or labels.get("platform") == self.platform)
            and (self.precision is None or labels.get("precision") == self.precision)
        )


@dataclass(frozen=True)
class Copied:
    """What happened to one bundle."""

    kind: str
    key_digest: str
    model: str
    outcome: str  # "copied", "already there", "would copy", "refused: ...", "conflict: ..."
    bytes: int = 0  # blob bytes moved by this run
    side_files: tuple[str, ...] = ()  # side files written by this run

    @property
    def ok(self) -> bool:
        return not self.outcome.startswith(("refused", "conflict"))


@dataclass
class CopyReport:
    source: str
    destination: str
    revocation_list: str = "none at the source"
    bundles: list[Copied] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.bundles)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.bundles) and not self.revocation_list.startswith("refused")

    def count(self, outcome: str) -> int:
        return sum(1 for c in self.bundles if c.outcome == outcome)

    def summary(self) -> str:
        copied, there = self.count("copied"), self.count("already there")
        bad = sum(1 for c in self.bundles if not c.ok)
        if copied == 0 and bad == 0 and self.count("would copy") == 0:
            head = f"nothing to copy: all {there} bundle(s) already there, 0 bytes copied"
        elif would := self.count("would copy"):
            head = f"dry run, nothing written: {would} bundle(s) would be copied, {there} already there"
        else:
            head = f"{copied} bundle(s) copied ({self.bytes} bytes), {there} already there"
        if bad:
            head += f", {bad} refused"
        return f"copy {self.source} -> {self.destination}: {head}; revocation list: {self.revocation_list}"

    def render(self) -> str:
        """`prebake copy`'s text: the summary, then a line per bundle not already there."""
        done = [
            f"  {c.kind:9} {c.key_digest[:16]}  {c.model:20} {c.outcome}"
            for c in self.bundles
            if c.outcome != "already there"
        ]
        return "\n".join([self.summary(), *done])

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "destination": self.destination,
            "revocation_list": self.revocation_list,
            "bytes_copied": self.bytes,
            "copied": self.count("copied"),
            "already_there": self.count("already there"),
            "bundles": [asdict(c) for c in self.bundles],
        }


RevocationCheck = Callable[[bytes], "str | None"]  # the list's bytes -> why it is refused, or None


def copy_bundles(
    source: Registry,
    destination: Registry,
    *,
    trust: TrustCheck | None,
    select: Selection = Selection(),
    check_revocations: RevocationCheck | None = None,
    side_names: Sequence[str] = SIDE_NAMES,
    dry_run: bool = False,
    scratch: Path | None = None,
    progress: Callable[[Copied], None] | None = None,
) -> CopyReport:
    """Copy every selected bundle of `source` (with its side files) and the revocation list into `destination`."""
    if not dry_run and not destination.writable:
        raise PrebakeError(f"{destination.url} can be read but not written here; copy into a registry you can write")
    report = CopyReport(source.url, destination.url)
    report.revocation_list = _copy_revocations(source, destination, check_revocations, dry_run)
    manifests = sorted((m for m in source.list(select.kind) if select(m)), key=_upstream_first)
    with tempfile.TemporaryDirectory(prefix="prebake-copy-", dir=scratch) as tmp:
        for manifest in manifests:
            done = _copy_one(manifest, source, destination, trust, side_names, dry_run, Path(tmp))
            report.bundles.append(done)
            if progress is not None:
                progress(done)
    return report


def _upstream_first(manifest: Manifest) -> tuple[int, str, str]:
    return len(manifest.inputs), manifest.kind, manifest.key_digest


def _copy_one(
    m: Manifest,
    source: Registry,
    destination: Registry,
    trust: TrustCheck | None,
    side_names: Sequence[str],
    dry_run: bool,
    tmp: Path,
) -> Copied:
    def out(outcome: str, moved: int = 0, sides: Iterable[str] = ()) -> Copied:
        return Copied(m.kind, m.key_digest, m.labels.get("model", ""), outcome, moved, tuple(sides))

    there = destination.lookup(m.kind, m.key_digest)
    if there is not None:
        if not there.same_bundle(m):
            return out(_conflict(destination.url, there))
        return out("already there", sides=_copy_sides(m, source, destination, side_names))  # a kill between the two
    if trust is not None and (why := trust(m)) is not None:
        return out(f"refused: {why}")
    if dry_run:
        return out("would copy")
    blob = source.fetch_blob(m.blob.digest, tmp / m.blob.hex, size=m.blob.size)  # digest and size checked
    try:
        sides = _copy_sides(m, source, destination, side_names)  # before the entry that makes the bundle visible
        try:
            published = destination.publish(m, blob)
        except PublishConflict as exc:
            return out(f"conflict: {exc}")
    finally:
        blob.unlink(missing_ok=True)
    return out("copied" if published.created else "already there", m.blob.size if published.created else 0, sides)


def _conflict(where: str, there: Manifest) -> str:
    return (
        f"conflict: {where} already answers this key with blob {there.blob.digest[:23]}, a different build; "
        f"left as it is (registries are create-only: remove it there first if the source's should win)"
    )


def _copy_sides(m: Manifest, source: Registry, destination: Registry, names: Sequence[str]) -> list[str]:
    if not (isinstance(source, SideFiles) and isinstance(destination, SideFiles)):
        return []
    written = []
    for name in names:
        if destination.get_side(m.blob.digest, name) is not None:
            continue
        data = source.get_side(m.blob.digest, name)
        if data is not None and destination.put_side(m.blob.digest, name, data):
            written.append(name)
    return written


def _copy_revocations(source: Registry, destination: Registry, check: RevocationCheck | None, dry_run: bool) -> str:
    from prebake.registry.trust.revocation import LIST_NAME, unverified

    if not isinstance(source, SideFiles):
        return "none at the source"
    raw = source.get_meta(LIST_NAME)
    if raw is None:
        return "none at the source"
    theirs = unverified(raw)
    if theirs is None:
        return f"refused: the source's meta/{LIST_NAME} is not a revocation list"
    if check is not None and (why := check(raw)) is not None:
        return f"refused: {why}"
    if not isinstance(destination, SideFiles):
        return f"not copied: {destination.url} keeps no files about itself"
    held = destination.get_meta(LIST_NAME)
    if held == raw:
        return f"already there (serial {theirs.serial})"
    mine = None if held is None else unverified(held)
    if mine is not None and mine.serial >= theirs.serial:
        return f"kept the destination's (serial {mine.serial} >= the source's {theirs.serial}: never rolled back)"
    if dry_run:
        return f"would copy (serial {theirs.serial})"
    destination.put_meta(LIST_NAME, raw)
    return f"copied (serial {theirs.serial})"


def revocation_check_in_force(trust: TrustCheck | None) -> RevocationCheck | None:
    """The check of a revocation list under the policy in force: its revocation keys when the
    policy file names them (prebake.registry.trust.policy.FilePolicy), else none (readers check it)."""
    from prebake.registry.trust.policy import FilePolicy

    if not isinstance(trust, FilePolicy) or trust.policy.revocation is None:
        return None
    policy, rules = trust.policy, trust.policy.revocation

    def check(raw: bytes) -> str | None:
        from prebake.registry.trust.attestation import AttestationError
        from prebake.registry.trust.revocation import read_list

        try:
            read_list(raw, policy, rules)
        except AttestationError as exc:
            return f"the source's revocation list does not verify under policy {trust.source}: {exc}"
        return None

    return check


__all__ = ["SIDE_NAMES", "Copied", "CopyReport", "Selection", "copy_bundles", "revocation_check_in_force"]
