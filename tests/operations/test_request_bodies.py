"""Memory is bounded in aggregate: the bodies being received at once have one bound (503 past it),
and a refusal sent before a body was read reaches a client that sends its whole body first."""

from __future__ import annotations

import json
import socket
import threading

import pytest

CAP = 4 << 20  # the per-request body cap `prebake serve` runs with


@pytest.fixture(scope="module")
def server(baked, tmp_path_factory):
    served = baked.serve(tmp_path_factory.mktemp("bodies") / "home")
    served.wait_ready(300)
    yield served
    served.stop()


def _status(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body of the answer on `sock` (which the server closes after it)."""
    sock.settimeout(60)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def _head(server, length: int | None, extra: str = "") -> bytes:
    size = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{size}{extra}\r\n".encode()


def test_a_body_over_the_cap_sent_whole_before_reading_gets_a_413_it_can_read(server):
    body = b"x" * (20 << 20)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(_head(server, len(body)) + body)  # all of it, then read: as curl and most clients do
        status, headers, answer = _status(sock)
    assert status == 413 and headers.get("connection") == "close"
    assert "larger than 4194304 bytes" in json.loads(answer)["error"]["message"]


def test_a_chunked_body_over_the_cap_gets_a_413_it_can_read_too(server):
    piece = b"y" * (1 << 20)
    chunks = b"".join(b"%x\r\n" % len(piece) + piece + b"\r\n" for _ in range(8)) + b"0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(_head(server, None) + chunks)
        status, _, answer = _status(sock)
    assert status == 413, answer


def test_bodies_past_the_aggregate_bound_get_503_and_their_bytes_come_back(server):
    parked = []
    for _ in range(100):  # uploads parked just below the cap: all but their last byte sent
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(_head(server, CAP - 1))
        parked.append(sock)
    payload = b" " * (CAP - 2)
    senders = [threading.Thread(target=s.sendall, args=(payload,)) for s in parked]
    for t in senders:
        t.start()
    for t in senders:
        t.join(120)
    answers: list[tuple[int, dict[str, str]]] = []
    readers = [threading.Thread(target=lambda s=s: answers.append(_status(s)[:2])) for s in parked[16:]]
    for t in readers:
        t.start()
    for t in readers:
        t.join(120)
    busy = [headers for status, headers in answers if status == 503]
    assert len(busy) >= 100 - 16 - 1, [s for s, _ in answers]  # 64 MiB hold 16 bodies of 4 MiB at most
    assert all(h.get("retry-after") == "1" and h.get("connection") == "close" for h in busy)
    for sock in parked:
        sock.close()
    # every reservation came back: a full-size body is read again (and refused by the schema, not by the bound)
    status, answer = server.post("/v1/completions", b'{"prompt": "' + b"a" * (CAP - 64) + b'"}')
    assert status == 400, answer
    assert server.complete(prompt=[1, 2, 3], max_tokens=2, temperature=0)["choices"][0]["token_ids"]
