"""A blob sent slowly ends inside the fetch's time box (issue 32, point 4): before, a blob sent a piece
every half second kept the process running until the last byte (its unpacker, a thread the interpreter
waits for at exit, kept reading); now the download itself stops at the time box and the process exits.
Debian's docker-registry behind the fault proxy, which throttles the blob; the fetch is a child process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

from tests.faults.fault_proxy import Fault, fault_proxy
from tests.faults.procs import REPO, child_env

TIME_BOX_S = 2.0
CHILD = """
import json, sys
from pathlib import Path
from prebake.artifacts.bake.fetch import install
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.store.local import Store, StoreLimits
from prebake.registry.oci import OCIRegistry
home, address, entry, box = sys.argv[1:5]
manifest = Manifest.read(Path(entry))
got = install({"graphs": manifest}, store=Store(home, StoreLimits()), registry=OCIRegistry(address), timeout=float(box))
print(json.dumps({"reason": getattr(got["graphs"], "reason", None)}))
"""


def test_a_blob_sent_a_piece_every_half_second_ends_at_the_time_box_and_the_process_exits(
    tmp_path, origin, scenario, in_force
):
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.client import OCISettings

    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=128 << 10)  # 32 pieces: 16 s when sent whole
    repo = f"faults/slow{uuid.uuid4().hex[:10]}"
    direct = OCIRegistry(origin.address(repo), OCISettings(plain_http=(origin.host,), settle_s=0.1))
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    entry = tmp_path / "entry.json"
    entry.write_bytes(bundle.manifest.to_bytes())
    home = scenario.store(tmp_path / "home")
    with fault_proxy(origin.url) as proxy:
        host = proxy.url.removeprefix("http://")
        proxy.inject(Fault("GET", "/blobs/sha256:", "throttle", seconds=0.5))
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(home), f"oci://{host}/{repo}", str(entry), str(TIME_BOX_S)],
            env=child_env(PREBAKE_OCI_PLAIN_HTTP=host),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    reason = json.loads(done.stdout)["reason"]
    assert reason is not None and "--fetch-timeout" in reason, reason
    assert took < TIME_BOX_S + 6, f"the process ran {took:.1f} s with a {TIME_BOX_S:g} s time box"
    # nothing installed: at most a crash's temporaries (a `.partial` tree), which no reader looks at
    assert not list(home.glob("trees/[0-9a-f]*")) and not list(home.glob("blobs/sha256/*/[0-9a-f]*.tar.zst"))
    assert not list(home.glob("index/*/*.json"))
