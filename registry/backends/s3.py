"""The S3 backend: the registry layout inside a bucket, on AWS or any S3-compatible server.

    s3://<bucket>/<prefix>/
    ├── index/<kind>/<key-digest>.json          PutObject with If-None-Match: * (never replaced)
    └── blobs/sha256/<aa>/<digest>.tar.zst      multipart upload, parallel ranged download

Endpoint, region and credentials come from the standard AWS configuration, read by boto3
itself: AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3), AWS_PROFILE, AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY, ~/.aws/config. MinIO, R2 and Ceph therefore need only their
endpoint. Transfers are tuned by `S3Settings` (PREBAKE_S3_* variables).

An index entry is created only if absent: PutObject with If-None-Match: *, which AWS S3,
MinIO, R2 and moto honour. A 412 means another baker created it first: we read theirs and
settle like the file backend (same bundle: not created; different: PublishConflict).

Fallback for servers without conditional writes (they answer 501 NotImplemented, or the
operator sets PREBAKE_S3_CONDITIONAL_PUT=off): look, put, read back. The race that
remains: two bakers who both look before either puts both write; the later write replaces
the earlier one, and the earlier baker may already have reported `created=True`. Readers
never see a broken entry (each write is whole and names a complete blob of that key), but
"created once, never replaced" then holds only between bakers that do not overlap. A
server that silently ignores If-None-Match has the same race without the read-back check.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES, BlobRef, Manifest
from prebake.artifacts.bundle.payload import file_digest
from prebake.artifacts.errors import BundleError
from prebake.artifacts.layout import blob_relpath, index_relpath, meta_relpath, parse_index_relpath, side_relpath
from prebake.artifacts.ports.errors import BlobDigestMismatch, RegistryError, RegistryNotFound, RegistryUnavailable
from prebake.registry.backends.s3_listing import S3Listing
from prebake.registry.backends.s3_maintain import S3Maintenance
from prebake.registry.shared.ranged import OrderedSink
from prebake.registry.shared.transfer import Published, SizedSink, read_ahead, settle

log = logging.getLogger(__name__)

_MiB = 1 << 20
_CREATE_ATTEMPTS = 5  # rounds of "409 ConditionalRequestConflict: try again" before giving up
_FIRST_PAGE = 100  # keys in the first listing page; later pages hold S3's maximum, 1,000
_PROGRESS_MIN_BYTES = 16 * _MiB  # smaller transfers finish before a meter is worth drawing
_INDEX_READ_S = 30.0  # an index entry is small: one that takes longer is stalled or hostile


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
        values: dict[str, object] = {}
        for name, parse in (
            ("concurrency", int),
            ("chunk_mb", int),
            ("max_attempts", int),
            ("retry_mode", str),
            ("timeout_s", float),
            ("conditional_put", _parse_switch),
        ):
            var = f"PREBAKE_S3_{name.upper()}"
            if (raw := env.get(var, "").strip()) != "":
                try:
                    values[name] = parse(raw)
                except ValueError as exc:
                    raise RegistryError(f"{var}={raw!r} is not valid: {exc}; fix or unset it") from exc
        return cls(**values)  # type: ignore[arg-type]


class S3Registry(S3Maintenance, S3Listing):
    """index/ + blobs/ under s3://bucket/prefix, through boto3 (maintainable: see s3_maintain; listable: s3_listing)."""

    settings: S3Settings

    writable = True

    def __init__(self, address: str, settings: S3Settings | None = None):
        self.bucket, self.prefix = _parse_address(address)
        self.url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.settings = settings or S3Settings.from_env()
        self._client = _make_client(self.settings)
        self._transfer = _transfer_config(self.settings)
        self._conditional = self.settings.conditional_put
        self.endpoint = self._client.meta.endpoint_url

    def lookup(self, kind: str, key_digest: str) -> Manifest | None:
        key = self._key(index_relpath(kind, key_digest))
        with self._faults(f"read {self._where(key)}"):
            raw = self._get_or_none(key)
        return None if raw is None else Manifest.parse(raw, self._where(key))

    def fetch_blob(
        self, digest: str, dest: Path, *, size: int | None = None, tee: Callable[[bytes], None] | None = None
    ) -> Path:
        key = self._key(blob_relpath(digest))
        where, dest = self._where(key), Path(dest)
        sized = SizedSink(size, digest, where, self.url, tee)
        with self._faults(f"download {where}"):
            stored = self._size_or_none(key)
            if stored is None:
                raise RegistryError(
                    f"blob {digest} is named by an index entry but missing at {where}; run `prebake verify`"
                )
            sized.announce(stored)  # a blob larger than its manifest says is refused before a byte moves
            with (
                fsutil.atomic_target(dest) as tmp,
                tmp.open("w+b") as f,  # read back by the sink when parts arrive out of order
                _progress("download", digest, stored) as progress,
            ):
                sink = OrderedSink(f, sized)
                self._client.download_fileobj(self.bucket, key, sink, Config=self._transfer, Callback=progress.update)
                sized.finish()
                if sink.digest() != digest:
                    raise BlobDigestMismatch(
                        f"blob {where} hashes to {sink.digest()}, not {digest}: it is corrupt; "
                        f"run `prebake verify --quarantine --registry {self.url}` and rebake"
                    )
        return dest

    def publish(self, manifest: Manifest, blob: Path) -> Published:
        blob = Path(blob)
        if file_digest(blob) != manifest.blob.digest:
            raise BlobDigestMismatch(f"{blob} does not hash to {manifest.blob.digest}; repack it before publishing")
        key = self._key(index_relpath(manifest.kind, manifest.key_digest))
        existing = self.lookup(manifest.kind, manifest.key_digest)
        if existing is not None:
            return settle(existing, manifest, self._where(key))
        with self._faults(f"publish into {self.url}"):
            self._put_blob(manifest.blob, blob)
            return self._create_index(manifest, key)

    def put_side(self, blob_digest: str, name: str, data: bytes) -> bool:
        """Create the side file with a conditional put (If-None-Match), as index entries are created."""
        from botocore.exceptions import ClientError

        key = self._key(side_relpath(blob_digest, name))
        with self._faults(f"write {self._where(key)}"):
            if not self._conditional:
                if self._get_or_none(key) is not None:
                    return False
                self._client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType="application/json")
                return True
            try:
                self._client.put_object(
                    Bucket=self.bucket, Key=key, Body=data, ContentType="application/json", IfNoneMatch="*"
                )
            except ClientError as exc:
                if _error_code(exc) == "PreconditionFailed" or _status(exc) == 412:
                    return False
                if _error_code(exc) == "NotImplemented" or _status(exc) == 501:
                    self._conditional = False
                    return self.put_side(blob_digest, name, data)
                raise
        return True

    def put_meta(self, name: str, data: bytes) -> None:
        key = self._key(meta_relpath(name))
        with self._faults(f"write {self._where(key)}"):
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType="application/json")

    def get_meta(self, name: str) -> bytes | None:
        key = self._key(meta_relpath(name))
        with self._faults(f"read {self._where(key)}"):
            return self._get_or_none(key)

    def get_side(self, blob_digest: str, name: str) -> bytes | None:
        key = self._key(side_relpath(blob_digest, name))
        with self._faults(f"read {self._where(key)}"):
            return self._get_or_none(key)

    def list(self, kind: str | None = None) -> Iterator[Manifest]:
        """Every manifest in the index, in key order. Listing pages are fetched as they are needed
        and entries read `concurrency` at a time in parallel: the first few cost a handful of
        requests (a bounded miss explanation), ten thousand run at the server's pace (`prebake ls`)."""
        base = self._key(f"index/{kind}/" if kind else "index/")
        yield from read_ahead(
            self._index_keys(base), self._read_listed, readers=self.settings.concurrency, name="prebake-s3-list"
        )

    def __repr__(self) -> str:
        return f"S3Registry({self.url!r}, endpoint={self.endpoint!r})"

    # -- index entries ---------------------------------------------------------------------

    def _create_index(self, manifest: Manifest, key: str) -> Published:
        from botocore.exceptions import ClientError

        body = manifest.to_bytes()
        for attempt in range(_CREATE_ATTEMPTS):
            if not self._conditional:
                return self._create_index_unconditionally(manifest, key, body)
            try:
                self._client.put_object(
                    Bucket=self.bucket, Key=key, Body=body, ContentType="application/json", IfNoneMatch="*"
                )
                return Published(manifest, created=True, where=self._where(key))
            except ClientError as exc:
                code, status = _error_code(exc), _status(exc)
                if code == "PreconditionFailed" or status == 412:
                    return settle(self._read_index(key), manifest, self._where(key))
                if code == "ConditionalRequestConflict" or status == 409:
                    time.sleep(0.1 * 2**attempt)  # another conditional write of this key is in flight
                    continue
                if code == "NotImplemented" or status == 501:
                    log.warning(
                        "%s at %s does not support conditional writes (If-None-Match); creating index "
                        "entries by look-put-read-back instead, see registry/backends/s3.py for the race that leaves",
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

    def _create_index_unconditionally(self, manifest: Manifest, key: str, body: bytes) -> Published:
        if (raw := self._get_or_none(key)) is not None:
            return settle(Manifest.parse(raw, self._where(key)), manifest, self._where(key))
        self._client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json")
        stored = self._read_index(key)
        if stored.same_bundle(manifest):
            return Published(manifest, created=True, where=self._where(key))
        return settle(stored, manifest, self._where(key))  # a concurrent baker overwrote ours: theirs stands

    def _read_index(self, key: str) -> Manifest:
        raw = self._get_or_none(key)
        if raw is None:
            raise RegistryError(
                f"{self._where(key)} was reported present and then could not be read; "
                f"something deletes index entries behind prebake's back: check lifecycle rules on the bucket"
            )
        return Manifest.parse(raw, self._where(key))

    # -- objects ---------------------------------------------------------------------------

    def _put_blob(self, ref: BlobRef, blob: Path) -> None:
        key = self._key(blob_relpath(ref.digest))
        if self._size_or_none(key) == ref.size:
            return  # content-addressed: this name already holds these bytes
        with _progress("upload", ref.digest, ref.size) as progress:
            self._client.upload_file(str(blob), self.bucket, key, Config=self._transfer, Callback=progress.update)

    def _get_or_none(self, key: str) -> bytes | None:
        """An index entry's bytes, at most MAX_MANIFEST_BYTES of them, read within the time box."""
        got = self._get_tagged(key)
        return None if got is None else got[0]

    def _get_tagged(self, key: str) -> tuple[bytes, str] | None:
        """An index entry's bytes (bounded as `_get_or_none` says) and its version tag, ETag/size."""
        from botocore.exceptions import ClientError

        try:
            response = self._client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _error_code(exc) in ("NoSuchKey", "404"):
                return None
            raise
        body, where = response["Body"], self._where(key)
        try:
            if int(response.get("ContentLength") or 0) > MAX_MANIFEST_BYTES:
                raise BundleError(f"{where} is over {MAX_MANIFEST_BYTES} bytes; no manifest is: refusing it")
            chunks, total, deadline = [], 0, time.monotonic() + _INDEX_READ_S
            while chunk := body.read(min(_MiB, MAX_MANIFEST_BYTES + 1 - total)):
                chunks.append(chunk)
                total += len(chunk)
                if total > MAX_MANIFEST_BYTES or time.monotonic() > deadline:
                    raise BundleError(f"{where} sent over {MAX_MANIFEST_BYTES} bytes or for over {_INDEX_READ_S} s")
            return b"".join(chunks), f"{response.get('ETag', '')}/{total}"
        finally:
            body.close()

    def _size_or_none(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            return int(self._client.head_object(Bucket=self.bucket, Key=key)["ContentLength"])
        except ClientError as exc:
            if _error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise

    def _index_keys(self, base: str) -> Iterator[str]:
        """Index entry keys under `base`, page by page as they are consumed (S3 lists in key order).
        The first page is small, so a reader that wants only a few keys waits for a short answer."""
        strip, token, size = len(self._key("")), None, _FIRST_PAGE
        while True:
            ask = {"Bucket": self.bucket, "Prefix": base, "MaxKeys": size}
            with self._faults(f"list {self._where(base)}"):
                page = self._client.list_objects_v2(**ask, **({"ContinuationToken": token} if token else {}))
            for obj in page.get("Contents", ()):
                if parse_index_relpath(obj["Key"][strip:]) is not None:
                    yield obj["Key"]
            token, size = page.get("NextContinuationToken"), 1000
            if not page.get("IsTruncated") or not token:
                return

    def _read_listed(self, key: str) -> Manifest | None:
        with self._faults(f"read {self._where(key)}"):
            raw = self._get_or_none(key)
        return None if raw is None else Manifest.parse(raw, self._where(key))  # None: deleted since listed

    def _key(self, relpath: str) -> str:
        return f"{self.prefix}/{relpath}" if self.prefix else relpath

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    # -- faults ----------------------------------------------------------------------------

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
        code, status = _error_code(exc), _status(exc)
        if code == "NoSuchBucket":
            return RegistryNotFound(
                f"cannot {doing}: bucket {self.bucket} does not exist at {self.endpoint}; "
                f"create it (aws s3 mb s3://{self.bucket}) or fix the registry address"
            )
        if status in (401, 403) or code in (
            "AccessDenied",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "ExpiredToken",
        ):
            return RegistryUnavailable(
                f"cannot {doing}: {self.endpoint} refused us ({code}); check the credentials "
                f"(AWS_PROFILE, AWS_ACCESS_KEY_ID) and the policy of bucket {self.bucket}"
            )
        if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout"):
            return RegistryUnavailable(
                f"cannot {doing}: {self.endpoint} failed ({code}) after {self.settings.max_attempts} attempts; retry later"
            )
        return RegistryError(f"cannot {doing}: {self.endpoint} answered {code} (HTTP {status}): {exc}")


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


def _parse_switch(raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    raise ValueError("write on or off")


def _make_client(settings: S3Settings) -> Any:
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
        return boto3.session.Session().client("s3", config=config)
    except BotoCoreError as exc:
        raise RegistryUnavailable(f"cannot set up the S3 client: {exc}; check AWS_PROFILE and ~/.aws/config") from exc


def _transfer_config(settings: S3Settings) -> Any:
    from boto3.s3.transfer import TransferConfig

    chunk = settings.chunk_mb * _MiB
    return TransferConfig(
        multipart_threshold=chunk,
        multipart_chunksize=chunk,
        max_concurrency=settings.concurrency,
        preferred_transfer_client="classic",  # the CRT client ignores these settings
    )


def _error_code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _status(exc: Exception) -> int:
    return int(getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
