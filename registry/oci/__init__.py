"""The OCI backend: bundles as OCI artifacts in a container registry (GHCR, ECR, Harbor, distribution).

Its tags carry image manifests, so it has a folder of its own: the client, auth, artifact
layout, ranged blob reads, side files, maintenance and the node preheat.
"""

from prebake.registry.oci.registry import OCIRegistry

__all__ = ["OCIRegistry"]
