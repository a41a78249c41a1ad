"""docs/registries.md's "Promote from staging to production" and "Carry bundles into an air-gapped
site" blocks, run as written (bash, prebake on PATH), with their variables pointing at a staging
folder registry of signed bundles, a policy file, a production folder, a carried disk and a site
distribution server."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.baking import BIN, REPO, Home
from tests.support.oci_server import oci_available, oci_server
from tests.support.staging import stage

PAGE = REPO / "docs" / "registries.md"


def block_under(heading: str) -> str:
    """The first ```sh block after `heading` in docs/registries.md."""
    text = PAGE.read_text()
    after = text[text.index(f"\n{heading}\n") :]
    found = re.search(r"```sh\n(.*?)```", after, re.S)
    assert found is not None, heading
    return found.group(1)


def run_block(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env={**env, "PATH": f"{BIN}:{os.environ['PATH']}"},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_promotion_block_copies_under_the_policy_once_then_nothing_and_production_serves(tmp_path):
    staged = stage(tmp_path / "staging")
    env = {**Home(tmp_path / "operator").env, "STAGING": str(staged.registry), "POLICY": str(staged.policy),
           "PRODUCTION": str(tmp_path / "production")}  # fmt: skip
    done = run_block(block_under("### Promote from staging to production"), env, tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    said = done.stdout
    assert "dry run, nothing written: 3 bundle(s) would be copied" in said and "3 bundle(s) copied" in said
    assert "nothing to copy: all 3 bundle(s) already there, 0 bytes copied" in said
    assert said.count("export PREBAKE_GRAPHS_DIR=") == 1  # the fetch from production, under the policy: complete


def test_the_air_gap_block_carries_a_tar_fetches_offline_and_loads_the_site_registry(tmp_path):
    if not oci_available():
        pytest.skip("docker-registry is not installed (apt-get install docker-registry; .ci/run does)")
    staged = stage(tmp_path / "staging")
    with oci_server(tmp_path / "site") as site:
        env = {**Home(tmp_path / "operator").env, **site.env(), "STAGING": str(staged.registry),
               "USB": str(tmp_path / "usb"), "SITE_REGISTRY": site.host}  # fmt: skip
        done = run_block(block_under("### Carry bundles into an air-gapped site"), env, tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    assert (tmp_path / "usb" / "prebake.tar").is_file()
    assert done.stdout.count("export PREBAKE_GRAPHS_DIR=") == 2, done.stdout  # from the disk, then the site's registry
