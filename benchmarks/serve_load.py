"""Load and bad input against the prebaked bundled engine, on loopback, bounded in time.

    python benchmarks/serve_load.py [--model tiny-llama] [--precision fp32] [--clients 32]
                                    [--duration 20] [--registry DIR] [--work DIR]

One `prebake serve` started from the recipe's bundles (a start with --write-back bakes them first
when --registry lacks them; "prebaked" says the measured engine compiled nothing), then:

    one-by-one   each reference request alone: the tokens every later answer must equal
    load         --clients concurrent clients (half streaming) for --duration seconds: errors,
                 answers that differ, p50/p99 time to first token and latency, tokens/s, and
                 the batching gain over one-by-one (at most max_num_seqs)
    bad input    malformed, mistyped and oversized bodies, non-UTF-8, a slow sender and a
                 client gone mid-stream: each its 4xx (the slow one its 200), never a 5xx;
                 then /health must be 200 and a reference request get the same tokens

The last line of output is the figures as one JSON object (docs/http-api.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
PREBAKE = Path(sys.executable).parent / "prebake"
MAX_TOKENS = 16


@dataclass
class Result:
    ok: bool
    ttft_s: float
    latency_s: float
    tokens: int
    same: bool
    streamed: bool = False


def main() -> None:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--clients", type=positive_int, default=32)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load (default 20)")
    parser.add_argument("--registry", type=Path, help="a registry holding the recipe's bundles (else baked first)")
    parser.add_argument("--work", type=Path, help="working folder (default: a new temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="prebake-serve-load-"))
    registry = args.registry or work / "registry"
    registry.mkdir(parents=True, exist_ok=True)
    # a start with --write-back: quick when the registry holds this build's bundles, the bake when not
    print(f"making sure {registry} holds {args.model} {args.precision}'s bundles (a start with --write-back) ...")
    with Server(work / "bake", args, registry, ["--write-back"]) as bake:
        compiled = "prebake serve: compile:" in bake.log.read_text()
    print("  baked by compiling in place" if compiled else "  they were there", flush=True)
    with Server(work / "serve", args, registry, []) as server:
        prebaked = "prebake serve: compile:" not in server.log.read_text()
        figures = asyncio.run(run_rounds(server.port, args))
    print(json.dumps({**figures, "prebaked": prebaked}, sort_keys=True))


class Server:
    """`prebake serve` from the registry, its log in a file, stopped by its process id."""

    def __init__(self, home: Path, args, registry: Path, extra: list[str]):
        home.mkdir(parents=True, exist_ok=True)
        self.log = home / "serve.log"  # beside the store (home/store), which holds only what prebake makes
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")}
        # the benchmark is its registry's builder: a write-back goes to the index, not to quarantine
        env.update(PREBAKE_HOME=str(home / "store"), PREBAKE_TRUSTED_KEYS="", PREBAKE_WRITE_BACK="index")
        cmd = [str(PREBAKE), "serve", "--model", args.model, "--precision", args.precision, "--port", "0"]
        cmd += ["--registry", str(registry), *extra]
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=self._out, stderr=subprocess.STDOUT)
        self.port = 0

    def __enter__(self) -> Server:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"prebake serve exited {self.proc.returncode}:\n{self.log.read_text()}")
            text = self.log.read_text()
            if not self.port and (m := re.search(r"listening on http://[^:]+:(\d+)", text)):
                self.port = int(m[1])
            if self.port and "prebake serve: ready:" in text:
                return self
            time.sleep(0.1)
        raise SystemExit(f"prebake serve was not ready in time; its log is {self.log}")

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)
        self._out.close()


def reference_bodies() -> list[dict]:
    """Greedy requests over a spread of prompt lengths: their answers do not depend on batching."""
    return [
        {"prompt": [(7 * i + j) % 1000 + 1 for j in range(4 + (i % 5) * 6)], "max_tokens": MAX_TOKENS, "temperature": 0}
        for i in range(16)
    ] + [
        {"prompt": f"request {i}: tell me about bundles", "max_tokens": MAX_TOKENS, "temperature": 0} for i in range(8)
    ]


async def run_rounds(port: int, args) -> dict:
    base = f"http://127.0.0.1:{port}"
    bodies = reference_bodies()
    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=args.clients + 8)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        started = time.perf_counter()
        reference = [await _tokens(client, b) for b in bodies]
        alone_s = time.perf_counter() - started
        alone_tps = sum(len(a.tokens) for a in reference) / alone_s
        print(f"one-by-one: {len(bodies)} requests, {alone_tps:.1f} tokens/s", flush=True)
        started = time.perf_counter()
        results = await _load(client, bodies, reference, args)
        load_s = time.perf_counter() - started
        bad = await _bad_input(client, port, bodies[0], reference[0])
    ok = [r for r in results if r.ok]
    tokens = sum(r.tokens for r in ok)
    load_tps = tokens / load_s  # to the last answer, past the deadline by the requests still running then
    figures = {
        "clients": args.clients,
        "duration_s": args.duration,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "mismatches": sum(not r.same for r in ok),
        "ttft_p50_ms": _ms(_pct([r.ttft_s for r in ok if r.streamed], 50)),
        "ttft_p99_ms": _ms(_pct([r.ttft_s for r in ok if r.streamed], 99)),
        "latency_p50_ms": _ms(_pct([r.latency_s for r in ok], 50)),
        "latency_p99_ms": _ms(_pct([r.latency_s for r in ok], 99)),
        "tokens_per_s": round(load_tps, 1),
        "one_by_one_tokens_per_s": round(alone_tps, 1),
        "batching_gain": round(load_tps / alone_tps, 2),
        **bad,
    }
    print(
        f"load: {figures['requests']} requests, {figures['errors']} errors, {figures['mismatches']} mismatches, "
        f"TTFT p50 {figures['ttft_p50_ms']} ms p99 {figures['ttft_p99_ms']} ms, latency p50 "
        f"{figures['latency_p50_ms']} ms p99 {figures['latency_p99_ms']} ms, {figures['tokens_per_s']} tokens/s "
        f"({figures['batching_gain']}x one-by-one)",
        flush=True,
    )
    print(
        f"bad input: {bad['bad_cases']} cases, {bad['bad_unexpected']} unexpected answers; after it /health "
        f"{bad['health_after']}, same tokens as before: {bad['same_after']}",
        flush=True,
    )
    return figures


@dataclass(frozen=True)
class Answer:
    tokens: list[int]
    text: str


async def _tokens(client: httpx.AsyncClient, body: dict) -> Answer:
    response = await client.post("/v1/completions", json=body)
    response.raise_for_status()
    choice = response.json()["choices"][0]
    return Answer(choice["token_ids"], choice["text"])


async def _load(client: httpx.AsyncClient, bodies: list[dict], reference: list[Answer], args) -> list[Result]:
    deadline = time.perf_counter() + args.duration
    results: list[Result] = []

    async def one_client(c: int) -> None:
        i = c
        while time.perf_counter() < deadline:
            k = i % len(bodies)
            call = _streamed if c % 2 else _whole
            results.append(await call(client, bodies[k], reference[k]))
            i += args.clients

    await asyncio.gather(*(one_client(c) for c in range(args.clients)))
    return results


async def _whole(client: httpx.AsyncClient, body: dict, expected: Answer) -> Result:
    started = time.perf_counter()
    try:
        response = await client.post("/v1/completions", json=body)
        took = time.perf_counter() - started
        if response.status_code != 200:
            return Result(False, took, took, 0, False)
        tokens = response.json()["choices"][0]["token_ids"]
        return Result(True, took, took, len(tokens), tokens == expected.tokens)
    except httpx.HTTPError:
        return Result(False, 0, 0, 0, False)


async def _streamed(client: httpx.AsyncClient, body: dict, expected: Answer) -> Result:
    started, first, text, usage = time.perf_counter(), None, [], None
    try:
        async with client.stream(
            "POST", "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
        ) as response:
            if response.status_code != 200:
                return Result(False, 0, 0, 0, False)
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return Result(False, 0, 0, 0, False)
                if chunk["choices"]:
                    first = first or time.perf_counter()
                    text.append(chunk["choices"][0]["text"])
                if chunk.get("usage"):
                    usage = chunk["usage"]
    except httpx.HTTPError:
        return Result(False, 0, 0, 0, False)
    done = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else 0
    same = "".join(text) == expected.text and tokens == len(expected.tokens)
    return Result(usage is not None, (first or done) - started, done - started, tokens, same, streamed=True)


async def _bad_input(client: httpx.AsyncClient, port: int, body: dict, expected: Answer) -> dict:
    """Every bad input once: (what, status it got, statuses that are right)."""
    cases: list[tuple[str, int, set[int]]] = []
    raw = [
        ("malformed JSON", b"{not json"),
        ("not an object", b"[1, 2]"),
        ("wrong type", b'{"prompt": "hi", "max_tokens": "many"}'),
        ("unknown field", b'{"prompt": "hi", "max_tokns": 3}'),
        ("negative max_tokens", b'{"prompt": "hi", "max_tokens": -5}'),
        ("huge max_tokens", b'{"prompt": "hi", "max_tokens": 1000000000000}'),
        ("prompt past the limits", json.dumps({"prompt": list(range(1, 400)), "max_tokens": 1}).encode()),
        ("body past the cap", b'{"prompt": "' + b"a" * (5 << 20) + b'"}'),
        ("non-UTF-8", b'{"prompt": "\xff\xfe"}'),
        ("lone surrogate", b'{"prompt": "\\ud800"}'),
    ]
    for what, data in raw:
        for path in ("/v1/completions", "/v1/chat/completions"):
            status = await _status(client.post(path, content=data, headers={"Content-Type": "application/json"}))
            cases.append((f"{what} {path}", status, {400, 404, 413, 422}))
    cases.append(("slow body", await asyncio.to_thread(_slow_body, port, body), {200}))
    cases.append(("disconnect mid-stream", await asyncio.to_thread(_disconnect_mid_stream, port, body), {200}))
    unexpected = [(what, status) for what, status, right in cases if status not in right]
    for what, status in unexpected:
        print(f"  unexpected: {what}: {status}", flush=True)
    health = (await client.get("/health")).status_code
    same = await _tokens(client, body) == expected
    return {
        "bad_cases": len(cases),
        "bad_unexpected": len(unexpected),
        "health_after": health,
        "same_after": same,
    }


async def _status(request) -> int:
    try:
        return (await request).status_code
    except httpx.HTTPError:
        return 0  # a dropped connection: never right


def _slow_body(port: int, body: dict) -> int:
    """Send the body in ten pieces over two seconds, as a client on a bad link would."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        )
        step = max(1, len(data) // 10)
        for i in range(0, len(data), step):
            sock.sendall(data[i : i + step])
            time.sleep(0.2)
        return _status_line(sock)


def _disconnect_mid_stream(port: int, body: dict) -> int:
    data = json.dumps({**body, "stream": True, "max_tokens": 64, "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        return _status_line(sock)  # then close with the stream still running


def _status_line(sock: socket.socket) -> int:
    head = sock.recv(64)
    match = re.match(rb"HTTP/1\.1 (\d{3})", head)
    return int(match[1]) if match else 0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[min(98, int(q) - 1)]


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 1)


if __name__ == "__main__":
    main()
