"""The trust policy in force: read from the environment at the edges, bound to one registry, handed down.

    PREBAKE_POLICY=FILE          an operator's policy file (registry.trust.policy_file)
    PREBAKE_TRUSTED_KEYS=LINES   the simple case: any of these keys may sign anything
    neither                      bundles are installed unverified (said once per process)

`FilePolicy` is the TrustCheck (prebake.artifacts.ports.registry) of a policy file, bound to the
registry address, this host's versions, where attestations are read, and the revocation list.
For a bundle already in the store it checks signatures only, never re-hashes the tree. Its own
registry reads are time-boxed (ATTESTATION_TIMEOUT_S, revocation.READ_TIMEOUT_S) and, through
`policy.by(deadline)`, end by the caller's deadline: a slow list cannot extend a start.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion

from prebake.artifacts import fsutil
from prebake.artifacts.bake.provenance import SIDE_NAME, Provenance
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.layout import side_relpath
from prebake.artifacts.ports.registry import MAX_SIDE_FILE_BYTES, Registry, SideFiles, TrustCheck
from prebake.artifacts.timebox import Done, bounded, seconds_left, within
from prebake.registry.trust.policy_file import HOST, PolicyError, PolicyFile, Rule, load_policy
from prebake.registry.trust.signing import TRUSTED_KEYS_ENV, TrustPolicy, trust_from_env

POLICY_ENV = "PREBAKE_POLICY"
ATTESTATION_TIMEOUT_S = 5.0

Revoked = Callable[[Manifest, str], "str | None"]  # (manifest, signer) -> why it is revoked, or None


@dataclass(frozen=True)
class FilePolicy:
    """A policy file bound to one registry address: a TrustCheck."""

    policy: PolicyFile
    source: str  # the file, for messages
    address: str
    host_versions: Mapping[str, str] = field(default_factory=dict)  # for "host" constraints
    attestation: Callable[[Manifest], bytes | None] | None = None
    revoked: Revoked | None = None
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    model_signature: Callable[[Manifest], bytes | None] | None = None  # the model.sig side file

    def by(self, deadline: float) -> FilePolicy:
        """This policy with its registry reads ending by `deadline` (a time.monotonic() value)."""
        return replace(
            self,
            attestation=bounded(self.attestation, deadline),
            revoked=bounded(self.revoked, deadline),
            model_signature=bounded(self.model_signature, deadline),
        )

    def __call__(self, manifest: Manifest) -> str | None:
        model = manifest.labels.get("model", "")
        found = self.policy.rule_for(self.address, model)
        if found is None:
            return (
                f"policy {self.source}: no rule covers registry {self.address} and model {model or '(none)'}; "
                f"add a [[rules]] entry that matches them"
            )
        index, rule = found
        why = self._check(manifest, rule)
        return None if why is None else f"policy {self.source} {rule.describe(index)}: {why}"

    def _check(self, manifest: Manifest, rule: Rule) -> str | None:
        if rule.allow_unsigned:
            return None
        signer = self._signer(manifest, rule) if rule.keys else ""
        if signer.startswith("!"):
            return signer[1:]
        if rule.model_signing:
            model_signer = self._model_signer(manifest, rule)
            if model_signer.startswith("!"):
                return model_signer[1:]
            signer = signer or model_signer
        if self.revoked is not None and (why := self.revoked(manifest, signer)) is not None:
            return why
        if rule.max_age_days is not None and (why := self._too_old(manifest, rule.max_age_days)) is not None:
            return why
        if rule.needs_provenance:
            return self._provenance(manifest, rule)
        return None

    def _signer(self, manifest: Manifest, rule: Rule) -> str:
        """The name of a key of `rule` whose signature verifies and which is valid now; else "!why"."""
        if not manifest.signatures:
            return f"!unsigned; this rule requires a signature by one of: {', '.join(rule.keys)}"
        now, created = self.now(), _created(manifest)
        problems = []
        for name in rule.keys:
            entry = self.policy.keys[name]
            if TrustPolicy((entry.public(),)).check(manifest) is not None:
                continue
            if not entry.valid_at(now):
                problems.append(f"key {name} signed it but is valid {entry.period()} only, not now ({_clock(now)})")
            elif created is None or not entry.valid_at(created):
                problems.append(f"key {name} signed it, but the bundle says it was made {manifest.created}, "
                                f"outside the key's validity {entry.period()}")  # fmt: skip
            else:
                return name
        if problems:
            return "!" + "; ".join(problems) + "; rotate to a valid key and re-sign (bake again)"
        signers = ", ".join(sorted({s.signer for s in manifest.signatures}))
        return (
            f"!signed by {signers}, and no signature verifies against the keys this rule trusts "
            f"({', '.join(rule.keys)}); sign with one of them, or add the key to the rule if you trust it"
        )

    def _model_signer(self, manifest: Manifest, rule: Rule) -> str:
        """The name of a model signing key of `rule` whose signature covers exactly the bundle's files; else "!why"."""
        raw = None if self.model_signature is None else self.model_signature(manifest)
        if raw is None:
            return (
                f"!it requires an OpenSSF model signature beside blob {manifest.blob.digest[:23]} by one of "
                f"{', '.join(rule.model_signing)}, and there is none (or the registry did not give it within the "
                f"time box); bake it with PREBAKE_MODEL_SIGNING_KEY set"
            )
        from prebake.registry.trust.model_signatures import (  # model_signing
            Anchor,
            ModelSignatureError,
            check_signature,
        )

        folder = Path(self.source).parent
        anchors = [
            Anchor(
                name,
                None if (k := self.policy.model_signing_keys[name]).public_key is None else folder / k.public_key,
                tuple(folder / c for c in k.certificate_chain),
            )
            for name in rule.model_signing
        ]
        try:
            return check_signature(raw, anchors, manifest)
        except ModelSignatureError as exc:
            return f"!its model signature is refused: {exc}"

    def _too_old(self, manifest: Manifest, days: float) -> str | None:
        created = _created(manifest)
        if created is None:
            return f"its creation time {manifest.created!r} cannot be read, and this rule limits age; rebake it"
        age = self.now() - created
        if age > dt.timedelta(days=days):
            return (
                f"made {manifest.created}, {age.days} days ago ({_clock(self.now())}), older than "
                f"max_age_days = {days:g}; rebake it"
            )
        return None

    def _provenance(self, manifest: Manifest, rule: Rule) -> str | None:
        raw = None if self.attestation is None else self.attestation(manifest)
        if raw is None:
            return (
                f"it requires a provenance attestation beside blob {manifest.blob.digest[:23]}, and there is none "
                f"(or the registry did not give it within the time box); bake it with a signing key (the bake "
                f"publishes one), or give the registry longer with --registry-timeout"
            )
        from prebake.registry.trust.attestation import AttestationError, check_attestation  # securesystemslib: heavy

        keys = [self.policy.keys[k].public() for k in rule.keys if self.policy.keys[k].valid_at(self.now())]
        try:
            provenance = check_attestation(raw, keys, manifest)
        except AttestationError as exc:
            return f"its provenance is refused: {exc}"
        if rule.builders and not rule.accepts_builder(provenance.builder_id):
            return (
                f"built by {provenance.builder_id!r}, which is not one of the accepted builders {list(rule.builders)}"
            )
        return self._dependencies(provenance, rule)

    def _dependencies(self, provenance: Provenance, rule: Rule) -> str | None:
        for name, constraint in rule.dependencies.items():
            have = provenance.dependencies.get(name)
            if have is None:
                return f"its provenance names no {name}, and this rule constrains {name} ({constraint!r})"
            if constraint.strip() == HOST:
                mine = self.host_versions.get(name)
                if mine is None:
                    return f"this rule wants {name} equal to this node's, and this node has no {name}"
                if have != mine:
                    return f"built with {name} {have}, this node has {name} {mine} (constraint 'host')"
                continue
            try:
                ok = SpecifierSet(constraint).contains(have, prereleases=True)
            except InvalidVersion:
                ok = False
            if not ok:
                return f"built with {name} {have}, which does not satisfy {name} {constraint!r}"
        return None


@dataclass(frozen=True)
class Attestations:
    """A bundle's side file (its attestation, or another `name`): the store's copy, else the
    registry's (time-boxed), then kept in the store."""

    store_home: Path
    open_registry: Callable[[], Registry]
    timeout: float = ATTESTATION_TIMEOUT_S
    deadline: float | None = None  # the caller's registry time box, when it has one
    name: str = SIDE_NAME

    def by(self, deadline: float) -> Attestations:
        return replace(self, deadline=deadline)

    def __call__(self, manifest: Manifest) -> bytes | None:
        local = self.store_home / side_relpath(manifest.blob.digest, self.name)
        try:
            return fsutil.read_bounded(local, MAX_SIDE_FILE_BYTES)
        except FileNotFoundError:
            pass
        seconds = seconds_left(self.deadline, self.timeout)
        asked = within(seconds, lambda: self._from_registry(manifest.blob.digest), name="prebake-attestation")
        if not isinstance(asked, Done) or asked.value is None:
            return None
        fsutil.write_bytes(local, asked.value)  # verified on every use: a copy is only a cache
        return asked.value

    def _from_registry(self, digest: str) -> bytes | None:
        registry = self.open_registry()
        return registry.get_side(digest, self.name) if isinstance(registry, SideFiles) else None


def trust_in_force(
    env: Mapping[str, str] = os.environ,
    *,
    warn: bool = True,
    address: str = "",
    host_versions: Mapping[str, str] | None = None,
    store_home: Path | None = None,
    open_registry: Callable[[], Registry] | None = None,
    attestation: Callable[[Manifest], bytes | None] | None = None,
) -> TrustCheck | None:
    """The policy file named by PREBAKE_POLICY (bound to `address`; attestations and the revocation
    list read through the store at `store_home` from `open_registry`), else the keys of
    PREBAKE_TRUSTED_KEYS, else None (bundles unverified; said once per process when `warn`)."""
    if path := env.get(POLICY_ENV, "").strip():
        policy = load_policy(path)
        if attestation is None and store_home is not None and open_registry is not None:
            attestation = Attestations(store_home, open_registry)
        revoked: Revoked | None = None
        if policy.revocation is not None:
            from prebake.registry.trust.revocation import Revocations  # securesystemslib: only when a list is named

            if store_home is None or open_registry is None:
                raise PolicyError(f"policy {path} names a revocation list, and this command cannot read one")
            revoked = Revocations(policy, address, store_home, open_registry)
        model_signature = None
        if policy.model_signing_keys and store_home is not None and open_registry is not None:
            from prebake.registry.trust.model_signatures import SIDE_NAME as MODEL_SIGNATURE

            model_signature = Attestations(store_home, open_registry, name=MODEL_SIGNATURE)
        return FilePolicy(
            policy, path, address, host_versions or {}, attestation, revoked, model_signature=model_signature
        )
    if not warn and not env.get(TRUSTED_KEYS_ENV, "").strip():
        return None
    return trust_from_env(env)


def policy_file_in_force(env: Mapping[str, str] = os.environ) -> PolicyFile | None:
    path = env.get(POLICY_ENV, "").strip()
    return load_policy(path) if path else None


def _clock(now: dt.datetime) -> str:
    """The node's time as a refusal names it: this node's clock decides (docs/trust-and-failure.md, "Clocks")."""
    return f"{now:%Y-%m-%d %H:%M} UTC by this node's clock; if that is wrong, set it right (NTP)"


def _created(manifest: Manifest) -> dt.datetime | None:
    try:
        when = dt.datetime.fromisoformat(manifest.created)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)
