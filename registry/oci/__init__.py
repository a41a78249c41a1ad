"""The OCI backend: bundles as OCI artifacts in a container registry (GHCR, ECR, Harbor, distribution).

Not a StoreRegistry over the object-store port, though its small files (side, meta, summaries) are
one (files.py's OCIFiles, under the shared parts of registry/shared/parts.py). An index entry is an
image manifest that embeds the prebake manifest and needs the blob's uncompressed digest, so no
put(index key, bytes) can write it; a tag has no conditional write, so create-only is a settle wait
the port cannot say; and the distribution API lists tags, never blobs, so list("blobs/") has no answer.
"""

from prebake.registry.oci.registry import OCIRegistry

__all__ = ["OCIRegistry"]
