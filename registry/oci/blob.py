"""A blob out of an OCI registry: parallel ranged GETs where the registry serves ranges, else one stream.

    digest_seen = download(client, "sha256:...", f, sized)      # f: the download's file, opened w+b

May touch one blob of one repository, through the client. A blob over one part (PREBAKE_OCI_CHUNK_MB)
is asked for with a Range first: a 206 names its size and the other parts go out, PREBAKE_OCI_PARTS
at a time; a 200 (a mirror that ignores Range) is read as the one stream, so a cold mirror costs its
origin one copy. Every part resumes from the byte it reached when its connection is cut. The parts
meet in registry/shared/ranged.py's OrderedSink: size bound and sha256 in order, either way.
A blob the entry names but the registry lacks is a RegistryError, never a miss.
"""

from __future__ import annotations

import logging
import re
import threading
from contextlib import AbstractContextManager
from typing import BinaryIO

import httpx

from prebake.artifacts.ports.errors import RegistryUnavailable
from prebake.registry.oci.client import Distribution
from prebake.registry.shared.http import pause
from prebake.registry.shared.ranged import OrderedSink, one_part, part_ranges, run_parts
from prebake.registry.shared.transfer import SizedSink, missing

log = logging.getLogger(__name__)

_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")


class _Stopped(Exception):
    """Another part failed: this one stops at its next chunk (the other part's error is raised)."""


def download(client: Distribution, digest: str, f: BinaryIO, sized: SizedSink) -> str:
    """Download blob `digest` into `f` (every byte checked against `sized`); the sha256 of what came."""
    sink, part = OrderedSink(f, sized), client.settings.chunk_mb << 20
    blob = _Blob(client, digest, sink, sized)
    if part == 0 or (sized.size is not None and one_part(sized.size, part)):
        blob.read(0, None, None)
        return sink.digest()
    with client.stream("GET", f"blobs/{digest}", headers={"Range": f"bytes=0-{part - 1}"}) as probe:
        blob.found(probe)
        if probe.status_code != 206:  # Range ignored: this body is the whole blob, one stream
            blob.read(0, None, probe)
            return sink.digest()
        _, last, total = blob.content_range(probe, 0)
        sized.announce(total)
        ranges = [(0, last), *part_ranges(total, part, start=last + 1)]
        log.debug("blob %s: %d bytes in %d ranged parts", digest[:23], total, len(ranges))

        def fetch(start: int, end: int) -> None:
            blob.read(start, end, probe if start == 0 else None)

        run_parts(ranges, fetch, workers=client.settings.parts, name="prebake-oci-part", stop=blob.stop)
    return sink.digest()


def pull_through(client: Distribution, digest: str, f: BinaryIO, sized: SizedSink) -> str | None:
    """For a preheat: None when the registry serves the blob from its own storage (it answers a
    one-byte Range request with 206); else its answer is the whole blob, read into `f` and hashed
    (what it sent, "sha256:<hex>"): a mirror fetching it from its origin."""
    sink = OrderedSink(f, sized)
    blob = _Blob(client, digest, sink, sized)
    with client.stream("GET", f"blobs/{digest}", headers={"Range": "bytes=0-0"}) as r:
        blob.found(r)
        if r.status_code == 206:
            return None
        blob.read(0, None, r)
    return sink.digest()


def held(client: Distribution, digest: str) -> bool:
    """Whether the registry serves the blob itself: a one-byte Range request answered 206."""
    with client.stream("GET", f"blobs/{digest}", headers={"Range": "bytes=0-0"}) as r:
        _found(r, digest, client.url)
        return r.status_code == 206


class _Blob:
    """One blob's download: reading a byte range of it, resuming where a connection broke."""

    def __init__(self, client: Distribution, digest: str, sink: OrderedSink, sized: SizedSink):
        self.client, self.digest, self.sink, self.sized = client, digest, sink, sized
        self.url, self.stop = client.url, threading.Event()

    def read(self, start: int, end: int | None, response: httpx.Response | None) -> None:
        """Bytes [start, end] (end None: to the blob's end) into the sink; `response`, when given,
        is the first attempt's answer, already open."""
        at, attempts = [start], self.client.settings.max_attempts  # at[0]: the next byte to write
        for attempt in range(attempts):
            try:
                if response is not None:
                    self._body(response, at, end)
                else:
                    with self._get(at[0], end, whole=at[0] == 0 and end is None) as r:
                        self._body(r, at, end)
                return
            except httpx.TransportError as exc:  # cut or stalled mid-body: resume from at[0]
                response = None
                if attempt == attempts - 1:
                    raise self.client.fault(exc, f"download blob {self.digest[:23]}") from exc
                log.info("blob %s broke off at byte %d (%s); resuming", self.digest[:23], at[0], exc)
                pause(attempt)

    def _get(self, pos: int, end: int | None, *, whole: bool) -> AbstractContextManager[httpx.Response]:
        headers = {} if whole else {"Range": f"bytes={pos}-{'' if end is None else end}"}
        return self.client.stream("GET", f"blobs/{self.digest}", headers=headers)

    def _body(self, r: httpx.Response, at: list[int], end: int | None) -> None:
        """Read one answer's body into the sink from at[0], moving at[0] on as bytes are written."""
        self.found(r)
        pos = at[0]
        if r.status_code == 206:
            self.content_range(r, pos)
        elif pos and "Range" in r.request.headers:
            raise RegistryUnavailable(
                f"{self.url} broke off blob {self.digest[:23]} at byte {pos} and does not serve ranges "
                f"(HTTP {r.status_code}); retry the fetch"
            )
        elif not pos and end is None and r.headers.get("Content-Length"):
            self.sized.announce(int(r.headers["Content-Length"]))
        limit = None if end is None else end + 1
        for chunk in r.iter_bytes():  # as they arrive
            if self.stop.is_set():
                raise _Stopped
            if limit is not None and at[0] + len(chunk) > limit:
                raise RegistryUnavailable(
                    f"{self.url} answered a request for bytes up to {end} of blob {self.digest[:23]} with more; "
                    f"it serves ranges wrongly: retry, or set PREBAKE_OCI_CHUNK_MB=0 to fetch blobs in one stream"
                )
            self.sink.write_at(at[0], chunk)
            at[0] += len(chunk)
        if limit is not None and at[0] != limit:
            raise httpx.RemoteProtocolError(f"the range ended at byte {at[0]}, not {limit}")  # resumed like a cut

    def found(self, r: httpx.Response) -> None:
        _found(r, self.digest, self.url)

    def content_range(self, r: httpx.Response, pos: int) -> tuple[int, int, int]:
        got = _CONTENT_RANGE.match(r.headers.get("Content-Range", "").strip())
        if got is None or int(got[1]) != pos:
            raise RegistryUnavailable(
                f"{self.url} answered a Range request for blob {self.digest[:23]} from byte {pos} with "
                f"Content-Range {r.headers.get('Content-Range')!r}; it serves ranges wrongly: retry, or set "
                f"PREBAKE_OCI_CHUNK_MB=0 to fetch blobs in one stream"
            )
        return int(got[1]), int(got[2]), int(got[3])


def _found(r: httpx.Response, digest: str, url: str) -> None:
    if r.status_code == 404:
        raise missing(digest, url, url)


__all__ = ["download", "held", "pull_through"]
