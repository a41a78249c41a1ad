"""No unreviewed write-back (issue 22, point 5), with real `prebake serve` and `prebake promote` processes.

A pod serving from a shared registry compiles on a miss and writes back: by default into the
registry's quarantine namespace (incoming/), which no other pod reads; an entry copied from
there into the index is refused; `prebake promote` on a trusted builder re-verifies, signs and
publishes it, and the next pod starts from it. The embedded local registry keeps writing to its
index. One eager recipe (tests/support/api_server.py): no torch.compile.
"""

from __future__ import annotations

import json
import shutil

import pytest

from prebake.artifacts.layout import index_relpath
from prebake.registry import open_registry
from prebake.registry.trust.signing import write_keypair
from tests.support.api_server import write_api_recipe
from tests.support.baking import BIN, REPO
from tests.support.serving import ServeProcess, serve_env

MODEL = "api-test"


def _serve(home, recipes, *args: str, **env: str) -> str:
    server = ServeProcess(["--model", MODEL, "--eager", *args], serve_env(home, recipes, **env))
    try:
        server.wait_ready(600)
    finally:
        server.stop()
    return server.log


@pytest.fixture(scope="module")
def pod(tmp_path_factory):
    """One pod's cold start with --write-back against a shared folder registry (the default: quarantine)."""
    root = tmp_path_factory.mktemp("writeback")
    recipes = write_api_recipe(root / "recipes")
    (root / "shared").mkdir()
    log = _serve(root / "pod-home", recipes, "--registry", str(root / "shared"), "--write-back")
    return root, recipes, log


def _prebake(root, recipes, *args: str, **env: str):
    import subprocess

    return subprocess.run(
        [str(BIN / "prebake"), *args], env=serve_env(root / "builder-home", recipes, **env), cwd=REPO,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_pods_write_back_lands_in_quarantine_not_in_the_index_every_pod_reads(pod):
    root, _recipes, log = pod
    assert "quarantine: awaiting `prebake promote`" in log
    assert list(open_registry(str(root / "shared")).list()) == []
    waiting = {m.kind: m for m in open_registry(str(root / "shared" / "incoming")).list()}
    assert set(waiting) == {"buckets", "autotune"} and all(
        m.labels["writeback"] == "quarantine" for m in waiting.values()
    )


def test_a_quarantined_bundle_offered_as_a_normal_entry_is_refused(pod, tmp_path):
    root, recipes, _log = pod
    shared = tmp_path / "shared"
    shutil.copytree(root / "shared", shared)
    for m in open_registry(str(shared / "incoming")).list():  # an attacker copies them into the index
        src, dest = shared / "incoming", shared
        for rel in (index_relpath(m.kind, m.key_digest), f"blobs/sha256/{m.blob.hex[:2]}/{m.blob.hex}.tar.zst"):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src / rel, dest / rel)
    server = ServeProcess(
        ["--model", MODEL, "--eager", "--registry", str(shared), "--on-miss", "fail"],
        serve_env(tmp_path / "other-pod", recipes),
    )
    code = server.proc.wait(timeout=300)
    server.stop()
    assert code != 0 and "awaiting review (label writeback=quarantine), offered as a normal index entry" in server.log
    assert "prebake promote" in server.log


def test_promote_reviews_signs_and_publishes_and_the_next_pod_starts_from_it(pod, tmp_path):
    root, recipes, _log = pod
    shared = tmp_path / "shared"
    shutil.copytree(root / "shared", shared)
    listed = _prebake(root, recipes, "promote", "--registry", str(shared), "--list")
    assert listed.returncode == 0 and "2 write-back(s) awaiting review" in listed.stdout
    unsigned = _prebake(root, recipes, "promote", "--registry", str(shared))
    assert unsigned.returncode == 2 and "set PREBAKE_SIGNING_KEY" in unsigned.stderr
    private, public = write_keypair("builder", tmp_path / "keys")
    done = _prebake(root, recipes, "promote", "--registry", str(shared), "--json", PREBAKE_SIGNING_KEY=str(private))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [r["outcome"] for r in json.loads(done.stdout)["results"]] == ["promoted", "promoted"]
    index = {m.kind: m for m in open_registry(str(shared)).list()}
    assert set(index) == {"buckets", "autotune"} and all(m.signatures[0].signer == "builder" for m in index.values())
    assert list(open_registry(str(shared / "incoming")).list()) == []
    log = _serve(
        tmp_path / "next-pod", recipes, "--registry", str(shared), "--on-miss", "fail",
        PREBAKE_TRUSTED_KEYS=public.read_text().strip(),
    )  # fmt: skip
    assert "buckets in the registry, autotune in the registry" in log


def test_the_embedded_registry_keeps_writing_back_to_its_index(tmp_path):
    recipes = write_api_recipe(tmp_path / "recipes")
    log = _serve(tmp_path / "home", recipes, "--write-back")
    embedded = open_registry(str(tmp_path / "home" / "registry"))
    assert {m.kind for m in embedded.list()} == {"buckets", "autotune"}
    assert "(the index)" in log and not (tmp_path / "home" / "registry" / "incoming").exists()


def test_under_a_policy_a_pod_writes_every_kind_to_quarantine_and_promote_promotes_the_set(tmp_path):
    """A pod under a policy that refuses unsigned bundles compiles every kind on a miss: each kind is
    written back (built on the pod's own write-backs, never refetched under the policy, which would
    refuse them), its inputs name the quarantined blobs, and promote promotes the set upstream first."""
    recipes = write_api_recipe(tmp_path / "recipes")
    (tmp_path / "shared").mkdir()
    private, public = write_keypair("builder", tmp_path / "keys")
    policy = tmp_path / "policy.toml"
    policy.write_text(
        f'version = 1\n[keys.builder]\nkey = "{public.read_text().strip()}"\n[[rules]]\nkeys = ["builder"]\n'
    )
    shared = str(tmp_path / "shared")
    log = _serve(tmp_path / "pod", recipes, "--registry", shared, "--write-back", PREBAKE_POLICY=str(policy))
    assert "write-back: buckets: published, autotune: published" in log, log
    waiting = {m.kind: m for m in open_registry(f"{shared}/incoming").list()}
    assert waiting["autotune"].inputs == {"buckets": waiting["buckets"].blob.digest}

    done = _prebake(
        tmp_path, recipes, "promote", "--registry", shared, "--json",
        PREBAKE_SIGNING_KEY=str(private), PREBAKE_POLICY=str(policy),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert [(r["kind"], r["outcome"]) for r in json.loads(done.stdout)["results"]] == [
        ("buckets", "promoted"),
        ("autotune", "promoted"),
    ]
    log = _serve(tmp_path / "next-pod", recipes, "--registry", shared, "--on-miss", "fail", PREBAKE_POLICY=str(policy))
    assert "buckets in the registry, autotune in the registry" in log


def test_prebake_promote_prune_removes_what_waited_past_the_policys_maximum_age(tmp_path):
    """`prebake promote --prune`: the maximum age from --older-than, else the policy's [quarantine] max_age_days."""
    import datetime as dt

    from tests.support.baking import Home
    from tests.support.bundles import make_bundle

    shared = tmp_path / "shared"
    incoming = open_registry(str(shared / "incoming"))
    for model, days in (("week-old", 8), ("two-days-old", 2)):
        b = make_bundle(tmp_path / "bake", model=model)
        created = (dt.datetime.now(dt.UTC) - dt.timedelta(days=days)).isoformat(timespec="seconds")
        incoming.publish(
            b.manifest.model_copy(update={"created": created, "labels": {"writeback": "quarantine"}}), b.blob
        )
    _private, public = write_keypair("builder", tmp_path / "keys")
    policy = tmp_path / "policy.toml"
    policy.write_text(
        f'version = 1\n[keys.builder]\nkey = "{public.read_text().strip()}"\n[[rules]]\nkeys = ["builder"]\n'
        "[quarantine]\nmax_age_days = 1\n"
    )
    node = Home(tmp_path / "builder")
    by_default = node.prebake("promote", "--registry", str(shared), "--prune", "--dry-run")
    assert by_default.returncode == 0 and "1 of 2 write-back(s) older than 7d would remove" in by_default.stdout
    weekly = node.prebake("promote", "--registry", str(shared), "--prune", "--older-than", "7d", "--json")
    assert [r["outcome"] for r in json.loads(weekly.stdout)["results"]] == ["kept", "removed"], weekly.stdout
    assert [m.labels.get("model") for m in incoming.list()] == [None]  # the two-day-old one stays
    daily = node.prebake("promote", "--registry", str(shared), "--prune", extra_env={"PREBAKE_POLICY": str(policy)})
    assert daily.returncode == 0 and "1 of 1 write-back(s) older than 1d removed" in daily.stdout, daily.stdout
    assert list(incoming.list()) == []
    wrong = node.prebake("promote", "--registry", str(shared), "--prune", "--older-than", "soon")
    assert wrong.returncode == 2 and "is not a duration" in wrong.stderr
