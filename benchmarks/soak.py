"""Days of serving, compressed: the bundled engine under mixed traffic for --minutes, with the store's
gc and fetches of other bundles running beside it on the same store; RSS, open fds and threads of
the serving process tree sampled each minute.

    python -m benchmarks.soak [--minutes 35] [--rate 2] [--model tiny-llama] [--precision fp32]
                              [--registry DIR] [--work DIR] [--chart docs/images/soak.png]

One `prebake serve` from the recipe's bundles (baked first by a start with --write-back when
--registry lacks them). One client, --rate requests a second, in turn: a whole answer, a streamed
one, a stream cancelled after its first chunk, a bad body (must be a 4xx). Beside it, every 20 s:
a fetch of one of 8 other bundles into the same store, then `prebake store gc --max-size` small
enough to evict every bundle but the served one (held), and every 5 minutes `prebake fetch` of the
served model. Goal: after the first 5 minutes growth <= 5%, 0 errors, 0 differing answers.
The last line is the figures as one JSON object (docs/operations.md, "Days of serving").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from benchmarks.serve_load import PREBAKE, REPO, Server, reference_bodies

OTHERS = 8  # other bundles fetched and evicted beside the served one
OTHER_BYTES = 2 << 20
SIDE_EVERY_S = 20.0
FETCH_EVERY_S = 300.0
WARM_MIN = 5  # growth is measured from this minute on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--minutes", type=float, default=35.0)
    parser.add_argument("--rate", type=float, default=2.0, help="requests a second, one client (default 2)")
    parser.add_argument("--registry", type=Path, help="a registry holding the recipe's bundles (else baked first)")
    parser.add_argument("--work", type=Path, help="working folder (default: a new temporary one)")
    parser.add_argument("--chart", type=Path, help="draw the samples (benchmarks/charts.py soak)")
    parser.add_argument("--fetch-one", type=Path, help=argparse.SUPPRESS)  # the side fetch of one other bundle
    args = parser.parse_args()
    if args.fetch_one:
        return fetch_one(args.fetch_one)
    work = args.work or Path(tempfile.mkdtemp(prefix="prebake-soak-"))
    registry = args.registry or work / "registry"
    registry.mkdir(parents=True, exist_ok=True)
    print(f"making sure {registry} holds {args.model} {args.precision}'s bundles (a start with --write-back) ...")
    with Server(work / "bake", args, registry, ["--write-back"]):
        pass
    others = _publish_others(work, registry)
    with Server(work / "serve", args, registry, []) as server:
        side = Side(work / "serve" / "store", registry, others, args)
        sampler = Sampler(server.proc.pid)
        traffic = Traffic(server.port)
        side.start()
        sampler.start()
        traffic.run(args.minutes * 60, args.rate)
        side.stop()
        sampler.stop()
    figures = {**traffic.figures(), **side.figures(), **sampler.figures(), "minutes": args.minutes, "rate": args.rate}
    figures["load_average"] = os.getloadavg()
    (work / "soak.json").write_text(json.dumps(figures, indent=2, sort_keys=True))
    if args.chart:
        from benchmarks.charts import soak

        soak(figures, args.chart)
        print(f"chart: {args.chart}")
    print(json.dumps(figures, sort_keys=True))


def _publish_others(work: Path, registry: Path) -> list[str]:
    """Publish OTHERS bundles of other keys into `registry`; their manifests' paths, for the side fetches."""
    sys.path.insert(0, str(REPO))
    from prebake.registry.backends.file import FileRegistry
    from tests.support.bundles import make_bundle

    folder, out = FileRegistry(registry), []
    for i in range(OTHERS):
        bundle = make_bundle(work / "others", model=f"soak-other-{i}", payload_bytes=OTHER_BYTES)
        if folder.lookup(bundle.manifest.kind, bundle.manifest.key_digest) is None:
            folder.publish(bundle.manifest, bundle.blob)
        path = work / "others" / f"{i}.json"
        path.write_bytes(bundle.manifest.to_bytes())
        out.append(str(path))
    return out


def fetch_one(manifest_path: Path) -> None:
    """Install one other bundle into $PREBAKE_HOME from $PREBAKE_REGISTRY, as a fetch of it does."""
    from prebake.artifacts.bundle.manifest import Manifest
    from prebake.artifacts.store.local import Store
    from prebake.registry.backends.file import FileRegistry

    manifest = Manifest.parse(manifest_path.read_bytes(), str(manifest_path))
    store = Store()
    if store.lookup(manifest.kind, manifest.key_digest) is None:
        store.install(manifest, FileRegistry(Path(os.environ["PREBAKE_REGISTRY"])))


class Traffic:
    """One client: whole, streamed, cancelled and bad requests in turn, each answer checked."""

    def __init__(self, port: int):
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
        self.bodies = reference_bodies()
        self.reference = [self._whole(b) for b in self.bodies]
        self.counts = {"whole": 0, "streamed": 0, "cancelled": 0, "bad": 0}
        self.errors: list[str] = []
        self.differing = 0

    def run(self, seconds: float, rate: float) -> None:
        deadline, i = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            started = time.monotonic()
            kind = ("whole", "streamed", "cancelled", "bad")[i % 4]
            k = (i // 4) % len(self.bodies)
            try:
                self._one(kind, k)
                self.counts[kind] += 1
            except Exception as exc:  # every failure is counted and named
                self.errors.append(f"{kind} {k}: {type(exc).__name__}: {str(exc)[:200]}")
            i += 1
            time.sleep(max(0.0, 1 / rate - (time.monotonic() - started)))

    def _one(self, kind: str, k: int) -> None:
        body, expected = self.bodies[k], self.reference[k]
        if kind == "whole":
            self.differing += self._whole(body) != expected
        elif kind == "streamed":
            self.differing += self._streamed(body) != expected[1]
        elif kind == "cancelled":
            with self.client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
                response.raise_for_status()
                next(response.iter_lines())  # then close with the stream running
        else:
            status = self.client.post("/v1/completions", content=b'{"prompt": "hi", "max_tokens": "many"').status_code
            if not 400 <= status < 500:
                raise RuntimeError(f"a bad body got {status}, not a 4xx")

    def _whole(self, body: dict) -> tuple[list[int], str]:
        response = self.client.post("/v1/completions", json=body)
        response.raise_for_status()
        choice = response.json()["choices"][0]
        return choice["token_ids"], choice["text"]

    def _streamed(self, body: dict) -> str:
        text = []
        with self.client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        raise RuntimeError(f"stream error: {chunk['error']}")
                    text += [c["text"] for c in chunk["choices"]]
        return "".join(text)

    def figures(self) -> dict:
        return {
            "requests": self.counts,
            "errors": len(self.errors),
            "error_samples": self.errors[:5],
            "differing": self.differing,
        }


class Side(threading.Thread):
    """Fetches of other bundles and gc on the served store, and `prebake fetch` of the served model."""

    def __init__(self, home: Path, registry: Path, others: list[str], args):
        super().__init__(daemon=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")}
        self.env.update(PREBAKE_HOME=str(home), PREBAKE_TRUSTED_KEYS="", PREBAKE_REGISTRY=str(registry))
        self.registry, self.others, self.args = registry, others, args
        self.done = threading.Event()
        self.runs = {"fetch_other": 0, "gc": 0, "fetch": 0}
        self.failures: list[str] = []

    def run(self) -> None:
        i, last_fetch = 0, 0.0
        while not self.done.wait(SIDE_EVERY_S):
            self._call("fetch_other", [sys.executable, "-m", "benchmarks.soak", "--fetch-one", self.others[i % OTHERS]])
            self._call("gc", [str(PREBAKE), "store", "gc", "--max-size", f"{OTHER_BYTES * 3 // (1 << 20) + 1}M"])
            if time.monotonic() - last_fetch > FETCH_EVERY_S:
                cmd = [str(PREBAKE), "fetch", "--model", self.args.model, "--precision", self.args.precision]
                self._call("fetch", cmd)
                last_fetch = time.monotonic()
            i += 1

    def _call(self, what: str, cmd: list[str]) -> None:
        done = subprocess.run(cmd, env=self.env, cwd=REPO, capture_output=True, text=True, timeout=600)
        self.runs[what] += 1
        if done.returncode != 0:
            self.failures.append(f"{what} exited {done.returncode}: {(done.stderr or done.stdout)[-300:]}")

    def stop(self) -> None:
        self.done.set()
        self.join()

    def figures(self) -> dict:
        return {"side_runs": self.runs, "side_failures": len(self.failures), "side_samples": self.failures[:5]}


class Sampler(threading.Thread):
    """RSS, open fds and threads of a process and its descendants, once a minute."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.done = pid, threading.Event()
        self.samples: list[dict] = []
        self.started = time.monotonic()

    def run(self) -> None:
        self._sample()
        while not self.done.wait(60):
            self._sample()

    def stop(self) -> None:
        self.done.set()
        self.join()
        self._sample()

    def _sample(self) -> None:
        rss = fds = threads = 0
        for pid in _tree(self.pid):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
                rss += int(fields["VmRSS"].split()[0]) * 1024
                threads += int(fields["Threads"])
                fds += len(os.listdir(f"/proc/{pid}/fd"))
            except (OSError, KeyError, ValueError):  # exited between listing and reading
                continue
        minute = round((time.monotonic() - self.started) / 60, 2)
        self.samples.append({"minute": minute, "rss_bytes": rss, "fds": fds, "threads": threads})
        print(f"  minute {minute:5.1f}: RSS {rss / (1 << 20):.1f} MiB, {fds} fds, {threads} threads", flush=True)

    def figures(self) -> dict:
        warm = [s for s in self.samples if s["minute"] >= WARM_MIN] or self.samples[-1:]
        growth = {
            name: round(max(s[name] for s in warm) / max(1, warm[0][name]) - 1, 4)
            for name in ("rss_bytes", "fds", "threads")
        }
        return {"samples": self.samples, "growth_after_warm_up": growth, "warm_up_minutes": WARM_MIN}


def _tree(root: int) -> list[int]:
    """`root` and every process below it, from /proc's parent links."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += parents.get(pid, [])
    return out


if __name__ == "__main__":
    main()
