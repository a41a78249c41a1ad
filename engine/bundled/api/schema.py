"""The OpenAI wire schema the bundled engine speaks, with vLLM's extra sampling fields, as pydantic models.

Requests accept fields they do not know, as vLLM's do (`extra="allow"`): `extra_fields` names
them, the route logs each name once and says them in the `X-Ignored-Fields` header, and an
operator's `--reject-unknown-fields` turns them into a 400 (api.fields). Every number is bounded,
so a bad value is refused by validation before it reaches the scheduler. Options that would
change the answer and that the engine cannot honour (tools, structured output, beam search, ...)
are accepted at their neutral value and otherwise refused as "not supported by this engine",
naming the option. Responses are frozen models; the engine adds `token_ids` to every choice and
every streamed chunk (as vLLM's `return_token_ids` does), and `prompt_token_ids` when asked.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints, field_validator, model_validator
from pydantic_core import PydanticCustomError

MAX_N = 16  # choices per prompt; more is a 400, not a queue of hundreds of rows
MAX_STOP = 8  # stop strings per request
MAX_TOKENS_BOUND = 1 << 20  # above any model length: a clear 400 from the limits, never an overflow
SEED_BOUND = (1 << 63) - 1

MAX_TOP_LOGPROBS = 20  # OpenAI's bound (prebake.engine.bundled.runtime.scheduler keeps the same)
RENDER_VARIABLES = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token"})  # api.chat sets these
TokenId = Annotated[StrictInt, Field(ge=0, lt=1 << 31)]
StopString = Annotated[str, StringConstraints(min_length=1, max_length=256)]


MAX_LOGIT_BIAS = 1024  # entries of logit_bias
MAX_STOP_TOKEN_IDS = 64


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # every chunk carries the usage so far (with include_usage, as vLLM)


# vLLM request fields that change the answer and that this engine does not implement: their neutral values.
_NEUTRAL: dict[str, tuple[object, ...]] = {
    "use_beam_search": (None, False),
    "length_penalty": (None, 1.0),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "prompt_logprobs": (None,),
    "include_stop_str_in_output": (None, False),
    "truncate_prompt_tokens": (None,),
    "structured_outputs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "guided_decoding_backend": (None,),
}


class _Sampling(_Request):
    """What completions and chat share: sampling (vLLM's extras too), stopping, streaming, and the options
    refused unless neutral."""

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
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = Field(default=None, max_length=MAX_LOGIT_BIAS)
    response_format: Any = None  # OpenAI's structured output: only {"type": "text"}, the neutral value
    # vLLM's sampling parameters (runtime.sampling applies them)
    top_k: StrictInt | None = Field(default=None, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=100.0, allow_inf_nan=False)
    min_tokens: StrictInt = Field(default=0, ge=0, le=MAX_TOKENS_BOUND)
    stop_token_ids: list[TokenId] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    skip_special_tokens: bool = True
    return_token_ids: bool | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not key.isdigit():
                raise ValueError(f'logit_bias keys are token ids ("50256"), got {key!r}')
            if bias != bias or bias in (float("inf"), float("-inf")):
                raise ValueError(f"logit_bias[{key}] must be a finite number, got {bias}")
        return value

    @field_validator("response_format")
    @classmethod
    def _free_text_only(cls, value: Any) -> Any:
        if value is None or value == {"type": "text"}:
            return value
        raise not_supported("response_format", "it generates free text only; leave response_format out")

    @model_validator(mode="after")
    def _checks(self):
        for name, neutral in _NEUTRAL.items():
            if (self.model_extra or {}).get(name) not in neutral:
                raise not_supported(name, f"leave {name} out (or at {neutral[-1]!r})")
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOP:
            raise ValueError(f"stop: at most {MAX_STOP} stop strings, got {len(self.stop)}")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed with stream=true")
        if self.stream and self.top_logprobs_asked() is not None:
            raise not_supported("logprobs", "log-probabilities come with whole answers only; ask without stream")
        return self

    def top_logprobs_asked(self) -> int | None:
        """None: no log-probabilities; k: each token's and the k likeliest."""
        return None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def continuous_usage(self) -> bool:
        return self.include_usage() and bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def bias(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(k), v) for k, v in (self.logit_bias or {}).items())


Prompt = (
    Annotated[str, StringConstraints(min_length=0)]
    | Annotated[list[str], Field(min_length=1)]
    | Annotated[list[TokenId], Field(min_length=1)]
    | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
)


def not_supported(field: str, why: str) -> PydanticCustomError:
    """The refusal of an OpenAI option this engine does not implement (errors.py words it)."""
    return PydanticCustomError("not_supported", "not supported by this engine: {why}", {"why": why, "field": field})


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: Prompt
    max_tokens: StrictInt | None = Field(default=16, ge=1, le=MAX_TOKENS_BOUND)
    echo: Literal[False] = False
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: Literal[1] | None = None
    suffix: None = None

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs


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
    continue_final_message: bool = False  # the last message is left open and continued (vLLM's)
    chat_template_kwargs: dict[str, Any] | None = None  # more variables for the chat template (vLLM's)
    echo: Literal[False] = False
    logprobs: bool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Any = None  # function calling: only none or [] (the neutral values)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: Any = None  # the deprecated spelling of tools
    function_call: Any = None

    @field_validator("tools", "functions")
    @classmethod
    def _no_tools(cls, value: Any, info) -> Any:
        if value in (None, []):
            return value
        raise not_supported(info.field_name, "it has no function calling; leave tools out")

    @field_validator("tool_choice", "function_call")
    @classmethod
    def _no_tool_choice(cls, value: Any, info) -> Any:
        if value in (None, "none", "auto"):
            return value
        raise not_supported(info.field_name, "it has no function calling; leave it out")

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: only with logprobs=true")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError(
                "continue_final_message: cannot be true with add_generation_prompt (the default); "
                "send add_generation_prompt=false"
            )
        if self.chat_template_kwargs and (taken := sorted(set(self.chat_template_kwargs) & RENDER_VARIABLES)):
            raise ValueError(f"chat_template_kwargs: {taken} are set by the request itself; leave them out")
        return self

    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

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


class CompletionLogprobs(_Response):
    """OpenAI's legacy completions shape: parallel lists, one entry per generated token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None  # with return_token_ids


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


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Response):
    content: list[ChatTokenLogprob]


class ChatChoice(_Response):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason
    token_ids: list[int] | None = None


class ChatCompletion(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = None  # with return_token_ids


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
    prompt_token_ids: list[int] | None = None  # with return_token_ids, on the opening chunk


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
