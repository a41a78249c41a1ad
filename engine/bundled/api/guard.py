"""What every request passes before a route sees it: the API key, then a bounded body.

    API key     with a key set, every route but the probes needs `Authorization: Bearer <key>`
                (compared in constant time)
    body        at most `max_body_bytes` (413), read within `body_timeout_s` (408), UTF-8 (400),
                read as JSON when unlabelled or labelled a form (`curl -d`)
    all bodies  every body in flight within `max_bodies_bytes` together (503 with Retry-After)

The body is read in full and replayed to the route. A refusal before the body was read drains the
rest (bounded, as nginx's lingering close) so the client gets the answer, not a reset; when the
last large body is given back the C heap is trimmed (malloc_trim).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import hmac
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prebake.engine.bundled.api.errors import error_response

PROBES = frozenset({"/health", "/health/live", "/v1/health/ready", "/v1/health/live", "/ping"})  # app's probe routes


@dataclass(frozen=True)
class GuardSettings:
    api_key: str | None = None
    max_body_bytes: int = 4 << 20
    body_timeout_s: float = 30.0
    max_bodies_bytes: int = 64 << 20  # every request's body in flight, together
    drain_bytes: int = 64 << 20  # read and dropped at most, before a refusal goes out
    drain_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_bodies_bytes < self.max_body_bytes:
            raise ValueError(
                f"max_bodies_bytes ({self.max_bodies_bytes}) is below max_body_bytes ({self.max_body_bytes}): "
                f"no body could ever be taken; raise it to at least the per-request cap"
            )


_TRIM_AFTER = 8 << 20  # bodies this large together leave the heap big: trim it when they are all gone


class Guard:
    """Pure ASGI middleware (no per-request task, so streaming stays untouched)."""

    def __init__(self, app: ASGIApp, settings: GuardSettings):
        self.app, self.settings = app, settings
        self._key = None if settings.api_key is None else f"Bearer {settings.api_key}".encode()
        self._in_flight = 0  # bytes reserved by the bodies of requests in flight (one event loop: no lock)
        self._peak = 0  # the most reserved since the heap was last trimmed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._key is not None and scope["path"] not in PROBES and not self._authorized(scope):
            response = error_response(
                401,
                "missing or wrong API key: send the header `Authorization: Bearer <key>` "
                "with the key the server was started with (--api-key or PREBAKE_API_KEY)",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        reserved = _Reservation(self)
        try:
            body, problem = await self._read_body(scope, receive, reserved)
            if problem is not None:
                await problem(scope, receive, send)
                return
            if body is None:  # the client went away while sending
                return
            await self.app(_as_json(scope), _replay(body, receive), send)
        finally:
            reserved.give_back()

    def _authorized(self, scope: Scope) -> bool:
        assert self._key is not None
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        return hmac.compare_digest(given, self._key)

    async def _read_body(self, scope: Scope, receive: Receive, reserved: _Reservation):
        cap = self.settings.max_body_bytes
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and (not declared.isdigit() or int(declared) > cap):
            return None, await self._refuse(scope, receive, _too_large(cap), int(declared) if declared.isdigit() else 0)
        if declared is not None and not reserved.take(int(declared)):
            return None, await self._refuse(scope, receive, self._busy(), int(declared))
        body = bytearray()
        try:
            async with asyncio.timeout(self.settings.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None, None
                    chunk = message.get("body", b"")
                    body += chunk
                    if len(body) > cap:
                        return None, await self._refuse(scope, receive, _too_large(cap), 0, message)
                    if declared is None and not reserved.take(len(chunk)):
                        return None, await self._refuse(scope, receive, self._busy(), 0, message)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            return None, error_response(
                408, f"the request body did not arrive within {self.settings.body_timeout_s:g} s; send it at once"
            )
        if body and scope["method"] in ("POST", "PUT", "PATCH"):
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as exc:
                return None, error_response(
                    400, f"the request body is not UTF-8 (byte {exc.start}: {exc.reason}); send JSON encoded as UTF-8"
                )
        return bytes(body), None

    async def _refuse(self, scope: Scope, receive: Receive, response, declared: int, last: Message | None = None):
        """`response`, with `Connection: close`, once the rest of the body has been read and dropped, so a
        client that sends its whole body before reading gets the answer, not a reset."""
        response.headers["Connection"] = "close"
        expects = any(k == b"expect" and v.lower() == b"100-continue" for k, v in scope["headers"])
        if expects or declared > self.settings.drain_bytes or (last is not None and not last.get("more_body")):
            return response  # nothing sent yet (100-continue), too much to read, or nothing left
        drained = 0
        try:
            async with asyncio.timeout(self.settings.drain_s):
                while drained <= self.settings.drain_bytes:
                    message = await receive()
                    drained += len(message.get("body", b""))
                    if message["type"] == "http.disconnect" or not message.get("more_body", False):
                        break
        except TimeoutError:  # a client that keeps sending: refuse now, as nginx does after lingering_time
            pass
        return response

    def _busy(self):
        return error_response(
            503,
            f"the server is receiving {self.settings.max_bodies_bytes >> 20} MiB of request bodies already, "
            f"its bound for all requests together; retry in a moment",
            headers={"Retry-After": "1"},
        )

    def _reserve(self, n: int) -> bool:
        if self._in_flight + n > self.settings.max_bodies_bytes:
            return False
        self._in_flight += n
        self._peak = max(self._peak, self._in_flight)
        return True

    def _give_back(self, n: int) -> None:
        self._in_flight -= n
        if self._in_flight == 0 and self._peak >= _TRIM_AFTER:
            self._peak = 0
            trim_heap()


class _Reservation:
    """The bytes one request's body holds of the guard's bound, given back once it is answered."""

    def __init__(self, guard: Guard):
        self.guard, self.bytes = guard, 0

    def take(self, n: int) -> bool:
        if not self.guard._reserve(n):
            return False
        self.bytes += n
        return True

    def give_back(self) -> None:
        if self.bytes:
            self.guard._give_back(self.bytes)
            self.bytes = 0


def trim_heap() -> None:
    """Hand freed heap pages back to the kernel (glibc); elsewhere a no-op."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _load_libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


_LIBC = _load_libc()


_FORM = b"application/x-www-form-urlencoded"


def _as_json(scope: Scope) -> Scope:
    """Every body this API takes is JSON: one sent unlabelled, or labelled a form as `curl -d` does, is read as JSON."""
    if scope["method"] != "POST":
        return scope
    kind = next((v for k, v in scope["headers"] if k == b"content-type"), None)
    if kind is not None and not kind.startswith(_FORM):
        return scope
    headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"] + [(b"content-type", b"application/json")]
    return {**scope, "headers": headers}


def _too_large(cap: int):
    return error_response(413, f"the request body is larger than {cap} bytes; send a shorter prompt")


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
