"""POST /v1/completions and /v1/chat/completions: whole answers, or server-sent events.

A streamed answer is a sequence of `data: <chunk JSON>` events, one per piece of text as the
scheduler samples it, a last chunk per choice with its finish_reason, with
stream_options.include_usage one more chunk with no choices and the usage, then `data: [DONE]`.
A failure after the stream began is sent as a `data: {"error": ...}` event before [DONE] (the
status line is already out). A client that disconnects ends its rows at their next token.
"""

from __future__ import annotations

import time
import uuid

from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from prebake.engine.bundled.api.chat import ChatTemplateError
from prebake.engine.bundled.api.errors import ApiError
from prebake.engine.bundled.api.generate import Finished, Generation, GenerationFailed, Params
from prebake.engine.bundled.api.schema import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    Completion,
    CompletionChoice,
    CompletionRequest,
    Delta,
    ErrorBody,
    ErrorResponse,
    FinishReason,
    Usage,
)
from prebake.engine.bundled.api.state import AppState, Serving
from prebake.engine.bundled.runtime.tokenizer import Tokenizer

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def add_routes(app: FastAPI, state: AppState) -> None:
    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest) -> Completion | StreamingResponse:
        serving = state.ready()
        state.check_model(body.model)
        prompts = await run_in_threadpool(_prompts, serving, body.prompt)
        return await _answer(state, serving, prompts, body, _CompletionShape(state.model_id))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest) -> ChatCompletion | StreamingResponse:
        serving = state.ready()
        state.check_model(body.model)
        prompt = await run_in_threadpool(chat_prompt, serving, body.messages, body.add_generation_prompt)
        return await _answer(state, serving, [prompt], body, _ChatShape(state.model_id))


# -- prompts ---------------------------------------------------------------------------------------


def tokenizer_of(serving: Serving) -> Tokenizer:
    if serving.tokenizer is None:
        raise ApiError(
            400,
            "this model has no tokenizer (no tokenizer.json in its folder; see the start-up log), "
            "so text cannot be encoded; send token ids",
            "prompt",
        )
    return serving.tokenizer


def encode(serving: Serving, text: str, special: bool = True, param: str = "prompt") -> list[int]:
    tokenizer = tokenizer_of(serving)
    try:
        return tokenizer.encode(text, special)
    except Exception as exc:  # lone surrogates (\ud800 in JSON) and the like: the text's fault, not ours
        raise ApiError(400, f"{param} cannot be encoded as UTF-8 text: {exc}; send valid Unicode", param) from exc


def chat_prompt(serving: Serving, messages: list[ChatMessage], add_generation_prompt: bool) -> list[int]:
    if serving.chat is None:
        raise ApiError(
            400,
            "this model has no chat template (no chat_template in its tokenizer_config.json); "
            "use /v1/completions with a prompt",
            "messages",
        )
    try:
        text = serving.chat.render([{"role": m.role, "content": m.text()} for m in messages], add_generation_prompt)
    except ChatTemplateError as exc:
        raise ApiError(400, str(exc), "messages") from exc
    return encode(serving, text, special=False, param="messages")


def _prompts(serving: Serving, prompt) -> list[list[int]]:
    """OpenAI's four prompt forms (text, [text], [ids], [[ids]]) as token ids."""
    if isinstance(prompt, str):
        return [encode(serving, prompt)]
    if prompt and isinstance(prompt[0], str):
        return [encode(serving, p) for p in prompt]
    if prompt and isinstance(prompt[0], int):
        return [list(prompt)]
    return [list(p) for p in prompt]


# -- answers ---------------------------------------------------------------------------------------


async def _answer(state: AppState, serving: Serving, prompts, body, shape):
    started = time.perf_counter()
    params = Params(
        max_tokens=body.token_budget() if isinstance(body, ChatCompletionRequest) else body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        n=body.n,
        seed=body.seed,
        stop=body.stop_strings(),
        ignore_eos=body.ignore_eos,
    )
    try:
        generation = Generation(serving.scheduler, serving.tokenizer, serving.eos, prompts, params, state.metrics)
    except ValueError as exc:  # RequestRejected: past the limits, named with the fix
        state.metrics.add("prebake_requests_total", outcome="rejected")
        raise ApiError(400, str(exc), "prompt" if "prompt" in str(exc) else "max_tokens") from exc
    if body.stream:
        events = _stream(state, generation, shape, body.include_usage(), started)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        finished = {f.index: f async for f in generation.events() if isinstance(f, Finished)}
    except GenerationFailed as exc:
        state.metrics.add("prebake_requests_total", outcome="error")
        raise ApiError(500, f"{exc}; the server goes on serving, retry the request") from exc
    finally:
        generation.cancel()  # no-op once all finished; ends the rows if this handler was cancelled
        state.metrics.observe_latency(time.perf_counter() - started)
    state.metrics.add("prebake_requests_total", outcome="ok")
    usage = Usage(
        prompt_tokens=generation.prompt_tokens,
        completion_tokens=generation.completion_tokens,
        total_tokens=generation.prompt_tokens + generation.completion_tokens,
    )
    return shape.whole([finished[i] for i in sorted(finished)], usage)


async def _stream(state: AppState, generation: Generation, shape, include_usage: bool, started: float):
    outcome = "error"
    try:
        for chunk in shape.opening(generation.size):
            yield _sse(chunk)
        async for event in generation.events():
            if isinstance(event, Finished):
                yield _sse(shape.piece(event.index, event.tail, event.reason))
            else:
                yield _sse(shape.piece(event.index, event.text, None))
        if include_usage:
            usage = Usage(
                prompt_tokens=generation.prompt_tokens,
                completion_tokens=generation.completion_tokens,
                total_tokens=generation.prompt_tokens + generation.completion_tokens,
            )
            yield _sse(shape.usage(usage))
        outcome = "ok"
    except GenerationFailed as exc:
        error = ErrorBody(message=f"{exc}; retry the request", type="server_error", code=500)
        yield _sse(ErrorResponse(error=error))
    finally:  # also on a client's disconnect (the generator is closed): free its rows
        generation.cancel()
        state.metrics.add("prebake_requests_total", outcome=outcome)
        state.metrics.observe_latency(time.perf_counter() - started)
    yield "data: [DONE]\n\n"


def _sse(chunk: BaseModel) -> str:
    return f"data: {chunk.model_dump_json()}\n\n"


class _CompletionShape:
    def __init__(self, model: str):
        self.model, self.id, self.created = model, f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def whole(self, finished: list[Finished], usage: Usage) -> Completion:
        choices = [
            CompletionChoice(index=f.index, text=f.text, finish_reason=f.reason, token_ids=list(f.tokens))
            for f in finished
        ]
        return Completion(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def opening(self, n: int) -> list[Completion]:
        return []

    def piece(self, index: int, text: str, reason: FinishReason) -> Completion:
        choice = CompletionChoice(index=index, text=text, finish_reason=reason)
        return Completion(id=self.id, created=self.created, model=self.model, choices=[choice])

    def usage(self, usage: Usage) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.model, choices=[], usage=usage)


class _ChatShape:
    def __init__(self, model: str):
        self.model, self.id, self.created = model, f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def whole(self, finished: list[Finished], usage: Usage) -> ChatCompletion:
        choices = [
            ChatChoice(
                index=f.index,
                message=AssistantMessage(content=f.text),
                finish_reason=f.reason,
                token_ids=list(f.tokens),
            )
            for f in finished
        ]
        return ChatCompletion(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def opening(self, n: int) -> list[ChatCompletionChunk]:
        return [self._chunk([ChatChunkChoice(index=i, delta=Delta(role="assistant", content=""))]) for i in range(n)]

    def piece(self, index: int, text: str, reason: FinishReason) -> ChatCompletionChunk:
        delta = Delta(content=text) if text or reason is None else Delta()
        return self._chunk([ChatChunkChoice(index=index, delta=delta, finish_reason=reason)])

    def usage(self, usage: Usage) -> ChatCompletionChunk:
        return self._chunk([], usage)
