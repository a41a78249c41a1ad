"""`doit bake ... registry=s3://|hf://` on one machine, `prebake fetch` from an empty home on another.

The S3 registry is moto's server mode as a real process on loopback, talked to by the real boto3
client; the Hub registry is tests/support/hub_server.py, a local stand-in speaking the endpoints
huggingface_hub calls (the real Hub is not reachable from here).
"""

import json
import uuid
from pathlib import Path

import pytest

from tests.support.baking import Home
from tests.support.hub_server import hub_server
from tests.support.moto_server import moto_server, s3_env
from tests.support.serving import write_recipe

MODEL = "tiny-remote"


@pytest.fixture(scope="module")
def s3_registry():
    import boto3

    with moto_server() as endpoint:
        env = s3_env(endpoint)
        bucket = f"prebake-{uuid.uuid4().hex[:8]}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=env["AWS_DEFAULT_REGION"],
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket=bucket)
        yield f"s3://{bucket}/bundles", env


@pytest.fixture(scope="module")
def hf_registry(tmp_path_factory):
    with hub_server() as hub:
        cache = tmp_path_factory.mktemp("hf-cache")
        yield "hf://team/prebake-bundles", {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_test", "HF_HUB_CACHE": str(cache)}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["s3_registry", "hf_registry"])
def test_bake_into_a_remote_registry_then_fetch_it_from_an_empty_home(tmp_path, request, backend):
    address, env = request.getfixturevalue(backend)
    write_recipe(tmp_path / "recipes", MODEL, variant="inductor-cache", seqs=1)
    env = {**env, "PREBAKE_RECIPES": str(tmp_path / "recipes")}

    baked = Home(tmp_path / "baker").doit(
        "run", "bake", f"model={MODEL}", "precision=fp32", f"registry={address}", extra_env=env
    )
    assert baked.returncode == 0, baked.stdout + baked.stderr
    assert baked.stdout.count(": published, key") == 3

    reader = Home(tmp_path / "reader")
    listing = reader.prebake("ls", "--registry", address, extra_env=env)
    assert sorted(line.split()[1] for line in listing.stdout.splitlines()[1:]) == ["autotune", "buckets", "graphs"]
    fetched = reader.prebake(
        "fetch", "--model", MODEL, "--precision", "fp32", "--registry", address, "--json", extra_env=env
    )
    assert fetched.returncode == 0, fetched.stderr
    exported = json.loads(fetched.stdout)["env"]
    # the tree's writable cache beside the read-only tree, seeded from the tree's inductor/
    assert Path(exported["TORCHINDUCTOR_CACHE_DIR"]).is_relative_to(reader.root / "home" / "caches")
    assert any(Path(exported["TORCHINDUCTOR_CACHE_DIR"]).rglob("*"))
    assert json.loads(Path(exported["PREBAKE_BUCKETS_FILE"]).read_text())["prompt"]

    again = Home(tmp_path / "baker").doit(
        "run", "bake", f"model={MODEL}", "precision=fp32", f"registry={address}", extra_env=env
    )
    assert again.returncode == 0 and ": published" not in again.stdout, again.stdout
