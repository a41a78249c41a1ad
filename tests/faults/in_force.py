"""The trust policy every fault scenario runs under (issue 22, point 6): a fleet key, a policy file
that trusts only it, and bundles signed with it.

    in_force.bundle(workdir, ...)         make_bundle's bundle, its manifest signed by the fleet key
    in_force.sign(manifest)               what a holder of the key signs: an honest builder, or an
                                          attacker who has it (the hostile suite signs its forgeries,
                                          so the checks behind the signature are what must refuse them)
    in_force.trust(registry, home)        the policy file's TrustCheck, bound to that registry
                                          (registry.policy.trust_in_force, as a node builds it)
    in_force.fetch(store, registry, key)  prebake's fetch with that check
    in_force.env                          PREBAKE_POLICY and PREBAKE_SIGNING_KEY: tests/faults/conftest.py
                                          sets them for the scenario, and procs.child_env hands them to
                                          every actor and `prebake` child, so those run under it too

The policy names no revocation list: the attacks on revocation have their own policies
(test_trust_attacks.py), and a fault injected on a registry must stay the fault under test.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.fetch.pipeline import fetch_key
from prebake.artifacts.keys import Key
from prebake.artifacts.ports.registry import TrustCheck
from prebake.artifacts.store.local import Installed, Store
from prebake.registry.trust.policy import POLICY_ENV, trust_in_force
from prebake.registry.trust.signing import (
    SIGNING_KEY_ENV,
    SIGNING_KEY_NAME_ENV,
    KeySigner,
    load_private_key,
    write_keypair,
)
from tests.support.bundles import Bundle, make_bundle

FLEET_KEY = "fleet"


@dataclass(frozen=True)
class FleetKey:
    private: Path
    public_line: str

    @classmethod
    def write(cls, folder: Path) -> FleetKey:
        private, public = write_keypair(FLEET_KEY, folder)
        return cls(private, public.read_text().strip())

    def policy_file(self, folder: Path) -> Path:
        path = folder / "policy.toml"
        path.write_text(
            f'version = 1\n[keys.{FLEET_KEY}]\nkey = "{self.public_line}"\n[[rules]]\nkeys = ["{FLEET_KEY}"]\n'
        )
        return path


@dataclass(frozen=True)
class InForce:
    """One scenario's policy file and the fleet key's signer."""

    policy: Path
    key: FleetKey
    scratch: Path  # a store home for the policy's own reads (attestations), never a scenario's

    @property
    def env(self) -> dict[str, str]:
        return {POLICY_ENV: str(self.policy), SIGNING_KEY_ENV: str(self.key.private), SIGNING_KEY_NAME_ENV: FLEET_KEY}

    @property
    def signer(self) -> KeySigner:
        return KeySigner(FLEET_KEY, load_private_key(self.key.private))

    def sign(self, manifest: Manifest) -> Manifest:
        return self.signer(manifest.model_copy(update={"signatures": ()}))

    def bundle(self, workdir: Path, **kw) -> Bundle:
        made = make_bundle(workdir, **kw)
        return Bundle(self.sign(made.manifest), made.blob)

    def trust(self, registry, home: Path | None = None) -> TrustCheck:
        check = trust_in_force(
            {POLICY_ENV: str(self.policy)},
            address=registry.url,
            store_home=home or self.scratch,
            open_registry=lambda: registry,
        )
        assert check is not None
        return check

    def fetch(self, store: Store, registry, key: Key, **kw) -> Installed | Miss:
        return fetch_key(store, registry, key, trust=self.trust(registry, store.home), **kw)
