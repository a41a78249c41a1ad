"""The composition root: the one place that opens the store, the registry, the trust policy, the
signer and the host probe, for every command, dodo.py and every engine.

    Context.open(registry=None), for_baking   a command's parts, from the environment
    open_address, open_store                  a registry alone; a store alone (stats, store ls)
    trust_for, gc_trust, verify_trust         the one assembly of the trust policy in force
    context.source, publishing, holds         what an engine's start reads, writes back and holds
    context.plans, pick_plan, resolve, bake   the recipe's targets, the fetch pipeline, one bake

Nothing else reads the PREBAKE_* settings of the registry (registry_address), trust or signing; other settings are
read where they apply (engine/common/environment.py lists every variable and who reads it).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.fetch.outcome import Resolution
from prebake.artifacts.fetch.pipeline import FETCH_TIMEOUT_S, REGISTRY_TIMEOUT_S, Source, resolve
from prebake.artifacts.ports.registry import Registry, SideFiles, TrustCheck
from prebake.artifacts.recipe.kinds import HostFacts, TargetKeys, buildable_targets, target_keys
from prebake.artifacts.recipe.schema import Recipe
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.overlap import check_apart
from prebake.engine.adapters import kinds_for
from prebake.engine.common.adapter import Publishing
from prebake.engine.common.builder import attester, host_versions
from prebake.engine.common.probe import Host, current_host
from prebake.registry import open_registry
from prebake.registry.trust.policy import POLICY_ENV, trust_in_force
from prebake.registry.trust.signing import SIGNING_KEY_ENV, KeySigner, signer_from_env

if TYPE_CHECKING:  # the bake's modules and write-back's: imported where a command bakes or writes back
    from prebake.artifacts.bake.bake_kind import Baked, ModelSign
    from prebake.artifacts.bake.provenance import Attest

REGISTRY_ENV = "PREBAKE_REGISTRY"


@dataclass(frozen=True)
class Context:
    """The store, registry address, trust policy, signer and host one command works with."""

    store: Store
    host: Host
    address: str
    trust: TrustCheck | None = None
    sign: KeySigner | None = None  # a Signer (bundles), with its key for statements and lists
    attest: Attest | None = None  # the bake's provenance, sealed with the signing key
    model_sign: ModelSign | None = None  # OpenSSF model signatures over each tree (PREBAKE_MODEL_SIGNING_KEY)
    given_registry: Registry | None = field(default=None, compare=False)  # tests: a registry double
    creating: bool = False  # a command that writes: a registry folder that is not there is created
    holds: ExitStack = field(default_factory=ExitStack, compare=False, repr=False)  # trees this command uses

    @classmethod
    def open(
        cls,
        registry: str | None = None,
        *,
        store: Store | None = None,
        host: Host | None = None,
        creating: bool = False,
        trusting: bool = True,
        signing_key: str | None = None,
    ) -> Context:
        """`trusting=False`: a command that installs nothing (promote, revoke) and needs no policy;
        `signing_key`: a key file that stands in for PREBAKE_SIGNING_KEY (revoke --signing-key)."""
        store = store or Store()
        host = host or current_host()
        signer = signer_from_env({**os.environ, SIGNING_KEY_ENV: signing_key} if signing_key else os.environ)
        address = registry_address(store, registry)
        opened = functools.cache(lambda: open_registry(address))
        trust = trust_for(store, address, host=host, open_registry=opened) if trusting else None
        return cls(
            store=store,
            host=host,
            address=address,
            trust=trust,
            sign=signer,
            attest=attester(signer, host),
            model_sign=_model_signing(),
            creating=creating,
        )

    @classmethod
    def for_baking(cls, registry: str | None = None, *, store: Store | None = None) -> Context:
        """The context of a bake (doit bake, prebake bake): it publishes, so it may create the registry folder."""
        return cls.open(registry, store=store, creating=True)

    @cached_property
    def publishing(self) -> Publishing:
        """Where and how a serving pod writes back what it compiled: the registry's quarantine
        namespace by default (PREBAKE_WRITE_BACK, registry/review/writeback.py), signed and attested as
        a bake, judged by the trust policy only when it goes to the index."""
        from prebake.registry.review.writeback import write_back_target

        target = write_back_target(self.address, self.store.default_registry)
        return Publishing(
            target=target,
            open_registry=(lambda: self.registry)
            if not target.quarantined
            else functools.cache(lambda: open_registry(target.address)),  # opened once, on first use
            sign=self.sign,
            attest=self.attest,
            trust=None if target.quarantined else self.trust,
        )

    def quarantine(self) -> tuple[str, Registry]:
        """The address and registry of this registry's quarantine namespace (registry/review/writeback.py)."""
        from prebake.registry.review.writeback import quarantine_address

        address = quarantine_address(self.address)
        return address, open_registry(address)

    @cached_property
    def source(self) -> Source:
        """Where this command's bundles come from: its address, its trust policy, and its registry,
        opened by prebake.registry.open_registry on first use (the fetch pipeline's lookup, in its
        time box, or `registry`)."""
        create, home = _creates(self.store, self.address, self.creating), self.store.home
        return Source(self.address, self.trust, open_registry, create=create, home=home, registry=self.given_registry)

    @property
    def registry(self) -> Registry:
        """The registry, opened on first use (UnknownRegistryError for an address prebake does not know,
        RegistryNotFound for a folder that is not there when this command only reads)."""
        return self.source.open()

    def plans(self, recipe: Recipe, *, dtype: str | None = None, tp: int | None = None) -> list[TargetKeys]:
        """Every target of `recipe` (narrowed to dtype/tp) this host can build, with its keys."""
        return plans_for(recipe, self.host, dtype=dtype, tp=tp)

    def pick_plan(self, recipe: Recipe, *, dtype: str | None = None, tp: int | None = None) -> TargetKeys:
        """The one target to serve: the requested dtype and TP (TP defaults to the smallest baked)."""
        return min(self.plans(recipe, dtype=dtype, tp=tp), key=lambda p: (p.target.tp, p.target.dtype))

    def resolve(
        self,
        plan: TargetKeys,
        *,
        lookup_timeout: float = REGISTRY_TIMEOUT_S["fetch"],
        fetch_timeout: float = FETCH_TIMEOUT_S,
        hold: ExitStack | None = None,
        kinds: Sequence[str] | None = None,
    ) -> Resolution:
        """The fetch pipeline (pipeline.resolve) for every kind of `plan` (or the given kinds) from
        this command's source. Every tree is held from the moment it is found or installed: on
        `hold`, else on `holds`, which lives as long as this command (`with context.holds:`)."""
        return resolve(
            plan,
            store=self.store,
            source=self.source,
            kinds=kinds,
            lookup_timeout=lookup_timeout,
            fetch_timeout=fetch_timeout,
            hold=self.holds if hold is None else hold,
        )

    def bake(self, plan: TargetKeys, kind: str) -> Baked:
        """Build, publish and install one kind of one target, and say what happened."""
        from prebake.artifacts.bake.bake_kind import bake_kind

        started = time.monotonic()
        baked = bake_kind(
            plan,
            kind,
            store=self.store,
            registry=self.registry,
            sign=self.sign,
            trust=self.trust,
            attest=self.attest,
            model_sign=self.model_sign,
        )
        seconds = time.monotonic() - started
        print(
            f"prebake: {plan.target.name} {kind}: {baked.note}, key {baked.manifest.key_digest[:16]}, "
            f"blob {baked.manifest.blob.hex[:16]} ({baked.manifest.blob.size} bytes) in {seconds:.1f} s",
            flush=True,
        )
        return baked


def _model_signing() -> ModelSign | None:
    """The OpenSSF model signer PREBAKE_MODEL_SIGNING_KEY names (registry.model_signatures), or None."""
    from prebake.registry.trust.model_signatures import model_signer_from_env

    signer = model_signer_from_env()
    return None if signer is None else signer.sign


def address_in_force(store: Store, explicit: str | None = None, env: Mapping[str, str] = os.environ) -> str:
    """The registry a command uses: the explicit one, else $PREBAKE_REGISTRY, else the store's embedded
    folder (the store's deleting calls take it, and refuse one that shares the store's folder)."""
    return explicit or env.get(REGISTRY_ENV) or str(store.default_registry)


def registry_address(store: Store, explicit: str | None = None, env: Mapping[str, str] = os.environ) -> str:
    """`address_in_force`, refused with StoreOverlapError when it is a folder that shares the store's
    folder (prebake.artifacts.store.overlap): a gc there would delete the registry's files."""
    address = address_in_force(store, explicit, env)
    check_apart(store.home, address, embedded=store.default_registry)
    return address


def trust_for(
    store: Store,
    address: str,
    *,
    host: Host | None = None,
    env: Mapping[str, str] = os.environ,
    warn: bool = True,
    open_registry: Callable[[], Registry] | None = None,
    attestation: Callable[[Manifest], bytes | None] | None = None,
) -> TrustCheck | None:
    """The trust policy in force for `address` (registry/trust/policy.py: PREBAKE_POLICY, else
    PREBAKE_TRUSTED_KEYS, else none), its "host" constraints checked against `host`'s versions, its
    attestations and revocation list read through `store` from `open_registry`."""
    return trust_in_force(
        env,
        warn=warn,
        address=address,
        host_versions=host_versions(host) if host is not None else None,
        store_home=store.home,
        open_registry=open_registry,
        attestation=attestation,
    )


def open_store() -> Store:
    """The store of a command that needs the store alone ($PREBAKE_HOME and its limits: stats, store ls)."""
    return Store()


def gc_trust(store: Store) -> TrustCheck | None:
    """The policy in force when gc judges `store`'s bundles: the store's own copies of attestations
    and revocation list first, the registry opened only when the policy reads it."""
    address = registry_address(store)
    return trust_for(store, address, warn=False, open_registry=functools.cache(lambda: open_registry(address)))


def verify_trust(policy: str | None, address: str, registry: Registry) -> TrustCheck | None:
    """The trust check `prebake verify` applies to every entry of `registry` (at `address`): the
    policy file `policy` (else $PREBAKE_POLICY) reading each bundle's attestation from that registry;
    else the keys of PREBAKE_TRUSTED_KEYS; else none."""
    from prebake.artifacts.bake.provenance import SIDE_NAME

    env = {**os.environ, POLICY_ENV: policy} if policy else dict(os.environ)

    def attestation(manifest: Manifest) -> bytes | None:  # from the registry being verified, not a store's copy
        return registry.get_side(manifest.blob.digest, SIDE_NAME) if isinstance(registry, SideFiles) else None

    return trust_for(
        Store(), address, host=current_host(), env=env, open_registry=lambda: registry, attestation=attestation
    )


def open_address(store: Store, registry: str | None = None, *, creating: bool = False) -> Registry:
    """The registry of an address (default: PREBAKE_REGISTRY, else the embedded one). The embedded
    registry is prebake's own folder and is created on first use; any other folder must exist
    unless the command writes (`creating`)."""
    address = registry_address(store, registry)
    return open_registry(address, create=_creates(store, address, creating), home=store.home)


def _creates(store: Store, address: str, creating: bool) -> bool:
    """Whether opening `address` creates a folder that is not there: the embedded registry (prebake's
    own folder), or any folder a command that writes names."""
    return creating or address == str(store.default_registry)


def plans_for(recipe: Recipe, host: HostFacts, *, dtype: str | None = None, tp: int | None = None) -> list[TargetKeys]:
    """Every target of `recipe` (narrowed to dtype/tp) that `host` can build, with its kind table and keys."""
    return [
        target_keys(recipe, t, host, kinds_for(recipe, t)) for t in buildable_targets(recipe, host, dtype=dtype, tp=tp)
    ]
