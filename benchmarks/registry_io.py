"""Registry transfer throughput: prebake's S3 backend against awscli on moto's S3 server, and its
OCI backend against skopeo on Debian's docker-registry (benchmarks/oci_io.py), over loopback.

    python -m benchmarks.registry_io [--size-mb 256] [--repeat 3] [--only s3|oci]

Writes a blob of random bytes, starts moto's server as a process on 127.0.0.1
(tests/support/moto_server.py), and times, in one run and alternating which goes first:

    download  S3Registry.fetch_blob: parallel ranged GETs, sha256 verified while writing
              vs `aws s3 cp s3://<bucket>/<key> <file>`
    publish   S3Registry.publish: hash the blob, look up the key, multipart upload, conditional index put
              vs `aws s3 cp <file> s3://<bucket>/<key>`

Both sides use 10 concurrent requests and 8 MiB parts (awscli's defaults and prebake's). It
prints the median seconds and MiB/s of each, and the ratios prebake/awscli of throughput
(above 1: prebake is faster). awscli's figures include starting its process; that start-up
is measured on its own and a second ratio leaves it out. The server is moto, a Python
process: both clients are bound by it, so the figures compare clients, not S3.
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
from pathlib import Path
from subprocess import DEVNULL

from prebake.artifacts.bundle.manifest import BlobRef, Manifest
from prebake.artifacts.bundle.payload import file_digest
from prebake.artifacts.keys import Key
from prebake.artifacts.layout import blob_relpath
from prebake.registry.backends.s3 import S3Registry
from tests.support.moto_server import moto_server, s3_env

_MiB = 1 << 20


def main(argv: list[str] | None = None) -> int:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--size-mb", type=int, default=256, help="blob size in MiB (at least 256 for the issue's figure)"
    )
    parser.add_argument(
        "--repeat", type=positive_int, default=3, help="timed rounds per measurement; the median is reported"
    )
    parser.add_argument("--only", choices=("s3", "oci"), help="measure one backend (default: both)")
    args = parser.parse_args(argv)
    from benchmarks import oci_io

    if args.only != "oci" and shutil.which("aws") is None:
        print("awscli (`aws`) is not on PATH; install it (pip install awscli) to compare against it", file=sys.stderr)
        return 2
    if args.only != "s3" and not oci_io.available():
        print("docker-registry and skopeo are needed: apt-get install docker-registry skopeo", file=sys.stderr)
        return 2
    figures: dict[str, float] = {}
    if args.only != "oci":
        with tempfile.TemporaryDirectory(prefix="prebake-bench-") as tmp, moto_server() as endpoint:
            os.environ.update(s3_env(endpoint))  # a script, not a library: this process talks only to moto
            results = _run(Path(tmp), endpoint, args.size_mb, args.repeat)
        figures |= _report(results, args.size_mb)
    if args.only != "s3":
        with tempfile.TemporaryDirectory(prefix="prebake-bench-oci-") as tmp:
            figures |= oci_io.report(oci_io.measure(Path(tmp), args.size_mb, args.repeat), args.size_mb)
    print(json.dumps(figures))
    return 0


def _run(tmp: Path, endpoint: str, size_mb: int, repeat: int) -> dict[str, list[float]]:
    import boto3

    blob = _random_file(tmp / "blob.tar.zst", size_mb)
    manifest = _manifest_for(blob)
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    seeded = S3Registry(f"s3://{bucket}/seed")
    seeded.publish(manifest, blob)
    seed_url = f"s3://{bucket}/seed/{blob_relpath(manifest.blob.digest)}"
    aws = ["aws", "--endpoint-url", endpoint]

    def prebake_download() -> None:
        seeded.fetch_blob(manifest.blob.digest, tmp / "dl-prebake")

    def aws_download() -> None:
        subprocess.run([*aws, "s3", "cp", "--only-show-errors", seed_url, str(tmp / "dl-aws")], check=True)

    def prebake_publish(r: int) -> Callable[[], object]:
        registry = S3Registry(f"s3://{bucket}/pub-{r}")  # a fresh prefix: nothing to skip
        return lambda: registry.publish(manifest, blob)

    def aws_publish(r: int) -> Callable[[], object]:
        target = f"s3://{bucket}/aws-{r}/blob"
        return lambda: subprocess.run([*aws, "s3", "cp", "--only-show-errors", str(blob), target], check=True)

    names = ("prebake download", "aws download", "prebake publish", "aws publish", "aws start-up", "sha256 of the blob")
    results: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeat):
        pairs: list[tuple[str, Callable[[], object]]] = [
            ("prebake download", prebake_download),
            ("aws download", aws_download),
        ]
        pairs += [("prebake publish", prebake_publish(r)), ("aws publish", aws_publish(r))]
        if r % 2:  # alternate who goes first, so neither always meets a warmer server or page cache
            pairs = [pairs[1], pairs[0], pairs[3], pairs[2]]
        for name, call in pairs:
            results[name].append(_timed(call))
            print(f"  round {r + 1}: {name:17s} {results[name][-1]:6.2f} s", file=sys.stderr)
        for leftover in ("dl-prebake", "dl-aws"):
            (tmp / leftover).unlink(missing_ok=True)
        _delete_prefixes(s3, bucket, [f"pub-{r}/", f"aws-{r}/"])  # moto keeps objects in memory
        results["aws start-up"].append(
            _timed(
                lambda: subprocess.run([*aws, "s3api", "head-bucket", "--bucket", bucket], check=True, stdout=DEVNULL)
            )
        )
        results["sha256 of the blob"].append(_timed(lambda: file_digest(blob)))
    _check_downloads_verified(seeded, manifest, tmp)
    return results


def _report(results: dict[str, list[float]], size_mb: int) -> dict[str, float]:
    med = {name: statistics.median(times) for name, times in results.items()}
    rate = {name: size_mb / t for name, t in med.items()}
    rounds = len(results["aws download"])
    print(f"\nS3 transfer of a {size_mb} MiB blob on moto's server over loopback (median of {rounds} rounds)")
    for name in ("prebake download", "aws download", "prebake publish", "aws publish"):
        print(f"  {name:17s} {med[name]:7.2f} s  {rate[name]:8.1f} MiB/s")
    startup = med["aws start-up"]
    print(f"  aws start-up      {startup:7.2f} s  (one `aws s3api head-bucket`: process start and one request)")
    print(
        f"  sha256 of the blob {med['sha256 of the blob']:6.2f} s  (inside every prebake publish: it checks the blob first)"
    )
    figures: dict[str, float] = {"blob_mib": size_mb}
    for op in ("download", "publish"):
        raw = rate[f"prebake {op}"] / rate[f"aws {op}"]
        net = (med[f"aws {op}"] - startup) / med[f"prebake {op}"]
        print(f"  {op:9s} throughput prebake/awscli: {raw:5.2f}   (awscli without its start-up: {net:5.2f})")
        figures[f"{op}_ratio_to_awscli"] = round(raw, 3)
        figures[f"{op}_ratio_to_awscli_net"] = round(net, 3)
    return figures


def _random_file(path: Path, size_mb: int) -> Path:
    with path.open("wb") as f:
        for _ in range(size_mb):
            f.write(os.urandom(_MiB))
    return path


def _manifest_for(blob: Path) -> Manifest:
    key = Key.of("graphs", {"benchmark": {"run": uuid.uuid4().hex}})
    return Manifest(
        kind="graphs",
        key={group: dict(factors) for group, factors in key.groups},
        key_digest=key.digest,
        blob=BlobRef(digest=file_digest(blob), size=blob.stat().st_size),
        files=(),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        builder="benchmarks.registry_io",
    )


def _timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _delete_prefixes(s3, bucket: str, prefixes: list[str]) -> None:
    for prefix in prefixes:
        for obj in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", ()):
            s3.delete_object(Bucket=bucket, Key=obj["Key"])


def _check_downloads_verified(registry: S3Registry, manifest: Manifest, tmp: Path) -> None:
    """A last fetch, compared byte for byte: the timed downloads were of the real bytes."""
    out = registry.fetch_blob(manifest.blob.digest, tmp / "check")
    if file_digest(out) != manifest.blob.digest:
        raise SystemExit("the final download does not match the blob: the figures above are void")


if __name__ == "__main__":
    sys.exit(main())
