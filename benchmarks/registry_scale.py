"""Registries that grow: hit lookups, miss explanations and `prebake ls` at 10, 1,000 and 10,000 entries.

    python -m benchmarks.registry_scale [--sizes 10,1000,10000] [--files 50] [--lookups 20] [--backends file,s3,hf,oci]

A folder, S3 (moto's server), the Hub (tests/support/hub_server.py) and OCI (docker-registry,
when installed) are filled with index entries (tests/support/index_seed.py, --files files each).
At each size, in one run:

    hit   median time of Registry.lookup of an existing key
    miss  nearest_miss for a key in no registry: its time, the entries it read, S3's requests
    ls    `prebake ls` as a subprocess: the first listing (every entry read, the summary
          written), then the median of three later ones (the summary verified, no entry read)

Ratios compare the largest size with the smallest (hits, ls) and with the first size of a full
miss sample (misses): about 1 means flat. `ls_ms_per_entry` is an entry's marginal cost, with the
process start-up taken out. The last line is a JSON object of the figures (docs/performance.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.fetch.explain import MISS_SAMPLE, nearest_miss
from prebake.artifacts.keys import Key
from prebake.artifacts.layout import index_relpath
from prebake.artifacts.ports.registry import Registry
from prebake.registry.backends.file import FileRegistry
from prebake.registry.backends.hf import HubRegistry
from prebake.registry.backends.s3 import S3Registry
from prebake.registry.backends.s3_client import S3Settings
from tests.support.hub_server import hub_server
from tests.support.index_seed import entry_key, seed_folder, seed_oci, seed_s3, synthetic_manifests
from tests.support.moto_server import moto_server, s3_env
from tests.support.oci_server import oci_server

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ["file", "s3", "hf", "oci"]  # oci: Debian's docker-registry on loopback, when installed


@dataclass(frozen=True)
class Point:
    backend: str
    entries: int
    hit_ms: float
    miss_ms: float
    miss_reads: int
    miss_requests: int | None  # HTTP requests (S3 only)
    ls_s: float  # with the listing summary in place (the median of three)
    ls_first_s: float  # the first listing: every entry read, the summary written


class _Counting:
    """A registry whose listing counts the manifests it hands out."""

    def __init__(self, inner):
        self.inner, self.url, self.listed = inner, inner.url, 0

    def list(self, kind: str | None = None) -> Iterator[Manifest]:
        for manifest in self.inner.list(kind):
            self.listed += 1
            yield manifest


def main(argv: list[str] | None = None) -> int:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,1000,10000", help="registry sizes, comma-separated, ascending")
    parser.add_argument("--files", type=int, default=50, help="files listed by each index entry")
    parser.add_argument("--lookups", type=positive_int, default=20, help="hit lookups per size; the median is reported")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="which registries, comma-separated")
    args = parser.parse_args(argv)
    BACKENDS[:] = [b for b in args.backends.split(",") if b != "oci" or shutil.which("docker-registry")]
    sizes = [int(s) for s in args.sizes.split(",")]
    manifests = synthetic_manifests(sizes[-1], files=args.files)
    print(f"index entries of {args.files} files each; a miss reads at most {MISS_SAMPLE} entries")
    with (
        tempfile.TemporaryDirectory(prefix="prebake-registry-scale-") as tmp,
        moto_server() as endpoint,
        hub_server() as hub,
        ExitStack() as servers,
    ):
        oci = servers.enter_context(oci_server(Path(tmp, "oci"))) if "oci" in BACKENDS else None
        if oci is not None:
            os.environ["PREBAKE_OCI_PLAIN_HTTP"] = oci.host
        # a script, not a library: this process and its `prebake ls` children talk only to these servers
        os.environ.update(s3_env(endpoint))
        os.environ.update(HF_ENDPOINT=hub.url, HF_TOKEN="hf_scale", HF_HUB_DISABLE_XET="1")
        os.environ.update(HF_HUB_CACHE=str(Path(tmp, "hf-cache")), PREBAKE_HOME=str(Path(tmp, "home")))
        registries = _seed(Path(tmp), hub, oci, sizes, manifests)
        points = _measure(registries, manifests, args.lookups)
    figures = _figures(points, sizes)
    for b in BACKENDS:
        large, small = sizes[-1], sizes[0]
        print(
            f"{b}: prebake ls of {large} entries costs {figures[f'{b}_ls_ratio_{large}_vs_{small}']}x that of "
            f"{small} ({figures[f'{b}_ls_ms_per_entry']} ms an entry); the first listing (no summary yet) "
            f"{figures[f'{b}_ls_first_ratio_{large}_vs_{small}']}x ({figures[f'{b}_ls_first_ms_per_entry']} ms an "
            f"entry), {figures[f'{b}_ls_first_vs_ls_{large}']}x the time of later ones"
        )
    print(json.dumps(figures))
    return 0


def _seed(
    tmp: Path, hub, oci, sizes: list[int], manifests: list[Manifest]
) -> dict[tuple[str, int], tuple[Callable, str]]:
    """One registry per backend and size, side by side (measured round-robin by _measure)."""
    import boto3

    client, bucket = boto3.client("s3"), f"scale-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    registries: dict[tuple[str, int], tuple[Callable, str]] = {}
    for size in sizes:
        started = time.perf_counter()
        folder = tmp / f"registry-{size}"
        seed_folder(folder, manifests[:size])
        seed_s3(client, bucket, f"reg-{size}", manifests[:size])
        hub.create_repo("model", f"scale/reg-{size}")
        hub.push(
            "model", f"scale/reg-{size}", {index_relpath(m.kind, m.key_digest): m.to_bytes() for m in manifests[:size]}
        )
        print(f"seeded {size} entries in a folder, in S3 and on the Hub ({time.perf_counter() - started:.1f} s)")
        registries["file", size] = (lambda f=folder: FileRegistry(f), str(folder))
        address = f"s3://{bucket}/reg-{size}"
        registries["s3", size] = (lambda a=address: S3Registry(a, S3Settings()), address)
        registries["hf", size] = (lambda a=f"hf://scale/reg-{size}": HubRegistry(a), f"hf://scale/reg-{size}")
        if oci is not None:
            from prebake.registry.oci import OCIRegistry

            address = oci.address(f"scale/reg-{size}")
            seed_oci(OCIRegistry(address), manifests[:size])  # the same keys, each with a small blob of its own
            registries["oci", size] = (lambda a=address: OCIRegistry(a), address)
            print(f"  and in OCI ({time.perf_counter() - started:.1f} s)")
    return {k: v for k, v in registries.items() if k[0] in BACKENDS}


def _measure(registries: dict, manifests: list[Manifest], lookups: int) -> list[Point]:
    """Every measurement taken round-robin over the registries, so a change in the machine's load
    falls on all sizes alike and the ratios between sizes stay fair."""
    opened = {where: make() for where, (make, _) in registries.items()}
    hits: dict = {where: [] for where in registries}
    for i in range(lookups):
        for (backend, size), registry in opened.items():
            m = manifests[(i * 7919) % size]
            hits[backend, size].append(_timed(functools.partial(registry.lookup, m.kind, m.key_digest)))
    misses: dict = {where: [] for where in registries}
    for _ in range(3):
        for where, (make, _) in registries.items():
            misses[where].append(_miss(make()))
    first = {where: _timed(functools.partial(_prebake_ls, address)) for where, (_, address) in registries.items()}
    again: dict = {where: [] for where in registries}
    for _ in range(3):
        for where, (_, address) in registries.items():
            again[where].append(_timed(functools.partial(_prebake_ls, address)))
    points = []
    for backend, size in registries:
        miss_s, reads, requests = sorted(misses[backend, size])[1]  # the median of three
        hit_ms, ls_s = 1000 * statistics.median(hits[backend, size]), statistics.median(again[backend, size])
        points.append(Point(backend, size, hit_ms, 1000 * miss_s, reads, requests, ls_s, first[backend, size]))
        _report(points[-1])
    return points


def _miss(registry) -> tuple[float, int, int | None]:
    """nearest_miss on a key in no registry: seconds, entries read, HTTP requests (S3)."""
    counting = _Counting(registry)
    sent: list[str] = []
    if isinstance(registry, S3Registry):
        registry.s3._client.meta.events.register("before-send.s3", lambda request, **_: sent.append(request.url))
    seconds = _timed(lambda: nearest_miss(cast(Registry, counting), _missing_key(), "no bundle for this key"))
    return seconds, counting.listed, len(sent) if isinstance(registry, S3Registry) else None


def _missing_key() -> Key:
    near = entry_key(0)
    return Key.of("graphs", {**{g: dict(f) for g, f in near.groups}, "software": {"torch": "2.99.0+cpu"}})


def _prebake_ls(address: str) -> None:
    argv = [sys.executable, "-m", "prebake.engine.cli", "ls", "--registry", address, "--kind", "graphs"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True)
    if done.stdout.count("\n") < 2:
        raise RuntimeError(f"prebake ls printed no bundles: {done.stdout!r} {done.stderr!r}")


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _report(p: Point) -> None:
    requests = f", {p.miss_requests} requests" if p.miss_requests is not None else ""
    print(
        f"  {p.backend:<4} {p.entries:>6} entries: hit {p.hit_ms:7.2f} ms   "
        f"miss {p.miss_ms:7.1f} ms ({p.miss_reads} entries read{requests})   "
        f"prebake ls {p.ls_s:6.2f} s (first {p.ls_first_s:6.2f} s)"
    )


def _figures(points: list[Point], sizes: list[int]) -> dict[str, float]:
    figures: dict[str, float] = {}
    for p in points:
        figures[f"{p.backend}_hit_ms_{p.entries}"] = round(p.hit_ms, 3)
        figures[f"{p.backend}_miss_ms_{p.entries}"] = round(p.miss_ms, 1)
        figures[f"{p.backend}_miss_reads_{p.entries}"] = p.miss_reads
        if p.miss_requests is not None:
            figures[f"{p.backend}_miss_requests_{p.entries}"] = p.miss_requests
        figures[f"{p.backend}_ls_s_{p.entries}"] = round(p.ls_s, 3)
        figures[f"{p.backend}_ls_first_s_{p.entries}"] = round(p.ls_first_s, 3)
    # hits against the smallest registry; misses against the first size whose sample is full
    large = sizes[-1]
    full = next((s for s in sizes if s >= MISS_SAMPLE), sizes[0])
    for backend in BACKENDS:
        for what, base in (("hit_ms", sizes[0]), ("miss_ms", full)):
            ratio = figures[f"{backend}_{what}_{large}"] / figures[f"{backend}_{what}_{base}"]
            figures[f"{backend}_{what.removesuffix('_ms')}_ratio_{large}_vs_{base}"] = round(ratio, 2)
        small = sizes[0]
        for what in ("ls", "ls_first"):
            at_large, at_small = figures[f"{backend}_{what}_s_{large}"], figures[f"{backend}_{what}_s_{small}"]
            figures[f"{backend}_{what}_ratio_{large}_vs_{small}"] = round(at_large / at_small, 2)
            per_entry = 1000 * (at_large - at_small) / max(large - small, 1)
            figures[f"{backend}_{what}_ms_per_entry"] = round(per_entry, 3)
        figures[f"{backend}_ls_first_vs_ls_{large}"] = round(
            figures[f"{backend}_ls_first_s_{large}"] / figures[f"{backend}_ls_s_{large}"], 1
        )
    return figures


if __name__ == "__main__":
    sys.exit(main())
