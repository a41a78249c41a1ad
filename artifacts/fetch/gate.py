"""Trust gating: whether a registry entry or a stored bundle may be used. It reads the registry's
index (accepted_entry) and calls the policy in force; it installs, downloads and writes nothing.

The policy in force decides, whatever installed a bundle: a store hit is used only when the trust
check passes on its manifest now (a signature check, not a re-hash: the tree was verified when it
was unpacked).
"""

from __future__ import annotations

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.fetch.outcome import Miss, StoreRefused
from prebake.artifacts.keys import Key
from prebake.artifacts.ports.registry import Registry, TrustCheck
from prebake.artifacts.store.local import Installed

WRITE_BACK_LABEL = "writeback"  # on bundles a serving pod wrote back: "quarantine" until promoted


def verify_entry(key: Key, manifest: Manifest, trust: TrustCheck | None) -> Manifest | Miss:
    """The registry's entry, if it carries the wanted key, is no unreviewed write-back and passes
    the trust policy."""
    if manifest.key_digest != key.digest or manifest.the_key() != key:
        return Miss(
            key, f"the registry's entry for {key.digest[:16]} carries another key; it was tampered with", refused=True
        )
    if (why := unreviewed(manifest)) is not None:
        return Miss(key, why, refused=True)
    refused = None if trust is None else trust(manifest)
    return manifest if refused is None else Miss(key, f"refused by the trust policy: {refused}", refused=True)


def unreviewed(manifest: Manifest) -> str | None:
    """Why an index entry is refused whatever the policy: a serving pod's write-back, which only
    the quarantine namespace may hold until `prebake promote` reviews it."""
    if manifest.labels.get(WRITE_BACK_LABEL) != "quarantine":
        return None
    return (
        f"{manifest.kind} {manifest.key_digest[:16]} is a serving pod's write-back awaiting review (label "
        f"{WRITE_BACK_LABEL}=quarantine), offered as a normal index entry: it was copied out of quarantine; "
        f"refused under every trust policy. Review it with `prebake promote`"
    )


def accepted_entry(registry: Registry, kind: str, key_digest: str, trust: TrustCheck | None) -> Manifest | None:
    """The registry's entry for this key if the policy in force accepts it: what a bake may adopt
    as already built and a plan may count as present. A refused entry is None (work to do)."""
    manifest = registry.lookup(kind, key_digest)
    if manifest is None or unreviewed(manifest) is not None or (trust is not None and trust(manifest) is not None):
        return None
    return manifest


def policy_refuses(installed: Installed, trust: TrustCheck | None) -> StoreRefused | None:
    """Why the policy in force refuses a stored bundle, or None: a check of its manifest's
    signature and provenance rules, never a re-hash of its tree."""
    if trust is None:
        return None
    why = trust(installed.manifest)
    return None if why is None else StoreRefused(installed, why)
