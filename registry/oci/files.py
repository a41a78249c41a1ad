"""Small files on an OCI registry, each a one-layer artifact under a tag of its own: the listing
summaries, the files beside a blob (its provenance attestation: prebake.artifacts.ports.registry
SideFiles) and the files about the registry (its signed revocation list).

    <repo>:prebake-side.<blob hex>.<name>   a file beside one blob, created once
    <repo>:prebake-meta.<name>              a file about the registry, replaced whole
    <repo>:prebake-summary.<kind>           a listing summary (below)

Each is an OCI image manifest whose config is the empty descriptor and whose one layer holds the
file; its artifactType says what it is. A tag is last-writer-wins, so "created once" is a look
before the write and a read-back after it: of two racing creators, the one whose layer the tag
names on read-back is told True, the other False (each side file is signed on its own, so either
one is a whole, verifiable file). None of these tags parses as an index entry's.

Listing and maintenance (OCIRegistry's listing, index_entries, quarantine, remove):
    <repo>:prebake-summary.<kind>      the listing summary of one kind (prebake.artifacts.ports.listing), as an artifact
                                       (artifactType application/vnd.prebake.summary.v1) whose one
                                       layer is the summary JSON; written back when it was missing or stale
    <repo>:quarantine-<kind>-<key>     an entry `prebake verify --quarantine` moved aside: its manifest
                                       with annotation org.prebake.quarantined (so another digest), then
                                       the original manifest deleted by digest, which removes its tag

A listing costs the tags API (one request per 1,000 tags) and one summary read; only entries the
summary lacks are read. The tags API carries names only, no version, so a summary row is trusted
for its tag name: entries are created once (see registry/oci/registry.py for the one race), and quarantine,
the only other change of what a tag names, removes the entry's row from the summary when it
removes the tag. Deletes need a registry that allows them (distribution: storage.delete.enabled).
A quarantined blob loses its link in this repository (a republish uploads it again); its bytes
stay in the registry's storage until the registry's own garbage collection.
"""

from __future__ import annotations

import re

from prebake.artifacts.errors import PrebakeError
from prebake.registry.oci.artifact import tag_for

SIDE_TYPE = "application/vnd.prebake.side.v1"
META_TYPE = "application/vnd.prebake.meta.v1"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
SUMMARY_TYPE = "application/vnd.prebake.summary.v1"
SUMMARY_LAYER_TYPE = "application/vnd.prebake.summary.v1+json"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,49}$")
_HEX = re.compile(r"^sha256:([0-9a-f]{64})$")


def side_tag(blob_digest: str, name: str) -> str:
    m = _HEX.match(blob_digest)
    if m is None or not _NAME.match(name):
        raise PrebakeError(
            f"side file {name!r} of {blob_digest[:23]}: names are letters, digits, '.', '_' and '-' "
            f"(at most 50), beside a sha256 blob digest"
        )
    return f"prebake-side.{m.group(1)}.{name}"


def meta_tag(name: str) -> str:
    if not _NAME.match(name):
        raise PrebakeError(f"registry file {name!r}: names are letters, digits, '.', '_' and '-' (at most 50)")
    return f"prebake-meta.{name}"


def summary_tag(kind: str) -> str:
    tag_for(kind, "0" * 64)  # the same rules for kinds
    return f"prebake-summary.{kind}"
