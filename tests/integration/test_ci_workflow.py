"""The GitHub Actions example, job by job, against a moto S3 server: plan -> one bake per matrix row -> verify.

The `run` steps of examples/github-actions/bake.yml execute in order under bash, with the
workflow's, job's and step's env resolved from a stand-in of GitHub's contexts (inputs, vars,
secrets, matrix), $GITHUB_OUTPUT and $RUNNER_TEMP, in a folder laid out as the user's
repository (recipes/, profiles/). "Install prebake" steps are skipped: this venv has it.
The recipe is a shrunken tiny-llama (one layer, two bucket shapes), so the compiles fit in minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prebake.artifacts.recipe.schema import load_recipe
from tests.support.ci_examples import resolve, workflow
from tests.support.moto_server import moto_server, s3_env
from tests.support.recipe_files import write_recipe

BIN = Path(sys.executable).parent


def _repository(root: Path) -> None:
    base = load_recipe("tiny-llama")
    recipe = base.model_copy(
        update={
            "model": base.model.model_copy(
                update={"name": "ci-tiny", "config": dict(base.model.config, num_hidden_layers=1)}
            ),
            "serving": base.serving.model_copy(
                update={"max_model_len": 64, "max_num_seqs": 1, "max_num_batched_tokens": 64}
            ),
        }
    )
    write_recipe(recipe, root / "recipes")
    (root / "profiles").mkdir()
    profile = subprocess.run(
        [str(BIN / "prebake"), "profile", "--name", "cpu", "--label", "cpu-baker"], capture_output=True, text=True
    )
    (root / "profiles" / "fleet.toml").write_text(profile.stdout)


def _run_job(name: str, job: dict, top_env: dict, context: dict, base_env: dict, root: Path) -> dict[str, str]:
    """Run a job's steps; return what they wrote to $GITHUB_OUTPUT."""
    output = root / f"output-{name}.txt"
    output.write_text("")
    for step in job["steps"]:
        if "run" not in step or step.get("name") == "Install prebake":
            continue
        env = dict(base_env)
        for block in (top_env, job.get("env", {}), step.get("env", {})):
            env.update({k: resolve(str(v), context) for k, v in block.items()})
        env.update(GITHUB_OUTPUT=str(output), RUNNER_TEMP=str(root / "runner-temp"))
        proc = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", step["run"]],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert proc.returncode == 0, f"{name}: {step.get('name')}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)


@pytest.mark.slow
def test_the_workflow_plans_bakes_each_missing_target_and_verifies_against_s3(tmp_path):
    import boto3

    _repository(tmp_path)
    (tmp_path / "runner-temp").mkdir()
    keys = subprocess.run(
        [str(BIN / "prebake"), "keygen", "prebake-ci", "--dir", str(tmp_path / "keys")], capture_output=True, text=True
    )
    public = (tmp_path / "keys" / "prebake-ci.pub").read_text().strip()
    assert keys.returncode == 0, keys.stderr
    flow = workflow()
    with moto_server() as endpoint:
        aws = s3_env(endpoint)
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket="ci-bakes")
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("PREBAKE_", "AWS_"))}
        base_env.update({k: v for k, v in aws.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
        base_env.update(PATH=f"{BIN}:{base_env['PATH']}", PREBAKE_HOME=str(tmp_path / "home"))
        context = {
            "inputs.model": "ci-tiny",
            "vars.PREBAKE_REGISTRY": "s3://ci-bakes/prebake",
            "vars.PREBAKE_PIP_SPEC": "prebake",
            "vars.PREBAKE_TRUSTED_KEYS": public,
            "secrets.AWS_ACCESS_KEY_ID": aws["AWS_ACCESS_KEY_ID"],
            "secrets.AWS_SECRET_ACCESS_KEY": aws["AWS_SECRET_ACCESS_KEY"],
            "secrets.PREBAKE_SIGNING_KEY_PEM": (tmp_path / "keys" / "prebake-ci.pem").read_text().strip(),
        }
        jobs = flow["jobs"]
        planned = _run_job("plan", jobs["plan"], flow["env"], context, base_env, tmp_path)
        matrix = json.loads(planned["matrix"])
        assert planned["count"] == "2" and {row["dtype"] for row in matrix["include"]} == {"bf16", "fp32"}
        for row in matrix["include"]:
            assert row["runner"] == ["self-hosted", "cpu-baker"]
            cell = {**context, **{f"matrix.{k}": str(v) for k, v in row.items()}}
            _run_job(
                "bake",
                jobs["bake"],
                flow["env"],
                cell,
                {**base_env, "PREBAKE_HOME": str(tmp_path / f"runner-{row['dtype']}")},
                tmp_path,
            )
        _run_job("verify", jobs["verify"], flow["env"], context, base_env, tmp_path)
        again = _run_job("plan", jobs["plan"], flow["env"], context, base_env, tmp_path)
        assert again["count"] == "0" and json.loads(again["matrix"]) == {"include": []}
