"""prebake plan: every target x kind keyed from a profile, looked up by exact key, never guessed."""

from __future__ import annotations

import json

import pytest

from prebake.artifacts.bake.fleet_plan import (
    MISSING,
    PRESENT,
    UNBUILDABLE,
    UNKNOWN,
    Profile,
    host_independent_kinds,
    plan_fleet,
)
from prebake.artifacts.errors import RecipeError
from prebake.artifacts.recipe.kinds import target_keys
from prebake.artifacts.recipe.schema import load_recipe, targets
from prebake.engine.adapters import kinds_for, refusal
from prebake.engine.cli import main
from prebake.engine.common.probe import Host, Platform, Software, current_host
from prebake.engine.fleet.profiles import host_profile, load_profiles, render_toml, to_profile
from prebake.registry.backends.file import FileRegistry
from tests.support.fleet import fill_registry, write_entry
from tests.support.serving import write_recipe

NO_ENGINE_PACKAGES = (("vllm", None), ("vllm_gaudi", None))  # the vLLM adapter's, not installed

H100 = Host(
    Platform("cuda", "sm_90", "NVIDIA H100 80GB HBM3", 8, ("avx2", "avx512")),
    Software("3.11", "2.13.0+cu128", "3.6.0", None, "12.8", "570.124.06", packages=NO_ENGINE_PACKAGES),
)
OLD_GPU = Host(
    Platform("cuda", "sm_80", "NVIDIA A100", 8, ("avx2",)),
    Software("3.11", "2.13.0+cu128", "3.6.0", None, "12.8", "570.124.06", packages=NO_ENGINE_PACKAGES),
)


def _plan(recipe, profiles, present=frozenset()):
    return plan_fleet(
        recipe,
        targets(recipe),
        here=current_host(),
        profiles=profiles,
        published=lambda k, d: (k, d) in present,
        kinds_for=kinds_for,
        refuses=refusal,
    )


def test_llama3_plan_has_26_targets_by_3_kinds_with_requirements(capsys, tmp_path):
    assert main(["plan", "--model", "llama3-8b", "--format", "json", "--registry", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (
        out["schema"] == "prebake.plan/1" and len(out["targets"]) == 26
    )  # 24 on accelerators, 2 on the CPU (bf16, fp8)
    for t in out["targets"]:
        on_cpu = t["platform"] == "cpu"
        assert set(t["kinds"]) == {"buckets", "autotune", "graphs"}
        assert t["requires"]["accelerators"] == (0 if on_cpu else t["tp"])
        assert t["requires"]["runner_labels"] and t["requires"]["ray_resources"]
        assert t["buildable_here"] is on_cpu  # this machine is a CPU host: bf16 and fp8 on it build here


def test_without_a_profile_only_host_independent_kinds_are_keyed():
    recipe = load_recipe("llama3-8b")
    assert host_independent_kinds(recipe, current_host(), kinds_for) == {"buckets"}
    fleet = _plan(recipe, [])
    for t in fleet.targets:
        states = {k.kind: k for k in t.kinds}
        if t.target.platform == "cpu":  # this host is its profile: every kind keyed
            assert all(k.status == MISSING and k.key_digest for k in t.kinds) and t.profile == "this host"
            continue
        assert states["buckets"].status == MISSING and states["buckets"].key_digest
        assert states["autotune"].status == states["graphs"].status == UNKNOWN
        assert states["graphs"].key_digest is None and "no profile for" in t.reason


def test_a_profile_keys_targets_as_the_probe_on_that_runner_would(tmp_path):
    recipe = load_recipe("llama3-8b")
    path = tmp_path / "profiles.toml"
    path.write_text(render_toml(host_profile(H100, "h100", ("gpu-h100",))))
    [profile] = load_profiles(path)
    fleet = _plan(recipe, [profile])
    target = fleet.find("llama3-8b/cuda:sm_90/tp8/fp8")
    expected = target_keys(recipe, target.target, H100, kinds_for(recipe, target.target))
    assert {k.kind: k.key_digest for k in target.kinds} == {k: v.digest for k, v in expected.keys.items()}
    assert target.requirement.runner_labels == ("gpu-h100",) and target.profile == "h100"
    assert fleet.find("llama3-8b/gaudi2/tp1/bf16").status == MISSING  # buckets known, rest unknown


def test_present_only_when_the_exact_key_is_in_the_registry(tmp_path):
    recipe = load_recipe("llama3-8b")
    target = next(t for t in targets(recipe, dtype="bf16", tp=1) if t.platform == "cuda:sm_90")
    keys = target_keys(recipe, target, H100, kinds_for(recipe, target)).keys
    present = {(k, key.digest) for k, key in keys.items()}
    fleet = _plan(recipe, [Profile("h100", H100)], present)
    assert fleet.find(target.name).status == PRESENT
    assert len(fleet.missing()) == 25
    other_driver = Host(
        H100.platform, Software("3.11", "2.13.0+cu128", "3.6.0", None, "12.8", "580.1", packages=NO_ENGINE_PACKAGES)
    )
    assert _plan(recipe, [Profile("h100-new", other_driver)], present).find(target.name).status == MISSING


def test_a_profile_that_cannot_build_a_dtype_marks_it_unbuildable():
    recipe = load_recipe("llama3-8b").model_copy(
        update={"matrix": load_recipe("llama3-8b").matrix.model_copy(update={"platform": ("cuda:sm_80",)})}
    )
    fleet = _plan(recipe, [Profile("a100", OLD_GPU)])
    fp8 = [t for t in fleet.targets if t.target.dtype == "fp8"]
    assert fp8 and all(t.status == UNBUILDABLE and "fp8 needs sm_89" in t.reason for t in fp8)
    assert all(k.status == UNBUILDABLE for t in fp8 for k in t.kinds)


def test_missing_only_github_matrix_is_a_valid_actions_matrix(tmp_path, capsys):
    root = tmp_path / "registry"
    recipe = load_recipe("tiny-llama")
    bf16 = targets(recipe, dtype="bf16")[0]
    for key in target_keys(recipe, bf16, current_host(), kinds_for(recipe, bf16)).keys.values():
        write_entry(root, key)
    argv = ["plan", "--model", "tiny-llama", "--registry", str(root), "--missing-only", "--format", "github-matrix"]
    assert main(argv) == 0
    matrix = json.loads(capsys.readouterr().out)
    assert [row["target"] for row in matrix["include"]] == ["tiny-llama/cpu/tp1/fp32"]
    row = matrix["include"][0]
    assert row["runner"] == ["self-hosted", "prebake-cpu"] and row["tp"] == 1 and row["dtype"] == "fp32"


def test_plan_reads_only_the_index_entries_of_its_targets(tmp_path):
    """Planning never lists the registry: a registry that refuses to list still plans."""
    root = tmp_path / "registry"
    fill_registry(root, 50)

    class NoListing(FileRegistry):
        def list(self, kind=None):
            raise AssertionError("planning listed the registry")

    registry = NoListing(root)
    recipe = load_recipe("tiny-llama")
    fleet = plan_fleet(
        recipe,
        targets(recipe),
        here=current_host(),
        profiles=[],
        published=lambda k, d: registry.lookup(k, d) is not None,
        kinds_for=kinds_for,
    )
    assert [t.status for t in fleet.targets] == [MISSING, MISSING]


def test_a_bad_profiles_file_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "p.toml"
    bad.write_text('[[profile]]\nname = "x"\nsurprise = 1\n')
    assert main(["plan", "--model", "tiny-llama", "--profiles", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "profiles file" in err and str(bad) in err and "Traceback" not in err


def test_profile_round_trips_through_toml():
    model = host_profile(current_host(), "here", ("a", "b"))
    import tomllib

    again = to_profile(type(model).model_validate(tomllib.loads(render_toml(model))["profile"][0]))
    assert again.host == current_host() and again.runner_labels == ("a", "b")


def test_a_profile_written_before_engines_declared_their_packages_still_reads(tmp_path):
    """Profiles name vllm beside torch in [profile.software], as the probe's fields once did: they read
    the same (the engine packages by factor), and a name no field or engine declares is refused."""
    old = tmp_path / "profiles.toml"
    old.write_text(
        '[[profile]]\nname = "h100"\n[profile.platform]\ndevice = "cuda"\narch = "sm_90"\n'
        '[profile.software]\npython = "3.11"\ntorch = "2.13.0+cu128"\nvllm = "0.32.0"\ndriver = "570.124.06"\n'
    )
    (profile,) = load_profiles(old)
    assert profile.host.software.package_factors(["vllm", "vllm_gaudi"]) == {"vllm": "0.32.0", "vllm_gaudi": "none"}
    assert profile.host.software.factors()["driver"] == "570"
    old.write_text(old.read_text().replace('vllm = "0.32.0"', 'sglang = "0.5"'))
    with pytest.raises(RecipeError, match="names sglang, which no probe field or engine package is"):
        load_profiles(old)


def test_ray_resources_prints_this_hosts_custom_resource(capsys):
    assert main(["ray-resources"]) == 0
    assert json.loads(capsys.readouterr().out) == {"prebake-cpu": 1}


@pytest.mark.parametrize("argv", [["--version"]])
def test_version(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0 and capsys.readouterr().out.startswith("prebake ")


@pytest.mark.parametrize("variant", ["dynamo-precompile", "inductor-cache"])
def test_a_tp_target_its_variant_refuses_is_unbuildable_here_too_naming_why(tmp_path, variant):
    write_recipe(tmp_path, "tp-plan", variant=variant, seqs=2)
    path = tmp_path / "tp-plan.toml"
    path.write_text(path.read_text().replace('platform = ["cpu"]', 'platform = ["cpu"]\ntp = [1, 2]'))
    plan = {t.id: t for t in _plan(load_recipe(str(path)), []).targets}
    one, two = plan["tp-plan/cpu/tp1/fp32"], plan["tp-plan/cpu/tp2/fp32"]
    assert one.buildable_here and one.status == "missing"
    assert not two.buildable_here and two.status == "unbuildable"
    assert "does not serve at tp 2" in (two.reason or "") and "variant = 'aoti-package'" in (two.reason or "")
