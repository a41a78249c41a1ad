"""The manifest: what a bundle is, which key it answers, and the digest of every byte in it.

A bundle is two objects: `manifest.json` (this model) and a payload `.tar.zst` named by
its sha256. The manifest records the key's raw factors (so a miss can be explained),
the digest and size of the payload blob, the digest and size of every file inside,
and who built it when. Signatures (ed25519) cover `signed_payload()`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import BundleError
from .keys import Key, canonical_json

SCHEMA_VERSION = "1"
_DIGEST_PREFIX = "sha256:"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_digest(value: str) -> str:
    if _DIGEST.fullmatch(value) is None:  # a regex: a manifest lists thousands of files, listings read thousands
        raise ValueError(f"digest {value!r} must read 'sha256:' followed by 64 lower-case hex digits")
    return value


class FileEntry(_Frozen):
    """One regular file (or link) in the payload, relative to the tree's root."""

    path: str
    size: int = Field(ge=0)
    sha256: str
    executable: bool = False
    link: str | None = None  # symlink target, relative, inside the tree

    _digest = field_validator("sha256")(lambda cls, v: _check_digest(v))


class BlobRef(_Frozen):
    """The payload: a content-addressed `.tar.zst`."""

    digest: str
    size: int = Field(ge=0)

    _digest = field_validator("digest")(lambda cls, v: _check_digest(v))

    @property
    def hex(self) -> str:
        return self.digest.removeprefix(_DIGEST_PREFIX)


class Signature(_Frozen):
    """An ed25519 signature over `Manifest.signed_payload()` by a named key."""

    signer: str
    signature: str  # base64


class Manifest(_Frozen):
    """Everything a reader needs to trust, explain and unpack a bundle."""

    schema_version: str = SCHEMA_VERSION
    kind: str
    key: dict[str, dict[str, str]]  # group -> factor -> value
    key_digest: str
    labels: dict[str, str] = {}  # model, platform, precision, tp: for listings, not identity
    blob: BlobRef
    files: tuple[FileEntry, ...]
    inputs: dict[str, str] = {}  # kind -> blob digest of artifacts this one was built from
    created: str
    builder: str
    build_seconds: float | None = Field(default=None, ge=0)  # how long the build took: what a hit saves
    signatures: tuple[Signature, ...] = ()

    @classmethod
    def parse(cls, raw: bytes | str, source: str) -> Manifest:
        """Read a manifest, naming the source on any problem."""
        try:
            manifest = cls.model_validate(json.loads(raw))
        except (ValueError, ValidationError) as exc:
            raise BundleError(f"manifest {source} is malformed: {exc}; republish the bundle") from exc
        if manifest.schema_version != SCHEMA_VERSION:
            raise BundleError(
                f"manifest {source} has schema {manifest.schema_version}, this prebake reads "
                f"{SCHEMA_VERSION}; upgrade prebake or rebake the bundle"
            )
        if manifest.the_key().digest != manifest.key_digest:
            raise BundleError(
                f"manifest {source} names key {manifest.key_digest[:16]} but its factors hash to "
                f"{manifest.the_key().digest[:16]}: it was edited after baking; rebake it"
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

    def signed_payload(self) -> bytes:
        """The bytes a signature covers: kind, key factors and digest, blob digest and size, files."""
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
