"""kill -9 at each step of the commands that review a registry (issue 32, point 5): `prebake promote`,
`prebake promote --prune` and `prebake revoke`, real processes on a folder registry, each killed by
PREBAKE_TEST_CRASH_AT at a named step (artifacts/fsutil.py lists them). Nothing is published half
(an index entry names a whole blob, or there is none), nothing is promoted twice (one index entry,
the write-back moved aside once), and the rerun completes.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest

from prebake.artifacts.layout import index_relpath
from prebake.registry.backends.file import FileRegistry
from prebake.registry.review.verify import verify_registry
from tests.faults.procs import REPO, child_env

CRASH = "PREBAKE_TEST_CRASH_AT"


def _prebake(home, *args: str, crash: str = "") -> subprocess.CompletedProcess:
    """One command, killed at `crash` if given; its temporary folder beside its home (a promote killed
    by -9 leaves its scratch store there, not in the host's /tmp)."""
    systemp = Path(home).parent / "systemp"
    systemp.mkdir(exist_ok=True)
    env = child_env(PREBAKE_HOME=str(home), TMPDIR=str(systemp), **({CRASH: crash} if crash else {}))
    return subprocess.run(
        [sys.executable, "-m", "prebake.engine.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _write_back(incoming: FileRegistry, in_force, workdir, model: str = "tiny-llama", days_old: float = 0):
    """A pod's write-back waiting in the quarantine (the label `prebake serve --write-back` sets)."""
    bundle = in_force.bundle(workdir, model=model)
    created = (dt.datetime.now(dt.UTC) - dt.timedelta(days=days_old)).isoformat(timespec="seconds")
    labels = {"model": model, "writeback": "quarantine"}
    waiting = in_force.sign(bundle.manifest.model_copy(update={"created": created, "labels": labels}))
    incoming.publish(waiting, bundle.blob)
    return waiting


@pytest.mark.parametrize(
    "point",
    [
        "write:*.tar.zst",  # re-verifying: the write-back's blob downloaded into the scratch store
        "create:provenance.intoto.dsse.json",  # the promotion's attestation written beside the blob
        "create:[0-9a-f]*.json",  # the blob in the index, its index entry not yet created
        "move:[0-9a-f]*.json",  # published; the write-back not yet moved out of the quarantine
    ],
    ids=["re-verify", "attest", "publish", "move-aside"],
)
def test_promote_killed_9_at_each_step_publishes_nothing_half_and_the_rerun_promotes_once(
    tmp_path, in_force, scenario, point
):
    shared = FileRegistry(tmp_path / "shared")
    incoming = FileRegistry(tmp_path / "shared" / "incoming")
    waiting = _write_back(incoming, in_force, tmp_path / "bake")
    home = tmp_path / "builder"
    promote = ["promote", "--registry", str(shared.root), "--json"]

    crashed = _prebake(home, *promote, crash=point)
    assert crashed.returncode == -9, f"promote did not reach {point}: {crashed.stdout}{crashed.stderr[-2000:]}"
    published = list(shared.list())
    assert len(published) <= 1, published
    if point == "move:[0-9a-f]*.json":
        assert len(published) == 1, "killed after publishing: the entry stands"
    else:
        assert published == [], f"killed before the index entry ({point}): no entry"
    assert verify_registry(shared, trust=in_force.trust(shared), quarantine=False).findings == ()

    rerun = _prebake(home, *promote)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr[-2000:]
    (outcome,) = [r["outcome"] for r in json.loads(rerun.stdout)["results"]]
    assert outcome == ("already in the index (the same bundle)" if published else "promoted"), outcome
    (entry,) = shared.list()
    assert entry.key_digest == waiting.key_digest and entry.blob == waiting.blob
    assert [s.signer for s in entry.signatures] == ["fleet"] and "writeback" not in entry.labels
    assert list(incoming.list()) == [], "the write-back left the quarantine"
    moved = list((incoming.root / "quarantine").glob("index/*/*.json*"))
    assert len(moved) == 1, f"moved aside once, not twice: {moved}"
    scenario.registry(shared, entry)

    again = _prebake(home, *promote)
    assert again.returncode == 0 and json.loads(again.stdout)["results"] == [], "nothing is left to promote"


def test_prune_killed_9_between_an_entry_and_its_blob_leaves_no_entry_without_its_blob_and_the_rerun_finishes(
    tmp_path, in_force, scenario
):
    shared = FileRegistry(tmp_path / "shared")
    incoming = FileRegistry(tmp_path / "shared" / "incoming")
    old = [_write_back(incoming, in_force, tmp_path / m, model=m, days_old=9) for m in ("old-one", "old-two")]
    young = _write_back(incoming, in_force, tmp_path / "young", model="young", days_old=1)
    home = tmp_path / "builder"
    prune = ["promote", "--registry", str(shared.root), "--prune", "--older-than", "7d", "--json"]

    crashed = _prebake(home, *prune, crash="remove:*.tar.zst")  # the first old entry gone, its blob not yet
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr[-2000:]
    left = {m.key_digest for m in incoming.list()}
    assert young.key_digest in left and len(left & {m.key_digest for m in old}) == 1, "one old entry was removed"
    for m in incoming.list():  # every entry still there names its whole blob
        assert incoming.blob_path(m.blob.digest).is_file(), m.labels

    rerun = _prebake(home, *prune)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr[-2000:]
    assert [m.key_digest for m in incoming.list()] == [young.key_digest], "the rerun removed the other old one"
    assert not (incoming.root / index_relpath("graphs", old[1].key_digest)).exists()
    assert incoming.blob_path(young.blob.digest).is_file()
    # what the kill left: the first old entry's blob, without an entry (invisible to readers; not pruned)
    named = {m.blob.hex for m in incoming.list()}
    orphans = [b for b in incoming.root.glob("blobs/sha256/*/*.tar.zst") if b.name.split(".")[0] not in named]
    assert len(orphans) == 1, orphans
    scenario.registry(incoming, young)


def test_revoke_killed_9_while_writing_the_list_keeps_the_old_list_whole_and_the_rerun_signs_the_next(
    tmp_path, in_force, scenario
):
    from prebake.registry.trust.revocation import LIST_NAME, unverified

    shared = FileRegistry(tmp_path / "shared")
    home = tmp_path / "builder"
    first = _prebake(home, "revoke", "--registry", str(shared.root), "--key", "old-ci", "--json")
    assert first.returncode == 0, first.stderr[-2000:]

    crashed = _prebake(home, "revoke", "--registry", str(shared.root), "--key", "leaked", crash=f"write:{LIST_NAME}")
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr[-2000:]
    stands = unverified(shared.get_meta(LIST_NAME) or b"")
    assert stands is not None and stands.serial == 1 and stands.keys == ("old-ci",), "the old list, whole"

    rerun = _prebake(home, "revoke", "--registry", str(shared.root), "--key", "leaked", "--json")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    now = unverified(shared.get_meta(LIST_NAME) or b"")
    assert now is not None and now.serial == 2 and now.keys == ("leaked", "old-ci")
