"""Many pods, one node's store: 32 `prebake fetch` processes at once on one PREBAKE_HOME from S3, a gc
loop beside them, 4 of them killed -9 and started again.

What holds (docs/operations.md, "Many pods on one node"): every blob is downloaded once (GETs counted by
the fault proxy in front of moto's S3 server), plus at most one more for each fetch killed while it was
the one downloading; every fetch that was not killed exits 0 with the same trees; `prebake store verify`
finds the store clean; and the 32 started together on an empty store finish in about the time 32 take
that find everything installed (the figure is printed, not asserted: a timed assertion fails on a
loaded machine).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from prebake.registry.backends.s3 import S3Registry
from prebake.registry.backends.s3_client import S3Settings
from tests.faults.fault_proxy import fault_proxy
from tests.faults.procs import child_env
from tests.operations.target import KINDS, MODEL, PRECISION, target_set
from tests.support.baking import BIN, REPO
from tests.support.moto_server import s3_env

PODS = 32
KILLED = 4
SMALL = {"buckets": 16 << 10, "autotune": 32 << 10, "graphs": 96 << 10}  # small: the scenario is about the store
GC_LOOP = """
import sys, time
from pathlib import Path
from prebake.artifacts.store.local import Store, StoreLimits
home, stop, runs = Path(sys.argv[1]), Path(sys.argv[2]), 0
while not stop.exists():
    Store(home, StoreLimits()).gc(100 << 30)  # the node's cron: a bound the set fits in, evicting nothing
    runs += 1
    time.sleep(0.05)
print(runs)
"""


def _fetch(address: str, env: dict[str, str]) -> subprocess.Popen:
    args = ["fetch", "--model", MODEL, "--precision", PRECISION, "--registry", address, "--json"]
    return subprocess.Popen(
        [str(BIN / "prebake"), *args], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wave(address: str, env: dict[str, str], kill: int = 0) -> tuple[float, list[dict], int]:
    """PODS fetches started together; `kill` of them killed -9 at staggered moments and started again.
    Returns the wave's seconds, the JSON of every fetch that finished, and how many were killed."""
    start = time.monotonic()
    procs = [_fetch(address, env) for _ in range(PODS)]
    killed = 0
    for i in range(kill):
        time.sleep(0.4)
        victim = procs[i * (PODS // kill)]
        if victim.poll() is None:
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            killed += 1
            procs.append(_fetch(address, env))  # the pod's restart
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        if proc.returncode == -signal.SIGKILL:
            continue
        assert proc.returncode == 0, err[-3000:]
        done.append(json.loads(out))
    return time.monotonic() - start, done, killed


def test_thirty_two_pods_fetching_into_one_store_beside_a_gc_loop_with_four_killed(
    tmp_path, scenario, in_force, bucket, moto
):
    targets = target_set(tmp_path / "bake", SMALL)
    address = f"s3://{bucket}/prebake"
    direct = S3Registry(address, S3Settings())
    signed = {kind: in_force.sign(targets.manifests[kind]) for kind in KINDS}
    for kind in KINDS:
        direct.publish(signed[kind], targets.blobs[kind])
    scenario.registry(direct, *signed.values())
    home = scenario.store(tmp_path / "node")
    stop = tmp_path / "stop-gc"
    with fault_proxy(moto) as proxy:
        env = child_env(PREBAKE_HOME=str(home), PREBAKE_TRUSTED_KEYS="", **s3_env(proxy.url))
        gc_loop = subprocess.Popen(
            [sys.executable, "-c", GC_LOOP, str(home), str(stop)],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            cold_s, cold, killed = _wave(address, env, kill=KILLED)
            warm_s, warm, _ = _wave(address, env)
        finally:
            stop.touch()
            gc_out, gc_err = gc_loop.communicate(timeout=120)
        blob_gets = proxy.count("GET", "/blobs/")

    assert gc_loop.returncode == 0, gc_err[-3000:]
    assert int(gc_out) > 0  # the gc loop ran beside the fetches
    assert len(cold) == PODS and len(warm) == PODS  # every pod ends with its bundles: the killed ones on restart
    trees = {json.dumps(sorted(b["tree"] for b in r["bundles"].values())) for r in cold + warm}
    assert len(trees) == 1, trees  # one set of trees, shared by every pod
    assert len(KINDS) <= blob_gets <= len(KINDS) + killed, f"{blob_gets} blob GETs for {len(KINDS)} blobs"
    verify = subprocess.run(
        [str(BIN / "prebake"), "store", "verify", "--json"], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert verify.returncode == 0 and json.loads(verify.stdout)["bad"] == 0, verify.stdout + verify.stderr
    assert json.loads(verify.stdout)["bundles"] == len(KINDS)
    ratio = cold_s / warm_s
    sys.stderr.write(
        f"fleet node: {PODS} pods on an empty store (gc loop beside, {killed} killed -9 and restarted) "
        f"{cold_s:.1f} s, {PODS} that find everything installed {warm_s:.1f} s: {ratio:.2f}x; "
        f"{blob_gets} blob GETs for {len(KINDS)} blobs; load {os.getloadavg()[0]:.1f}\n"
    )
