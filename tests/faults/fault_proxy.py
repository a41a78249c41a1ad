"""An HTTP proxy in front of a real S3, Hub or OCI server that injects the faults of a bad network or server.

    with fault_proxy(moto_endpoint) as proxy:      # proxy.url: point AWS_ENDPOINT_URL here
        proxy.inject(Fault("GET", "/blobs/", "corrupt"))
        ...                                         # boto3 talks real HTTP through it
        proxy.count("GET", "/blobs/")               # how many requests reached it

Requests pass through unchanged unless a fault matches (method and a piece of the path); the
faults are listed on `Fault`. Every request is logged (with its Authorization header), and the
bytes of each GET body sent so far are counted, so a test can assert "downloaded once" or wait
until a download is half done.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}
_NOT_IMPLEMENTED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NotImplemented</Code>'
    b"<Message>A header you provided implies functionality that is not implemented</Message>"
    b"<Header>If-None-Match</Header></Error>"
)
_INTERNAL_ERROR = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)


@dataclass(frozen=True)
class Fault:
    """One fault: requests whose method is `method` and whose path contains `path_contains` get `kind`:

    error500   answer 500 InternalError, as an overloaded S3 does (clients retry, then give up)
    slow       wait `seconds` before answering, longer than the client's read timeout
    cut        GET: send the announced length's first half, then drop the connection
               PUT: read half the upload, then drop the connection without an answer
    short      GET: serve the first half as if it were the whole object
    corrupt    GET: flip one byte in the middle: same length, wrong bytes
               (both drop the x-amz-checksum-* headers, as a server without checksums sends
               none, so only prebake's own sha256 stands between the bytes and the store)
    corrupt+checksum  GET: flip one byte but keep the server's checksum headers (botocore checks them)
    throttle   GET: send the body in 4 KiB pieces, `seconds` apart (a test kills the reader mid-way)
    no-conditional  PUT with If-None-Match: answer 501 NotImplemented, as S3-compatible servers
               without conditional writes do (every other request passes)
    ignore-range  GET: forward it without its Range header, as a server or mirror that ignores
               ranges does (a 200 with the whole body)
    busy429, busy503  answer 429 Too Many Requests (or 503) with `Retry-After: <seconds>`, as a
               rate-limited registry does
    huge200, huge500  answer 200 (or 500) with a body that never ends (no Content-Length: until the
               client hangs up, at most 1 GiB), as a hostile or broken server may
    bearer401  answer a request without Authorization 401 with a Bearer challenge whose token realm
               is this proxy's /token (inject a fault on "/token" to make the token service misbehave)
    basic401   answer a request without Authorization 401 with a Basic challenge, as a registry with
               logins does (the client then sends its login on every request)
    expired401 forward the request without its Authorization, so the registry behind answers as it
               does to an expired token: 401 with its Bearer challenge (its token service is real)
    redirect   answer 307 to `to` + the request's path, as distribution and Harbor send blob GETs to
               object storage (`to`: another proxy, whose log says which headers arrived there)

    Body faults apply to whole answers (200); `partial=True` applies them to 206 answers to Range
    requests too. `times=n` applies a fault to the first n requests it matches only (0: all of them);
    `after=n` lets the first n matching requests pass untouched before it applies.
    """

    method: str  # "GET", "PUT", "HEAD", or "*"
    path_contains: str  # e.g. "/blobs/" or "/index/"
    kind: str  # one of the kinds above
    seconds: float = 0.0  # slow: delay; throttle: pause between pieces
    partial: bool = False  # body faults also on 206 answers to Range requests
    times: int = 0  # the first `times` matching requests only; 0: every one
    after: int = 0  # let this many matching requests pass before the fault applies
    to: str = ""  # redirect: the base URL the answer points at

    def matches(self, method: str, path: str) -> bool:
        return self.method in ("*", method) and self.path_contains in path


class FaultProxy:
    """The proxy's state, shared with its handler threads."""

    def __init__(self, upstream: str):
        target = urlsplit(upstream)
        self.upstream = (target.hostname, target.port)
        self.url = ""
        self._faults: list[Fault] = []
        self._log: list[tuple[str, str, int, float]] = []  # method, path, status, time.monotonic() when answered
        self._sent: dict[str, int] = {}
        self._used: dict[int, int] = {}  # index in _faults -> requests it was applied to
        self._seen: dict[int, int] = {}  # index in _faults -> requests it matched, applied or not
        self._credentials: list[tuple[str, str, str]] = []  # method, path, Authorization ("" if none)
        self._lock = threading.Lock()

    def inject(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self._used.clear()
            self._seen.clear()

    def count(self, method: str, path_contains: str) -> int:
        with self._lock:
            return sum(1 for m, p, _s, _t in self._log if m == method and path_contains in p)

    def bytes_sent(self, path_contains: str) -> int:
        with self._lock:
            return sum(n for p, n in self._sent.items() if path_contains in p)

    def statuses(self, method: str, path_contains: str) -> list[int]:
        with self._lock:
            return [s for m, p, s, _t in self._log if m == method and path_contains in p]

    def answered_at(self, method: str, path_contains: str) -> list[float]:
        """When each matching request was answered (time.monotonic()), in order."""
        with self._lock:
            return [t for m, p, _s, t in self._log if m == method and path_contains in p]

    def credentials(self, method: str, path_contains: str) -> list[str]:
        """The Authorization header of each matching request as it arrived here ("" when it had none)."""
        with self._lock:
            return [a for m, p, a in self._credentials if m == method and path_contains in p]

    def _fault_for(self, method: str, path: str, authorization: str) -> Fault | None:
        with self._lock:
            self._credentials.append((method, path, authorization))
            for i, f in enumerate(self._faults):
                if not f.matches(method, path):
                    continue
                self._seen[i] = self._seen.get(i, 0) + 1
                if self._seen[i] > f.after and (not f.times or self._used.get(i, 0) < f.times):
                    self._used[i] = self._used.get(i, 0) + 1
                    return f
            return None

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self._log.append((method, path, status, time.monotonic()))

    def _add_sent(self, path: str, n: int) -> None:
        with self._lock:
            self._sent[path] = self._sent.get(path, 0) + n


@contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream)
    handler = type("Handler", (_Handler,), {"proxy": proxy})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    proxy.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fault-proxy", daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.clear()
        server.shutdown()
        server.server_close()


class _Handler(BaseHTTPRequestHandler):
    proxy: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _handle(self) -> None:
        fault = self.proxy._fault_for(self.command, self.path, self.headers.get("Authorization", ""))
        length = int(self.headers.get("Content-Length") or 0)
        if fault is not None and fault.kind == "cut" and self.command == "PUT":
            self.rfile.read(length // 2)
            self.proxy._record(self.command, self.path, 0)
            self._drop()
            return
        body = self.rfile.read(length)
        if fault is not None and fault.kind == "slow":
            time.sleep(fault.seconds)
        if fault is not None and fault.kind == "no-conditional" and "If-None-Match" in self.headers:
            self.proxy._record(self.command, self.path, 501)
            self._reply(501, {"Content-Type": "application/xml"}, _NOT_IMPLEMENTED)
            return
        if fault is not None and fault.kind in ("busy429", "busy503"):
            status = int(fault.kind.removeprefix("busy"))
            self.proxy._record(self.command, self.path, status)
            self._reply(status, {"Retry-After": f"{fault.seconds:g}", "Content-Type": "application/json"}, b"{}")
            return
        if fault is not None and fault.kind == "bearer401" and "Authorization" not in self.headers:
            self.proxy._record(self.command, self.path, 401)
            challenge = f'Bearer realm="{self.proxy.url}/token",service="fault-proxy"'
            self._reply(401, {"WWW-Authenticate": challenge, "Content-Type": "application/json"}, b"{}")
            return
        if fault is not None and fault.kind == "basic401" and "Authorization" not in self.headers:
            self.proxy._record(self.command, self.path, 401)
            self._reply(
                401, {"WWW-Authenticate": 'Basic realm="fault-proxy"', "Content-Type": "application/json"}, b"{}"
            )
            return
        if fault is not None and fault.kind == "redirect":
            self.proxy._record(self.command, self.path, 307)
            self._reply(307, {"Location": f"{fault.to}{self.path}", "Content-Type": "text/plain"}, b"")
            return
        if fault is not None and fault.kind in ("huge200", "huge500"):
            self.proxy._record(self.command, self.path, int(fault.kind.removeprefix("huge")))
            self._endless(int(fault.kind.removeprefix("huge")))
            return
        if fault is not None and fault.kind == "error500":
            self.proxy._record(self.command, self.path, 500)
            self._reply(500, {"Content-Type": "application/xml"}, _INTERNAL_ERROR)
            return
        try:
            status, headers, data = self._forward(
                body,
                drop_range=fault is not None and fault.kind == "ignore-range",
                drop_login=fault is not None and fault.kind == "expired401",
            )
        except OSError:  # the server is gone (a test ended while a slow answer was pending)
            self._drop()
            return
        self.proxy._record(self.command, self.path, status)
        if fault is None or self.command != "GET" or status not in ((200, 206) if fault.partial else (200,)):
            self._reply(status, headers, data, length=headers.pop("__length", None))
            return
        self._faulty_body(fault, status, headers, data)

    def _forward(
        self, body: bytes, *, drop_range: bool = False, drop_login: bool = False
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(*self.proxy.upstream, timeout=60)
        dropped = _HOP_BY_HOP | ({"range"} if drop_range else set()) | ({"authorization"} if drop_login else set())
        try:
            headers: dict[str, str] = {}
            for k, v in self.headers.items():  # a repeated header (Go clients send Accept once per type) is kept whole
                if k.lower() not in dropped:
                    headers[k] = f"{headers[k]}, {v}" if k in headers else v
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            out = {k: v for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP}
            if self.command == "HEAD" and resp.getheader("Content-Length"):
                out["__length"] = resp.getheader("Content-Length")
            return resp.status, out, data
        finally:
            conn.close()

    def _faulty_body(self, fault: Fault, status: int, headers: dict[str, str], data: bytes) -> None:
        if fault.kind in ("short", "corrupt"):
            headers = {k: v for k, v in headers.items() if not k.lower().startswith("x-amz-checksum")}
        if fault.kind == "short":
            self._reply(status, headers, data[: len(data) // 2])
        elif fault.kind in ("corrupt", "corrupt+checksum"):
            bad = bytearray(data)
            bad[len(bad) // 2] ^= 0xFF
            self._reply(status, headers, bytes(bad))
        elif fault.kind == "cut":
            self._head(status, headers, len(data))
            self._send(data[: len(data) // 2])
            self._drop()
        elif fault.kind == "throttle":
            self._head(status, headers, len(data))
            for i in range(0, len(data), 4096):
                self._send(data[i : i + 4096])
                time.sleep(fault.seconds)
        else:
            self._reply(status, headers, data)

    def _reply(self, status: int, headers: dict[str, str], data: bytes, length: str | None = None) -> None:
        self._head(status, headers, int(length) if self.command == "HEAD" and length else len(data))
        if self.command != "HEAD":
            self._send(data)

    def _head(self, status: int, headers: dict[str, str], length: int) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def _send(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()
        self.proxy._add_sent(self.path, len(data))

    def _endless(self, status: int) -> None:
        """A body without a length, sent until the client hangs up (or 1 GiB): what a bound must stop."""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        piece = b'{"tags": [' + b'"x",' * 16383
        try:
            while self.proxy.bytes_sent(self.path) < 1 << 30:
                self._send(piece)
        except OSError:  # the client hung up: the bound did its work
            pass

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(2)
        except OSError:
            pass
