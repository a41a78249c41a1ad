"""The S3 backend: the registry layout inside a bucket, on AWS or any S3-compatible server.

    s3://<bucket>/<prefix>/
    ├── index/<kind>/<key-digest>.json          PutObject with If-None-Match: * (never replaced)
    └── blobs/sha256/<aa>/<digest>.tar.zst      multipart upload, parallel ranged download

boto3 reads endpoint, region and credentials from the standard AWS configuration (so MinIO, R2
and Ceph need only their endpoint); `S3Settings` (PREBAKE_S3_* variables) tunes transfers. A 412
on an index entry means another baker created it first: theirs is read and settled as the file
backend does. Servers without conditional writes (501, or PREBAKE_S3_CONDITIONAL_PUT=off) get
look, put, read back, which leaves a race between overlapping bakers (docs/registries.md).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm import tqdm

from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES
from prebake.artifacts.errors import BundleError
from prebake.artifacts.ports.errors import BlobDigestMismatch, RegistryError, RegistryUnavailable
from prebake.artifacts.ports.objects import Stored
from prebake.registry.backends.s3_client import S3Settings, error_code, make_client, status_of, transfer_config
from prebake.registry.shared.faults import Answer, Hints, translate
from prebake.registry.shared.index import StoreRegistry

log = logging.getLogger(__name__)

_MiB = 1 << 20
_CREATE_ATTEMPTS = 5  # rounds of "409 ConditionalRequestConflict: try again" before giving up
_PROGRESS_MIN_BYTES = 16 * _MiB  # smaller transfers finish before a meter is worth drawing
_INDEX_READ_S = 30.0  # an index entry is small: one that takes longer is stalled or hostile
_REFUSED_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"})
_THROTTLED_CODES = frozenset({"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout"})


class S3Store:
    """The object-store port over s3://bucket/prefix, through boto3."""

    writable = True

    def __init__(self, address: str, settings: S3Settings | None = None):
        self.bucket, self.prefix = _parse_address(address)
        self.url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.settings = settings or S3Settings.from_env()
        self._client = make_client(self.settings)
        self._transfer = transfer_config(self.settings)
        self._conditional = self.settings.conditional_put
        self.endpoint = self._client.meta.endpoint_url

    def head(self, key: str) -> Stored | None:
        from botocore.exceptions import ClientError

        with self._faults(f"read {self._where(key)}"):
            try:
                got = self._client.head_object(Bucket=self.bucket, Key=self._key(key))
            except ClientError as exc:
                if error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                    return None
                raise
        size = int(got["ContentLength"])
        return Stored(key, size, f"{got.get('ETag', '')}/{size}")

    def get(self, key: str, limit: int) -> tuple[bytes, str] | None:
        """The object's bytes, at most `limit` of them, read within the time box, and its ETag/size."""
        from botocore.exceptions import ClientError

        where = self._where(key)
        with self._faults(f"read {where}"):
            try:
                response = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            except ClientError as exc:
                if error_code(exc) in ("NoSuchKey", "404"):
                    return None
                raise
            body = response["Body"]
            try:
                if int(response.get("ContentLength") or 0) > limit:
                    raise BundleError(f"{where} is over {limit} bytes; no manifest is: refusing it")
                chunks, total, deadline = [], 0, time.monotonic() + _INDEX_READ_S
                while chunk := body.read(min(_MiB, limit + 1 - total)):
                    chunks.append(chunk)
                    total += len(chunk)
                    if total > limit or time.monotonic() > deadline:
                        raise BundleError(f"{where} sent over {limit} bytes or for over {_INDEX_READ_S} s")
                return b"".join(chunks), f"{response.get('ETag', '')}/{total}"
            finally:
                body.close()

    def read(self, key: str, first: int = 0, last: int | None = None) -> Iterator[bytes]:
        ranged = {} if (first, last) == (0, None) else {"Range": f"bytes={first}-{'' if last is None else last}"}
        with self._faults(f"download {self._where(key)}"):
            got = self._client.get_object(Bucket=self.bucket, Key=self._key(key), **ranged)
            try:
                yield from _as_received(got["Body"])
            finally:
                got["Body"].close()

    def put(self, key: str, data: bytes | Path, *, create_only: bool = False) -> bool:
        with self._faults(f"write {self._where(key)}"):
            if isinstance(data, Path):  # a blob: multipart past chunk_mb, parts in parallel
                if create_only and self.head(key) is not None:
                    return False
                with _progress("upload", key.rpartition("/")[2], data.stat().st_size) as progress:
                    self._client.upload_file(
                        str(data), self.bucket, self._key(key), Config=self._transfer, Callback=progress.update
                    )
                return True
            if create_only:
                return self._create(key, data)
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, ContentType="application/json")
        return True

    def delete(self, key: str) -> None:
        with self._faults(f"remove {self._where(key)}"):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def list(self, prefix: str) -> Iterator[Stored]:
        """Every object under `prefix`, page by page (1,000 keys each) as they are consumed, in key order."""
        strip, pages = len(self._key("")), self._client.get_paginator("list_objects_v2")
        with self._faults(f"list {self._where(prefix)}"):
            for page in pages.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
                for obj in page.get("Contents", ()):
                    yield Stored(obj["Key"][strip:], int(obj["Size"]), f"{obj.get('ETag', '')}/{obj['Size']}")

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint={self.endpoint!r})"

    def _create(self, key: str, body: bytes) -> bool:
        """PutObject with If-None-Match: *; False when the object was there. A 409 is retried; a 501
        switches this client to look-put-read-back (see the module's docstring for its race)."""
        from botocore.exceptions import ClientError

        for attempt in range(_CREATE_ATTEMPTS):
            if not self._conditional:
                if self.get(key, MAX_MANIFEST_BYTES) is not None:
                    return False
                self._client.put_object(
                    Bucket=self.bucket, Key=self._key(key), Body=body, ContentType="application/json"
                )
                stored = self.get(key, MAX_MANIFEST_BYTES)
                return stored is not None and stored[0] == body  # a concurrent writer overwrote ours: theirs stands
            try:
                self._client.put_object(
                    Bucket=self.bucket, Key=self._key(key), Body=body, ContentType="application/json", IfNoneMatch="*"
                )
                return True
            except ClientError as exc:
                code, status = error_code(exc), status_of(exc)
                if code == "PreconditionFailed" or status == 412:
                    return False
                if code == "ConditionalRequestConflict" or status == 409:
                    time.sleep(0.1 * 2**attempt)  # another conditional write of this key is in flight
                    continue
                if code == "NotImplemented" or status == 501:
                    log.warning(
                        "%s at %s does not support conditional writes (If-None-Match); creating index entries "
                        "by look-put-read-back instead, see registry/backends/s3.py for the race that leaves",
                        self.url,
                        self.endpoint,
                    )
                    self._conditional = False
                    continue
                raise
        raise RegistryUnavailable(
            f"cannot create {self._where(key)}: the server kept answering 409 ConditionalRequestConflict; "
            f"another baker is writing the same key, retry the publish"
        )

    def _key(self, relpath: str) -> str:
        return f"{self.prefix}/{relpath}" if self.prefix else relpath

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    @contextmanager
    def _faults(self, doing: str) -> Iterator[None]:
        """Turn boto's exceptions into registry errors that name the endpoint, bucket and fix."""
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import (
            BotoCoreError,
            ChecksumError,
            ClientError,
            FlexibleChecksumError,
            NoCredentialsError,
            PartialCredentialsError,
        )
        from s3transfer.exceptions import RetriesExceededError
        from urllib3.exceptions import HTTPError

        try:
            yield
        except RegistryError:
            raise
        except (ChecksumError, FlexibleChecksumError) as exc:
            raise BlobDigestMismatch(
                f"cannot {doing}: the bytes {self.endpoint} sent do not match the checksum it stored ({exc}); "
                f"they were damaged in transit or at rest: retry, and if it persists run "
                f"`prebake verify --quarantine --registry {self.url}` and rebake"
            ) from exc
        except ClientError as exc:
            raise self._client_fault(exc, doing) from exc
        except (ConnectionError, HTTPError) as exc:  # a connection dropped mid-body: the network, not us
            raise RegistryUnavailable(
                f"cannot {doing}: the connection to {self.endpoint} broke ({exc}); retry"
            ) from exc
        except (NoCredentialsError, PartialCredentialsError) as exc:
            raise RegistryUnavailable(
                f"cannot {doing}: {exc}; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
            ) from exc
        except (BotoCoreError, Boto3Error, RetriesExceededError) as exc:
            if isinstance(exc.__context__, ClientError):  # S3UploadFailedError wraps the real answer
                raise self._client_fault(exc.__context__, doing) from exc
            raise RegistryUnavailable(
                f"cannot {doing}: the S3 endpoint {self.endpoint} (bucket {self.bucket}) did not answer "
                f"after {self.settings.max_attempts} attempts ({exc}); check that the server is up and that "
                f"AWS_ENDPOINT_URL, the network and any proxy point at it"
            ) from exc

    def _client_fault(self, exc: Exception, doing: str) -> RegistryError:
        code, status = error_code(exc), status_of(exc)
        answer = Answer(
            status,
            code,
            detail=f"HTTP {status}, {exc}",
            refused=code in _REFUSED_CODES,
            throttled=code in _THROTTLED_CODES,
            missing=code == "NoSuchBucket",
        )
        return translate(answer, doing, self._hints)

    @property
    def _hints(self) -> Hints:
        return Hints(
            who=self.endpoint,
            refused=f"check the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID) and the policy of bucket {self.bucket}",
            missing=f"bucket {self.bucket} does not exist at {self.endpoint}; "
            f"create it (aws s3 mb s3://{self.bucket}) or fix the registry address",
            attempts=self.settings.max_attempts,
        )


class S3Registry(StoreRegistry):
    """index/ + blobs/ under s3://bucket/prefix (prebake.registry.shared.index over S3Store)."""

    def __init__(self, address: str, settings: S3Settings | None = None):
        self.s3 = S3Store(address, settings)
        super().__init__(self.s3, readers=self.s3.settings.concurrency, part_bytes=self.s3.settings.chunk_mb * _MiB)

    def __repr__(self) -> str:
        return f"S3Registry({self.url!r}, endpoint={self.s3.endpoint!r})"


def _as_received(body: Any) -> Iterator[bytes]:
    """A GetObject body in the pieces the network delivers (at most 1 MiB each), so the consumer sees each
    one as it comes: its time box then ends a body sent slowly. botocore's own reads (`iter_chunks`) wait
    for each whole MiB, so a server sending a few bytes a second held the fetch past its time box until
    the last byte. urllib3's read1 is what the body wraps; the digest and size are prebake's own checks
    (registry/shared/index.py), so botocore's checksum of the whole body is not needed for them."""
    raw = getattr(body, "_raw_stream", None)
    if raw is None or not hasattr(raw, "read1"):
        yield from body.iter_chunks(_MiB)
        return
    while chunk := raw.read1(_MiB):
        yield chunk
    if short := getattr(raw, "length_remaining", None):  # botocore's read checks this; read1 does not
        from urllib3.exceptions import ProtocolError

        raise ProtocolError(f"Connection broken: the body ended {short} bytes before its Content-Length")


def _progress(verb: str, digest: str, total: int) -> tqdm:
    """A tqdm transfer bar on stderr, drawn only when a person is watching (a TTY) and worth it."""
    return tqdm(
        total=total,
        desc=f"{verb} {digest.removeprefix('sha256:')[:12]}",
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=total < _PROGRESS_MIN_BYTES or not sys.stderr.isatty(),
        leave=False,
    )


def _parse_address(address: str) -> tuple[str, str]:
    if not address.startswith("s3://"):
        raise RegistryError(f"{address!r} is not an S3 address; write s3://<bucket>/<prefix>")
    bucket, _, prefix = address[len("s3://") :].partition("/")
    if not bucket:
        raise RegistryError(f"{address!r} names no bucket; write s3://<bucket>/<prefix>")
    return bucket, prefix.strip("/")
