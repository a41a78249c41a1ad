"""A stand-in for vLLM's OpenAI server, for tests of the adapter's plumbing without vLLM.

    python tests/support/vllm_standin.py --model NAME [vLLM flags] --host H --port P

It behaves as vLLM does towards prebake, and nothing more: it needs the model folder (relative
to its working folder, as vLLM resolves it), keys its compile cache on its flags and VLLM_*
variables under $VLLM_CACHE_ROOT/torch_compile_cache/<hash10>/rank_<r>_0/backbone/ (one per rank
of --tensor-parallel-size; at tp > 1 with AOT compile off, as on CPU, it needs one core list per
rank in VLLM_CPU_OMP_THREADS_BIND, as vLLM does on a one-NUMA-node host), prints vLLM's own log
lines for a compile ("Compiling a graph for compile range") or a load ("Directly load the
compiled graph(s)"), each rank's as "(Worker_TP<r> pid=...)" at tp > 1, then answers GET /health
until SIGTERM. STANDIN_LOSE_RANKS=1 makes rank 1 compile and keep nothing (a lost cache). With PT_HPU_RECIPE_CACHE_CONFIG
set it acts as vLLM on Gaudi: it imports habana_frameworks (the stand-in in fake_habana/), honours
<path>,<delete>,<size MB>, and keeps one recipe per bucket variable setting, as the bridge would.
"""

import hashlib
import http.server
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

_NOT_KEYED = {"--host", "--port"}
# As in vLLM's own ignore list (vllm/envs.py compile_factors): places and memory, not graphs.
_PER_PROCESS = {
    "VLLM_CACHE_ROOT",
    "VLLM_NO_USAGE_STATS",
    "VLLM_DO_NOT_TRACK",
    "VLLM_HOST_IP",
    "VLLM_PORT",
    "VLLM_CPU_KVCACHE_SPACE",
}


def parse(argv):
    flags, i = {}, 0
    while i < len(argv):
        name = argv[i]
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[name], i = argv[i + 1], i + 2
        else:
            flags[name], i = "", i + 1
    return flags


def log(line, rank=None):
    if rank is None:
        print(f"INFO [standin] {line}", flush=True)
    else:  # vLLM's worker prefix at tp > 1 (vllm/logger.py, multiproc_executor.py)
        print(f"(Worker_TP{rank} pid={os.getpid() * 10 + rank}) INFO [standin] {line}", flush=True)


def thread_binding(tp):
    """vLLM's CPU rule (ompmultiprocessing.py): "auto" binds a NUMA node per rank, and this host has one."""
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    if bind != "auto" and len(bind.split("|")) == tp:
        return None
    return (
        f"Not enough allowed NUMA nodes to bind threads of {tp} local CPUWorkers (VLLM_CPU_OMP_THREADS_BIND={bind!r})"
    )


def compile_cache(flags):
    keyed = {k: v for k, v in flags.items() if k not in _NOT_KEYED}
    env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_") and k not in _PER_PROCESS}
    digest = hashlib.sha256(json.dumps([keyed, env], sort_keys=True).encode()).hexdigest()[:10]
    tp = int(flags.get("--tensor-parallel-size", "1"))
    for rank in range(tp):
        _rank_cache(digest, rank, keyed, env, rank if tp > 1 else None)


def _rank_cache(digest, rank, keyed, env, named):
    folder = Path(os.environ["VLLM_CACHE_ROOT"], "torch_compile_cache", digest, f"rank_{rank}_0", "backbone")
    graph = folder / "graph.bin"
    if graph.is_file():
        log("Directly load the compiled graph(s) for compile range (1, 128) from the cache, took 0.001 s", named)
        return
    if str(rank) in os.environ.get("STANDIN_LOSE_RANKS", "").split(","):  # a rank that compiles, keeps nothing
        log("Compiling a graph for compile range (1, 128) takes 0.20 s", named)
        return
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cache_key_factors.json").write_text(json.dumps({"flags": keyed, "env": env}, sort_keys=True))
    time.sleep(float(os.environ.get("STANDIN_COMPILE_S", "0.2")))
    graph.write_bytes(hashlib.sha256((f"{digest}/{rank}" if rank else digest).encode()).digest() * 64)
    log("Compiling a graph for compile range (1, 128) takes 0.20 s", named)


def hpu_recipes(config):
    import habana_frameworks.torch  # noqa: F401  (vLLM on Gaudi cannot start without the stack)

    path, delete, size_mb = config.rsplit(",", 2)
    folder = Path(path)
    if delete.strip().lower() == "true":
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    buckets = {k: v for k, v in sorted(os.environ.items()) if "BUCKET" in k}
    for i in range(3):
        recipe = folder / f"recipe-{hashlib.sha256(json.dumps([buckets, i]).encode()).hexdigest()[:12]}.bin"
        if recipe.is_file():
            log(f"HPU recipe cache hit {recipe.name}")
        else:
            recipe.write_bytes(b"\0" * 1024)
            log(f"HPU recipe compiled {recipe.name} (cache limit {int(size_mb)} MB)")


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    flags = parse(sys.argv[1:])
    if os.environ.get("STANDIN_FAIL"):
        print(f"ERROR [standin] {os.environ['STANDIN_FAIL']}", flush=True)
        return 3
    model = Path(flags.get("--model", ""))
    if not (model / "config.json").is_file():
        print(f"ERROR [standin] no model folder {model} from {os.getcwd()}", flush=True)
        return 1
    log(f"model={flags['--model']} cache root={os.environ.get('VLLM_CACHE_ROOT')}")
    tp = int(flags.get("--tensor-parallel-size", "1"))
    unbound = thread_binding(tp) if tp > 1 and os.environ.get("VLLM_USE_AOT_COMPILE") == "0" else None
    if unbound:
        print(f"ERROR [standin] AssertionError: {unbound}", flush=True)
        return 1
    compile_cache(flags)
    if "PT_HPU_RECIPE_CACHE_CONFIG" in os.environ:
        hpu_recipes(os.environ["PT_HPU_RECIPE_CACHE_CONFIG"])
    server = http.server.HTTPServer((flags.get("--host", "127.0.0.1"), int(flags.get("--port", "8000"))), Health)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    log("Application startup complete.")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
