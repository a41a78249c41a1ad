"""The S3 client prebake opens: its settings (PREBAKE_S3_* variables), its retries and transfer tuning.

boto3 reads endpoint, region and credentials from the standard AWS configuration; `S3Settings`
adds how transfers run. botocore retries with backoff; a 429 or 503 that names a Retry-After is
asked again after as long as it asks (`_wait_as_asked`). registry/backends/s3.py is the store.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prebake.artifacts.ports.errors import RegistryError, RegistryUnavailable
from prebake.registry.shared.http import retry_after_s
from prebake.registry.shared.transfer import env_settings

_MiB = 1 << 20


@dataclass(frozen=True)
class S3Settings:
    """How transfers run. Each field has a variable: PREBAKE_S3_<FIELD> (see `from_env`)."""

    concurrency: int = 10  # parallel part requests per transfer
    chunk_mb: int = 8  # multipart part size, and the size from which transfers split
    max_attempts: int = 5  # per request, with exponential backoff and jitter
    retry_mode: str = "standard"  # or "adaptive": also rate-limits the client on throttling
    timeout_s: float = 30.0  # connect and read timeout of each request
    conditional_put: bool = True  # False for servers that reject If-None-Match outright

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.max_attempts < 1 or self.timeout_s <= 0:
            raise RegistryError(f"{self}: concurrency, max_attempts and timeout_s must be positive")
        if self.chunk_mb < 5:
            raise RegistryError(f"{self}: chunk_mb must be at least 5, S3's smallest multipart part")
        if self.retry_mode not in ("standard", "adaptive", "legacy"):
            raise RegistryError(f"{self}: retry_mode must be 'standard', 'adaptive' or 'legacy'")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> S3Settings:
        """Settings from PREBAKE_S3_CONCURRENCY, _CHUNK_MB, _MAX_ATTEMPTS, _RETRY_MODE,
        _TIMEOUT_S and _CONDITIONAL_PUT (on/off); unset variables keep the defaults."""
        parsers = {"concurrency": int, "chunk_mb": int, "max_attempts": int, "retry_mode": str, "timeout_s": float}
        return cls(**env_settings("PREBAKE_S3_", {**parsers, "conditional_put": _parse_switch}, env))


def _parse_switch(raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    raise ValueError("write on or off")


def make_client(settings: S3Settings) -> Any:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError

    config = Config(
        retries={"max_attempts": settings.max_attempts, "mode": settings.retry_mode},
        connect_timeout=settings.timeout_s,
        read_timeout=settings.timeout_s,
        max_pool_connections=settings.concurrency + 2,
    )
    try:
        client = boto3.session.Session().client("s3", config=config)
    except BotoCoreError as exc:
        raise RegistryUnavailable(f"cannot set up the S3 client: {exc}; check AWS_PROFILE and ~/.aws/config") from exc
    client.meta.events.register_first("needs-retry.s3", _wait_as_asked(settings.max_attempts))
    return client


def _wait_as_asked(max_attempts: int) -> Callable[..., float | None]:
    """A botocore needs-retry hook: a 429 or 503 with Retry-After is retried after as long as it asks
    (at most MAX_RETRY_AFTER_S). botocore's own retries read only x-amz-retry-after, and wait at most 5 s
    more than their backoff; S3-compatible servers (MinIO, Ceph, R2) and proxies send the standard header.
    The first hook that names a delay decides, so this one runs before botocore's."""

    def hook(response: Any = None, attempts: int = 0, **_: Any) -> float | None:
        if response is None or attempts >= max_attempts:
            return None
        answer = response[0]
        if answer.status_code not in (429, 503):
            return None
        return retry_after_s(answer.headers.get("Retry-After", "")) or None

    return hook


def transfer_config(settings: S3Settings) -> Any:
    from boto3.s3.transfer import TransferConfig

    chunk = settings.chunk_mb * _MiB
    return TransferConfig(
        multipart_threshold=chunk,
        multipart_chunksize=chunk,
        max_concurrency=settings.concurrency,
        preferred_transfer_client="classic",  # the CRT client ignores these settings
    )


def error_code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def status_of(exc: Exception) -> int:
    return int(getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
