"""Pack and unpack throughput of prebake bundles against `tar` with the `zstd` CLI, as ratios.

Two trees: a real Inductor cache (compiled here from the tiny model, a few shapes) and a
large synthetic tree (many small files and a few large ones, half compressible). Each is
packed and unpacked by prebake (artifacts.bundle: deterministic tar + multi-threaded zstd,
sha256 of every file, verified unpack) and by `tar -I 'zstd -T0 -3'`, interleaved, median
of --repeat runs. A ratio above 1 means prebake is slower than the CLI pair.

    python benchmarks/bundle.py [--synthetic-mb 512] [--repeat 3] [--inductor-tree DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from artifacts.bundle import pack, unpack  # noqa: E402

COMPILE_SNIPPET = """
from artifacts.recipes import load_recipe
from engine.runtime.loader import load_model
from engine.runtime.model import KVCache
from engine.runtime.steps import CompiledSteps, Tactic
from engine.runtime.shapes import StepShape
import torch
recipe = load_recipe("tiny-llama")
model = load_model(recipe.model, "fp32")
cache = KVCache.allocate(model.config, 2, 128, dtype=torch.float32)
steps = CompiledSteps(model, cache)
for shape in (StepShape("prefill", 1, 64, 64), StepShape("decode", 2, 1, 128)):
    steps.run_dummy(shape, Tactic())
"""


def inductor_tree(work: Path) -> Path:
    tree = work / "inductor"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tree)}
    subprocess.run([sys.executable, "-c", COMPILE_SNIPPET], env=env, cwd=REPO, check=True)
    return tree


def synthetic_tree(work: Path, megabytes: int) -> Path:
    tree = work / "synthetic"
    rng = __import__("random").Random(0)
    budget = megabytes << 20
    big = budget // 2 // 4
    for i in range(4):  # large kernels: half random, half repetitive
        data = rng.randbytes(big // 2) + bytes(range(256)) * (big // 512)
        (tree / "kernels").mkdir(parents=True, exist_ok=True)
        (tree / "kernels" / f"k{i}.so").write_bytes(data)
    small_total, n = budget - 4 * big, 0
    while small_total > 0:  # many small cache entries
        size = rng.randint(512, 64 << 10)
        folder = tree / "fxgraph" / f"{n % 256:02x}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"entry{n}").write_bytes(rng.randbytes(size // 2) + b"\0" * (size - size // 2))
        small_total -= size
        n += 1
    return tree


def tree_bytes(tree: Path) -> int:
    return sum(p.stat().st_size for p in tree.rglob("*") if p.is_file() and not p.is_symlink())


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bench(name: str, tree: Path, work: Path, repeat: int) -> None:
    size = tree_bytes(tree)
    ours_pack, ours_unpack, cli_pack, cli_unpack = [], [], [], []
    for i in range(repeat):
        blob, cli_blob = work / f"{name}-{i}.tar.zst", work / f"{name}-{i}-cli.tar.zst"
        packed = None

        def do_pack():
            nonlocal packed
            packed = pack(tree, blob)

        ours_pack.append(timed(do_pack))
        ours_unpack.append(timed(lambda: unpack(blob, work / f"{name}-out-{i}", packed.files)))
        cli_pack.append(
            timed(
                lambda: subprocess.run(
                    ["tar", "-I", "zstd -T0 -3 -q", "-cf", str(cli_blob), "-C", str(tree), "."], check=True
                )
            )
        )
        out = work / f"{name}-cli-out-{i}"
        out.mkdir()
        cli_unpack.append(
            timed(lambda: subprocess.run(["tar", "-I", "zstd -d -q", "-xf", str(cli_blob), "-C", str(out)], check=True))
        )
        ratio = blob.stat().st_size / size
        shutil.rmtree(work / f"{name}-out-{i}")
        shutil.rmtree(out)
    mb = size / 1e6
    op, ou, cp, cu = (statistics.median(x) for x in (ours_pack, ours_unpack, cli_pack, cli_unpack))
    print(
        f"{name}: {mb:.1f} MB in {sum(1 for p in tree.rglob('*') if p.is_file())} files, prebake blob {ratio:.2f} of raw"
    )
    print(
        f"  pack    prebake {mb / op:8.1f} MB/s   tar+zstd {mb / cp:8.1f} MB/s   time ratio prebake/cli {op / cp:.2f}"
    )
    print(
        f"  unpack  prebake {mb / ou:8.1f} MB/s   tar+zstd {mb / cu:8.1f} MB/s   time ratio prebake/cli {ou / cu:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic-mb", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--inductor-tree", type=Path, help="an existing Inductor cache folder to use")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="prebake-bundle-bench-") as tmp:
        work = Path(tmp)
        tree = args.inductor_tree or inductor_tree(work)
        bench("inductor-cache", tree, work, args.repeat)
        bench("synthetic", synthetic_tree(work, args.synthetic_mb), work, args.repeat)


if __name__ == "__main__":
    main()
