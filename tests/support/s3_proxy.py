"""An HTTP proxy in front of an S3 server that plays a server without conditional writes.

Every request is forwarded unchanged, except a PUT carrying If-None-Match, which is answered
501 NotImplemented with S3's error body, as S3-compatible servers that lack the feature do.
It lets the tests drive the S3 backend's fallback path through real HTTP.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_NOT_IMPLEMENTED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NotImplemented</Code>'
    b"<Message>A header you provided implies functionality that is not implemented</Message>"
    b"<Header>If-None-Match</Header></Error>"
)
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


@contextmanager
def without_conditional_writes(upstream: str) -> Iterator[str]:
    """Yield the endpoint of a proxy to `upstream` that refuses If-None-Match with 501."""
    target = urlsplit(upstream)
    handler = type("Handler", (_Handler,), {"upstream": (target.hostname, target.port)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="s3-no-conditional", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _Handler(BaseHTTPRequestHandler):
    upstream: tuple[str, int]
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_PUT(self) -> None:
        if "If-None-Match" in self.headers:
            self._read_body()
            self._reply(501, {"Content-Type": "application/xml"}, _NOT_IMPLEMENTED)
        else:
            self._forward()

    def do_GET(self) -> None:
        self._forward()

    def do_HEAD(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def do_DELETE(self) -> None:
        self._forward()

    def _read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self) -> None:
        body = self._read_body()
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            self._reply(
                resp.status,
                {k: v for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP},
                data,
                length=resp.getheader("Content-Length"),
            )
        finally:
            conn.close()

    def _reply(self, status: int, headers: dict[str, str], data: bytes, length: str | None = None) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        # A HEAD answer announces the object's length without sending it.
        self.send_header("Content-Length", length if self.command == "HEAD" and length else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
