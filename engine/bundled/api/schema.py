"""The OpenAI wire schema the bundled engine speaks, as pydantic models.

Requests forbid unknown fields (a typo is a 400, not a silently ignored option) and bound every
number, so a bad value is refused by validation before it reaches the scheduler. Options of the
OpenAI schema the engine does not implement (echo, logprobs, best_of, penalties, tools) are
accepted at their neutral value and refused otherwise, naming the option. Responses are frozen
models; the engine adds `token_ids` to every choice (as vLLM's `return_token_ids` does).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints, model_validator

MAX_N = 16  # choices per prompt; more is a 400, not a queue of hundreds of rows
MAX_STOP = 8  # stop strings per request
MAX_TOKENS_BOUND = 1 << 20  # above any model length: a clear 400 from the limits, never an overflow
SEED_BOUND = (1 << 63) - 1

TokenId = Annotated[StrictInt, Field(ge=0, lt=1 << 31)]
StopString = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StreamOptions(_Request):
    include_usage: bool = False


class _Sampling(_Request):
    """What completions and chat share: sampling, stopping, streaming and the neutral unsupported options."""

    model: str | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=MAX_TOKENS_BOUND)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    n: StrictInt = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopString | list[StopString] | None = Field(default=None)
    seed: StrictInt | None = Field(default=None, ge=0, le=SEED_BOUND)
    ignore_eos: bool = False
    user: str | None = None
    presence_penalty: float = Field(default=0.0, ge=0.0, le=0.0, description="not supported: 0 only")
    frequency_penalty: float = Field(default=0.0, ge=0.0, le=0.0, description="not supported: 0 only")
    logit_bias: dict[str, float] | None = Field(default=None, max_length=0)

    @model_validator(mode="after")
    def _checks(self):
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOP:
            raise ValueError(f"stop: at most {MAX_STOP} stop strings, got {len(self.stop)}")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed with stream=true")
        return self

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


Prompt = (
    Annotated[str, StringConstraints(min_length=0)]
    | Annotated[list[str], Field(min_length=1)]
    | Annotated[list[TokenId], Field(min_length=1)]
    | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
)


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: Prompt
    max_tokens: StrictInt | None = Field(default=16, ge=1, le=MAX_TOKENS_BOUND)
    echo: Literal[False] = False
    logprobs: None = None
    best_of: Literal[1] | None = None
    suffix: None = None


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, le=MAX_TOKENS_BOUND)
    add_generation_prompt: bool = True
    logprobs: Literal[False] | None = None
    top_logprobs: None = None

    def token_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(_Request):
    """POST /tokenize: a prompt or chat messages, as vLLM's route takes them."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send exactly one of prompt and messages")
        return self


class DetokenizeRequest(_Request):
    """POST /detokenize."""

    model: str | None = None
    tokens: list[TokenId]


# -- responses -------------------------------------------------------------------------------------


class _Response(BaseModel):
    model_config = ConfigDict(frozen=True)


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


FinishReason = Literal["stop", "length"] | None


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: None = None
    finish_reason: FinishReason
    token_ids: list[int] | None = None


class Completion(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Response):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: FinishReason
    token_ids: list[int] | None = None


class ChatCompletion(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Response):
    index: int
    delta: Delta
    logprobs: None = None
    finish_reason: FinishReason = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "prebake"
    root: str
    max_model_len: int


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Tokens(_Response):
    count: int
    max_model_len: int
    tokens: list[int]


class Text(_Response):
    prompt: str


class ErrorBody(_Response):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(_Response):
    """What every 4xx and 5xx carries, as OpenAI clients parse it."""

    error: ErrorBody
