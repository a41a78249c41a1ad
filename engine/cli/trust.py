"""Trust commands: the policy `prebake verify --policy` checks a registry against.

`verify_trust` is what `prebake verify` asks for its trust check: the policy file given with
--policy (else $PREBAKE_POLICY), bound to the registry being verified and reading each
bundle's attestation from it; else the keys of PREBAKE_TRUSTED_KEYS; else none.
"""

from __future__ import annotations

import os

from prebake.artifacts.bake.provenance import SIDE_NAME
from prebake.artifacts.ports.registry import Registry, SideFiles, TrustCheck
from prebake.artifacts.store.local import Store
from prebake.engine.common.probe import current_host
from prebake.engine.compose import trust_for
from prebake.registry.trust.policy import POLICY_ENV


def verify_trust(policy: str | None, address: str, registry: Registry) -> TrustCheck | None:
    """The trust check `prebake verify` applies to every entry of `registry`."""
    env = {**os.environ, POLICY_ENV: policy} if policy else dict(os.environ)

    def attestation(manifest):  # straight from the registry being verified, not a store's copy
        return registry.get_side(manifest.blob.digest, SIDE_NAME) if isinstance(registry, SideFiles) else None

    return trust_for(
        Store(), address, host=current_host(), env=env, open_registry=lambda: registry, attestation=attestation
    )
