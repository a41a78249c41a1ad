"""One rule for an SDK's error answer (registry/shared/faults.py): refused, retry later, not found, or
the service's own words; each backend reads its SDK's real exceptions into it and adds its hints.
The servers' own answers are the contract suite's (tests/contract); these are the exceptions the
SDKs raise, made here, so every branch is reached without a server that misbehaves on cue."""

from __future__ import annotations

import pytest

from prebake.artifacts.ports.errors import RegistryError, RegistryNotFound, RegistryUnavailable
from prebake.registry.shared.faults import Answer, Hints, Verdict, translate, verdict

HINTS = Hints(who="store.example", refused="check the key", missing="bucket b does not exist; create it", attempts=3)


@pytest.mark.parametrize(
    ("status", "expected"),
    [(401, Verdict.REFUSED), (403, Verdict.REFUSED), (408, Verdict.RETRY_LATER), (429, Verdict.RETRY_LATER)]
    + [(s, Verdict.RETRY_LATER) for s in (500, 501, 502, 503, 504)]
    + [(s, Verdict.OTHER) for s in (0, 400, 404, 409, 412)],
)
def test_every_status_has_one_verdict(status, expected):
    assert verdict(status) is expected


def test_each_verdict_is_its_error_with_the_backends_hints():
    missing = translate(Answer(404, "NoSuchBucket", missing=True), "read x", HINTS)
    refused = translate(Answer(403, "AccessDenied"), "read x", HINTS)
    later = translate(Answer(503), "read x", HINTS)
    other = translate(Answer(409, "Conflict", detail="HTTP 409, busy"), "read x", HINTS)

    assert isinstance(missing, RegistryNotFound) and "create it" in str(missing)
    assert isinstance(refused, RegistryUnavailable) and "refused us (AccessDenied); check the key" in str(refused)
    assert isinstance(later, RegistryUnavailable) and "failed (HTTP 503) after 3 attempts; retry later" in str(later)
    assert type(other) is RegistryError and "answered Conflict: HTTP 409, busy" in str(other)


def test_an_sdks_own_refusal_or_throttling_counts_whatever_the_status():
    assert "refused us" in str(translate(Answer(0, "ExpiredToken", refused=True), "read x", HINTS))
    assert "retry later" in str(translate(Answer(400, "SlowDown", throttled=True), "read x", HINTS))


def test_s3_reads_botocores_answers_into_the_rule():
    from botocore.exceptions import ClientError

    from prebake.registry.backends.s3 import S3Store
    from prebake.registry.backends.s3_client import S3Settings

    store = S3Store("s3://team-bucket/prebake", S3Settings(max_attempts=2))

    def answer(code: str, status: int) -> Exception:
        error = ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")
        return store._client_fault(error, "read index/x")

    assert isinstance(answer("NoSuchBucket", 404), RegistryNotFound)
    assert "aws s3 mb s3://team-bucket" in str(answer("NoSuchBucket", 404))
    assert "refused us (SignatureDoesNotMatch)" in str(answer("SignatureDoesNotMatch", 400))
    assert "failed (SlowDown) after 2 attempts; retry later" in str(answer("SlowDown", 503))
    assert type(answer("InvalidRange", 416)) is RegistryError


def test_azure_reads_its_sdks_answers_into_the_rule():
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    from prebake.registry.backends.azure import AzureStore

    key = "a2V5" * 22  # any base64 account key: the client is built, never asked
    env = {"AZURE_STORAGE_CONNECTION_STRING": f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={key}"}
    store = AzureStore("az://acct/models/prebake", env=env)

    def raised(exc: Exception) -> RegistryError:
        with pytest.raises(RegistryError) as caught, store._faults("read index/x"):
            raise exc
        return caught.value

    def http(status: int, code: str) -> HttpResponseError:
        exc = HttpResponseError(message=f"{status} {code}")
        exc.status_code, exc.error_code = status, code
        return exc

    assert isinstance(raised(http(404, "ContainerNotFound")), RegistryNotFound)
    assert "az storage container create --name models" in str(raised(http(404, "ContainerNotFound")))
    assert "refused us" in str(raised(ClientAuthenticationError(message="bad key")))
    assert "refused us (AuthorizationFailure)" in str(raised(http(403, "AuthorizationFailure")))
    assert "retry later" in str(raised(http(429, "ServerBusy")))
    assert type(raised(http(409, "LeaseIdMissing"))) is RegistryError
