"""OCI transfer throughput: prebake's OCI backend against `skopeo copy`, on Debian's docker-registry.

    python -m benchmarks.oci_io [--size-mb 256] [--repeat 3]       (also run by benchmarks/registry_io.py)

Packs a bundle of one incompressible file (a real blob and manifest), starts docker-registry on
127.0.0.1 over plain HTTP (tests/support/oci_server.py), publishes it, and times, in one run and
alternating which goes first:

    fetch     OCIRegistry.fetch_blob: parallel ranged GETs (the default parts), size-bounded and
              sha256-verified while written, and the same in one stream (PREBAKE_OCI_CHUNK_MB=0),
              vs `skopeo copy docker://HOST/REPO:TAG dir:OUT` (digests checked)
    publish   OCIRegistry.publish: hash, diff_id, layer and config, manifest, tag, settle read-back,
              vs `skopeo copy dir:OUT docker://HOST2/REPO:TAG`; each round into a fresh registry
              server, so skopeo cannot mount the layer from where it read it

It prints the median seconds and MiB/s of each and the time ratios prebake/skopeo (below 1:
prebake is faster), also with skopeo's process start (`skopeo --version`) left out. Ends with
one JSON line (docs/performance.md, "OCI transfers against skopeo").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

_MiB = 1 << 20


def available() -> bool:
    return all(shutil.which(t) for t in ("docker-registry", "skopeo"))


def measure(tmp: Path, size_mb: int, repeat: int) -> dict[str, list[float]]:
    from prebake.artifacts.bundle.payload import file_digest
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings
    from prebake.registry.oci.artifact import tag_for
    from tests.support.bundles import make_bundle
    from tests.support.oci_server import oci_server

    bundle = make_bundle(tmp / "bundle", payload_bytes=size_mb * _MiB)
    with oci_server(tmp / "server") as server, ExitStack() as servers:
        settings = OCISettings(plain_http=(server.host,))
        seeded = OCIRegistry(server.address("bench/seed"), settings)
        seeded.publish(bundle.manifest, bundle.blob)
        tag = tag_for("graphs", bundle.manifest.key_digest)
        src = f"docker://{server.host}/bench/seed:{tag}"
        skopeo = ["skopeo", "copy", "-q", "--src-tls-verify=false", "--dest-tls-verify=false"]
        layout = tmp / "layout"
        subprocess.run([*skopeo, src, f"dir:{layout}"], check=True)

        one_stream = OCIRegistry(server.address("bench/seed"), OCISettings(plain_http=(server.host,), chunk_mb=0))

        def prebake_fetch() -> None:
            seeded.fetch_blob(bundle.manifest.blob.digest, tmp / "dl-prebake", size=bundle.manifest.blob.size)

        def prebake_fetch_one_stream() -> None:
            one_stream.fetch_blob(bundle.manifest.blob.digest, tmp / "dl-one", size=bundle.manifest.blob.size)
            (tmp / "dl-one").unlink()

        def skopeo_fetch() -> None:
            shutil.rmtree(tmp / "dl-skopeo", ignore_errors=True)
            subprocess.run([*skopeo, src, f"dir:{tmp / 'dl-skopeo'}"], check=True)

        def prebake_publish(r: int) -> Callable[[], object]:
            registry = OCIRegistry(
                fresh[r].address(f"bench/pub-{uuid.uuid4().hex[:6]}"), OCISettings(plain_http=(fresh[r].host,))
            )
            return lambda: registry.publish(bundle.manifest, bundle.blob)

        def skopeo_publish(r: int) -> Callable[[], object]:
            # a registry skopeo has never seen: its blob-info cache knows the layer on the seed registry
            # and would mount it from there instead of uploading it
            dest = f"docker://{fresh[r].host}/bench/sk-{uuid.uuid4().hex[:6]}:{tag}"
            return lambda: subprocess.run([*skopeo, f"dir:{layout}", dest], check=True)

        fresh = [servers.enter_context(oci_server(tmp / f"publish-{r}")) for r in range(repeat)]
        names: tuple[str, ...] = (
            "prebake fetch",
            "skopeo fetch",
            "prebake publish",
            "skopeo publish",
            "skopeo start-up",
        )
        names += ("prebake fetch 1-stream",)
        results: dict[str, list[float]] = {n: [] for n in names}
        for r in range(repeat):
            pairs: list[tuple[str, Callable[[], object]]] = [
                ("prebake fetch", prebake_fetch),
                ("skopeo fetch", skopeo_fetch),
            ]
            pairs += [("prebake publish", prebake_publish(r)), ("skopeo publish", skopeo_publish(r))]
            if r % 2:
                pairs = [pairs[1], pairs[0], pairs[3], pairs[2]]
            for name, call in pairs:
                results[name].append(_timed(call))
                print(f"  round {r + 1}: {name:16s} {results[name][-1]:6.2f} s", file=sys.stderr)
            (tmp / "dl-prebake").unlink(missing_ok=True)
            results["prebake fetch 1-stream"].append(_timed(prebake_fetch_one_stream))
            results["skopeo start-up"].append(
                _timed(lambda: subprocess.run(["skopeo", "--version"], check=True, stdout=subprocess.DEVNULL))
            )
        got = seeded.fetch_blob(bundle.manifest.blob.digest, tmp / "check")
        copied = tmp / "dl-skopeo" / bundle.manifest.blob.hex
        if file_digest(got) != bundle.manifest.blob.digest or file_digest(copied) != bundle.manifest.blob.digest:
            raise SystemExit("the final downloads do not match the blob: the figures above are void")
    return results


def report(results: dict[str, list[float]], size_mb: int) -> dict[str, float]:
    med = {name: statistics.median(times) for name, times in results.items()}
    rounds = len(results["skopeo fetch"])
    print(f"\nOCI transfer of a {size_mb} MiB bundle on docker-registry over loopback (median of {rounds} rounds)")
    for name in ("prebake fetch", "prebake fetch 1-stream", "skopeo fetch", "prebake publish", "skopeo publish"):
        print(f"  {name:22s} {med[name]:7.2f} s  {size_mb / med[name]:8.1f} MiB/s")
    startup = med["skopeo start-up"]
    print(f"  skopeo start-up  {startup:7.2f} s  (`skopeo --version`)")
    figures: dict[str, float] = {"oci_blob_mib": size_mb}
    for op in ("fetch", "publish"):
        raw = med[f"prebake {op}"] / med[f"skopeo {op}"]
        net = med[f"prebake {op}"] / max(med[f"skopeo {op}"] - startup, 1e-9)
        print(f"  {op:8s} time prebake/skopeo: {raw:5.2f}   (skopeo without its start-up: {net:5.2f})")
        figures[f"oci_{op}_time_ratio_to_skopeo"] = round(raw, 3)
        figures[f"oci_{op}_time_ratio_to_skopeo_net"] = round(net, 3)
    one = med["prebake fetch 1-stream"] / med["skopeo fetch"]
    print(f"  fetch in one stream, time prebake/skopeo: {one:5.2f}")
    figures["oci_fetch_one_stream_time_ratio_to_skopeo"] = round(one, 3)
    return figures


def _timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=256, help="bundle size in MiB (256 for the issue's figure)")
    parser.add_argument(
        "--repeat", type=positive_int, default=3, help="timed rounds per measurement; the median is reported"
    )
    args = parser.parse_args(argv)
    if not available():
        print("docker-registry and skopeo are needed: apt-get install docker-registry skopeo", file=sys.stderr)
        return 2
    os.environ.pop("PREBAKE_OCI_PLAIN_HTTP", None)
    with tempfile.TemporaryDirectory(prefix="prebake-bench-oci-") as tmp:
        figures = report(measure(Path(tmp), args.size_mb, args.repeat), args.size_mb)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
