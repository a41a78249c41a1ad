"""A fleet fetching one bundle at once: N simulated nodes against S3, an OCI registry, and a mirror.

    python -m benchmarks.fleet_fetch [--nodes 1,8,32] [--scale 8]

Each node is a process with its own empty PREBAKE_HOME, warmed up (imports done, registry
opened) and blocked on its stdin until a shared go line; from it, it looks up, fetches,
verifies and installs the bundle, and reports how long that took. Per N and per source:

    s3           moto's S3 server (tests/support/moto_server.py)
    oci          Debian's docker-registry, the nodes talking to it directly
    mirror       a second docker-registry with `proxy.remoteurl` set to the first (cold: the bundle is new)
    mirror-warm  N fresh nodes again through the same mirror, which now holds the bundle
    preheated    a bundle pulled through the mirror once by `prebake preheat` before N nodes start

Origin bytes are what the origin sent for blob requests, from its own access log (for S3, the
fault proxy in front of moto counts them), so nothing sits in the data path. Reported per N and
source: origin blob bytes per node (and over the bundle's size), p50 and p99 to installed.
`--scale` is the bundle's size in MiB (8: sized for a 2-core machine). Every N uses a bundle of
its own. Ends with one JSON line (docs/performance.md, "Fleets fetching through a mirror").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

_MiB = 1 << 20
_REPO = Path(__file__).resolve().parents[1]


def node(argv: list[str]) -> int:
    """One simulated node: warm up, wait for the go signal (a line on stdin: the time it was given),
    fetch, print seconds since the signal."""
    parser = argparse.ArgumentParser(prog="fleet_fetch node")
    parser.add_argument("--home", required=True)
    parser.add_argument("--registry", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--ready", type=Path, required=True)
    args = parser.parse_args(argv)
    from prebake.artifacts.fetch.outcome import Miss
    from prebake.artifacts.fetch.pipeline import fetch_key
    from prebake.artifacts.store.local import Store
    from prebake.artifacts.store.settings import StoreLimits
    from prebake.registry import open_registry

    store, registry = Store(Path(args.home), StoreLimits()), open_registry(args.registry)
    args.ready.touch()
    started = float(sys.stdin.readline() or time.time())  # blocks until the go signal: no polling
    manifest = registry.lookup("graphs", args.key)
    got = None if manifest is None else fetch_key(store, registry, manifest.the_key())
    if got is None or isinstance(got, Miss):
        print(json.dumps({"error": "no index entry" if got is None else got.reason}))
        return 1
    print(json.dumps({"seconds": time.time() - started, "tree": str(got.tree)}))
    return 0


def _fleet(n: int, address: str, key: str, env: dict[str, str], tmp: Path) -> list[float]:
    run = tmp / f"run-{uuid.uuid4().hex[:8]}"
    run.mkdir()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREBAKE_", "AWS_"))}
    procs = []
    for i in range(n):
        args = ["--home", str(run / f"home-{i}"), "--registry", address, "--key", key]
        args += ["--ready", str(run / f"ready-{i}")]
        with (run / f"err-{i}").open("w") as err:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.fleet_fetch", "node", *args],
                    cwd=_REPO,
                    env={**base, **env},
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                )
            )
    deadline = time.monotonic() + 300
    while not all((run / f"ready-{i}").exists() for i in range(n)):
        if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
            for p in procs:
                p.kill()
            raise SystemExit(f"the nodes did not start: {(run / 'err-0').read_text()[-2000:]}")
        time.sleep(0.05)
    go = f"{time.time()!r}\n"
    for p in procs:  # every node blocks on its stdin: all wake at once, none spins
        assert p.stdin is not None
        p.stdin.write(go)
        p.stdin.close()
    seconds = []
    for i, p in enumerate(procs):
        assert p.stdout is not None
        out = p.stdout.read()
        if p.wait(timeout=600) != 0:
            raise SystemExit(f"a node failed: {out[-500:]} {(run / f'err-{i}').read_text()[-2000:]}")
        seconds.append(json.loads(out.strip().splitlines()[-1])["seconds"])
    shutil.rmtree(run, ignore_errors=True)
    return seconds


def _bundle(tmp: Path, scale: int, tag: str):
    from tests.support.bundles import make_bundle

    return make_bundle(tmp / f"bundle-{tag}", model=f"fleet-{tag}", payload_bytes=scale * _MiB)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


SOURCES = ("s3", "oci", "mirror", "preheated")


def run(
    nodes: list[int], scale: int, tmp: Path, sources: tuple[str, ...] = SOURCES
) -> dict[str, dict[int, dict[str, float]]]:
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings
    from tests.support.oci_server import oci_server

    out: dict[str, dict[int, dict[str, float]]] = {s: {} for s in sources}
    if "mirror" in sources:
        out["mirror-warm"] = {}
    if "s3" in sources:
        out["s3"] = _s3(nodes, scale, tmp)
    with oci_server(tmp / "origin") as origin:
        with oci_server(tmp / "mirror", proxy_of=origin) as mirror:
            direct = OCIRegistry(origin.address("fleet/prebake"), OCISettings(plain_http=(origin.host,), settle_s=0.1))
            for source, host in (("oci", origin.host), ("mirror", mirror.host)):
                if source not in sources:
                    continue
                for n in nodes:
                    b = _bundle(tmp, scale, f"{source}-{n}")
                    direct.publish(b.manifest, b.blob)
                    before = origin.bytes_sent("/blobs/")
                    seconds = _fleet(
                        n, f"oci://{host}/fleet/prebake", b.manifest.key_digest, {"PREBAKE_OCI_PLAIN_HTTP": host}, tmp
                    )
                    blob_bytes = origin.bytes_sent("/blobs/") - before
                    out[source][n] = _figures(seconds, blob_bytes, n, b.manifest.blob.size)
                    print(f"  {source:6s} N={n:3d}: {out[source][n]}", file=sys.stderr)
                    if source == "mirror":  # a second wave of fresh nodes: the mirror now holds the bundle
                        before = origin.bytes_sent("/blobs/")
                        seconds = _fleet(
                            n,
                            f"oci://{host}/fleet/prebake",
                            b.manifest.key_digest,
                            {"PREBAKE_OCI_PLAIN_HTTP": host},
                            tmp,
                        )
                        blob_bytes = origin.bytes_sent("/blobs/") - before
                        out["mirror-warm"][n] = _figures(seconds, blob_bytes, n, b.manifest.blob.size)
                        print(f"  mirror-warm N={n:3d}: {out['mirror-warm'][n]}", file=sys.stderr)
            for n in nodes if "preheated" in sources else ():
                out["preheated"][n] = _preheated(n, direct, origin, mirror.host, scale, tmp)
                print(f"  preheated N={n:3d}: {out['preheated'][n]}", file=sys.stderr)
    return out


def _s3(nodes: list[int], scale: int, tmp: Path) -> dict[int, dict[str, float]]:
    import boto3

    from prebake.registry.backends.s3 import S3Registry
    from tests.faults.fault_proxy import fault_proxy
    from tests.support.moto_server import moto_server, s3_env

    out = {}
    with moto_server() as moto, fault_proxy(moto) as s3_proxy:
        env = s3_env(s3_proxy.url)
        os.environ.update(s3_env(moto))
        bucket = f"fleet-{uuid.uuid4().hex[:8]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        for n in nodes:
            b = _bundle(tmp, scale, f"s3-{n}")
            S3Registry(f"s3://{bucket}/prebake").publish(b.manifest, b.blob)
            before = s3_proxy.bytes_sent("/blobs/")
            seconds = _fleet(n, f"s3://{bucket}/prebake", b.manifest.key_digest, env, tmp)
            out[n] = _figures(seconds, s3_proxy.bytes_sent("/blobs/") - before, n, b.manifest.blob.size)
            print(f"  s3     N={n:3d}: {out[n]}", file=sys.stderr)
    return out


def _preheated(n: int, direct, origin, host: str, scale: int, tmp: Path) -> dict[str, float]:
    """A new bundle, preheated through the mirror (what that cost the origin: measured), then N nodes."""
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings
    from prebake.registry.oci.preheat import preheat

    b = _bundle(tmp, scale, f"preheated-{n}")
    direct.publish(b.manifest, b.blob)
    before = origin.bytes_sent("/blobs/")
    mirror = OCIRegistry(f"oci://{host}/fleet/prebake", OCISettings(plain_http=(host,)))
    (done,) = preheat(mirror, keys=(b.manifest.key_digest,))
    assert done.pulled, "a new bundle is pulled through the mirror"
    preheat_bytes = origin.bytes_sent("/blobs/") - before
    before = origin.bytes_sent("/blobs/")
    env = {"PREBAKE_OCI_PLAIN_HTTP": host}
    seconds = _fleet(n, f"oci://{host}/fleet/prebake", b.manifest.key_digest, env, tmp)
    figures = _figures(seconds, origin.bytes_sent("/blobs/") - before, n, b.manifest.blob.size)
    figures["preheat_s"] = round(done.seconds, 3)
    figures["preheat_origin_blob_ratio"] = round(preheat_bytes / b.manifest.blob.size, 3)
    return figures


def _figures(seconds: list[float], origin_blob_bytes: int, n: int, size: int) -> dict[str, float]:
    return {
        "p50_s": round(statistics.median(seconds), 3),
        "p99_s": round(_quantile(seconds, 0.99), 3),
        "p99_over_p50": round(_quantile(seconds, 0.99) / max(statistics.median(seconds), 1e-9), 2),
        "origin_blob_bytes_per_node": round(origin_blob_bytes / n),
        "origin_blob_ratio_per_node": round(origin_blob_bytes / n / size, 3),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["node"]:
        return node(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1,8,32", help="comma-separated fleet sizes (default 1,8,32)")
    parser.add_argument("--scale", type=int, default=8, help="the bundle's size in MiB (default 8)")
    parser.add_argument("--sources", default=",".join(SOURCES), help=f"comma-separated, of {', '.join(SOURCES)}")
    args = parser.parse_args(argv)
    sources = tuple(s for s in SOURCES if s in args.sources.split(","))
    if shutil.which("docker-registry") is None:
        print("docker-registry is needed: apt-get install docker-registry", file=sys.stderr)
        return 2
    nodes = [int(n) for n in args.nodes.split(",")]
    with tempfile.TemporaryDirectory(prefix="prebake-fleet-") as tmp:
        results = run(nodes, args.scale, Path(tmp), sources)
    print(
        f"\n{len(nodes)} fleet sizes fetching one {args.scale} MiB bundle at once (origin bytes: blob bytes the origin sent)"
    )
    print(
        f"  {'source':7s} {'N':>4s} {'p50 s':>7s} {'p99 s':>7s} {'p99/p50':>8s} {'origin blob bytes/node':>23s} {'/ bundle':>9s}"
    )
    for source, per_n in results.items():
        for n, f in per_n.items():
            print(
                f"  {source:11s} {n:4d} {f['p50_s']:7.2f} {f['p99_s']:7.2f} {f['p99_over_p50']:8.2f} "
                f"{f['origin_blob_bytes_per_node']:23,d} {f['origin_blob_ratio_per_node']:9.3f}"
            )
    largest = max(nodes)
    summary: dict[str, object] = {"scale_mib": args.scale, "nodes": nodes}
    for source, per_n in results.items():
        for n, f in per_n.items():
            for name, value in f.items():
                summary[f"{source.replace('-', '_')}_n{n}_{name}"] = value
    for source in ("mirror-warm", "preheated"):
        if source in results:
            got = results[source][largest]["origin_blob_bytes_per_node"]
            summary[f"{source.replace('-', '_')}_origin_blob_bytes_per_node"] = got
    if "mirror" in results and "oci" in results:
        summary["mirror_origin_blob_ratio_to_direct"] = round(
            results["mirror"][largest]["origin_blob_bytes_per_node"]
            / max(results["oci"][largest]["origin_blob_bytes_per_node"], 1),
            3,
        )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
