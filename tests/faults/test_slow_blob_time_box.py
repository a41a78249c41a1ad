"""A blob sent slowly ends inside the fetch's time box (issue 32, point 4), on every backend over HTTP:
before, a blob sent a piece every half second kept the process running until the last byte (its
unpacker, a thread the interpreter waits for at exit, kept reading); now the download itself stops at
the time box and the process exits. The real server (Debian's docker-registry, moto's S3 server, the
Hub stand-in) behind the fault proxy, which throttles the blob; the fetch is a child process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from tests.faults.fault_proxy import Fault, fault_proxy
from tests.faults.procs import REPO, child_env
from tests.support.moto_server import s3_env

TIME_BOX_S = 2.0
CHILD = """
import json, sys
from pathlib import Path
from prebake.artifacts.fetch.pipeline import install
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.settings import StoreLimits
from prebake.registry import open_registry
home, address, entry, box = sys.argv[1:5]
manifest = Manifest.read(Path(entry))
registry = open_registry(address, create=False)
got = install({"graphs": manifest}, store=Store(home, StoreLimits()), registry=registry, timeout=float(box))
print(json.dumps({"reason": getattr(got["graphs"], "reason", None)}))
"""


def _oci(request, tmp_path, bundle, scenario):
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings

    origin = request.getfixturevalue("origin")
    repo = f"faults/slow{uuid.uuid4().hex[:10]}"
    direct = OCIRegistry(origin.address(repo), OCISettings(plain_http=(origin.host,), settle_s=0.1))
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    return origin.url, lambda proxy: (
        f"oci://{proxy.url.removeprefix('http://')}/{repo}",
        {"PREBAKE_OCI_PLAIN_HTTP": proxy.url.removeprefix("http://")},
    )


def _s3(request, tmp_path, bundle, scenario):
    from prebake.registry.backends.s3 import S3Registry

    moto, bucket = request.getfixturevalue("moto"), request.getfixturevalue("bucket")
    address = f"s3://{bucket}/prebake"
    direct = S3Registry(address)
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    return moto, lambda proxy: (address, s3_env(proxy.url))


def _hub(request, tmp_path, bundle, scenario):
    from prebake.registry.backends.hf import HubRegistry

    hub = request.getfixturevalue("stand_in")
    env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_slow_token", "HF_HUB_DISABLE_XET": "1"}
    env |= {"HF_HUB_CACHE": str(tmp_path / "hf-cache")}
    monkeypatch = request.getfixturevalue("monkeypatch")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    address = f"hf://team/slow-{uuid.uuid4().hex[:8]}"
    direct = HubRegistry(address, cache_dir=tmp_path / "direct-cache")
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    return hub.url, lambda proxy: (address, {**env, "HF_ENDPOINT": proxy.url})


@pytest.fixture(scope="module")
def stand_in():
    from tests.support.hub_server import hub_server

    with hub_server() as hub:
        yield hub


@pytest.mark.parametrize("backend", ["oci", "s3", "hub"])
def test_a_blob_sent_a_piece_every_half_second_ends_at_the_time_box_and_the_process_exits(
    request, tmp_path, scenario, in_force, backend
):
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=128 << 10)  # 32 pieces: 16 s when sent whole
    upstream, through = {"oci": _oci, "s3": _s3, "hub": _hub}[backend](request, tmp_path, bundle, scenario)
    entry = tmp_path / "entry.json"
    entry.write_bytes(bundle.manifest.to_bytes())
    home = scenario.store(tmp_path / "home")
    with fault_proxy(upstream) as proxy:
        address, env = through(proxy)
        proxy.inject(Fault("GET", "/blobs/sha256", "throttle", seconds=0.5))
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(home), address, str(entry), str(TIME_BOX_S)],
            env=child_env(**env),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - started
        throttled = proxy.count("GET", "/blobs/sha256")
    assert done.returncode == 0, done.stderr[-3000:]
    assert throttled >= 1, "the blob was never asked for: the fault did not apply"
    reason = json.loads(done.stdout)["reason"]
    assert reason is not None and "--fetch-timeout" in reason, reason
    assert took < TIME_BOX_S + 6, f"the process ran {took:.1f} s with a {TIME_BOX_S:g} s time box"
    # nothing installed: at most a crash's temporaries (a `.partial` tree), which no reader looks at
    assert not list(home.glob("trees/[0-9a-f]*")) and not list(home.glob("blobs/sha256/*/[0-9a-f]*.tar.zst"))
    assert not list(home.glob("index/*/*.json"))
