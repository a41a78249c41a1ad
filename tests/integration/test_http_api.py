"""The bundled engine's HTTP API through the official `openai` client, against a real `prebake serve`.

One eager server (no torch.compile) serves the session; a second one, started from the
bundles the first wrote back, checks the API key and the JSON log format.
"""

from __future__ import annotations

import json
import socket
import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.api_server import write_api_recipe
from tests.support.serving import ServeProcess, serve_env

MODEL = "api-test"
KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    recipes = write_api_recipe(root / "recipes")
    (root / "registry").mkdir()
    server = ServeProcess(
        ["--model", MODEL, "--eager", "--registry", str(root / "registry"), "--write-back"],
        serve_env(
            root / "home", recipes, PREBAKE_WRITE_BACK="index"
        ),  # a single-user setup: write-back straight to the index, said so (registry/review/writeback.py)
    )
    server.wait_ready(600)
    yield server, root
    server.stop()


@pytest.fixture(scope="module")
def server(served):
    return served[0]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0, timeout=120)


def _parallel(fn, args: list) -> list:
    out: list = [None] * len(args)
    barrier = threading.Barrier(len(args))

    def run(i: int) -> None:
        barrier.wait()
        out[i] = fn(args[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return out


def test_completions_answer_text_and_token_id_prompts_with_usage(client):
    by_text = client.completions.create(model=MODEL, prompt="hello", max_tokens=6, temperature=0)
    assert by_text.object == "text_completion" and by_text.model == MODEL
    (choice,) = by_text.choices
    assert choice.finish_reason == "length" and len(choice.model_extra["token_ids"]) == 6
    assert by_text.usage.prompt_tokens == 5 and by_text.usage.completion_tokens == 6
    by_ids = client.completions.create(model=MODEL, prompt=list(b"hello"), max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == choice.text


def test_a_streamed_completion_is_the_whole_one_in_pieces_with_usage_last(client):
    whole = client.completions.create(model=MODEL, prompt="stream me", max_tokens=12, temperature=0)
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="stream me",
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_chat_goes_through_the_template_and_streams_the_same_answer(client, server):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    templated = "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    assert whole.usage.prompt_tokens == len(templated.encode())
    status, tokens = server.post("/tokenize", {"messages": messages})
    assert status == 200 and tokens["tokens"] == list(templated.encode())
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_n_choices_with_a_seed_differ_from_each_other_and_repeat_exactly(client):
    def ask():
        return client.completions.create(model=MODEL, prompt="x", max_tokens=10, temperature=1.0, n=3, seed=11)

    first, again = ask(), ask()
    texts = [c.model_extra["token_ids"] for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2] and len({tuple(t) for t in texts}) == 3
    assert texts == [c.model_extra["token_ids"] for c in again.choices]


def test_a_stop_string_cuts_the_answer_and_says_stop(client):
    kw = {"model": MODEL, "prompt": "abc", "max_tokens": 20, "temperature": 0, "extra_body": {"ignore_eos": True}}
    free = client.completions.create(**kw)
    # take a stop string out of the free-running answer's middle
    text = free.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = client.completions.create(**kw, stop=[stop])
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == text[: text.index(stop)]
    streamed = client.completions.create(
        model=MODEL, prompt="abc", max_tokens=20, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text


def test_concurrent_requests_streamed_or_not_equal_the_same_requests_one_by_one(client):
    bodies = [
        {"prompt": [1, 2, 3], "max_tokens": 12, "temperature": 0},
        {"prompt": [9, 8, 7, 6, 5, 4], "max_tokens": 10, "temperature": 0},
        {"prompt": "a longer text prompt", "max_tokens": 8, "temperature": 0.8, "top_p": 0.9, "seed": 7},
        {"prompt": [400, 401], "max_tokens": 12, "temperature": 1.2, "seed": 3},
    ]

    def whole(body):
        return client.completions.create(model=MODEL, **body).choices[0].text

    def streamed(body):
        return "".join(c.choices[0].text for c in client.completions.create(model=MODEL, stream=True, **body))

    alone = [whole(b) for b in bodies]
    assert _parallel(whole, bodies) == alone
    assert _parallel(streamed, bodies) == alone


def test_bad_requests_raise_the_clients_errors_with_a_message_that_says_why(client):
    with pytest.raises(openai.BadRequestError, match="max_model_len = 128"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=1000)
    with pytest.raises(openai.BadRequestError, match="top_k: Input should be greater than or equal to -1"):
        client.completions.create(model=MODEL, prompt="hi", extra_body={"top_k": -3})
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=-4)
    with pytest.raises(openai.BadRequestError, match="prompt"):
        client.completions.create(model=MODEL, prompt=[[1, "x"]])
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="larger than the largest prefill bucket|more than the largest"):
        client.completions.create(model=MODEL, prompt=[1] * 200, max_tokens=1)


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2]",
        b'{"prompt": "hi", "max_tokens": "many"}',
        b'{"prompt": "hi", "max_tokens": 99999999999999999999999}',
        b'{"prompt": "hi", "temperature": NaN}',
        b'{"prompt": "\\ud800 lone surrogate"}',
        b'{"prompt": "\xff\xfe not utf-8"}',
        b'{"prompt": ""}',
        b'{"prompt": [], "n": 0}',
        b'{"messages": []}',
        b'{"prompt": "hi", "stream_options": {"include_usage": true}}',
        b'{"prompt": "hi", "echo": true}',
    ],
)
def test_every_bad_body_is_a_4xx_with_an_openai_error_and_the_server_stays_up(server, body):
    for path in ("/v1/completions", "/v1/chat/completions"):
        response = httpx.post(server.url(path), content=body, headers={"Content-Type": "application/json"})
        assert 400 <= response.status_code < 500, response.text
        error = response.json()["error"]
        assert error["message"] and error["type"] == "invalid_request_error" and error["code"] == response.status_code
    assert server.get("/health")[0] == 200


def test_a_body_past_the_cap_is_413(server):
    response = httpx.post(server.url("/v1/completions"), content=b'{"prompt": "' + b"a" * (5 << 20) + b'"}')
    assert response.status_code == 413 and "larger than" in response.json()["error"]["message"]


def test_a_client_that_disconnects_mid_stream_frees_its_row_and_the_answer_stays_the_same(client, server):
    body = {"prompt": [3, 1, 4, 1, 5], "max_tokens": 60, "temperature": 0, "ignore_eos": True}

    def answer() -> str:
        return (
            client.completions.create(
                model=MODEL, prompt=body["prompt"], max_tokens=60, temperature=0, extra_body={"ignore_eos": True}
            )
            .choices[0]
            .text
        )

    before = answer()
    with socket.create_connection(("127.0.0.1", server.port)) as raw:
        data = json.dumps({**body, "stream": True}).encode()
        raw.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
    assert server.get("/health")[0] == 200
    assert answer() == before


def test_models_version_tokenize_detokenize_and_probes(client, server):
    (card,) = client.models.list().data
    assert card.id == MODEL and card.model_extra["max_model_len"] == 128
    assert server.get("/version")[0] == 200
    assert server.get("/health/live")[0] == 200 and server.get("/health?probe=1")[0] == 200
    status, ids = server.post("/tokenize", {"prompt": "héllo"})
    assert status == 200 and ids["count"] == len("héllo".encode())
    status, text = server.post("/detokenize", {"tokens": ids["tokens"]})
    assert status == 200 and text["prompt"] == "héllo"


def test_metrics_parse_with_prometheus_clients_parser_and_count_requests(client, server):
    client.completions.create(model=MODEL, prompt="count me", max_tokens=2)
    families = {f.name: f for f in text_string_to_metric_families(server.get("/metrics")[1])}
    ok = [
        s for s in families["prebake_requests"].samples if s.labels.get("outcome") == "ok" and s.name.endswith("_total")
    ]
    assert ok and ok[0].value >= 1
    assert families["prebake_ready"].samples[0].value == 1
    assert families["prebake_generated_tokens"].samples[0].value >= 2
    assert "process_resident_memory_bytes" in families and "prebake_time_to_first_token_seconds" in families
    steps = {s.labels["step"] for s in families["prebake_startup_step_seconds"].samples}
    assert {"probe", "keys", "lookup", "load", "warm-up"} <= steps


def test_an_api_key_guards_every_route_but_the_probes_and_logs_go_out_as_json(served):
    _, root = served
    keyed = ServeProcess(
        ["--model", MODEL, "--eager", "--registry", str(root / "registry"), "--api-key", KEY],
        serve_env(root / "home-keyed", root / "recipes", PREBAKE_LOG_FORMAT="json"),
    )
    try:
        keyed.wait_ready(600)
        base = f"http://127.0.0.1:{keyed.port}/v1"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0).models.list()
        assert keyed.get("/metrics")[0] == 401 and keyed.get("/health")[0] == 200
        assert keyed.get("/health/live")[0] == 200
        good = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0)
        assert good.completions.create(model=MODEL, prompt="hi", max_tokens=2).usage.completion_tokens == 2
    finally:
        keyed.stop()
    records = [json.loads(line) for line in keyed.lines if line.startswith("{")]
    assert all({"ts", "level", "logger", "message"} <= r.keys() for r in records)
    messages = [r["message"] for r in records]
    assert any(m.startswith("prebake serve: lookup: ") for m in messages)
    assert any(r["logger"] == "prebake.trust" for r in records)  # a library module's logger reaches the handler
    assert len(records) == len([line for line in keyed.lines if line.strip()])


# -- where users of vLLM and NIM look ---------------------------------------------------------------


def test_completions_logprobs_give_each_tokens_logprob_and_its_likeliest(client):
    answer = client.completions.create(model=MODEL, prompt=[3, 1, 4], max_tokens=5, temperature=0, logprobs=3)
    (choice,) = answer.choices
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert all(v <= 0 for v in lp.token_logprobs) and all(len(top) <= 3 for top in lp.top_logprobs)
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        # greedy: the chosen token is the likeliest (tokens that decode alike share a key in this legacy shape)
        assert value >= max(top.values()) - 1e-5 and token in top


def test_chat_logprobs_follow_the_chat_shape(client):
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    choice = answer.choices[0]
    content = choice.logprobs.content
    assert len(content) == len(choice.model_extra["token_ids"])
    assert all(c.logprob <= 0 and len(c.top_logprobs) == 2 and c.bytes is not None for c in content)
    assert all(c.logprob == pytest.approx(c.top_logprobs[0].logprob, abs=1e-5) for c in content)  # greedy


@pytest.mark.parametrize(
    "path, extra",
    [
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}}),
        ("/v1/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
        ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}),
        ("/v1/chat/completions", {"tool_choice": "required"}),
        ("/v1/completions", {"logprobs": 2, "stream": True}),
    ],
    ids=lambda v: v if isinstance(v, str) else next(iter(v)),
)
def test_openai_fields_this_engine_lacks_are_a_clear_400_not_an_unknown_field(server, path, extra):
    base = {"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    status, body = server.post(path, {**base, "max_tokens": 2, **extra})
    assert status == 400, body
    assert (
        "not supported by this engine" in body["error"]["message"] and "unknown field" not in body["error"]["message"]
    )


def test_neutral_values_of_those_fields_are_accepted(server):
    status, body = server.post(
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "response_format": {"type": "text"},
            "tools": [],
            "tool_choice": "none",
        },
    )
    assert status == 200, body


@pytest.mark.parametrize("path", ["/health", "/health/live", "/v1/health/ready", "/v1/health/live"])
def test_every_probe_answers_get_and_head(server, path):
    assert server.get(path)[0] == 200
    assert httpx.head(server.url(path)).status_code == 200


def test_streamed_chunks_carry_token_ids_that_add_up_to_the_whole_answers(client, server):
    body = {
        "model": MODEL,
        "prompt": [2, 7, 1, 8],
        "max_tokens": 12,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.completions.create(**body)
    chunks = list(client.completions.create(**body, stream=True))
    streamed = [t for c in chunks for choice in c.choices for t in (choice.model_extra.get("token_ids") or [])]
    assert streamed == whole.choices[0].model_extra["token_ids"]


def test_metrics_show_running_and_waiting_requests_and_kv_cache_use(client, server):
    client.completions.create(model=MODEL, prompt="load", max_tokens=2)
    families = {f.name: f for f in text_string_to_metric_families(server.get("/metrics")[1])}
    for name in ("prebake_num_requests_running", "prebake_num_requests_waiting", "prebake_kv_cache_usage_perc"):
        assert name in families, sorted(families)
    assert 0 <= families["prebake_kv_cache_usage_perc"].samples[0].value <= 1
