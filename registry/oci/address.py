"""Where an OCI registry is and how prebake's client talks to it: an oci://HOST/REPO address, checked
as docker checks names, and the client's settings (PREBAKE_OCI_* variables). Reads the environment
and checks a CA bundle exists; opens nothing."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.ports.errors import RegistryError
from prebake.registry.shared.transfer import env_settings

_NAME = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_HOST = re.compile(r"^(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$")


@dataclass(frozen=True)
class OCIAddress:
    host: str  # host[:port], as docker names it
    repository: str  # namespace/repo

    @classmethod
    def parse(cls, address: str) -> OCIAddress:
        form = "write oci://HOST[:PORT]/NAMESPACE/REPO, e.g. oci://ghcr.io/acme/prebake"
        if not address.startswith("oci://"):
            raise RegistryError(f"{address!r} is not an OCI address; {form}")
        host, _, repository = address[len("oci://") :].strip("/").partition("/")
        if not host or not _HOST.match(host):
            raise RegistryError(f"{address!r} names no registry host; {form}")
        if not repository or not _NAME.match(repository) or len(repository) > 255:
            raise RegistryError(
                f"{address!r}: {repository!r} is not a repository name (lower-case letters, digits and "
                f"separators . _ - between /-separated parts); {form}"
            )
        return cls(host, repository)

    @property
    def url(self) -> str:
        return f"oci://{self.host}/{self.repository}"


@dataclass(frozen=True)
class OCISettings:
    """How the client talks. Each field has a variable: PREBAKE_OCI_<FIELD> (see `from_env`)."""

    timeout_s: float = 30.0  # connect and read timeout of each request
    max_attempts: int = 5  # per request, for 5xx, 429 and dropped connections
    settle_s: float = 0.5  # publish: how long a tag must stand before it is called ours (registry/oci/registry.py)
    concurrency: int = 8  # parallel entry reads of a listing
    chunk_mb: int = 8  # a blob larger than this downloads in ranged parts of this size; 0: one stream
    parts: int = 4  # ranged parts of one blob in flight at once (benchmarks/oci_io.py: 4 beat 2 and 8 here)
    plain_http: tuple[str, ...] = ()  # hosts spoken to over http://, by explicit request only
    ca_bundle: str = ""  # a PEM file of extra CAs

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.max_attempts < 1 or self.settle_s < 0 or min(self.concurrency, self.parts) < 1:
            raise RegistryError(
                f"{self}: timeout_s, max_attempts, concurrency and parts must be positive, settle_s >= 0"
            )
        if self.chunk_mb < 0:
            raise RegistryError(f"{self}: chunk_mb must be 0 (one stream) or a part size in MiB")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> OCISettings:
        """Settings from PREBAKE_OCI_TIMEOUT_S, _MAX_ATTEMPTS, _SETTLE_S, _CONCURRENCY, _CHUNK_MB, _PARTS,
        _PLAIN_HTTP (comma-separated host[:port]) and _CA_BUNDLE; unset ones keep the defaults."""
        numbers = {"timeout_s": float, "max_attempts": int, "settle_s": float, "concurrency": int}
        values = env_settings("PREBAKE_OCI_", {**numbers, "chunk_mb": int, "parts": int}, env)
        if raw := env.get("PREBAKE_OCI_PLAIN_HTTP", "").strip():
            values["plain_http"] = tuple(h.strip() for h in raw.split(",") if h.strip())
        if raw := env.get("PREBAKE_OCI_CA_BUNDLE", "").strip():
            if not Path(raw).is_file():
                raise RegistryError(f"PREBAKE_OCI_CA_BUNDLE={raw!r} is not a file; point it at a PEM file of CAs")
            values["ca_bundle"] = raw
        return cls(**values)
