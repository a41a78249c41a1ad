"""Memory of `prebake serve` under parked uploads: the aggregate body bound, and memory given back.

One eager `prebake serve` (a small recipe; buckets and autotune built in place, no torch.compile),
then:

    baseline   its resident memory (VmRSS) once ready
    parked     --uploads clients each send a body just below the 4 MiB cap but its last byte,
               and wait: the server holds what it reads of them. Peak VmRSS while they are
               parked, and how many were refused with 503 (the aggregate bound)
    after      every client closes; VmRSS a few seconds later (the heap trimmed)

Ratios are of this one run: peak over baseline, after over baseline, and the megabytes the
parked bodies add per upload accepted. The last line of output is the figures as one JSON object.

    python benchmarks/serve_bodies.py [--uploads 100] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.support.api_server import write_api_recipe
from tests.support.serving import serve_env

REPO = Path(__file__).resolve().parents[1]
PREBAKE = Path(sys.executable).parent / "prebake"
CAP = 4 << 20


def _rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text)[1]) / 1024  # type: ignore[index]


def _start(work: Path) -> tuple[subprocess.Popen, int]:
    recipes = write_api_recipe(work / "recipes", "bodies-bench")
    (work / "registry").mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            str(PREBAKE),
            "serve",
            "--port",
            "0",
            "--model",
            "bodies-bench",
            "--eager",
            "--registry",
            str(work / "registry"),
        ],
        env=serve_env(work / "home", recipes),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    port = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        if not port and (m := re.search(r"listening on http://[^:]+:(\d+)", line)):
            port = int(m[1])
        if "prebake serve: ready" in line:
            break
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    return proc, port


def _park(port: int, n: int) -> list[socket.socket]:
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {CAP - 1}\r\n\r\n"
    ).encode()
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(head)
        socks.append(sock)
    body = b" " * (CAP - 2)
    senders = [threading.Thread(target=s.sendall, args=(body,)) for s in socks]
    for t in senders:
        t.start()
    for t in senders:
        t.join(120)
    return socks


def _refused(socks: list[socket.socket]) -> int:
    """How many of the parked clients were answered 503 (the others wait for their last byte)."""
    count = 0
    for sock in socks:
        sock.settimeout(0.5)
        try:
            count += sock.recv(64).startswith(b"HTTP/1.1 503")
        except OSError:
            pass
    return count


def main(argv: list[str] | None = None) -> int:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uploads", type=positive_int, default=100)
    parser.add_argument("--work", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="serve-bodies-") as tmp:
        work = args.work or Path(tmp)
        proc, port = _start(work)
        try:
            time.sleep(2)
            baseline = _rss_mib(proc.pid)
            socks = _park(port, args.uploads)
            time.sleep(1)
            peak = _rss_mib(proc.pid)
            time.sleep(6)  # past the 5 s drain: the refused ones have their 503 by now
            refused = _refused(socks)
            for sock in socks:
                sock.close()
            time.sleep(3)
            after = _rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
    accepted = args.uploads - refused
    figures = {
        "uploads": args.uploads,
        "refused_503": refused,
        "baseline_mib": round(baseline, 1),
        "peak_mib": round(peak, 1),
        "after_mib": round(after, 1),
        "peak_over_baseline": round(peak / baseline, 3),
        "after_over_baseline": round(after / baseline, 3),
        "mib_per_accepted_upload": round((peak - baseline) / max(1, accepted), 2),
    }
    print(
        f"serve bodies: {args.uploads} parked uploads of 4 MiB, {refused} refused with 503; RSS {baseline:.0f} -> "
        f"{peak:.0f} MiB parked (x{peak / baseline:.2f}) -> {after:.0f} MiB after (x{after / baseline:.2f})"
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
