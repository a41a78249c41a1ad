"""Streamed fetch: a bundle installed from S3 (moto) against the two floors it overlaps.

    python -m benchmarks.fetch_stream [--size-mib 1024] [--repeat 2]

Packs a tree shaped like a vLLM CUDA cache (a few large binaries among thousands of small
files, incompressible, so the blob is about --size-mib), publishes it to moto's S3 server
(a separate process on 127.0.0.1), and times, in one run, alternating which goes first:

    download    the blob alone, as `aws s3 cp` would fetch it: boto3's download_file with
                the same part size and concurrency (and `aws s3 cp` itself when awscli works)
    unpack      `zstd -d -c blob | tar -x` from local disk
    prebake     Store.install: download, blob digest, decompression, unpack and every
                file's digest in one overlapped pipeline, the blob written to the store
                as it streams, every member checked against the manifest before writing
    sequential  the same work one step after the other (fetch_blob, then unpack): what the
                pipeline saves

ratio = prebake / max(download, unpack); the goal is <= 1.1. The median of --repeat rounds
is reported. moto is a Python server: the download floor is moto's speed, not S3's.
"""

from __future__ import annotations

import argparse
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
from pathlib import Path

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.payload import pack, unpack
from prebake.artifacts.keys import Key
from prebake.artifacts.layout import blob_relpath
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.settings import StoreLimits
from prebake.registry.backends.s3 import S3Registry
from prebake.registry.backends.s3_client import S3Settings, transfer_config
from tests.support.moto_server import moto_server, s3_env

_MiB = 1 << 20


def main(argv: list[str] | None = None) -> int:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="bundle size in MiB (1024 for the issue's figure)")
    parser.add_argument(
        "--repeat", type=positive_int, default=2, help="timed rounds per measurement; the median is reported"
    )
    args = parser.parse_args(argv)
    for tool in ("zstd", "tar"):
        if shutil.which(tool) is None:
            print(f"`{tool}` is not on PATH; install it to measure the unpack floor", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="prebake-bench-", dir=os.environ.get("TMPDIR")) as tmp:
        work = Path(tmp)
        manifest, blob = _bundle(work, args.size_mib)
        with moto_server() as endpoint:
            os.environ.update(s3_env(endpoint))  # a script, not a library: this process talks only to moto
            times = _run(work, manifest, blob, args.repeat)
    _report(times, manifest)
    return 0


def _bundle(work: Path, size_mib: int) -> tuple[Manifest, Path]:
    """A vLLM-cache-shaped tree of `size_mib` incompressible MiB, packed; its manifest and blob."""
    tree, rng = work / "tree", random.Random(11)
    small, big_count = 2000, 4
    small_bytes = min(size_mib * _MiB // 8, small * 32 * 1024)
    big = (size_mib * _MiB - small_bytes) // big_count
    for i in range(big_count):
        path = tree / "inductor" / f"kernel-{i}.so"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            for _ in range(big // (16 * _MiB)):
                f.write(rng.randbytes(16 * _MiB))
            f.write(rng.randbytes(big % (16 * _MiB)))
    for i in range(small):
        path = tree / "triton" / f"{i % 64:02x}" / f"k{i}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(small_bytes // small))
    blob = work / "payload.tar.zst"
    packed = pack(tree, blob, level=1)
    shutil.rmtree(tree)
    key = Key.of("graphs", {"bench": {"shape": "vllm-cache", "mib": str(size_mib)}})
    manifest = Manifest(
        kind="graphs",
        key={g: dict(f) for g, f in key.groups},
        key_digest=key.digest,
        blob=packed.blob,
        files=packed.files,
        created="2026-11-30T00:00:00Z",
        builder="benchmarks/fetch_stream.py",
    )
    return manifest, blob


def _run(work: Path, manifest: Manifest, blob: Path, repeat: int) -> dict[str, list[float]]:
    import boto3

    client = boto3.client("s3")
    client.create_bucket(Bucket="bench")
    # moto assembles a multipart upload in one request: large parts and a long timeout for that one
    S3Registry("s3://bench/prebake", S3Settings(chunk_mb=128, timeout_s=900)).publish(manifest, blob)
    registry = S3Registry("s3://bench/prebake")  # the defaults (8 MiB parts, 10 at once), as `aws s3 cp`
    key = f"prebake/{blob_relpath(manifest.blob.digest)}"
    steps: dict[str, Callable[[Path], None]] = {
        "download": lambda out: client.download_file(
            "bench", key, str(out / "blob"), Config=transfer_config(S3Settings())
        ),
        "unpack": lambda out: _zstd_tar(blob, out),
        "prebake": lambda out: _install(out, manifest, registry),
        "sequential": lambda out: _sequential(out, manifest, registry),
    }
    if _aws_works():
        steps["aws_s3_cp"] = lambda out: _aws_cp(f"s3://bench/{key}", out / "blob")
    times: dict[str, list[float]] = {name: [] for name in steps}
    for round_ in range(repeat):
        order = list(steps) if round_ % 2 == 0 else list(reversed(steps))
        for name in order:
            out = work / f"out-{name}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            start = time.perf_counter()
            steps[name](out)
            times[name].append(time.perf_counter() - start)
            shutil.rmtree(out)
    return times


def _install(out: Path, manifest: Manifest, registry: S3Registry) -> None:
    installed = Store(out / "home", StoreLimits()).install(manifest, registry)
    assert installed.tree.is_dir()


def _sequential(out: Path, manifest: Manifest, registry: S3Registry) -> None:
    registry.fetch_blob(manifest.blob.digest, out / "blob", size=manifest.blob.size)
    unpack(out / "blob", out / "tree", manifest.files)


def _zstd_tar(blob: Path, out: Path) -> None:
    with subprocess.Popen(["zstd", "-d", "-c", str(blob)], stdout=subprocess.PIPE) as zstd:
        subprocess.run(["tar", "-x", "-C", str(out)], stdin=zstd.stdout, check=True)
    if zstd.returncode:
        raise SystemExit(f"zstd -d failed with {zstd.returncode}")


def _aws_works() -> bool:
    try:
        return subprocess.run(["aws", "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _aws_cp(url: str, dest: Path) -> None:
    subprocess.run(["aws", "s3", "cp", "--only-show-errors", url, str(dest)], check=True)


def _report(times: dict[str, list[float]], manifest: Manifest) -> None:
    med = {name: statistics.median(values) for name, values in times.items()}
    floor_download = max(med["download"], med.get("aws_s3_cp", 0.0)) if "aws_s3_cp" in med else med["download"]
    floor = max(floor_download, med["unpack"])
    mib = manifest.blob.size / _MiB
    print(f"bundle: {mib:.0f} MiB blob, {len(manifest.files)} files, {manifest.unpacked_bytes / _MiB:.0f} MiB unpacked")
    for name, value in med.items():
        print(f"  {name:<11} {value:7.2f} s  ({mib / value:6.1f} MiB/s of blob)")
    print("  verification on: blob sha256, every file's sha256, every member checked against the manifest")
    ratio = med["prebake"] / floor
    print(f"prebake fetch / max(download, zstd|tar) = {ratio:.2f} (goal <= 1.1)")
    print(f"pipeline / sequential = {med['prebake'] / med['sequential']:.2f}")
    figures = {
        "bundle_mib": round(mib, 1),
        "files": len(manifest.files),
        "download_s": round(med["download"], 3),
        "aws_s3_cp_s": round(med["aws_s3_cp"], 3) if "aws_s3_cp" in med else None,
        "zstd_tar_s": round(med["unpack"], 3),
        "prebake_fetch_s": round(med["prebake"], 3),
        "sequential_s": round(med["sequential"], 3),
        "ratio_fetch_vs_floor": round(ratio, 3),
        "ratio_pipeline_vs_sequential": round(med["prebake"] / med["sequential"], 3),
    }
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
