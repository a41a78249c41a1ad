"""One HTTP request's choices run on the scheduler and come back as events on the event loop.

    Generation(serving, prompts, params)    n choices per prompt, submitted all or nothing
      .events()                             Piece(index, text, token) as sampled, then Finished per choice
      .cancel()                             the client went away: every row ends at its next token

The scheduler's thread feeds each choice's TextStream (decoding, stop strings) and posts to this
request's asyncio queue; the route streams or collects the same events, so a streamed answer is
the non-streamed one in pieces. Choice i of a seeded prompt samples with seed + i.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from prebake.engine.bundled.api.schema import SEED_BOUND, FinishReason
from prebake.engine.bundled.api.text import TextStream
from prebake.engine.bundled.runtime.metrics import Metrics
from prebake.engine.bundled.runtime.tokenizer import Tokenizer

MAX_CHOICES = 64  # prompts x n in one request: more is a 400, not a queue that starves everyone else

if TYPE_CHECKING:  # torch: the server answers probes while it loads, so the scheduler comes later
    from prebake.engine.bundled.runtime.sampling import SamplingOptions
    from prebake.engine.bundled.runtime.scheduler import Request, Scheduler, TokenLogprob


@dataclass(frozen=True)
class Params:
    """Sampling and stopping, as the schema validated them."""

    max_tokens: int | None
    temperature: float
    top_p: float
    n: int
    seed: int | None
    stop: tuple[str, ...]
    ignore_eos: bool
    top_logprobs: int | None = None  # None: no log-probabilities; k: each token's and the k likeliest
    options: SamplingOptions | None = None  # vLLM's top_k, min_p, penalties, logit_bias, min_tokens
    stop_token_ids: frozenset[int] = frozenset()  # more stop tokens (they stop even with ignore_eos, as vLLM's)
    skip_special: bool = True  # skip_special_tokens

    def min_tokens(self) -> int:
        return self.options.min_tokens if self.options is not None else 0


@dataclass(frozen=True)
class Piece:
    index: int
    text: str
    token: int | None
    tokens: tuple[int, ...] = ()  # the ids sampled since the last piece handed out, this one's last


@dataclass(frozen=True)
class Finished:
    index: int
    reason: FinishReason
    tokens: tuple[int, ...]
    tail: str  # text not yet handed out as a Piece
    text: str  # the whole choice's text
    tail_tokens: tuple[int, ...] = ()  # ids not yet handed out with a Piece
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token, when asked for


class _Timing:
    """One request's figures for vLLM's series, per choice (vLLM runs each of n as a request of its own)."""

    def __init__(self, metrics: Metrics, prompts: list[list[int]]):
        self.metrics, self.started = metrics, time.perf_counter()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        tokens = sum(len(p) for p in prompts)
        for name in (
            "vllm:prompt_tokens_total",
            "vllm:prefix_cache_queries_total",
            "vllm:gpu_prefix_cache_queries_total",
        ):
            metrics.add(name, tokens)  # no prefix cache: every prompt token is a query and none a hit
        for prompt in prompts:
            metrics.observe("vllm:request_prompt_tokens", len(prompt))

    def token(self, index: int) -> None:
        now = time.perf_counter()
        if index in self.first:
            self.metrics.observe("vllm:inter_token_latency_seconds", now - self.last[index])
        else:
            self.first[index] = now
            self.metrics.observe("vllm:time_to_first_token_seconds", now - self.started)
        self.last[index] = now
        self.metrics.add("vllm:generation_tokens_total")

    def finished(self, index: int, reason: str, tokens: int) -> None:
        self.metrics.add("vllm:request_success_total", finished_reason=reason)
        if reason == "abort":
            return
        self.metrics.observe("vllm:e2e_request_latency_seconds", time.perf_counter() - self.started)
        self.metrics.observe("vllm:request_generation_tokens", tokens)
        if tokens > 1 and index in self.first:
            self.metrics.observe(
                "vllm:request_time_per_output_token_seconds", (self.last[index] - self.first[index]) / (tokens - 1)
            )


class GenerationFailed(RuntimeError):
    """A model step failed under this request (the server goes on serving)."""


class _Choice:
    def __init__(self, generation: Generation, index: int, text: TextStream, stop_ids: frozenset[int]):
        self.generation, self.index, self.text, self.stop_ids = generation, index, text, stop_ids
        self.future: Future | None = None

    def __call__(self, token: int) -> bool:  # the scheduler's thread
        if self.generation.cancelled:
            return False
        consumed = not self.text.stopped  # a token after a stop string is not part of the answer
        delta = self.text.feed(token, stop_token=token in self.stop_ids)
        self.generation.post(Piece(self.index, delta, token if consumed else None))
        return not self.text.stopped

    def done(self, future: Future) -> None:  # the scheduler's thread, or the one that cancelled
        self.generation.post(self)


class Generation:
    def __init__(
        self,
        scheduler: Scheduler,
        tokenizer: Tokenizer | None,
        eos: frozenset[int],
        prompts: list[list[int]],
        params: Params,
        metrics: Metrics,
    ):
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._metrics = metrics
        self.cancelled = False
        self.prompt_tokens = sum(len(p) for p in prompts)
        self.completion_tokens = 0
        self.sampled = 0  # tokens sampled so far, every choice (the usage of a chunk with continuous_usage_stats)
        self._started = time.perf_counter()
        self._first = True
        if len(prompts) * params.n > MAX_CHOICES:
            raise ValueError(
                f"{len(prompts)} prompts x n = {params.n} asks for {len(prompts) * params.n} choices, more than "
                f"{MAX_CHOICES} in one request; split the prompts over several requests"
            )
        requests = [
            _request(p, params, i, eos, scheduler.limits.max_model_len) for p in prompts for i in range(params.n)
        ]
        for request in requests:  # all or nothing: nothing is queued when one choice is refused
            scheduler.limits.check(request)
        self.prompts = [p for p in prompts for _ in range(params.n)]  # each choice's prompt
        self._choices = [
            _Choice(self, i, TextStream(tokenizer, params.stop, params.min_tokens(), params.skip_special), r.stop_ids)
            for i, r in enumerate(requests)
        ]
        for choice, request in zip(self._choices, requests, strict=True):
            choice.future = scheduler.submit(request, choice)
            choice.future.add_done_callback(choice.done)
        self._timing = _Timing(metrics, self.prompts)

    @property
    def size(self) -> int:
        """How many choices (prompts x n)."""
        return len(self._choices)

    def post(self, item) -> None:
        """From any thread: hand an event (or a finished choice) to the request's event loop."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is gone (server stopping): nobody is listening
            pass

    def cancel(self) -> None:
        self.cancelled = True
        for choice in self._choices:
            if choice.future is not None:
                choice.future.cancel()  # still queued: never admitted; running: its sink ends it

    async def events(self) -> AsyncIterator[Piece | Finished]:
        """Pieces with text (each carrying the ids sampled since the previous one), then Finished."""
        pending = len(self._choices)
        held: dict[int, list[int]] = {}  # ids sampled whose text is not settled yet, per choice
        while pending:
            item = await self._queue.get()
            if isinstance(item, Piece):
                if self._first:
                    self._first = False
                    self._metrics.observe("prebake_time_to_first_token_seconds", time.perf_counter() - self._started)
                ids = held.setdefault(item.index, [])
                if item.token is not None:
                    ids.append(item.token)
                    self.sampled += 1
                    self._timing.token(item.index)
                if item.text:
                    yield Piece(item.index, item.text, item.token, tuple(ids))
                    ids.clear()
                continue
            pending -= 1
            finished = self._finished(item)
            yield replace(finished, tail_tokens=tuple(held.pop(finished.index, ())))

    def _finished(self, choice: _Choice) -> Finished:
        future = choice.future
        assert future is not None  # set when the choice was submitted
        if future.cancelled():
            self._timing.finished(choice.index, "abort", 0)
            raise GenerationFailed("the request was cancelled")
        if (exc := future.exception()) is not None:
            self._timing.finished(choice.index, "abort", 0)
            raise GenerationFailed(f"generation failed: {type(exc).__name__}: {exc}") from exc
        completion = future.result()
        tail = choice.text.finish()
        tokens = tuple(choice.text.tokens)
        self.completion_tokens += len(tokens)
        self._metrics.add("prebake_generated_tokens_total", len(tokens))
        reason: FinishReason = "stop" if choice.text.stopped or completion.finish_reason == "stop" else "length"
        self._timing.finished(choice.index, reason or "length", len(tokens))
        logprobs = completion.logprobs[: len(tokens)]  # a stop string may end the text before the last token
        return Finished(choice.index, reason, tokens, tail, choice.text.text, logprobs=logprobs)


def _request(prompt: list[int], params: Params, i: int, eos: frozenset[int], max_model_len: int) -> Request:
    # torch: loaded by the time a request can arrive
    from prebake.engine.bundled.runtime.sampling import SamplingOptions
    from prebake.engine.bundled.runtime.scheduler import Request

    seed = None if params.seed is None else (params.seed + i) % (SEED_BOUND + 1)
    budget = params.max_tokens if params.max_tokens is not None else max(1, max_model_len - len(prompt))
    return Request(
        prompt=tuple(prompt),
        max_tokens=budget,
        temperature=params.temperature,
        top_p=params.top_p,
        seed=seed,
        stop_ids=(frozenset() if params.ignore_eos else eos) | params.stop_token_ids,
        top_logprobs=params.top_logprobs,
        options=params.options or SamplingOptions(),
    )
