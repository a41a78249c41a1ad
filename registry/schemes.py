"""The table of registry backends: one row per address scheme; every list of schemes is read from it.

A row says what an address starts with, the wheel's extra its backend needs, the address's form
and what it names (the help of --registry, PREBAKE_REGISTRY and `doit bake registry=` is built
from these), and how it opens. A new backend adds its module and one row here; docs/registries.md
describes each row (tests/repo/test_backend_table.py checks both).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.ports.registry import Registry


@dataclass(frozen=True)
class Opening:
    """What an opener is told beside the address: whether it may create, and the store's folder."""

    create: bool
    home: Path | None = None  # where a Hub registry keeps its listing summaries (home/listing)


@dataclass(frozen=True)
class Backend:
    """One registry backend: its address scheme, the extra it needs, its help text, its opener."""

    scheme: str  # what its addresses start with: "s3://", "oci-layout:"
    extra: str | None  # the wheel's extra its module imports (prebake.artifacts.extras), None: nothing
    form: str  # an address's shape, for help texts: "s3://bucket/prefix"
    names: str  # what the address names
    open: Callable[[str, Opening], Registry]


def _file(text: str, opening: Opening) -> Registry:
    from prebake.registry.backends.file import FileRegistry

    return FileRegistry(text.removeprefix("file://"), create=opening.create)


def _s3(text: str, opening: Opening) -> Registry:
    from prebake.registry.backends.s3 import S3Registry

    return S3Registry(text)


def _hub(text: str, opening: Opening) -> Registry:
    from prebake.registry.backends.hf import HubRegistry

    listing = None if opening.home is None else opening.home / "listing"
    return HubRegistry(text, must_exist=not opening.create, listing_dir=listing)


def _oci(text: str, opening: Opening) -> Registry:
    from prebake.registry.oci import OCIRegistry

    return OCIRegistry(text, must_exist=not opening.create)


def _azure(text: str, opening: Opening) -> Registry:
    from prebake.registry.backends.azure import AzureRegistry

    return AzureRegistry(text)


def _layout(text: str, opening: Opening) -> Registry:
    from prebake.registry.oci.layout import LayoutRegistry

    return LayoutRegistry(text, create=opening.create)


BACKENDS: tuple[Backend, ...] = (
    Backend("file://", None, "file:///folder", "a local folder (a bare path names one too)", _file),
    Backend("s3://", "s3", "s3://bucket/prefix", "S3 or an S3-compatible server", _s3),
    Backend("hf://", "hf", "hf://[datasets/]ns/repo[@rev]", "a Hugging Face model or dataset repo", _hub),
    Backend("oci://", "oci", "oci://host[:port]/namespace/repo", "an OCI registry", _oci),
    Backend("az://", "azure", "az://account/container/prefix", "Azure Blob Storage", _azure),
    # registry/oci/ (the package the layout lives in) imports httpx
    Backend("oci-layout:", "oci", "oci-layout:DIR|FILE.tar", "an OCI image layout on a disk, or a tar of one", _layout),
)
FOLDER = BACKENDS[0]  # what an address without a scheme opens
SCHEMES: tuple[str, ...] = tuple(b.scheme for b in BACKENDS)


def backend_of(address: str) -> Backend | None:
    """The row whose scheme starts `address`; FOLDER for a bare path; None for an unknown scheme."""
    for backend in BACKENDS:
        if address.startswith(backend.scheme):
            return backend
    return None if "://" in address else FOLDER


def address_forms() -> str:
    """Every address form, comma-separated, for a help text: "a folder, file:///folder, s3://..."."""
    return ", ".join(["a folder", *(b.form for b in BACKENDS)])
