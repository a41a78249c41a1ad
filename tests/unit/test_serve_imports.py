"""What `prebake serve` loads before it serves: its parser, the composition root and the snapshot's
restore path, and none of the bake's modules. Each module a start imports costs a restore time to
ready (docs/snapshots.md: the supervisor's imports are a third of a restore into an empty store)."""

from __future__ import annotations

import json
import subprocess
import sys

# What only a bake, a write-back or a signing key runs: each imported where it is used.
NOT_BEFORE_SERVING = (
    "prebake.artifacts.bake.bake_kind",  # Context.bake
    "prebake.artifacts.bundle.pack",  # payload.pack: a bake's packer
    "prebake.engine.common.write_back",  # starter: a start that missed and compiled
    "prebake.registry.review.writeback",  # Context.publishing, Context.quarantine
    "prebake.registry.trust.attestation",  # builder.attester, with a signing key only
    "torch",
    "doit",
)

PROBE = """
import json, sys
from prebake.engine.cli import build_parser
from prebake.engine.compose import Context
from prebake.engine.bundled.snapshot import serving, stream, restore
build_parser(only="serving")
print(json.dumps(sorted(m for m in %r if m in sys.modules)))
"""


def test_a_start_imports_none_of_the_bakes_modules_before_it_serves():
    done = subprocess.run(
        [sys.executable, "-c", PROBE % (NOT_BEFORE_SERVING,)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_probe_sees_a_module_that_is_imported():
    probe = PROBE.replace("build_parser(only=", "import prebake.artifacts.bundle.pack; build_parser(only=")
    done = subprocess.run(
        [sys.executable, "-c", probe % (NOT_BEFORE_SERVING,)], capture_output=True, text=True, timeout=120
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["prebake.artifacts.bundle.pack"]
