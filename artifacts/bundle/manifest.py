"""The manifest: what a bundle is, which key it answers, and the digest of every byte in it.

A bundle is `manifest.json` (this model) and a payload `.tar.zst` named by its sha256. The
manifest records the key's raw factors (so a miss can be explained), the blob's and every
file's digest and size, and who built it when. Signatures cover `signed_payload(version)`:
version 2, everything but the signatures; version 1, key, blob, files and inputs only
(docs/trust.md, "Signatures, version 2"). It may come from a hostile registry, so reading is
bounded (MAX_MANIFEST_BYTES, nesting, plain relative paths, links inside the tree); any failure
is a BundleError naming the source.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path, PurePosixPath

from pydantic import Field, ValidationError, field_validator, model_validator

from prebake.artifacts.errors import BundleError, PrebakeError
from prebake.artifacts.frozen import Frozen
from prebake.artifacts.keys import Key, canonical_json

SCHEMA_VERSION = "1"
SIGNATURE_VERSION = 2  # what `signed_payload()` covers by default; see Signature.version
MAX_MANIFEST_BYTES = 64 << 20  # a million files' entries fit; an index entry that reads on is refused
MAX_PATH_BYTES = 4096  # PATH_MAX on Linux
MAX_NAME_BYTES = 255  # NAME_MAX of every common file system
_MAX_DEPTH = 8  # the schema nests 3 deep (files -> entry -> field); anything deeper is not a manifest
_DIGEST_PREFIX = "sha256:"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _check_digest(value: str) -> str:
    if _DIGEST.fullmatch(value) is None:  # a regex: a manifest lists thousands of files, listings read thousands
        raise ValueError(f"digest {value!r} must read 'sha256:' followed by 64 lower-case hex digits")
    return value


def check_relpath(path: str) -> str:
    """`path` if it is a plain relative posix path a file system accepts, else ValueError saying why."""
    parts = path.split("/")
    if not path or path.startswith("/") or "\x00" in path or len(path.encode()) > MAX_PATH_BYTES:
        raise ValueError(f"path {path[:80]!r} must be relative, non-empty, without NUL, at most {MAX_PATH_BYTES} bytes")
    for part in parts:
        if part in ("", ".", "..") or len(part.encode()) > MAX_NAME_BYTES:
            raise ValueError(
                f"path {path[:80]!r} has a part {part[:40]!r} that is empty, '.', '..' or over {MAX_NAME_BYTES} bytes"
            )
    return path


def link_escapes(path: str, target: str) -> bool:
    """Whether a link at `path` pointing at `target` reaches outside the tree it sits in."""
    if os.path.isabs(target) or "\x00" in target or not target:
        return True
    depth = len(PurePosixPath(path).parts) - 1
    for part in target.split("/"):
        depth += -1 if part == ".." else (0 if part in (".", "") else 1)
        if depth < 0:
            return True
    return False


class FileEntry(Frozen):
    """One regular file (or link) in the payload, relative to the tree's root."""

    path: str
    size: int = Field(ge=0, lt=1 << 62)
    sha256: str
    executable: bool = False
    link: str | None = None  # symlink target, relative, inside the tree

    _digest = field_validator("sha256")(lambda cls, v: _check_digest(v))
    _path = field_validator("path")(lambda cls, v: check_relpath(v))

    @model_validator(mode="after")
    def _link_inside(self) -> FileEntry:
        link = self.link
        if link is not None and (len(link.encode()) > MAX_PATH_BYTES or link_escapes(self.path, link) or self.size):
            raise ValueError(f"link {self.path!r} -> {link[:80]!r} leaves its tree or is malformed")
        return self


class BlobRef(Frozen):
    """The payload: a content-addressed `.tar.zst`."""

    digest: str
    size: int = Field(ge=0, lt=1 << 62)

    _digest = field_validator("digest")(lambda cls, v: _check_digest(v))

    @property
    def hex(self) -> str:
        return self.digest.removeprefix(_DIGEST_PREFIX)


class Signature(Frozen):
    """An ed25519 signature over `Manifest.signed_payload(version)` by a named key.

    version 2 covers the whole manifest but its signatures; version 1 (absent from manifests signed
    by older releases: docs/trust.md) covered kind, key, blob, files and inputs, not labels."""

    signer: str = Field(max_length=256)
    signature: str = Field(max_length=1024)  # base64
    version: int = 1


class Manifest(Frozen):
    """Everything a reader needs to trust, explain and unpack a bundle."""

    schema_version: str = SCHEMA_VERSION
    kind: str
    key: dict[str, dict[str, str]]  # group -> factor -> value
    key_digest: str
    labels: dict[str, str] = Field(default_factory=dict)  # model, platform, precision, tp: for listings, not identity
    blob: BlobRef
    files: tuple[FileEntry, ...]
    inputs: dict[str, str] = Field(default_factory=dict)  # kind -> blob digest of artifacts this one was built from
    created: str
    builder: str
    build_seconds: float | None = Field(default=None, ge=0)  # how long the build took: what a hit saves
    signatures: tuple[Signature, ...] = Field(default=(), max_length=64)

    @model_validator(mode="after")
    def _files_form_a_tree(self) -> Manifest:
        paths = {f.path for f in self.files}
        if len(paths) != len(self.files):
            raise ValueError("the file list names a path twice")
        for f in self.files:  # a file that is also another's folder could not be unpacked, and would let
            parent = f.path.rpartition("/")[0]  # an entry land through a link
            while parent:
                if parent in paths:
                    raise ValueError(f"{parent!r} is a file and also the folder of {f.path!r}")
                parent = parent.rpartition("/")[0]
        return self

    @classmethod
    def parse(cls, raw: bytes | str, source: str) -> Manifest:
        """Read a manifest, naming the source on any problem; never more than MAX_MANIFEST_BYTES."""
        if len(raw) > MAX_MANIFEST_BYTES:
            raise BundleError(
                f"manifest {source} is over {MAX_MANIFEST_BYTES} bytes; no bundle needs that: it is not a manifest"
            )
        try:
            data = json.loads(raw)
            _check_depth(data, source)
            manifest = cls.model_validate(data)
        except BundleError:
            raise
        except (ValueError, TypeError, ValidationError, RecursionError) as exc:
            raise BundleError(f"manifest {source} is malformed: {_short(exc)}; republish the bundle") from exc
        if manifest.schema_version != SCHEMA_VERSION:
            raise BundleError(
                f"manifest {source} has schema {manifest.schema_version}, this prebake reads "
                f"{SCHEMA_VERSION}; upgrade prebake or rebake the bundle"
            )
        try:
            digest = manifest.the_key().digest
        except PrebakeError as exc:
            raise BundleError(f"manifest {source} has an invalid key: {exc}; rebake it") from exc
        if digest != manifest.key_digest:
            raise BundleError(
                f"manifest {source} names key {manifest.key_digest[:16]} but its factors hash to "
                f"{digest[:16]}: it was edited after baking; rebake it"
            )
        return manifest

    @classmethod
    def read(cls, path: Path) -> Manifest:
        return cls.parse(path.read_bytes(), str(path))

    def the_key(self) -> Key:
        return Key.of(self.kind, self.key)

    def to_bytes(self) -> bytes:
        # build_seconds is left out when unknown, so manifests baked before it existed keep their bytes
        data = self.model_dump(mode="json", exclude={"build_seconds"} if self.build_seconds is None else set())
        return json.dumps(data, indent=2, sort_keys=True).encode() + b"\n"

    def signed_payload(self, version: int = SIGNATURE_VERSION) -> bytes:
        """The bytes a signature of `version` covers: 2, every field but the signatures (labels,
        created and builder included); 1, kind, key factors and digest, blob, files, inputs."""
        if version == 2:
            whole = self.model_dump(mode="json", exclude={"signatures"})
            return canonical_json({"signature_version": 2, **whole})
        if version != 1:
            raise BundleError(f"signature version {version} is unknown to this prebake; upgrade prebake")
        return canonical_json(
            {
                "schema_version": self.schema_version,
                "kind": self.kind,
                "key": self.key,
                "key_digest": self.key_digest,
                "blob": self.blob.model_dump(mode="json"),
                "files": [f.model_dump(mode="json") for f in self.files],
                "inputs": self.inputs,
            }
        )

    def same_bundle(self, other: Manifest) -> bool:
        """True when both describe the same payload under the same key (signatures aside)."""
        return self.key_digest == other.key_digest and self.blob == other.blob

    def files_digest(self) -> str:
        """sha256 over the file list: what a tree unpacked from this manifest's blob is recorded as."""
        return "sha256:" + hashlib.sha256(canonical_json([f.model_dump(mode="json") for f in self.files])).hexdigest()

    @property
    def unpacked_bytes(self) -> int:
        return sum(f.size for f in self.files)


def _check_depth(data: object, source: str) -> None:
    """Refuse JSON nested deeper than any manifest is, before validation walks it."""
    level, frontier = 0, [data]
    while frontier:
        level += 1
        if level > _MAX_DEPTH:
            raise BundleError(f"manifest {source} nests deeper than {_MAX_DEPTH} levels: it is not a manifest")
        frontier = [
            child
            for node in frontier
            for child in (node.values() if isinstance(node, dict) else node if isinstance(node, list) else ())
            if isinstance(child, (dict, list))
        ]


def _short(exc: BaseException, limit: int = 400) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."
