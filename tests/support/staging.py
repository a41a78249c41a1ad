"""A staging registry for the copy tests: tiny-llama's bundles for this host's keys (seeded, no
compile), signed by `ci` with provenance attestations, a revocation list signed by `revoker`, and a
policy file that needs all three."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from prebake.engine.common.builder import attester
from prebake.engine.common.probe import current_host
from prebake.registry.backends.file import FileRegistry
from prebake.registry.trust.revocation import LIST_NAME, RevocationList, sign_list
from prebake.registry.trust.signing import KeySigner, load_private_key, write_keypair
from tests.support.seeding import plan_here, seed

BUILDER = "https://github.com/acme/models/.github/workflows/bake.yml@refs/heads/main"


@dataclass(frozen=True)
class Staged:
    registry: Path
    policy: Path
    root: Path


def write_policy(root: Path, ci: str, revoker: str, name: str = "policy") -> Path:
    path = root / f"{name}.toml"
    path.write_text(
        f'version = 1\n[keys.ci]\nkey = "{ci}"\n[keys.revoker]\nkey = "{revoker}"\n'
        f'[[rules]]\nmodel = "tiny-*"\nkeys = ["ci"]\nbuilders = ["https://github.com/acme/models/*"]\n'
        '[revocation]\nkeys = ["revoker"]\nmax_age_hours = 48\n'
    )
    return path


def stage(root: Path, build: str = "first") -> Staged:
    """A staging folder registry: tiny-llama's bundles signed by `ci` with attestations, and a revocation list."""
    private, public = write_keypair("ci", root / "keys")
    signer = KeySigner("ci", load_private_key(private))
    seed(root / "registry", root / "scratch", plan_here(), sign=signer, build=build, attest=attester(signer, current_host(),
         {"PREBAKE_BUILDER_ID": BUILDER}))  # fmt: skip
    rprivate, rpublic = write_keypair("revoker", root / "keys")
    revoker = KeySigner("revoker", load_private_key(rprivate))
    revocations = RevocationList(serial=3, issued=dt.datetime.now(dt.UTC), keys=("old-ci",))
    FileRegistry(root / "registry").put_meta(LIST_NAME, sign_list(revocations, revoker))
    policy = write_policy(root, public.read_text().strip(), rpublic.read_text().strip())
    return Staged(root / "registry", policy, root)
