"""`prebake serve` as a real subprocess: its log, its port, and HTTP calls to it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.baking import BIN, REPO

# vLLM's metric names that routers and load clients read (llm-d's endpoint picker, vLLM's
# production-stack router, inference-perf): a test and benchmarks/clients.py check them on /metrics
VLLM_ROUTER_SERIES = (  # each labelled model_name (request_success_total also finished_reason)
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_hit_rate",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:request_time_per_output_token_seconds_count",
)

# A 2-layer Llama with three step shapes (prefill b1x32, decode b1 and b2 over 32 positions):
# small enough that compiling it in place takes a minute or two on two cores.
SERVE_TEST_RECIPE = """
[model]
name = "{name}"
weights = "random"
seed = {seed}

[model.config]
architectures = ["LlamaForCausalLM"]
model_type = "llama"
vocab_size = 512
hidden_size = 64
intermediate_size = 128
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
max_position_embeddings = 64

[serving]
max_model_len = 32
max_num_seqs = {seqs}
max_num_batched_tokens = 32
block_size = 32

[compile]
variant = "{variant}"

[autotune]
tactics = []
warmup = 0
iterations = 1

[matrix]
platform = ["cpu"]
dtype = ["fp32"]
"""


def write_recipe(
    folder: Path,
    name: str,
    *,
    variant: str,
    seqs: int,
    seed: int = 0,
    fallback: str | None = None,
    dtype: str | tuple[str, ...] = "fp32",
) -> None:
    """The test recipe `name` in `folder`; `dtype`: its [matrix] dtype (one, or several);
    `fallback`: an aoti-package tree's [compile] fallback."""
    folder.mkdir(parents=True, exist_ok=True)
    text = SERVE_TEST_RECIPE.format(name=name, variant=variant, seqs=seqs, seed=seed)
    text = text.replace('dtype = ["fp32"]', f"dtype = {json.dumps([dtype] if isinstance(dtype, str) else list(dtype))}")
    if fallback is not None:
        text = text.replace(f'variant = "{variant}"\n', f'variant = "{variant}"\nfallback = "{fallback}"\n')
    (folder / f"{name}.toml").write_text(text)


def serve_env(home: Path, recipes: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREBAKE_", "AWS_"))}
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):  # how OpenMP waits: the engine's (runtime.openmp)
        env.pop(name, None)
    env["PREBAKE_HOME"] = str(home)
    env["PREBAKE_TRUSTED_KEYS"] = ""  # unverified, on purpose: signing has its own tests
    if recipes is not None:
        env["PREBAKE_RECIPES"] = str(recipes)
    return {**env, **extra}


class ServeProcess:
    """One `prebake serve --port 0` child; its merged output is collected line by line."""

    def __init__(self, args: list[str], env: dict[str, str], command: list[str] | None = None):
        """`command`: what runs in place of the `prebake` script (a wrapper that takes its arguments)."""
        self.env = env
        self.proc = subprocess.Popen(
            [*(command or [str(BIN / "prebake")]), "serve", "--port", "0", *args],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.port: int | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if self.port is None and "listening on http://" in line:
                self.port = int(line.split("listening on http://", 1)[1].split()[0].rsplit(":", 1)[1])

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_listening(self, timeout: float = 60) -> None:
        self._wait(lambda: self.port is not None, timeout, "to listen")

    def wait_ready(self, timeout: float = 900) -> None:
        self.wait_listening()
        self._wait(lambda: self.get("/health")[0] == 200, timeout, "to be ready")

    def wait_line(self, text: str, timeout: float = 60) -> None:
        """Until a line holding `text` is in the log: what another rank says reaches the pipe on its own
        clock, so it can come after rank 0's /health said ready."""
        self._wait(lambda: text in self.log, timeout, f"to say {text!r}")

    def wait_exit(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code

    def _wait(self, done, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if self.proc.poll() is not None:
                self._reader.join(10)
                raise AssertionError(f"prebake serve exited {self.proc.returncode} before it came {what}:\n{self.log}")
            if time.monotonic() > deadline:
                raise AssertionError(f"prebake serve did not come {what} within {timeout:.0f} s:\n{self.log}")
            time.sleep(0.2)

    def get(self, path: str) -> tuple[int, str]:
        return self._call(urllib.request.Request(self._url(path)))

    def post(self, path: str, body: object) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, text = self._call(
            urllib.request.Request(
                self._url(path), data=data, method="POST", headers={"Content-Type": "application/json"}
            )
        )
        return status, json.loads(text)

    def complete(self, **body) -> dict:
        status, payload = self.post("/v1/completions", body)
        assert status == 200, payload
        return payload

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    _url = url

    @staticmethod
    def _call(request: urllib.request.Request) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, ""

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(60)


def metric(text: str, line_prefix: str) -> float:
    """The value of the one metrics line starting with `line_prefix` (name plus labels)."""
    values = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(line_prefix)]
    assert len(values) == 1, f"{line_prefix!r} matches {len(values)} lines in\n{text}"
    return float(values[0])
