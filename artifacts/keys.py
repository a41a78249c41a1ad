"""Keys: what an artifact depends on, as named factor groups hashed into one digest.

A key is a kind ("buckets", "autotune", "graphs", ...) and named groups of string
factors ({"software": {"torch": "2.13.0+cpu", ...}, "platform": {...}, ...}). Its
digest is sha256 over canonical JSON, so the same factors give the same digest on
any machine and any change of a factor changes it. Factors are strings and never
carry per-host noise (hostnames, ports, absolute paths): the constructor refuses
values that look like absolute paths, the most common way such noise leaks in.

The raw factors travel in each bundle's manifest, so a miss can be explained
factor by factor (see `Key.diff`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from prebake.artifacts.errors import PrebakeError

SALT_ENV = "PREBAKE_KEY_SALT"


def canonical_json(value: object) -> bytes:
    """JSON with sorted keys and no whitespace: the one byte form every digest is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Key:
    """One artifact's identity: its kind and its factor groups (group -> factor -> value)."""

    kind: str
    groups: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]

    @classmethod
    def of(cls, kind: str, groups: Mapping[str, Mapping[str, object]]) -> Key:
        """Build a key from plain mappings; values are stringified, order is irrelevant."""
        if not kind or not kind.isidentifier():
            raise PrebakeError(f"artifact kind {kind!r} must be a plain identifier such as 'graphs'")
        frozen = []
        for group, factors in sorted(groups.items()):
            items = tuple(sorted((name, _factor_value(group, name, v)) for name, v in factors.items()))
            frozen.append((group, items))
        return cls(kind=kind, groups=tuple(frozen))

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Key:
        return cls.of(str(data["kind"]), data["groups"])  # type: ignore[arg-type]

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "groups": {g: dict(f) for g, f in self.groups}}

    @property
    def digest(self) -> str:
        """sha256 hex of the canonical JSON of kind and groups."""
        return sha256_hex(canonical_json(self.to_json()))

    def factors(self) -> dict[str, str]:
        """Flat view, "group.factor" -> value."""
        return {f"{g}.{name}": value for g, items in self.groups for name, value in items}

    def diff(self, other: Key) -> dict[str, tuple[str, str]]:
        """Factors that differ: "group.factor" -> (value here, value in other); absent is "-"."""
        mine, theirs = self.factors(), other.factors()
        names = sorted(set(mine) | set(theirs))
        return {n: (mine.get(n, "-"), theirs.get(n, "-")) for n in names if mine.get(n) != theirs.get(n)}


def _factor_value(group: str, name: str, value: object) -> str:
    if isinstance(value, (dict, list, tuple)):
        text = canonical_json(value).decode()
    elif value is None:
        text = "none"
    else:
        text = str(value)
    if os.path.isabs(text) or text.startswith("~"):
        raise PrebakeError(
            f"key factor {group}.{name} = {text!r} looks like a path: paths differ per host and "
            f"would stop every other machine from reusing the artifact; key on the content instead"
        )
    return text


def policy_factors(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The operator's salt: changing PREBAKE_KEY_SALT disowns every bundle built before."""
    return {"salt": env.get(SALT_ENV, "")}
