"""The store bound never takes what a start is using: a bound too small for one target's bundles
is an error before anything is evicted, and a gc run while a fetch downloads never evicts the
kinds it installed first."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

from prebake.artifacts.fetch.pipeline import fetch_key
from prebake.artifacts.store.local import Store, StoreLimits
from prebake.registry.backends.file import FileRegistry
from tests.faults.fault_proxy import Fault, fault_proxy
from tests.operations.conftest import OPS_MODEL
from tests.operations.target import KINDS, fetch_args, prebake, prebake_env, publish, published_set, target_set
from tests.support.baking import BIN, REPO
from tests.support.bundles import make_bundle
from tests.support.moto_server import s3_env
from tests.support.serving import ServeProcess, serve_env

EXIT_INVALID = 2


def _registry(tmp_path, scenario):
    return published_set(tmp_path, scenario)


def _old_bundle(tmp_path, home, scenario):
    """Another model's bundle, installed earlier: what a bound must evict first, if anything."""
    other = FileRegistry(tmp_path / "other")
    bundle = make_bundle(tmp_path / "other-bake", model="other-model", payload_bytes=64 << 10)
    other.publish(bundle.manifest, bundle.blob)
    scenario.registry(other, bundle.manifest)
    got = prebake("store", "ls", env=prebake_env(home))
    fetch_key(Store(home, StoreLimits()), other, bundle.manifest.the_key())
    assert got.returncode == 0 and "other-model" in prebake("store", "ls", env=prebake_env(home)).stdout
    return bundle


def _trees(home) -> set[str]:
    return {p.name for p in (home / "trees").iterdir() if p.is_dir()} if (home / "trees").is_dir() else set()


def test_a_bound_below_one_targets_set_is_an_error_that_says_so_before_anything_is_evicted(tmp_path, scenario):
    registry, targets = _registry(tmp_path, scenario)
    home = scenario.store(tmp_path / "home")
    old = _old_bundle(tmp_path, home, scenario)
    largest = max(m.blob.size + m.unpacked_bytes for m in targets.manifests.values())
    bound = (largest + targets.bytes) // 2  # above the largest bundle, below the set
    before = _trees(home)

    got = prebake(*fetch_args(registry.root), env=prebake_env(home, PREBAKE_STORE_MAX_BYTES=str(bound)))

    assert got.returncode == EXIT_INVALID, got.stdout + got.stderr
    assert "export" not in got.stdout  # no paths handed out
    assert f"bounded to {bound / (1 << 20):.1f} MiB" in got.stderr and "nothing was installed or evicted" in got.stderr
    assert f"raise PREBAKE_STORE_MAX_BYTES to at least {targets.bytes} bytes" in got.stderr
    assert _trees(home) == before == {old.manifest.blob.hex}


def test_serve_with_a_bound_below_the_set_says_so_instead_of_a_miss(tmp_path, scenario):
    registry, targets = _registry(tmp_path, scenario)
    home = scenario.store(tmp_path / "home")
    bound = targets.bytes - 1
    server = ServeProcess(
        ["--model", "tiny-llama", "--precision", "bf16", "--registry", str(registry.root), "--on-miss", "fail"],
        prebake_env(home, PREBAKE_STORE_MAX_BYTES=str(bound)),
    )
    assert server.wait_exit(120) == EXIT_INVALID, server.log
    assert "nothing was installed or evicted" in server.log and "evicted before it could be held" not in server.log
    assert _trees(home) == set()


def test_a_gc_every_moment_while_fetch_downloads_never_takes_the_kinds_it_installed_first(tmp_path, scenario, bucket):
    from prebake.registry.backends.s3 import S3Registry
    from prebake.registry.backends.s3_client import S3Settings

    targets = target_set(tmp_path / "bake")
    address = f"s3://{bucket}/prebake"
    direct = S3Registry(address, S3Settings())
    publish(direct, targets)
    scenario.registry(direct, *targets.manifests.values())
    home = scenario.store(tmp_path / "home")
    (home / "index").mkdir(parents=True)
    gcs: list[tuple[float, dict]] = []  # (when it ended, its --json report)
    with fault_proxy(os.environ["AWS_ENDPOINT_URL"]) as proxy:
        proxy.inject(Fault("GET", "/blobs/", "throttle", seconds=0.03))  # the graphs blob takes seconds
        stop = threading.Event()

        def cron() -> None:  # an operator's `prebake gc --max-size 0`, as often as it can run
            while not stop.is_set():
                done = prebake("gc", "--max-size", "0", "--json", env=prebake_env(home))
                assert done.returncode == 0, done.stderr
                gcs.append((time.monotonic(), json.loads(done.stdout)))
                time.sleep(0.05)

        thread = threading.Thread(target=cron)
        thread.start()
        try:
            fetch = subprocess.Popen(
                [str(BIN / "prebake"), *fetch_args(address, "--json")],
                env=prebake_env(home, **s3_env(proxy.url)),
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            first_line = fetch.stdout.readline()
            printed = time.monotonic()  # the fetch holds its trees until after it has printed them
            out = fetch.stdout.read()
            fetch.wait(300)
        finally:
            stop.set()
            thread.join(60)
    assert fetch.returncode == 0, first_line + out
    payload = json.loads(first_line + out)
    assert payload["complete"] and sorted(payload["bundles"]) == sorted(KINDS)
    handed_out = {b["blob"] for b in payload["bundles"].values()}
    assert handed_out == {m.blob.digest for m in targets.manifests.values()}
    before_print = [report for ended, report in gcs if ended < printed]
    assert len(before_print) >= 2, "the gc loop ran while the downloads ran"
    assert not [d for r in before_print for d in r["evicted"] if d in handed_out], "a tree went before it was used"
    assert any(set(r["in_use"]) & handed_out for r in before_print)


def test_a_gc_every_moment_while_serve_starts_never_fails_the_start(baked, tmp_path, scenario, bucket):
    from prebake.registry.backends.s3 import S3Registry
    from prebake.registry.backends.s3_client import S3Settings

    address = f"s3://{bucket}/prebake"
    direct = S3Registry(address, S3Settings())
    source = FileRegistry(baked.registry)
    manifests = list(source.list())
    for manifest in manifests:
        direct.publish(manifest, source.blob_path(manifest.blob.digest))
    scenario.registry(direct, *manifests)
    home = scenario.store(tmp_path / "home")
    (home / "index").mkdir(parents=True)
    with fault_proxy(os.environ["AWS_ENDPOINT_URL"]) as proxy:
        proxy.inject(Fault("GET", "/blobs/", "throttle", seconds=0.3))  # the later kinds download slowly
        stop, gcs = threading.Event(), []

        def cron() -> None:
            while not stop.is_set():
                gcs.append(prebake("gc", "--max-size", "0", "--json", env=prebake_env(home)))
                time.sleep(0.05)

        thread = threading.Thread(target=cron)
        thread.start()
        server = ServeProcess(
            ["--model", OPS_MODEL, "--eager", "--registry", address, "--on-miss", "fail"],
            serve_env(home, baked.recipes, **s3_env(proxy.url)),
        )
        try:
            server.wait_ready(300)
            assert server.complete(prompt=[1, 2, 3], max_tokens=4, temperature=0)["choices"][0]["token_ids"]
        finally:
            stop.set()
            thread.join(60)
            server.stop()
    assert "evicted before it could be held" not in server.log and "miss:" not in server.log, server.log
    reports = [json.loads(g.stdout) for g in gcs if g.returncode == 0]
    assert len(reports) >= 3 and any(r["in_use"] for r in reports)
