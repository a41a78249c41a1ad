"""Clients built for vLLM against `prebake serve` of tiny-llama (eager): guidellm from PyPI with a
local tokenizer, vLLM's extra request fields and side routes, and vLLM's metric names.

The guidellm run sends what guidellm always sends (ignore_eos, stream_options.continuous_usage_stats,
max_completion_tokens, GET /health) plus `repetition_penalty` (what `vllm bench serve` sends) and a
vendor field this API does not know: it fails when an extra field is refused or a metric name goes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.baking import REPO
from tests.support.serving import VLLM_ROUTER_SERIES, ServeProcess, serve_env

MODEL = "tiny-llama"
REQUESTS = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("clients")
    process = ServeProcess(["--model", MODEL, "--eager"], serve_env(root / "home", REPO / "recipes"))
    process.wait_ready(600)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
    """A small byte-level BPE tokenizer saved as transformers saves one: a client's local --processor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 10, trainer)
    folder = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(
        folder
    )
    return folder


def _series(server) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(server.get("/metrics")[1])
        for s in family.samples
    }


def _total(series: dict, name: str) -> float:
    return sum(v for (n, labels), v in series.items() if n == name and ("model_name", MODEL) in labels)


def test_guidellm_completes_every_request_and_vllms_metric_names_count_them(server, tokenizer_folder, tmp_path):
    before = _series(server)
    report = tmp_path / "guidellm.json"
    backend = (
        f"kind=openai_http,target={server.url('')},model={MODEL},request_format=/v1/completions,"
        "extras.body.repetition_penalty=1.0,extras.body.vendor_priority=3"
    )
    run = subprocess.run(
        [sys.executable, "-m", "guidellm", "run", "--backend", backend, "--profile", "kind=concurrent,streams=2"]
        + ["--constraint", f"kind=max_requests,count={REQUESTS}"]
        + ["--data", "kind=synthetic_text,prompt_tokens=16,output_tokens=8"]
        + ["--tokenizer", f"kind=huggingface_auto,model={tokenizer_folder}"]
        + ["--output", f"kind=json,path={report}", "--disable-console"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    totals = json.loads(report.read_text())["benchmarks"][0]["metrics"]["request_totals"]
    assert totals == {"successful": REQUESTS, "errored": 0, "incomplete": 0, "total": REQUESTS}, server.log[-3000:]
    assert "vendor_priority are not part of this API and were ignored" in server.log
    after = _series(server)
    for name in VLLM_ROUTER_SERIES:
        assert any(n == name and ("model_name", MODEL) in labels for n, labels in after), f"{name} is gone"
    assert _total(after, "vllm:request_success_total") - _total(before, "vllm:request_success_total") == REQUESTS
    generated = _total(after, "vllm:generation_tokens_total") - _total(before, "vllm:generation_tokens_total")
    assert generated == REQUESTS * 8  # ignore_eos: every request its 8 tokens


def test_an_unknown_field_is_answered_and_named_in_a_header_streamed_or_not(client, server):
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="hi", max_tokens=2, extra_body={"max_tokns": 3, "priority": 1}
    )
    assert raw.headers["x-ignored-fields"] == "max_tokns, priority" and raw.parse().choices[0].finish_reason
    with httpx.stream(
        "POST",
        server.url("/v1/chat/completions"),
        json={"messages": [{"role": "user", "content": "x"}], "vendor": 1, "stream": True},
    ) as response:
        assert response.status_code == 200 and response.headers["x-ignored-fields"] == "vendor"
        assert response.read().decode().rstrip().endswith("data: [DONE]")
    assert "max_tokns (did you mean 'max_tokens'?)" in server.log


def test_return_token_ids_gives_the_prompts_ids_as_tokenize_does(client, server):
    ids = server.post("/tokenize", {"prompt": "hello"})[1]["tokens"]
    whole = client.completions.create(model=MODEL, prompt="hello", max_tokens=3, extra_body={"return_token_ids": True})
    assert whole.choices[0].model_extra["prompt_token_ids"] == ids
    messages = [{"role": "user", "content": "hello"}]
    chat_ids = server.post("/tokenize", {"messages": messages})[1]["tokens"]
    chat = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, extra_body={"return_token_ids": True}
    )
    assert chat.model_extra["prompt_token_ids"] == chat_ids
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="hello", max_tokens=3, stream=True, extra_body={"return_token_ids": True}
        )
    )
    assert chunks[0].choices[0].model_extra["prompt_token_ids"] == ids
    assert all(c.choices[0].model_extra.get("prompt_token_ids") is None for c in chunks[1:])


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "count"}],
            max_tokens=6,
            temperature=0,
            extra_body={"ignore_eos": True},
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
    )
    usage = [c.usage.completion_tokens for c in chunks]
    assert all(c.usage is not None for c in chunks) and usage == sorted(usage) and usage[-1] == 6
    assert chunks[-1].choices == [] and usage[0] == 0


def test_sampling_options_reach_the_sampler(client):
    greedy = client.completions.create(
        model=MODEL, prompt="abc", max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    ids = greedy.choices[0].model_extra["token_ids"]
    hot_top1 = client.completions.create(
        model=MODEL, prompt="abc", max_tokens=6, temperature=1.7, seed=4, extra_body={"top_k": 1, "ignore_eos": True}
    )
    assert hot_top1.choices[0].model_extra["token_ids"] == ids
    biased = client.completions.create(
        model=MODEL, prompt="abc", max_tokens=4, temperature=0, logit_bias={"65": 100}, extra_body={"ignore_eos": True}
    )
    assert biased.choices[0].text == "AAAA"
    stopped = client.completions.create(
        model=MODEL,
        prompt="abc",
        max_tokens=6,
        temperature=0,
        extra_body={"stop_token_ids": [ids[2]], "ignore_eos": True},
    )
    until = ids[: ids.index(ids[2]) + 1]  # the first time that token comes
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].model_extra["token_ids"] == until
    held = client.completions.create(
        model=MODEL,
        prompt="abc",
        max_tokens=6,
        temperature=0,
        extra_body={"stop_token_ids": [ids[0]], "min_tokens": 3, "ignore_eos": True},
    )
    assert (
        len(held.choices[0].model_extra["token_ids"]) >= 3
        and ids[0] not in held.choices[0].model_extra["token_ids"][:3]
    )


def test_continue_final_message_continues_the_assistants_text(client, server):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is"}]
    prompt = "<|user|>\nhi\n<|assistant|>\nThe answer is"
    tokens = server.post("/tokenize", {"prompt": prompt, "add_special_tokens": False})[1]["tokens"]
    answer = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=2,
        extra_body={"continue_final_message": True, "add_generation_prompt": False, "return_token_ids": True},
    )
    assert answer.model_extra["prompt_token_ids"] == tokens
    with pytest.raises(
        openai.BadRequestError, match="continue_final_message: cannot be true with add_generation_prompt"
    ):
        client.chat.completions.create(model=MODEL, messages=messages, extra_body={"continue_final_message": True})


def test_load_and_ping_answer_as_vllms(server):
    assert server.get("/ping")[0] == 200
    assert httpx.post(server.url("/ping")).status_code == 200
    status, body = server.get("/load")
    assert status == 200 and json.loads(body) == {"server_load": 0}


VLLM_BENCH_BODIES = {  # what `vllm bench serve` sends (its openai and openai-chat backends)
    "/v1/completions": {
        "model": MODEL,
        "prompt": "hello there",
        "temperature": 0.0,
        "repetition_penalty": 1.0,
        "max_tokens": 4,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    },
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}],
        "temperature": 0.0,
        "max_completion_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    },
}


@pytest.mark.parametrize("path", list(VLLM_BENCH_BODIES))
def test_what_vllm_bench_serve_sends_is_known_and_answered(server, path):
    with httpx.stream("POST", server.url(path), json=VLLM_BENCH_BODIES[path], timeout=60) as response:
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert response.status_code == 200 and "x-ignored-fields" not in response.headers
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["usage"]["completion_tokens"] == 4
