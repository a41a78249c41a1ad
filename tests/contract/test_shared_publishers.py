"""N bakers publishing at once into one shared registry (moto S3, the Hub stand-in, docker-registry): one entry per key,
every entry verifying, a lost race reported as such, never a crash."""

from __future__ import annotations

import os
import uuid

import pytest

from prebake.registry import open_registry
from prebake.registry.review.verify import verify_registry
from tests.faults.procs import actor, result
from tests.support.bundles import make_bundle
from tests.support.moto_server import s3_env

# two bakers per key on two keys with different builds (a race someone loses), two on one key
# with the very same build (both fine), and two alone on their keys
PLAN = [("a", "one"), ("a", "two"), ("b", "same"), ("b", "same"), ("c", "one"), ("d", "one")]


def _address(kind: str, request, tmp_path) -> tuple[str, dict[str, str]]:
    if kind == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        return f"s3://{bucket}/shared", s3_env(request.getfixturevalue("s3_endpoint"))
    if kind == "oci":
        server = request.getfixturevalue("oci")
        return server.address(f"team/shared-{uuid.uuid4().hex[:8]}"), server.env(docker_config=tmp_path / "docker")
    request.getfixturevalue("hub")  # sets HF_ENDPOINT and HF_TOKEN for this test
    repo = f"team/shared-{uuid.uuid4().hex[:8]}"
    env = {name: os.environ[name] for name in ("HF_ENDPOINT", "HF_TOKEN")}
    return f"hf://{repo}", {**env, "HF_HUB_CACHE": str(tmp_path / "hf-actors")}


@pytest.mark.parametrize("backend", ["s3", "hf", "oci"])
def test_six_publishers_at_once_leave_one_verified_entry_per_key(backend, request, tmp_path):
    address, env = _address(backend, request, tmp_path)
    go = tmp_path / "go"
    procs = []
    for i, (model, build) in enumerate(PLAN):
        b = make_bundle(tmp_path / f"w{i}", model=model, build=build)
        (tmp_path / f"m{i}.json").write_bytes(b.manifest.to_bytes())
        args = ["--home", str(tmp_path / f"home-{i}"), "--registry", address, "--go", str(go)]
        args += ["--manifest", str(tmp_path / f"m{i}.json"), "--blob", str(b.blob)]
        procs.append(actor("publish", *args, env=env))
    go.touch()
    results = [result(p, timeout=180) for p in procs]

    by_key: dict[str, list[dict]] = {}
    for (model, _), r in zip(PLAN, results):
        by_key.setdefault(model, []).append(r)
    assert [r.get("created") for r in by_key["c"] + by_key["d"]] == [True, True]
    identical = sorted(str(r.get("created")) for r in by_key["b"])
    # On the Hub both racers of an identical bundle may report created=True: huggingface_hub skips a
    # commit whose files all equal the branch head's ("no files have been modified") before the
    # Hub can refuse its stale parent. The registry still ends with the one entry (checked below).
    # On the Hub that happens when both read the same head; when one commits first the other is
    # told "already published": either way at least one, and the registry holds exactly one entry.
    # On OCI both racers of a byte-identical manifest push the very same manifest digest under the
    # tag, so each reads back its own and reports created (registry/oci/registry.py says so).
    allowed = (["False", "True"],) if backend == "s3" else (["False", "True"], ["True", "True"])
    assert identical in allowed, by_key["b"]  # each racer's whole answer, to tell a refusal from an error
    a = by_key["a"]
    assert sum(r.get("created") is True for r in a) == 1 and any(r.get("error") == "PublishConflict" for r in a), a
    registry = open_registry(address)
    entries = list(registry.list())
    assert sorted(m.labels["model"] for m in entries) == ["a", "b", "c", "d"]
    assert verify_registry(registry, trust=None, quarantine=False).exit_code == 0
