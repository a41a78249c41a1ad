"""POST /v1/completions and /v1/chat/completions: whole answers, or server-sent events.

A streamed answer is a sequence of `data: <chunk JSON>` events, one per piece of text as the
scheduler samples it, a last chunk per choice with its finish_reason, with
stream_options.include_usage one more chunk with no choices and the usage, then `data: [DONE]`.
A failure after the stream began is sent as a `data: {"error": ...}` event before [DONE] (the
status line is already out). A client that disconnects ends its rows at their next token, and
its choices still queued are never started, streamed or not: a streamed answer learns of it
from Starlette's disconnect listener (the generator is closed), a whole answer from its own
watcher on the connection (`_cancel_on_disconnect`), since nothing else would tell it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
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
    ChatLogprobs,
    ChatMessage,
    ChatTokenLogprob,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    Delta,
    ErrorBody,
    ErrorResponse,
    FinishReason,
    TopLogprob,
    Usage,
)
from prebake.engine.bundled.api.state import AppState, Serving
from prebake.engine.bundled.runtime.tokenizer import Tokenizer

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def add_routes(app: FastAPI, state: AppState) -> None:
    @app.post("/v1/completions", response_model=None)
    async def completions(
        body: CompletionRequest, request: Request, response: Response
    ) -> Completion | StreamingResponse:
        response.headers.update(state.unknown_fields.header(state.unknown_fields.check(body)))
        serving = state.ready()
        state.check_model(body.model)
        prompts = await run_in_threadpool(_prompts, serving, body.prompt)
        shape = _CompletionShape(state.model_id, prompts if body.return_token_ids else None, body.n)
        return await _answer(state, serving, prompts, body, shape, request, response.headers)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(
        body: ChatCompletionRequest, request: Request, response: Response
    ) -> ChatCompletion | StreamingResponse:
        response.headers.update(state.unknown_fields.header(state.unknown_fields.check(body)))
        serving = state.ready()
        state.check_model(body.model)
        prompt = await run_in_threadpool(chat_prompt, serving, body.messages, body.add_generation_prompt, body)
        shape = _ChatShape(state.model_id, prompt if body.return_token_ids else None)
        return await _answer(state, serving, [prompt], body, shape, request, response.headers)


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


def chat_prompt(
    serving: Serving,
    messages: list[ChatMessage],
    add_generation_prompt: bool,
    request: ChatCompletionRequest | None = None,
) -> list[int]:
    if serving.chat is None:
        raise ApiError(
            400,
            "this model has no chat template (no chat_template in its tokenizer_config.json); "
            "use /v1/completions with a prompt",
            "messages",
        )
    continue_final = request is not None and request.continue_final_message
    variables = request.chat_template_kwargs if request is not None else None
    try:
        rendered = [{"role": m.role, "content": m.text()} for m in messages]
        text = serving.chat.render(rendered, add_generation_prompt, continue_final, variables)
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


def _params(body: CompletionRequest | ChatCompletionRequest) -> Params:
    from prebake.engine.bundled.runtime.sampling import SamplingOptions  # torch: loaded once the engine is ready

    options = SamplingOptions(
        top_k=body.top_k or 0,
        min_p=body.min_p,
        repetition_penalty=body.repetition_penalty,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logit_bias=body.bias(),
        min_tokens=body.min_tokens,
    )
    return Params(
        max_tokens=body.token_budget() if isinstance(body, ChatCompletionRequest) else body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        n=body.n,
        seed=body.seed,
        stop=body.stop_strings(),
        ignore_eos=body.ignore_eos,
        top_logprobs=body.top_logprobs_asked(),
        options=options,
        stop_token_ids=frozenset(body.stop_token_ids or ()),
        skip_special=body.skip_special_tokens,
    )


_PARAMS = ("prompt", "max_tokens", "min_tokens", "logit_bias", "top_k", "min_p", "repetition_penalty")


def _param_of(message: str) -> str:
    """The request field a scheduler's refusal is about (it names it first)."""
    return next((p for p in _PARAMS if message.startswith(p) or f" {p} " in message), "max_tokens")


async def _answer(state: AppState, serving: Serving, prompts, body, shape, request: Request, headers=None):
    started = time.perf_counter()
    try:
        generation = Generation(
            serving.scheduler, serving.tokenizer, serving.eos, prompts, _params(body), state.metrics
        )
    except ValueError as exc:  # RequestRejected: past the limits, named with the fix
        state.metrics.add("prebake_requests_total", outcome="rejected")
        raise ApiError(400, str(exc), _param_of(str(exc))) from exc
    if body.stream:
        usage_kind = "continuous" if body.continuous_usage() else "last" if body.include_usage() else None
        events = _stream(state, generation, shape, usage_kind, started)
        return StreamingResponse(events, media_type="text/event-stream", headers={**SSE_HEADERS, **dict(headers or {})})
    try:
        async with _cancel_on_disconnect(request, generation):
            finished = {f.index: f async for f in generation.events() if isinstance(f, Finished)}
    except GenerationFailed as exc:
        state.metrics.add("prebake_requests_total", outcome="cancelled" if generation.cancelled else "error")
        raise ApiError(500, f"{exc}; the server goes on serving, retry the request") from exc
    finally:
        generation.cancel()  # no-op once all finished; ends the rows if this handler was cancelled
        state.metrics.observe_latency(time.perf_counter() - started)
    state.metrics.add("prebake_requests_total", outcome="ok")
    usage = _usage(generation, generation.completion_tokens)
    return shape.whole([finished[i] for i in sorted(finished)], usage, serving.tokenizer)


@asynccontextmanager
async def _cancel_on_disconnect(request: Request, generation: Generation):
    """While the block runs, a client that hangs up cancels `generation` (its running rows end at
    their next token, its queued ones never start); the block then fails with GenerationFailed."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass  # the body was read whole by the guard: nothing else can come but the disconnect
        generation.cancel()

    watcher = asyncio.create_task(watch())
    try:
        yield
    finally:
        watcher.cancel()


def _usage(generation: Generation, completion_tokens: int) -> Usage:
    total = generation.prompt_tokens + completion_tokens
    return Usage(prompt_tokens=generation.prompt_tokens, completion_tokens=completion_tokens, total_tokens=total)


async def _stream(state: AppState, generation: Generation, shape, usage: str | None, started: float):
    """Chunks; `usage` "last": one usage chunk at the end, "continuous": also the usage so far on every chunk."""
    outcome = "error"

    def sse(chunk) -> str:
        so_far = _usage(generation, generation.sampled) if usage == "continuous" else None
        return _sse(chunk.model_copy(update={"usage": so_far}) if so_far is not None else chunk)

    try:
        for chunk in shape.opening(generation.size):
            yield sse(chunk)
        async for event in generation.events():
            if isinstance(event, Finished):
                yield sse(shape.piece(event.index, event.tail, event.reason, event.tail_tokens))
            else:
                yield sse(shape.piece(event.index, event.text, None, event.tokens))
        if usage is not None:
            yield _sse(shape.usage(_usage(generation, generation.completion_tokens)))
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


def _token_text(tokenizer: Tokenizer | None, token: int) -> str:
    """A token as logprobs name it: its text, or token_id:N without a tokenizer (as vLLM's
    return_tokens_as_token_ids writes it)."""
    return tokenizer.decode([token]) if tokenizer is not None else f"token_id:{token}"


def _completion_logprobs(f: Finished, tokenizer: Tokenizer | None) -> CompletionLogprobs | None:
    if not f.logprobs:
        return None
    texts = [_token_text(tokenizer, lp.token) for lp in f.logprobs]
    offsets = [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    top = [{_token_text(tokenizer, t): v for t, v in lp.top} for lp in f.logprobs]
    return CompletionLogprobs(
        tokens=texts,
        token_logprobs=[lp.logprob for lp in f.logprobs],
        top_logprobs=top if any(lp.top for lp in f.logprobs) else None,
        text_offset=offsets,
    )


def _chat_logprobs(f: Finished, tokenizer: Tokenizer | None) -> ChatLogprobs | None:
    if not f.logprobs:
        return None

    def entry(token: int) -> tuple[str, list[int]]:
        text = _token_text(tokenizer, token)
        return text, list(text.encode("utf-8", "surrogatepass"))

    content = []
    for lp in f.logprobs:
        text, raw = entry(lp.token)
        top = [TopLogprob(token=t, logprob=v, bytes=b) for t, b, v in ((*entry(i), v) for i, v in lp.top)]
        content.append(ChatTokenLogprob(token=text, logprob=lp.logprob, bytes=raw, top_logprobs=top))
    return ChatLogprobs(content=content)


class _CompletionShape:
    """Completions' answer; with `prompts` (return_token_ids) each choice carries its prompt's ids,
    streamed on its first chunk (as vLLM's)."""

    def __init__(self, model: str, prompts: list[list[int]] | None = None, n: int = 1):
        self.model, self.id, self.created = model, f"cmpl-{uuid.uuid4().hex}", int(time.time())
        self.prompts, self.n = prompts, n
        self._started: set[int] = set()

    def _prompt_ids(self, index: int) -> list[int] | None:
        return None if self.prompts is None else self.prompts[index // self.n]

    def whole(self, finished: list[Finished], usage: Usage, tokenizer: Tokenizer | None) -> Completion:
        choices = [
            CompletionChoice(
                index=f.index,
                text=f.text,
                logprobs=_completion_logprobs(f, tokenizer),
                finish_reason=f.reason,
                token_ids=list(f.tokens),
                prompt_token_ids=self._prompt_ids(f.index),
            )
            for f in finished
        ]
        return Completion(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def opening(self, n: int) -> list[Completion]:
        return []

    def piece(self, index: int, text: str, reason: FinishReason, tokens: tuple[int, ...]) -> Completion:
        first = index not in self._started
        self._started.add(index)
        choice = CompletionChoice(
            index=index,
            text=text,
            finish_reason=reason,
            token_ids=list(tokens),
            prompt_token_ids=self._prompt_ids(index) if first else None,
        )
        return Completion(id=self.id, created=self.created, model=self.model, choices=[choice])

    def usage(self, usage: Usage) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.model, choices=[], usage=usage)


class _ChatShape:
    """Chat's answer; with `prompt` (return_token_ids) the prompt's ids on the answer and the opening chunk."""

    def __init__(self, model: str, prompt: list[int] | None = None):
        self.model, self.id, self.created = model, f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        self.prompt = prompt

    def whole(self, finished: list[Finished], usage: Usage, tokenizer: Tokenizer | None) -> ChatCompletion:
        choices = [
            ChatChoice(
                index=f.index,
                message=AssistantMessage(content=f.text),
                logprobs=_chat_logprobs(f, tokenizer),
                finish_reason=f.reason,
                token_ids=list(f.tokens),
            )
            for f in finished
        ]
        return ChatCompletion(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage,
            prompt_token_ids=self.prompt,
        )

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None, **more) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage, **more
        )

    def opening(self, n: int) -> list[ChatCompletionChunk]:
        return [
            self._chunk(
                [ChatChunkChoice(index=i, delta=Delta(role="assistant", content=""))],
                prompt_token_ids=self.prompt if i == 0 else None,
            )
            for i in range(n)
        ]

    def piece(self, index: int, text: str, reason: FinishReason, tokens: tuple[int, ...]) -> ChatCompletionChunk:
        delta = Delta(content=text) if text or reason is None else Delta()
        return self._chunk([ChatChunkChoice(index=index, delta=delta, finish_reason=reason, token_ids=list(tokens))])

    def usage(self, usage: Usage) -> ChatCompletionChunk:
        return self._chunk([], usage)
