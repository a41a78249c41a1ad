"""`prebake preheat` cut or killed (issue 32, point 5): the origin's blob cut mid-way while the mirror
pulls it for the preheat, and the preheat process killed -9 mid-pull. Neither leaves the mirror serving
a part of a blob: the rerun completes, and a node fetching through the mirror installs the verified
bundle. Two real docker-registry processes (an origin, and a pull-through mirror whose upstream is the
fault proxy in front of the origin); `prebake preheat` runs as a real process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid

import pytest

from prebake.artifacts.store.local import Installed
from tests.faults.checks import store_problems
from tests.faults.fault_proxy import Fault, fault_proxy
from tests.faults.procs import REPO, child_env, unbounded


@pytest.fixture
def fleet(tmp_path, origin, scenario, in_force):
    """A signed bundle at the origin, the fault proxy in front of it, and a mirror pulling through the proxy."""
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings
    from tests.support.oci_server import oci_server

    repo = f"faults/preheat{uuid.uuid4().hex[:10]}"
    direct = OCIRegistry(origin.address(repo), OCISettings(plain_http=(origin.host,), settle_s=0.1))
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=2 << 20)
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    with fault_proxy(origin.url) as upstream, oci_server(tmp_path / "mirror", proxy_of=upstream.url) as mirror:
        yield bundle, upstream, mirror, mirror.address(repo)


def _preheat(tmp_path, mirror, address: str) -> subprocess.Popen:
    env = child_env(PREBAKE_OCI_PLAIN_HTTP=mirror.host, PREBAKE_HOME=str(tmp_path / "preheater"))
    return subprocess.Popen(
        [sys.executable, "-m", "prebake.engine.cli", "preheat", "--mirror", address, "--json"],
        env={**env, "PREBAKE_OCI_TIMEOUT_S": "5", "PREBAKE_OCI_MAX_ATTEMPTS": "2"},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _node_fetches_whole(tmp_path, scenario, in_force, mirror, address, bundle) -> None:
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings

    node = unbounded(scenario.store(tmp_path / "node"))
    through = OCIRegistry(address, OCISettings(plain_http=(mirror.host,)))
    got = in_force.fetch(node, through, bundle.manifest.the_key())
    assert isinstance(got, Installed), got
    assert store_problems(node.home) == []


def test_the_origin_cut_mid_blob_during_a_preheat_leaves_no_part_served_and_the_rerun_completes(
    tmp_path, fleet, scenario, in_force
):
    bundle, upstream, mirror, address = fleet
    layer = f"/blobs/{bundle.manifest.blob.digest}"
    upstream.inject(Fault("GET", layer, "cut", times=1))
    first = _preheat(tmp_path, mirror, address)
    first.communicate(timeout=120)
    asked = len(upstream.statuses("GET", layer))
    assert asked, "the mirror never asked the origin for the blob"
    assert upstream.bytes_sent(layer) < asked * bundle.manifest.blob.size, "the cut did not land: every body whole"

    rerun = _preheat(tmp_path, mirror, address)
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err[-3000:]
    (done,) = json.loads(out)["bundles"]
    assert done["key_digest"] == bundle.manifest.key_digest
    _node_fetches_whole(tmp_path, scenario, in_force, mirror, address, bundle)


def test_a_preheat_killed_9_mid_pull_leaves_no_part_served_and_the_rerun_completes(tmp_path, fleet, scenario, in_force):
    bundle, upstream, mirror, address = fleet
    layer = f"/blobs/{bundle.manifest.blob.digest}"
    upstream.inject(Fault("GET", layer, "throttle", seconds=0.005))  # ~0.8 MiB/s
    first = _preheat(tmp_path, mirror, address)
    deadline = time.monotonic() + 60
    while upstream.bytes_sent(layer) < 256 << 10:
        assert time.monotonic() < deadline and first.poll() is None, "the pull never got going"
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    assert first.returncode == -9
    assert upstream.bytes_sent(layer) < bundle.manifest.blob.size, "killed mid-blob, not after"
    upstream.clear()

    rerun = _preheat(tmp_path, mirror, address)
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err[-3000:]
    (done,) = json.loads(out)["bundles"]
    assert done["key_digest"] == bundle.manifest.key_digest
    _node_fetches_whole(tmp_path, scenario, in_force, mirror, address, bundle)
