"""The revocation list: signed key ids and bundle digests that no node may use any more.

    <registry>/meta/revocations.dsse.json      a DSSE envelope over RevocationList JSON (serial, issued,
                                               keys, bundles, reasons), signed by a [revocation] key
    $PREBAKE_HOME/revocations/<sha256 of the registry address>.dsse.json   the copy a node read

Reads the list within the caller's registry time box (`by(deadline)`, never more than
READ_TIMEOUT_S) and keeps the node's copy, which stands in for `cache_seconds` when the registry
does not answer; `prebake revoke` (engine/cli/revoke.py) writes it. A list that is missing,
late, forged, stale or rolled back is unusable, and the policy's `on_unreadable` decides
("fail-closed" by default); docs/trust.md ("Keys rotate and revoke") has the whole behaviour.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.ports.registry import MAX_SIDE_FILE_BYTES, Registry, SideFiles
from prebake.artifacts.timebox import Done, Raised, TimedOut, seconds_left, within
from prebake.registry.trust.attestation import AttestationError, open_envelope, seal
from prebake.registry.trust.policy_file import PolicyFile, Revocation
from prebake.registry.trust.signing import KeySigner

LIST_NAME = "revocations.dsse.json"
PAYLOAD_TYPE = "application/vnd.prebake.revocations+json"
READ_TIMEOUT_S = 5.0
_PROCESS_MEMO_S = 60.0
FUTURE_SKEW = dt.timedelta(hours=1)  # a list issued further ahead of this node's clock says the clock is behind
_log = logging.getLogger("prebake.trust")


class RevocationList(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    serial: int = Field(ge=0)
    issued: dt.datetime
    keys: tuple[str, ...] = ()
    bundles: tuple[str, ...] = ()  # blob digests, "sha256:<hex>"
    reasons: dict[str, str] = {}

    def why_revoked(self, manifest: Manifest, signer: str) -> str | None:
        if manifest.blob.digest in self.bundles:
            note = self.reasons.get(manifest.blob.digest, "")
            return f"bundle blob {manifest.blob.digest[:23]} is revoked{f' ({note})' if note else ''}"
        if signer in self.keys:
            note = self.reasons.get(signer, "")
            return f"its signing key {signer} is revoked{f' ({note})' if note else ''}"
        return None

    def describe(self) -> str:
        return f"revocation list serial {self.serial} issued {self.issued.isoformat()}"


def sign_list(entries: RevocationList, signer: KeySigner) -> bytes:
    return seal(entries.model_dump_json().encode(), signer.key, signer.name, PAYLOAD_TYPE)


def read_list(raw: bytes, policy: PolicyFile, rules: Revocation) -> RevocationList:
    """The list, once a revocation key of the policy verified it; AttestationError saying why not."""
    keys = [policy.keys[k].public() for k in rules.keys]
    payload = open_envelope(raw, keys, PAYLOAD_TYPE)
    try:
        return RevocationList.model_validate_json(payload)
    except ValidationError as exc:
        raise AttestationError(f"the revocation list is malformed: {exc.errors()[0]['msg']}") from exc


def unverified(raw: bytes) -> RevocationList | None:
    """The list's entries without checking its signature: what `prebake revoke` extends."""
    try:
        envelope = json.loads(raw)
        return RevocationList.model_validate_json(base64.b64decode(envelope["payload"]))
    except (ValueError, KeyError, TypeError, ValidationError):
        return None


@dataclass(frozen=True)
class Revoked:
    """What `prebake revoke` wrote: the list now in force, where, and who signed it."""

    registry: str
    signed_by: str
    entries: RevocationList

    def to_json(self) -> dict[str, object]:
        return {"registry": self.registry, "signed_by": self.signed_by, **self.entries.model_dump(mode="json")}

    def render(self) -> str:
        e = self.entries
        return (
            f"revocation list serial {e.serial} issued {e.issued.isoformat()} signed by {self.signed_by} "
            f"at {self.registry}: {len(e.keys)} key(s) {list(e.keys)}, {len(e.bundles)} bundle(s)"
        )


def revoke(
    registry: Registry,
    address: str,
    signer: KeySigner,
    *,
    keys: Sequence[str] = (),
    bundles: Sequence[str] = (),
    reason: str = "",
) -> RevocationList:
    """Extend the registry's list (its entries kept) with `keys` and `bundles`, give it the next
    serial and a fresh `issued` time, sign it and write it back: `prebake revoke`."""
    if not isinstance(registry, SideFiles):
        raise PrebakeError(f"{address} cannot hold a revocation list; use a folder, S3 or Hub registry")
    raw = registry.get_meta(LIST_NAME)
    old = unverified(raw) if raw is not None else None
    if raw is not None and old is None:
        raise PrebakeError(
            f"{address}/meta/{LIST_NAME} is not a revocation list; move it aside (it may be forged) and run again"
        )
    reasons = dict(old.reasons) if old else {}
    if reason:
        reasons |= {entry: reason for entry in [*keys, *bundles]}
    entries = RevocationList(
        serial=(old.serial + 1) if old else 1,
        issued=dt.datetime.now(dt.UTC).replace(microsecond=0),
        keys=tuple(sorted({*(old.keys if old else ()), *keys})),
        bundles=tuple(sorted({*(old.bundles if old else ()), *bundles})),
        reasons=reasons,
    )
    registry.put_meta(LIST_NAME, sign_list(entries, signer))
    return entries


@dataclass
class Revocations:
    """The revocation check of one policy on one node (a registry.policy.Revoked)."""

    policy: PolicyFile
    address: str
    store_home: Path
    open_registry: Callable[[], Registry]
    timeout: float = READ_TIMEOUT_S
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    _state: tuple[float, RevocationList | str] | None = field(default=None, init=False, repr=False)
    _warned: bool = field(default=False, init=False, repr=False)
    _warned_future: bool = field(default=False, init=False, repr=False)

    @property
    def rules(self) -> Revocation:
        assert self.policy.revocation is not None
        return self.policy.revocation

    def by(self, deadline: float) -> _ByDeadline:
        """This check with its read of the list ending by `deadline` (a time.monotonic() value)."""
        return _ByDeadline(self, deadline)

    def __call__(self, manifest: Manifest, signer: str, deadline: float | None = None) -> str | None:
        state = self.state(deadline)
        if isinstance(state, RevocationList):
            why = state.why_revoked(manifest, signer)
            return None if why is None else f"{why} by the {state.describe()}; do not use it"
        if self.rules.on_unreadable == "fail-open":
            if not self._warned:
                _log.warning("prebake: WARNING: %s; the policy says fail-open, so bundles are used anyway", state)
                self._warned = True
            return None
        return f"{state}, and the policy says on_unreadable = 'fail-closed'; publish a fresh list with `prebake revoke`"

    def state(self, deadline: float | None = None) -> RevocationList | str:
        """The list in force, or why there is none; read once per process (again after a minute, for
        long-lived ones), since every bundle of a start is checked against the same list."""
        if self._state is not None and time.monotonic() - self._state[0] < _PROCESS_MEMO_S:
            return self._state[1]
        value = self._read(deadline)
        self._state = (time.monotonic(), value)
        return value

    def _read(self, deadline: float | None) -> RevocationList | str:
        """Ask the registry (time-boxed, by the caller's deadline when it has one); if it does not
        answer, the stored copy stands in while it is younger than cache_seconds (and not stale)."""
        cached_raw = self._cached()
        cached = self._verified(cached_raw) if cached_raw is not None else None
        held = cached if isinstance(cached, RevocationList) else None
        seconds = seconds_left(deadline, self.timeout)
        asked = within(seconds, self._from_registry, name="prebake-revocations")
        if isinstance(asked, Done) and asked.value is not None:
            got = self._verified(asked.value)
            if isinstance(got, str):
                return got
            if held is not None and got.serial < held.serial:
                return (
                    f"the registry's revocation list (serial {got.serial}) is older than the one this node "
                    f"holds (serial {held.serial}): it was rolled back"
                )
            fsutil.write_bytes(self._cache_path(), asked.value)
            return self._fresh(got)
        if isinstance(asked, Done):
            return f"the registry {self.address} holds no revocation list (meta/{LIST_NAME}): it is missing"
        box = (
            f"{self.timeout:g} s" if deadline is None else f"the registry time box ({max(seconds, 0):.1f} s of it left)"
        )
        why = f"the revocation list of {self.address} could not be read within {box} ({_said(asked)})"
        if held is not None and self._cache_age() < self.rules.cache_seconds:
            return self._fresh(held)
        return why + (" and this node's copy has expired (cache_seconds)" if held is not None else "")

    def _fresh(self, entries: RevocationList) -> RevocationList | str:
        issued = entries.issued if entries.issued.tzinfo else entries.issued.replace(tzinfo=dt.UTC)
        now = self.now()  # this node's clock decides freshness, against the issuer's `issued` stamp
        age = now - issued
        clock = f"{now:%Y-%m-%d %H:%M} UTC by this node's clock"
        if age > dt.timedelta(hours=self.rules.max_age_hours):
            return (
                f"the {entries.describe()} is stale: {age.total_seconds() / 3600:.0f} h old, more than "
                f"max_age_hours = {self.rules.max_age_hours:g} ({clock})"
            )
        if age < -FUTURE_SKEW and not self._warned_future:  # still used: a list only ever takes trust away
            _log.warning(
                "prebake: WARNING: the %s is %.0f h in the future (%s): this node's clock is behind; set it "
                "right (NTP), or stale lists will count as fresh for that much longer",
                entries.describe(),
                -age.total_seconds() / 3600,
                clock,
            )
            self._warned_future = True
        return entries

    def _verified(self, raw: bytes) -> RevocationList | str:
        try:
            return read_list(raw, self.policy, self.rules)
        except AttestationError as exc:
            return f"the revocation list of {self.address} is refused (forged or corrupt): {exc}"

    def _from_registry(self) -> bytes | None:
        registry = self.open_registry()
        return registry.get_meta(LIST_NAME) if isinstance(registry, SideFiles) else None

    def _cache_path(self) -> Path:
        return self.store_home / "revocations" / f"{hashlib.sha256(self.address.encode()).hexdigest()}.dsse.json"

    def _cached(self) -> bytes | None:
        try:
            return fsutil.read_bounded(self._cache_path(), MAX_SIDE_FILE_BYTES)
        except FileNotFoundError:
            return None

    def _cache_age(self) -> float:
        try:
            return time.time() - self._cache_path().stat().st_mtime
        except FileNotFoundError:
            return float("inf")


@dataclass(frozen=True)
class _ByDeadline:
    """A Revocations check whose read of the list ends by the caller's deadline (registry.policy.Revoked)."""

    revocations: Revocations
    deadline: float

    def __call__(self, manifest: Manifest, signer: str) -> str | None:
        return self.revocations(manifest, signer, self.deadline)


def _said(outcome: Raised | TimedOut) -> str:
    return outcome.describe() if isinstance(outcome, Raised) else "timed out"
