"""Verifying a registry: re-check every index entry and blob, report, and move bad entries aside.

For every index entry: the manifest parses and its factors hash to its key digest, it sits
at the path of its own kind and key, a trusted key signed it (when a trust policy is given),
its blob exists, hashes to its digest and has the recorded size (the download stops the
moment it passes that size). With `deep`, every blob is also opened: streamed through the
store's own checked unpacker into a scratch folder, so an entry whose file list disagrees
with its blob (a name, size, type or digest) is found, not only a blob with wrong bytes. Each bad entry is one
finding. With quarantine, bad entries are moved out of the index (and a blob whose bytes
are wrong out of blobs/) so readers miss instead of installing them; see
`FileRegistry.quarantine` for where they go.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.unpack import UnpackLimits, unpack_streamed
from prebake.artifacts.errors import BundleError, PrebakeError
from prebake.artifacts.layout import parse_index_relpath
from prebake.artifacts.ports.errors import BlobDigestMismatch, BlobSizeMismatch, RegistryError
from prebake.artifacts.ports.registry import Maintainable, Registry, TrustCheck


@dataclass(frozen=True)
class Finding:
    """One bad index entry: which, what is wrong with it, and where it went if it was moved aside."""

    kind: str
    key_digest: str
    problem: str
    bad_blob: str | None = None  # the blob digest, when the blob's own bytes are wrong
    quarantined_to: str | None = None


@dataclass(frozen=True)
class VerifyReport:
    """What `verify_registry` found: counts, one finding per bad entry, notes on what was not done."""

    registry: str
    entries: int
    ok: int
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()

    @property
    def bad(self) -> int:
        return len(self.findings)

    def to_json(self) -> dict[str, object]:
        """`prebake verify --json`."""
        return {
            "registry": self.registry,
            "entries": self.entries,
            "ok": self.ok,
            "bad": self.bad,
            "findings": [dataclasses.asdict(f) for f in self.findings],
            "notes": list(self.notes),
        }

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0

    def render(self) -> str:
        lines = [f"verify {self.registry}: {self.entries} entries, {self.ok} ok, {self.bad} bad"]
        for f in self.findings:
            lines.append(f"  BAD {f.kind} {f.key_digest[:16]}: {f.problem}")
            if f.quarantined_to:
                blob = ", and its corrupt blob with it" if f.bad_blob else ""
                lines.append(f"      moved aside to {f.quarantined_to}{blob}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def verify_registry(
    registry: Registry, *, trust: TrustCheck | None, quarantine: bool, deep: bool = False
) -> VerifyReport:
    """Check every entry of `registry` (with `deep`, unpack every blob against its file list);
    with `quarantine`, move the bad ones aside."""
    url = registry.url
    notes: list[str] = [] if trust is not None else ["signatures were not checked: no trusted keys were given"]
    if not deep:
        notes.append("blobs were re-hashed but not opened: run with --deep to check them against their file lists")
    blobs: dict[tuple[str, str | None], _BlobCheck] = {}
    entries, findings = 0, []
    for kind, key_digest, manifest, problem in _entries(registry):
        entries += 1
        if manifest is not None:
            problem = _check(registry, manifest, trust, blobs, deep)
        if problem is not None:
            bad_blob = (
                manifest.blob.digest if manifest is not None and blobs[_blob_key(manifest, deep)].corrupt else None
            )
            findings.append(Finding(kind, key_digest, problem, bad_blob))
    if quarantine and findings:
        findings, more = _quarantine(registry, findings)
        notes += more
    return VerifyReport(url, entries, entries - len(findings), tuple(findings), tuple(notes))


# -- reading the index -----------------------------------------------------------------------

_Entry = tuple[str, str, "Manifest | None", "str | None"]  # kind, key digest, manifest or None, why not


def _entries(registry: Registry) -> Iterator[_Entry]:
    """Every index entry, parsed where it parses; a backend with raw access reports bad ones too."""
    if not isinstance(registry, Maintainable):
        yield from _listed(registry)
        return
    for relpath, raw in registry.index_entries():
        yield _parse(relpath, raw)


def _parse(relpath: str, raw: bytes | PrebakeError) -> _Entry:
    named = parse_index_relpath(relpath)
    kind, key_digest = named if named else (relpath.split("/")[1], Path(relpath).stem)
    if named is None:
        return kind, key_digest, None, f"{relpath} is not named index/<kind>/<sha256>.json, so no lookup can find it"
    if isinstance(raw, PrebakeError):
        return kind, key_digest, None, str(raw)
    try:
        manifest = Manifest.parse(raw, relpath)
    except PrebakeError as exc:
        return kind, key_digest, None, str(exc)
    if (manifest.kind, manifest.key_digest) != named:
        where = f"{manifest.kind} {manifest.key_digest[:16]}"
        return kind, key_digest, None, f"{relpath} holds the manifest of {where}: it was copied or edited; rebake it"
    return kind, key_digest, manifest, None


def _listed(registry: Registry) -> Iterator[_Entry]:
    listing = iter(registry.list())
    while True:
        try:
            manifest = next(listing)
        except StopIteration:
            return
        except Exception as exc:  # the backend cannot say which entry broke its listing; report and stop
            yield "?", "?", None, f"listing stopped at an unreadable entry: {exc}"
            return
        yield manifest.kind, manifest.key_digest, manifest, None


# -- checking one entry ----------------------------------------------------------------------


@dataclass(frozen=True)
class _BlobCheck:
    problem: str | None
    corrupt: bool  # the blob's own bytes are wrong, so it goes aside with the entry
    size: int | None = None


def _blob_key(manifest: Manifest, deep: bool) -> tuple[str, str | None]:
    return manifest.blob.digest, (manifest.files_digest() if deep else None)


def _check(
    registry: Registry,
    manifest: Manifest,
    trust: TrustCheck | None,
    blobs: dict[tuple[str, str | None], _BlobCheck],
    deep: bool,
) -> str | None:
    """Why this entry is bad (every reason, joined), or None; blobs are read once per digest (and
    file list, when deep)."""
    problems = []
    if trust is not None and (refused := trust(manifest)) is not None:
        problems.append(refused)
    key = _blob_key(manifest, deep)
    if key not in blobs:
        blobs[key] = _check_blob(registry, manifest, deep)
    if (blob := blobs[key]).problem is not None:
        problems.append(blob.problem)
    return "; ".join(problems) or None


def _check_blob(registry: Registry, manifest: Manifest, deep: bool) -> _BlobCheck:
    """Download the blob (fetch_blob verifies the sha256 and stops past the manifest's size); with
    `deep`, unpack it as it streams, every member checked against the manifest's file list."""
    digest, size = manifest.blob.digest, manifest.blob.size
    with tempfile.TemporaryDirectory(prefix="prebake-verify-") as tmp:
        blob, tree = Path(tmp) / "blob", Path(tmp) / "tree"
        try:
            if deep:
                download = lambda tee: registry.fetch_blob(digest, blob, size=size, tee=tee)  # noqa: E731
                unpack_streamed(download, tree, manifest.files, UnpackLimits(), f"blob {digest[:23]}")
            else:
                registry.fetch_blob(digest, blob, size=size)
        except BlobSizeMismatch as exc:
            return _BlobCheck(f"the entry was edited or its blob replaced: {exc}; rebake it", corrupt=False)
        except BlobDigestMismatch:
            return _BlobCheck(
                f"blob is corrupt: {digest[:23]}... does not hash to its own digest; rebake this key", corrupt=True
            )
        except RegistryError as exc:
            return _BlobCheck(f"blob is unavailable: {exc}", corrupt=False)
        except BundleError as exc:  # the unpacker refused before the digest was known: which is it?
            plain = _check_blob(registry, manifest, deep=False)
            if plain.problem is not None:
                return plain
            return _BlobCheck(f"blob does not match the entry's file list: {exc}; rebake this key", corrupt=False)
        return _BlobCheck(None, corrupt=False, size=size)


# -- moving bad entries aside ----------------------------------------------------------------


def _quarantine(registry: Registry, findings: list[Finding]) -> tuple[list[Finding], list[str]]:
    if not isinstance(registry, Maintainable):
        return findings, [f"quarantine is not supported by {registry.url}; the bad entries were left in place"]
    moved, notes = [], []
    for f in findings:
        try:
            to = registry.quarantine(f.kind, f.key_digest, blob_digest=f.bad_blob)
        except PrebakeError as exc:
            notes.append(f"could not move {f.kind} {f.key_digest[:16]} aside: {exc}")
            moved.append(f)
            continue
        moved.append(replace(f, quarantined_to=str(to)))
    return moved, notes
