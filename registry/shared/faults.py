"""One rule for what a storage service's error answer means, shared by every backend's SDK translation.

    401, 403, or the SDK's own refusal        refused: RegistryUnavailable, check the credentials
    5xx, 408, 429, or the SDK's throttling    retry later: RegistryUnavailable
    the container (bucket, repo) is missing   RegistryNotFound: create it or fix the address
    anything else                             RegistryError, in the service's words

A backend reads its SDK's exception into an `Answer` and says its own `Hints` (which credentials
to check, how to create its container); the verdict and the message's shape are this module's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from prebake.artifacts.ports.errors import RegistryError, RegistryNotFound, RegistryUnavailable


class Verdict(enum.Enum):
    REFUSED = "refused"
    RETRY_LATER = "retry later"
    OTHER = "other"


def verdict(status: int) -> Verdict:
    """What an HTTP status says to a registry client: refused, worth retrying later, or neither."""
    if status in (401, 403):
        return Verdict.REFUSED
    if status >= 500 or status in (408, 429):
        return Verdict.RETRY_LATER
    return Verdict.OTHER


@dataclass(frozen=True)
class Answer:
    """An SDK's error answer, read into the rule's terms."""

    status: int  # the HTTP status; 0 when the SDK gave none
    code: str = ""  # the service's own error code (NoSuchBucket, SlowDown), "" when none
    detail: str = ""  # the service's words, for an answer the rule does not place
    refused: bool = False  # the SDK refused without a status (an authentication error, a gated repo)
    throttled: bool = False  # the service's code means retry later whatever the status
    missing: bool = False  # the container itself does not exist

    @property
    def label(self) -> str:
        return self.code or f"HTTP {self.status}"


@dataclass(frozen=True)
class Hints:
    """A backend's own words: who answered, the fix when refused, and when its container is missing."""

    who: str  # "s3.example.com:9000", "the Hub at https://huggingface.co"
    refused: str  # what to check: "check the credentials (AWS_PROFILE...) and the policy of bucket b"
    missing: str  # the whole reason: "bucket b does not exist at ...; create it (...) or fix the address"
    attempts: int | None = None  # how often the SDK asked before giving up, when it retries


def translate(answer: Answer, doing: str, hints: Hints) -> RegistryError:
    """The registry error of `answer`, met while `doing` something, worded with the backend's hints."""
    if answer.missing:
        return RegistryNotFound(f"cannot {doing}: {hints.missing}")
    rule = Verdict.REFUSED if answer.refused else verdict(answer.status)
    if rule is Verdict.REFUSED:
        return RegistryUnavailable(f"cannot {doing}: {hints.who} refused us ({answer.label}); {hints.refused}")
    if rule is Verdict.RETRY_LATER or answer.throttled:
        after = "" if hints.attempts is None else f" after {hints.attempts} attempts"
        return RegistryUnavailable(f"cannot {doing}: {hints.who} failed ({answer.label}){after}; retry later")
    return RegistryError(f"cannot {doing}: {hints.who} answered {answer.label}: {answer.detail}")
