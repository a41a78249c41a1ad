"""HTTP care the remote backends share: Retry-After, backoff, bounded bodies, slow servers.

May touch the responses and exceptions handed to it, the clock and threads it starts; no backend.
A 429 or 5xx is transient (TRANSIENT): asked again with jittered exponential backoff, or after
as long as its Retry-After asks (seconds or an HTTP date, at most MAX_RETRY_AFTER_S). A body is
read to a bound in bytes and in time (Bound), never on past it. A call that blocks out of sight
(a download into another library's cache) runs in a thread while the consumer's time box ticks.
Redirects and token renewal stay with each client: huggingface_hub owns the Hub's, the OCI client
answers the distribution token spec's challenges; the two share no shape there.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from typing import Protocol, TypeVar

from prebake.artifacts.errors import BundleError

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_RETRY_AFTER_S = 60.0  # a Retry-After above this is waited for this long, then asked again
TRANSIENT = frozenset({429, 500, 502, 503, 504})  # answers worth asking again


def retry_after_s(value: str) -> float:
    """The seconds a 429 or 503 asks the client to wait (Retry-After: seconds or an HTTP date), at most
    MAX_RETRY_AFTER_S; 0 when it asks nothing. The caller's time box still ends a fetch that waits too long."""
    value = value.strip()
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = (email.utils.parsedate_to_datetime(value) - dt.datetime.now(dt.UTC)).total_seconds()
        except (TypeError, ValueError):
            return 0.0
    return max(0.0, min(seconds, MAX_RETRY_AFTER_S))


def pause(attempt: int, at_least: float = 0.0) -> None:
    """Sleep before attempt `attempt + 1`: jittered exponential backoff (0.1 s doubling, at most 2 s),
    or `at_least` (what a Retry-After asked) when that is longer."""
    time.sleep(max(at_least, min(0.1 * 2**attempt, 2.0) * (0.5 + random.random() / 2)))


def causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every exception behind it (its cause, else its context), outermost first."""
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def asked_wait(exc: BaseException) -> tuple[int, float]:
    """The status of the HTTP answer behind `exc` (a library may wrap it in its own errors) and, for a
    429 or 503, how long its Retry-After asks to wait; (0, 0.0) when no answer is behind it."""
    for seen in causes(exc):
        response = getattr(seen, "response", None)
        if response is not None and hasattr(response, "status_code"):
            status = int(response.status_code)
            return status, retry_after_s(response.headers.get("Retry-After", "")) if status in (429, 503) else 0.0
    return 0, 0.0


def as_asked(call: Callable[[], T], *, attempts: int) -> T:
    """`call`, asked again (at most `attempts` times in all) after as long as a 429 or 503 behind its
    error asks with Retry-After; any other error, or one that asks nothing, is raised at once."""
    for attempt in range(attempts):
        try:
            return call()
        except Exception as exc:
            status, wait_s = asked_wait(exc)
            if not wait_s or attempt == attempts - 1:
                raise
            log.warning("HTTP %s asked to retry after %.0f s: waiting", status, wait_s)
            time.sleep(wait_s)
    raise AssertionError("unreachable")


class Bound:
    """Counts a body's bytes as they come: past `limit` bytes, or past `within_s` seconds, it raises
    `error` (a BundleError: the answer is refused, not retried)."""

    def __init__(
        self, limit: int, where: str, *, within_s: float | None = None, error: type[BundleError] = BundleError
    ):
        self.limit, self.where, self.within_s, self.error, self.seen = limit, where, within_s, error, 0
        self.deadline = None if within_s is None else time.monotonic() + within_s

    def announce(self, declared: str) -> None:
        """A Content-Length over the bound is refused before a byte is read."""
        if declared.isdigit() and int(declared) > self.limit:
            raise self.error(f"{self.where} is over {self.limit} bytes; no prebake answer is: refusing it")

    def add(self, n: int) -> None:
        self.seen += n
        late = self.deadline is not None and time.monotonic() > self.deadline
        if self.seen > self.limit or late:
            within = f" or for over {self.within_s:g} s" if self.within_s is not None else ""
            raise self.error(f"{self.where} sent over {self.limit} bytes{within}: refusing it")


class _Streamed(Protocol):
    @property
    def headers(self) -> Mapping[str, str]: ...

    def iter_bytes(self, chunk_size: int | None = None) -> Iterator[bytes]: ...


def read_bounded(response: _Streamed, bound: Bound) -> bytes:
    """A streamed body, read whole within `bound` (its Content-Length checked first)."""
    bound.announce(response.headers.get("Content-Length") or "")
    chunks = []
    for chunk in response.iter_bytes(1 << 20):
        bound.add(len(chunk))
        chunks.append(chunk)
    return b"".join(chunks)


def ticking(call: Callable[[], T], tee: Callable[[bytes], None] | None) -> T:
    """`call` (a download prebake sees no byte of until it ends) in a daemon thread, `tee` called with no
    bytes every quarter second meanwhile, so the consumer's time box ends the wait. An abandoned call
    ends with the process."""
    if tee is None:
        return call()
    done: Future[T] = Future()

    def run() -> None:
        try:
            done.set_result(call())
        except BaseException as exc:
            done.set_exception(exc)

    threading.Thread(target=run, name="prebake-http-call", daemon=True).start()
    while True:
        try:
            return done.result(timeout=0.25)
        except TimeoutError:
            tee(b"")


__all__ = [
    "MAX_RETRY_AFTER_S",
    "TRANSIENT",
    "Bound",
    "as_asked",
    "asked_wait",
    "causes",
    "pause",
    "read_bounded",
    "retry_after_s",
    "ticking",
]
