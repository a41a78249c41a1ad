"""Abandoned requests stop: clients that hang up (a time-out, a retry) free the engine within a
step or two, streamed or not, and what they left queued is never started."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.support.serving import metric

PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def server(baked, tmp_path_factory):
    served = baked.serve(tmp_path_factory.mktemp("abandoned") / "home")
    served.wait_ready(300)
    yield served
    served.stop()


def _steps(server, phase: str = "") -> float:
    status, text = server.get("/metrics")
    assert status == 200
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("prebake_steps_total{") and f'shape="{phase}' in line
    )


def _send(server, body: dict, path: str = "/v1/completions") -> socket.socket:
    """A client that sends its request and then never reads the answer."""
    raw = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
    sock.sendall(head.encode() + raw)
    return sock


def _settled(server, timeout: float = 30) -> float:
    """The step count once it stops moving (two reads half a second apart agree)."""
    deadline = time.monotonic() + timeout
    last = _steps(server)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _steps(server)
        if now == last:
            return now
        last = now
    raise AssertionError(f"the engine kept stepping {timeout:.0f} s after every client left")


def _abandon(server, stream: bool, chat: bool = False) -> tuple[float, float, float]:
    """Six long requests (n=16 x 120 tokens: minutes of work), hung up once the engine is busy on them;
    (steps while they ran, steps after they left, prefills after they left)."""
    body: dict = {"max_tokens": 120, "n": 16, "temperature": 1.0, "seed": 7, "stream": stream}
    if chat:  # the template's tokens count against max_model_len too
        body |= {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 64}
    else:
        body["prompt"] = PROMPT
    start = _settled(server)
    clients = [_send(server, body, "/v1/chat/completions" if chat else "/v1/completions") for _ in range(6)]
    deadline = time.monotonic() + 60
    while _steps(server) < start + 10:
        assert time.monotonic() < deadline, "the requests never started"
        time.sleep(0.05)
    for sock in clients:
        sock.close()
    left, prefills = _steps(server), _steps(server, "prefill")
    after = _settled(server)
    return left - start, after - left, _steps(server, "prefill") - prefills


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_clients_that_hang_up_free_the_engine_within_a_step_or_two(server, stream):
    ran, after, prefills = _abandon(server, stream)
    full = 6 * 16 * 120 / 4  # every choice's 120 tokens, four rows a step
    assert after < 0.02 * full, f"{after:.0f} steps after the clients left ({ran:.0f} before; all of it is {full:.0f})"
    assert prefills <= 1, "a request whose client was gone was started"
    started = time.monotonic()
    fresh = server.complete(prompt=PROMPT, max_tokens=8, temperature=0)
    assert len(fresh["choices"][0]["token_ids"]) == 8
    assert time.monotonic() - started < 30  # not behind an abandoned queue


def test_a_chat_client_that_hangs_up_is_stopped_too(server):
    ran, after, prefills = _abandon(server, stream=False, chat=True)
    assert after < 0.02 * (6 * 16 * 120 / 4) and prefills <= 1, (ran, after, prefills)


def test_cancelled_requests_are_counted_as_cancelled(server):
    status, text = server.get("/metrics")
    assert metric(text, 'prebake_requests_total{outcome="cancelled"}') >= 1
