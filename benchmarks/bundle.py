"""Pack and unpack throughput of prebake bundles against `tar` with the `zstd` CLI, as time ratios.

    python benchmarks/bundle.py [--repeat 3] [--scale 1.0] [--inductor-tree DIR] [--plot PNG]

Three trees, made here:

    inductor_cache  tiny-llama's real Inductor cache (compiled here with torch.compile, a few shapes)
    files_512mb     512 MB in 8,000 files, log-normal sizes, every other file incompressible
    vllm_cuda       shaped like a vLLM CUDA cache root: three kernel libraries among 4,000 small files

Each is packed (payload.pack) and unpacked (unpack_streamed, the fetch path; payload.unpack, a
blob already in the store) by prebake with every check on, and by `tar -I 'zstd -T0 -3'` (which
verifies nothing), alternating which goes first, median of --repeat rounds (at least 15 for a
tree under 64 MB), each after a sync; CPU seconds beside wall seconds. A ratio below 1 means
prebake is faster. The pack floor is tar+zstd's CPU plus sha256 over tree and blob, spread over
every core: above 1, no pack that computes these digests can match tar+zstd here. --scale
shrinks the synthetic trees. The last line is a JSON object of the figures (docs/performance.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prebake.artifacts.bundle.manifest import FileEntry  # noqa: E402
from prebake.artifacts.bundle.payload import UnpackLimits, pack, unpack  # noqa: E402
from prebake.artifacts.bundle.unpack import unpack_streamed  # noqa: E402
from prebake.artifacts.errors import BundleError  # noqa: E402

_MiB = 1 << 20
VERIFICATION = (
    "verification on: packing hashes every file (sha256, for the manifest) and the blob; unpacking (the "
    "streamed path of Store.install) checks the blob's sha256 as it reads it and every entry's path, type, size, "
    "link and sha256 against the manifest; unpack_local (a blob already in the store) makes the same entry "
    "checks without the blob digest; tar+zstd verifies nothing"
)
OPS = ("pack", "unpack", "unpack_local")
SMALL_TREE_BYTES = 64 << 20  # a tree under this size takes tens of milliseconds a round: ...
SMALL_TREE_ROUNDS = 15  # ... so it gets at least this many rounds, or its median is noise

COMPILE_SNIPPET = """
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.bundled.runtime.loader import load_model
from prebake.engine.bundled.runtime.model import KVCache
from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic
from prebake.engine.bundled.runtime.shapes import StepShape
import torch
recipe = load_recipe("tiny-llama")
model = load_model(recipe.model, "fp32")
cache = KVCache.allocate(model.config, 2, 128, dtype=torch.float32)
steps = CompiledSteps(model, cache)
for shape in (StepShape("prefill", 1, 64, 64), StepShape("decode", 2, 1, 128)):
    steps.run_dummy(shape, Tactic())
"""


# -- the trees -------------------------------------------------------------------------------


def inductor_tree(work: Path) -> Path:
    tree = work / "inductor_cache"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tree)}
    subprocess.run([sys.executable, "-c", COMPILE_SNIPPET], env=env, cwd=REPO, check=True)
    return tree


class _Content:
    """Bytes for synthetic files, cut from two pools: random (incompressible) and text-like (about 4:1)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.noise = b"".join(self.rng.randbytes(_MiB) for _ in range(64))
        words = [self.rng.randbytes(self.rng.randint(2, 8)).hex().encode() for _ in range(512)]
        self.text = b" ".join(self.rng.choice(words) for _ in range(3 * _MiB))[: 16 * _MiB]

    def take(self, size: int, compressible: bool) -> bytes:
        pool = self.text if compressible else self.noise
        parts, left = [], size
        while left > 0:  # pieces from random offsets, so neighbouring files do not repeat each other
            n = min(left, len(pool) // 2)
            start = self.rng.randrange(len(pool) - n + 1)
            parts.append(pool[start : start + n])
            left -= n
        return b"".join(parts)

    def binary(self, size: int) -> bytes:
        """A kernel library: 1 MiB stretches, about 60% machine code (incompressible), 40% tables."""
        return b"".join(self.take(min(_MiB, size - off), self.rng.random() < 0.4) for off in range(0, size, _MiB))


def files_tree(work: Path, content: _Content, megabytes: int, count: int) -> Path:
    tree = work / "files_512mb"
    weights = [content.rng.lognormvariate(0, 1.2) for _ in range(count)]
    scale = (megabytes * _MiB) / sum(weights)
    for i, w in enumerate(weights):
        folder = tree / f"{i % 256:02x}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"entry{i}.bin").write_bytes(content.take(max(1, int(w * scale)), i % 2 == 0))
    return tree


def vllm_tree(work: Path, content: _Content, scale: float) -> Path:
    """Shaped like $VLLM_CACHE_ROOT on a CUDA host: torch_compile_cache with Inductor and Triton
    artifacts, FlashInfer and DeepGEMM JIT libraries, a few large binaries."""
    tree = work / "vllm_cuda"
    libs = {
        "flashinfer/90a/cached_ops/batch_prefill/batch_prefill.so": 200,
        "flashinfer/90a/cached_ops/fused_moe/fused_moe_90.so": 120,
        "deep_gemm/cache/kernel.gemm_fp8_fp8_bf16_nt.so": 60,
    }
    for rel, mb in libs.items():
        _write(tree / rel, content.binary(max(_MiB, int(mb * scale * _MiB))))
    rank = tree / "torch_compile_cache" / "3f2a9c1b7e" / "rank_0_0" / "backbone"
    _write(rank / "cache_key_factors.json", content.take(4096, True))
    for i in range(max(10, int(1000 * scale))):  # Triton kernels: cubin (code), ptx and json (text)
        kernel = rank / "triton_cache" / f"{content.rng.getrandbits(128):032x}"
        _write(kernel / f"triton_k{i}.cubin", content.take(content.rng.randint(8 << 10, 96 << 10), False))
        _write(kernel / f"triton_k{i}.ptx", content.take(content.rng.randint(16 << 10, 128 << 10), True))
        _write(kernel / f"triton_k{i}.json", content.take(content.rng.randint(600, 2000), True))
        _write(kernel / "__grp__triton.json", content.take(300, True))
    for i in range(max(10, int(1000 * scale))):  # Inductor FX graphs and generated wrappers
        _write(
            rank / "inductor_cache" / "fxgraph" / f"{i:03x}" / f"f{i}",
            content.take(content.rng.randint(2 << 10, 40 << 10), True),
        )
    return tree


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


# -- timing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    wall: float  # median seconds
    cpu: float  # median CPU seconds, the process and its children


@dataclass(frozen=True)
class Result:
    name: str
    megabytes: float
    files: int
    rounds: int
    blob_fraction: float
    ours: dict[str, Timing]  # by operation: pack, unpack, unpack_local
    cli: dict[str, Timing]  # the tar+zstd timing each is compared with
    digest_cpu: float  # CPU seconds sha256 takes over the tree's bytes and the blob's, at this machine's rate

    def ratio(self, op: str) -> float:
        return self.ours[op].wall / self.cli[op].wall

    def pack_floor(self) -> float:
        """The least pack ratio this machine allows: if everything but the digests cost what tar+zstd
        costs (the same zstd at the same level, the same bytes read), prebake's CPU seconds are
        tar+zstd's plus the digests', and no run is shorter than that spread over every core."""
        cli = self.cli["pack"]
        return (cli.cpu + self.digest_cpu) / ((os.cpu_count() or 1) * cli.wall)


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds of fn, after writing out dirty pages so it starts from a clean cache."""
    os.sync()
    cpu, started = _cpu(), time.perf_counter()
    fn()
    return time.perf_counter() - started, _cpu() - cpu


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def streamed(blob: Path, digest: str, dest: Path, files: tuple[FileEntry, ...]) -> None:
    """Store.install's streamed unpack, fed from the local blob, whose sha256 is checked as it is read."""

    def download(tee: Callable[[bytes], None]) -> None:
        h = hashlib.sha256()
        with blob.open("rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                tee(chunk)
        if "sha256:" + h.hexdigest() != digest:
            raise BundleError(f"{blob} does not hash to {digest}")

    unpack_streamed(download, dest, files, UnpackLimits(), str(blob))


def sha256_rate() -> float:
    """Bytes a second hashlib's sha256 hashes here, from memory: the best of three 64 MiB runs."""
    data, best = os.urandom(64 * _MiB), float("inf")
    for _ in range(3):
        started = time.process_time()
        hashlib.sha256(data).digest()
        best = min(best, time.process_time() - started)
    return len(data) / best


def bench(name: str, tree: Path, work: Path, repeat: int, rate: float) -> Result:
    files = [p for p in tree.rglob("*") if p.is_file() and not p.is_symlink()]
    size = sum(p.stat().st_size for p in files)
    times: dict[str, list[tuple[float, float]]] = {f"{who}_{op}": [] for who in ("ours", "cli") for op in OPS}
    blob, cli_blob = work / f"{name}.tar.zst", work / f"{name}-cli.tar.zst"
    out, cli_out = work / f"{name}-out", work / f"{name}-cli-out"
    fraction = 0.0
    rounds = repeat if size >= SMALL_TREE_BYTES else max(repeat, SMALL_TREE_ROUNDS)
    for i in range(rounds):
        packed = []
        for old in (blob, cli_blob):  # both write a new file: rewriting a truncated one costs a flush on ext4
            old.unlink(missing_ok=True)
        _alternate(
            i,
            times,
            ("ours_pack", lambda: packed.append(pack(tree, blob))),
            ("cli_pack", lambda: _cli(["tar", "-I", "zstd -T0 -3 -q", "-cf", str(cli_blob), "-C", str(tree), "."])),
        )
        fraction = blob.stat().st_size / size
        digest, entries = packed[0].blob.digest, packed[0].files
        untar = ["tar", "-I", "zstd -d -q", "-xf", str(cli_blob), "-C", str(cli_out)]
        for op, ours in (
            ("unpack", lambda: streamed(blob, digest, out, entries)),
            ("unpack_local", lambda: unpack(blob, out, entries)),
        ):
            cli_out.mkdir()
            _alternate(i, times, (f"ours_{op}", ours), (f"cli_{op}", lambda: _cli(untar)))
            for folder in (out, cli_out):
                shutil.rmtree(folder)
    med = {k: Timing(*(statistics.median(x) for x in zip(*v))) for k, v in times.items()}
    return Result(
        name,
        size / 1e6,
        len(files),
        rounds,
        fraction,
        {op: med[f"ours_{op}"] for op in OPS},
        {op: med[f"cli_{op}"] for op in OPS},
        size * (1 + fraction) / rate,
    )


def _alternate(i: int, times: dict[str, list[tuple[float, float]]], *rounds: tuple[str, Callable[[], object]]) -> None:
    for label, fn in rounds if i % 2 == 0 else rounds[::-1]:
        times[label].append(timed(fn))


def _cli(argv: list[str]) -> None:
    subprocess.run(argv, check=True)


def report(result: Result) -> None:
    mb = result.megabytes
    print(
        f"{result.name}: {mb:.1f} MB in {result.files} files, prebake blob {result.blob_fraction:.2f} of raw, "
        f"median of {result.rounds} rounds"
    )
    for op in OPS:
        ours, cli = result.ours[op], result.cli[op]
        print(
            f"  {op:<12}  prebake {ours.wall:6.2f} s ({ours.cpu:5.2f} CPU s) {mb / ours.wall:7.1f} MB/s   "
            f"tar+zstd {cli.wall:6.2f} s ({cli.cpu:5.2f} CPU s) {mb / cli.wall:7.1f} MB/s   "
            f"time ratio prebake/tar+zstd {result.ratio(op):.2f}"
        )
    print(
        f"  pack floor    tar+zstd's {result.cli['pack'].cpu:.2f} CPU s plus the digests' {result.digest_cpu:.2f} "
        f"over {os.cpu_count()} cores: no pack here beats {result.pack_floor():.2f} of tar+zstd's time"
    )


def plot(results: list[Result], dest: Path) -> None:
    """A bar chart of throughput, prebake beside tar+zstd, per tree and operation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.name}\n{op}" for r in results for op in ("pack", "unpack")]
    ours = [r.megabytes / r.ours[op].wall for r in results for op in ("pack", "unpack")]
    cli = [r.megabytes / r.cli[op].wall for r in results for op in ("pack", "unpack")]
    fig, ax = plt.subplots(figsize=(9, 4))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], ours, width=0.4, label="prebake (verifying)")
    ax.bar([x + 0.2 for x in xs], cli, width=0.4, label="tar + zstd -T0 -3")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("MB/s (higher is better)")
    ax.set_title("Bundle throughput, prebake vs tar+zstd")
    ax.legend()
    fig.tight_layout()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dest, dpi=100)
    print(f"plot written to {dest}")


def main() -> None:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=positive_int, default=3, help="rounds per measurement; the median is reported")
    parser.add_argument("--scale", type=float, default=1.0, help="shrink the synthetic trees (0.1: a quick run)")
    parser.add_argument("--inductor-tree", type=Path, help="an existing Inductor cache folder to use")
    parser.add_argument("--plot", type=Path, help="also draw the throughput as a PNG here (needs matplotlib)")
    args = parser.parse_args()
    print(VERIFICATION)
    load_start = os.getloadavg()[0]
    results = []
    rate = sha256_rate()
    print(f"sha256 here: {rate / 1e9:.2f} GB/s of one core")
    with tempfile.TemporaryDirectory(prefix="prebake-bundle-bench-") as tmp:
        work = Path(tmp)
        content = _Content(seed=0)
        trees = [
            ("inductor_cache", lambda: args.inductor_tree or inductor_tree(work)),
            ("files_512mb", lambda: files_tree(work, content, int(512 * args.scale), int(8000 * args.scale))),
            ("vllm_cuda", lambda: vllm_tree(work, content, args.scale)),
        ]
        for name, make in trees:
            tree = make()
            results.append(bench(name, tree, work, args.repeat, rate))
            report(results[-1])
            if tree.is_relative_to(work):
                shutil.rmtree(tree)
    if args.plot:
        plot(results, args.plot)
    figures: dict[str, object] = {f"{op}_ratio_{r.name}": round(r.ratio(op), 3) for r in results for op in OPS}
    for r in results:
        figures[f"rounds_{r.name}"] = r.rounds
        figures[f"pack_floor_ratio_{r.name}"] = round(r.pack_floor(), 3)
        for op in OPS:
            figures[f"{op}_s_{r.name}"] = round(r.ours[op].wall, 3)
            figures[f"{op}_cli_s_{r.name}"] = round(r.cli[op].wall, 3)
            figures[f"{op}_cpu_s_{r.name}"] = round(r.ours[op].cpu, 3)
            figures[f"{op}_cli_cpu_s_{r.name}"] = round(r.cli[op].cpu, 3)
    figures.update(sha256_gb_s=round(rate / 1e9, 2), cpus=os.cpu_count())
    figures.update(verification=True, repeat=args.repeat, load_start=round(load_start, 2))
    figures["load_end"] = round(os.getloadavg()[0], 2)
    print(f"load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end ({os.cpu_count()} CPUs)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
