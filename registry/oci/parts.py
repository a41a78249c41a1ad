"""What OCIRegistry's listing and maintenance mixin uses of the registry, declared once and typed.

OCIRegistry (registry/oci/registry.py) defines every member below; the mixin (oci_maintain.py) inherits
these declarations, so mypy checks its use of the registry without seeing oci.py.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator

from prebake.artifacts.bundle.manifest import Manifest
from prebake.registry.oci.artifact import Blob
from prebake.registry.oci.client import Distribution, OCISettings


class OCIParts:
    """Declared here, defined by OCIRegistry."""

    url: str
    settings: OCISettings
    client: Distribution

    @abstractmethod
    def entry_tags(self, kind: str | None = None) -> tuple[tuple[str, str, str], ...]:
        """(kind, key digest, tag) of every index entry (of one kind), sorted."""

    @abstractmethod
    def tags(self) -> Iterator[str]: ...

    @abstractmethod
    def read_manifest(self, reference: str) -> tuple[bytes, str] | None:
        """A manifest's bytes and digest; None on 404."""

    @abstractmethod
    def read_small_blob(self, digest: str, where: str) -> bytes: ...

    @abstractmethod
    def push_bytes(self, ref: Blob, data: bytes) -> None: ...

    @abstractmethod
    def put_manifest(self, reference: str, body: bytes) -> str: ...

    @abstractmethod
    def write_file(self, tag: str, data: bytes, artifact_type: str, layer_type: str) -> Blob:
        """A small file as a one-layer artifact under `tag` (registry/oci/files.py)."""

    @abstractmethod
    def read_file(self, tag: str, layer_type: str) -> bytes | None: ...

    @abstractmethod
    def _entry(self, tag: str) -> tuple[str, Manifest] | None:
        """(manifest digest, prebake manifest) of the entry `tag` names; None when there is none."""


__all__ = ["OCIParts"]
