"""An operator's trust policy file: which keys may sign what, which builders, which toolchain, how old.

A TOML file (PREBAKE_POLICY=FILE at fetch and serve, `prebake verify --policy FILE`) of
[keys.<name>] with validity periods, [[rules]] matched by registry prefix and model glob (the
first match decides), [model_signing_keys.<name>], [revocation] and [quarantine]; docs/trust.md
("Policies an operator writes") shows every field in one example.

Reads the file and the PEM files it names; touches nothing else. Unknown fields are errors, so a
typo never silently widens a policy, and every refusal names the policy file and the rule.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from pathlib import Path
from typing import Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from prebake.artifacts.tomlfile import load_toml
from prebake.registry.trust.signing import PublicKey, SigningKeyError

DEFAULT_MAX_AGE_DAYS = 7.0  # how long a write-back quarantine keeps a bundle, unless the policy says
HOST = "host"  # a dependency constraint meaning "the serving node's own version"


class PolicyError(SigningKeyError):
    """A policy file is missing, is not TOML, or does not follow the schema."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KeyEntry(_Frozen):
    key: str
    not_before: dt.datetime | None = None
    not_after: dt.datetime | None = None

    @field_validator("key")
    @classmethod
    def _parses(cls, value: str) -> str:
        PublicKey.parse(value, "key")
        return value

    @field_validator("not_before", "not_after")
    @classmethod
    def _aware(cls, value: dt.datetime | None) -> dt.datetime | None:
        return value if value is None or value.tzinfo else value.replace(tzinfo=dt.UTC)

    def public(self) -> PublicKey:
        return PublicKey.parse(self.key, "key")

    def valid_at(self, when: dt.datetime) -> bool:
        return (self.not_before is None or self.not_before <= when) and (
            self.not_after is None or when <= self.not_after
        )

    def period(self) -> str:
        start = self.not_before.isoformat() if self.not_before else "always"
        end = self.not_after.isoformat() if self.not_after else "no end"
        return f"{start} .. {end}"


class ModelSigningKey(_Frozen):
    """An OpenSSF model signing trust anchor: a PEM public key, or a certificate chain (PEM files;
    relative paths are read from the policy file's folder)."""

    public_key: str | None = None
    certificate_chain: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _one_of(self) -> ModelSigningKey:
        if (self.public_key is None) == (not self.certificate_chain):
            raise ValueError("a model signing key gives either public_key or certificate_chain, not both or neither")
        return self


class Rule(_Frozen):
    registry: str = "*"
    model: str = "*"
    keys: tuple[str, ...] = ()
    model_signing: tuple[str, ...] = ()
    allow_unsigned: bool = False
    builders: tuple[str, ...] = ()
    require_provenance: bool = False
    dependencies: dict[str, str] = {}
    max_age_days: float | None = Field(default=None, gt=0)

    @field_validator("dependencies")
    @classmethod
    def _constraints(cls, value: dict[str, str]) -> dict[str, str]:
        for name, constraint in value.items():
            if constraint.strip() != HOST:
                try:
                    SpecifierSet(constraint)
                except InvalidSpecifier as exc:
                    raise ValueError(
                        f"dependency {name!r}: {constraint!r} is neither 'host' nor a version specifier "
                        f"such as '==2.13.0' or '>=0.10,<0.12' ({exc})"
                    ) from exc
        return value

    @model_validator(mode="after")
    def _says_who(self) -> Rule:
        if not self.keys and not self.model_signing and not self.allow_unsigned:
            raise ValueError(
                "a rule names the keys that may sign (keys = [...], model_signing = [...]) or says allow_unsigned = true"
            )
        if self.allow_unsigned and (self.needs_provenance or self.model_signing):
            raise ValueError(
                "a rule that allows unsigned bundles cannot also require provenance (builders, dependencies) "
                "or a model signature (model_signing)"
            )
        if self.needs_provenance and not self.keys:
            raise ValueError("a rule that requires provenance names the keys that seal it (keys = [...])")
        return self

    @property
    def needs_provenance(self) -> bool:
        return bool(self.builders or self.dependencies or self.require_provenance)

    def matches(self, address: str, model: str) -> bool:
        return (self.registry == "*" or address.startswith(self.registry)) and fnmatch.fnmatchcase(model, self.model)

    def describe(self, index: int) -> str:
        return f"rule {index + 1} (registry {self.registry}, model {self.model})"

    def accepts_builder(self, builder: str) -> bool:
        return any(builder == b or (b.endswith("*") and builder.startswith(b[:-1])) for b in self.builders)


class Revocation(_Frozen):
    keys: tuple[str, ...] = Field(min_length=1)
    on_unreadable: Literal["fail-closed", "fail-open"] = "fail-closed"
    max_age_hours: float = Field(default=24.0, gt=0)
    cache_seconds: float = Field(default=3600.0, ge=0)


class Quarantine(_Frozen):
    max_age_days: float = Field(default=DEFAULT_MAX_AGE_DAYS, gt=0)


class PolicyFile(_Frozen):
    version: Literal[1] = 1
    keys: dict[str, KeyEntry] = {}
    model_signing_keys: dict[str, ModelSigningKey] = {}
    rules: tuple[Rule, ...] = Field(min_length=1)
    revocation: Revocation | None = None
    quarantine: Quarantine = Quarantine()

    @model_validator(mode="after")
    def _names_agree(self) -> PolicyFile:
        for name, entry in self.keys.items():
            if entry.public().name != name:
                raise ValueError(f"keys.{name}: its key line is named {entry.public().name!r}; make the two agree")
        named = [(f"rules[{i}]", k) for i, r in enumerate(self.rules) for k in r.keys]
        named += [("revocation", k) for k in (self.revocation.keys if self.revocation else ())]
        for where, key in named:
            if key not in self.keys:
                known = ", ".join(self.keys) or "none"
                raise ValueError(f"{where} names key {key!r}, which [keys] does not define (defined: {known})")
        for i, rule in enumerate(self.rules):
            for key in rule.model_signing:
                if key not in self.model_signing_keys:
                    known = ", ".join(self.model_signing_keys) or "none"
                    raise ValueError(
                        f"rules[{i}] names model signing key {key!r}, which [model_signing_keys] does not define "
                        f"(defined: {known})"
                    )
        return self

    def rule_for(self, address: str, model: str) -> tuple[int, Rule] | None:
        return next(((i, r) for i, r in enumerate(self.rules) if r.matches(address, model)), None)


def load_policy(path: Path | str) -> PolicyFile:
    """Read and validate a policy file; PolicyError naming the line or field and the fix."""
    return load_toml(
        path,
        PolicyFile,
        what="policy file",
        error=PolicyError,
        fix="docs/trust.md describes every field; check PREBAKE_POLICY",
    )
