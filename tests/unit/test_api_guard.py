"""The API's guards and error shapes, in process (no engine needed: they act before any route)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from prebake.engine.bundled.api.app import create_app
from prebake.engine.bundled.api.fields import UnknownFields
from prebake.engine.bundled.api.guard import Guard, GuardSettings
from prebake.engine.bundled.api.state import AppState
from prebake.engine.bundled.runtime.metrics import Metrics


def _client(**guard) -> httpx.AsyncClient:
    app = create_app(AppState("m", Metrics(), step="compile"), GuardSettings(**guard))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def _run(coro):
    return asyncio.run(coro)


def test_probes_answer_while_starting_and_other_routes_say_503_with_the_step():
    async def go():
        async with _client() as c:
            return (await c.get("/health")), (await c.get("/health/live")), (await c.get("/v1/models"))

    health, live, models = _run(go())
    assert health.status_code == 503 and health.json() == {"status": "starting", "step": "compile"}
    assert live.status_code == 200
    assert models.status_code == 503 and "starting (compile)" in models.json()["error"]["message"]


def test_with_a_key_every_route_but_the_probes_needs_the_bearer_token():
    async def go():
        async with _client(api_key="k") as c:
            return [
                (await c.get("/health")).status_code,
                (await c.get("/health/live")).status_code,
                (await c.get("/metrics")).status_code,
                (await c.get("/metrics", headers={"Authorization": "Bearer k"})).status_code,
                (await c.get("/metrics", headers={"Authorization": "Bearer kk"})).status_code,
                (await c.post("/v1/completions", json={"prompt": "x"})).json()["error"]["type"],
            ]

    assert _run(go()) == [503, 200, 401, 200, 401, "authentication_error"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"\xff{}", 400, "not UTF-8"),
        (b"x" * 2000, 413, "larger than 1000 bytes"),
        (b'{"prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
        (b'{"prompt": "x", "temperature": "hot"}', 400, "temperature: Input should be a valid number"),
        (b'{"prompt": {"a": 1}}', 400, "prompt: must be a string, a list of strings"),
        (b"{", 400, "not valid JSON"),
    ],
)
def test_bad_bodies_are_refused_before_any_route_in_openais_error_shape(body, status, words):
    async def go():
        async with _client(max_body_bytes=1000) as c:
            return await c.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})

    response = _run(go())
    assert response.status_code == status
    assert words in response.json()["error"]["message"]
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_a_body_that_dribbles_past_the_time_limit_is_408():
    sent: list[dict] = []

    async def app(scope, receive, send):  # never reached
        raise AssertionError("the route ran")

    async def receive():
        await asyncio.sleep(0.2)
        return {"type": "http.request", "body": b"x", "more_body": True}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/v1/completions", "method": "POST", "headers": []}
    _run(Guard(app, GuardSettings(body_timeout_s=0.5))(scope, receive, send))
    assert sent[0]["status"] == 408


def test_a_body_sent_as_curl_d_sends_it_is_read_as_json():
    async def go():
        async with _client() as c:
            form = {"Content-Type": "application/x-www-form-urlencoded"}
            return await c.post("/v1/completions", content=b'{"prompt": "x", "max_tokens": 0}', headers=form)

    response = _run(go())
    assert response.status_code == 400 and "max_tokens: " in response.json()["error"]["message"]


def _answer(body: dict, reject: bool) -> httpx.Response:
    state = AppState("m", Metrics(), step="compile", unknown_fields=UnknownFields(reject))

    async def go():
        app = create_app(state, GuardSettings())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return await c.post("/v1/completions", json=body)

    return _run(go())


def test_unknown_fields_pass_by_default_and_are_refused_by_choice_naming_the_close_field(caplog):
    body = {"prompt": "x", "max_token": 5, "stream_options": None, "vendor_tag": "a"}
    passed = _answer(body, reject=False)  # past validation: the route's next answer is "starting"
    assert passed.status_code == 503 and "starting" in passed.json()["error"]["message"]
    assert "max_token (did you mean 'max_tokens'?)" in caplog.text and "vendor_tag" in caplog.text
    refused = _answer(body, reject=True)
    message = refused.json()["error"]["message"]
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_token"
    assert "max_token (did you mean 'max_tokens'?), vendor_tag: not part of this API" in message


@pytest.mark.parametrize(
    "field, value",
    [("use_beam_search", True), ("guided_json", {"type": "object"}), ("response_format", {"type": "json_object"})],
)
def test_fields_that_would_change_the_answer_and_cannot_be_honoured_are_a_400_naming_them(field, value):
    refused = _answer({"prompt": "x", field: value}, reject=False)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == field
    assert "not supported by this engine" in refused.json()["error"]["message"]


def test_the_unknown_names_logged_are_bounded_and_each_is_logged_once(caplog):
    from prebake.engine.bundled.api import fields
    from prebake.engine.bundled.api.schema import DetokenizeRequest

    policy = UnknownFields()
    for i in range(fields.MAX_LOGGED + 50):
        assert policy.check(DetokenizeRequest.model_validate({"tokens": [1], f"f{i}": 1})) == (f"f{i}",)
    policy.check(DetokenizeRequest.model_validate({"tokens": [1], "f0": 1}))
    assert caplog.text.count("f0 are not part") == 1 and "f1049" not in caplog.text
    assert len(policy._logged) == fields.MAX_LOGGED
