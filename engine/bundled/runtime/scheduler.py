"""Requests to bucketed steps: continuous batching over the compiled prefill and decode shapes.

Each request owns one row (slot) of the static KV cache from its prefill to its last token. One
iteration admits waiting requests into free slots (the longest FIFO run that fits one prefill
bucket, prefilled together), decodes every running request one token in the smallest decode
bucket that holds them, and finishes those at max_tokens, a stop token, or a sink that said stop
(a sink is told each token on the scheduler's thread: streaming, stop strings, a client gone).
A request's tokens depend only on its own row and its own seeded generator, so batched answers
equal answers served alone, up to floating-point reassociation across bucket shapes. Only the
thread that runs `step`/`serve_forever` touches the model.
"""

from __future__ import annotations

import math
import queue
import random
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from prebake.artifacts.buckets.artifact import BucketSet
from prebake.artifacts.errors import PrebakeError
from prebake.engine.bundled.runtime.model import is_greedy
from prebake.engine.bundled.runtime.sampling import SamplingOptions, adjusted_logits, draw
from prebake.engine.bundled.runtime.shapes import StepShape, decode_for, prefill_for, step_shapes
from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic


class RequestRejected(PrebakeError, ValueError):
    """A request the engine cannot serve as asked (too long, bad sampling settings)."""


@dataclass(frozen=True)
class Request:
    """One completion: a tokenized prompt and how to continue it."""

    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_ids: frozenset[int] = frozenset()
    top_logprobs: int | None = None  # None: no log-probabilities; k: each token's, and the k likeliest
    options: SamplingOptions = SamplingOptions()  # top_k, min_p, penalties, logit_bias, min_tokens (runtime.sampling)


Sink = Callable[[int], bool]  # told each sampled token; False ends the request ("stop")
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability under the model (before temperature and top_p, as vLLM's
    default raw_logprobs), and the `top` likeliest tokens with theirs."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Completion:
    tokens: tuple[int, ...]
    finish_reason: str  # "length" (max_tokens reached) or "stop" (a stop token was produced)
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token when the request asked for them


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, from the bucket set and the cache."""

    max_prompt: int  # the largest prefill bucket's tokens
    max_model_len: int  # prompt + generated tokens
    vocab_size: int

    def check(self, request: Request) -> None:
        n = len(request.prompt)
        if n == 0:
            raise RequestRejected("the prompt is empty; send at least one token")
        if n > self.max_prompt:
            raise RequestRejected(
                f"the prompt has {n} tokens, more than the largest prefill bucket holds ({self.max_prompt} tokens); "
                f"shorten the prompt or serve a recipe with larger buckets (serving.max_num_batched_tokens)"
            )
        if request.max_tokens < 1:
            raise RequestRejected(f"max_tokens must be at least 1, got {request.max_tokens}")
        if n + request.max_tokens > self.max_model_len:
            raise RequestRejected(
                f"the prompt ({n} tokens) plus max_tokens ({request.max_tokens}) exceeds the model length limit "
                f"max_model_len = {self.max_model_len}; lower max_tokens to at most {self.max_model_len - n}"
            )
        if bad := [t for t in request.prompt if not 0 <= t < self.vocab_size]:
            raise RequestRejected(f"prompt token ids {bad[:5]} are outside the vocabulary 0..{self.vocab_size - 1}")
        if request.top_logprobs is not None and not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
            raise RequestRejected(f"top_logprobs must be 0 ... {MAX_TOP_LOGPROBS}, got {request.top_logprobs}")
        if not (math.isfinite(request.temperature) and request.temperature >= 0 and 0 < request.top_p <= 1):
            raise RequestRejected(
                f"temperature must be >= 0 and top_p in (0, 1]; got {request.temperature} and {request.top_p}"
            )
        if problems := request.options.problems(self.vocab_size):
            raise RequestRejected("; ".join(problems))
        if request.options.min_tokens > request.max_tokens:
            raise RequestRejected(
                f"min_tokens ({request.options.min_tokens}) is more than max_tokens ({request.max_tokens}); "
                f"lower min_tokens or raise max_tokens"
            )


@dataclass(frozen=True)
class Load:
    """The scheduler's load as vLLM users graph it: num_requests_running / _waiting, kv_cache_usage_perc."""

    running: int
    waiting: int
    kv_cache_usage: float  # positions held by running requests / the cache's positions (slots x max_model_len)


@dataclass
class _Running:
    request: Request
    future: Future
    slot: int
    generator: torch.Generator | None
    sink: Sink | None = None
    tokens: list[int] = field(default_factory=list)
    ended: bool = False  # the sink said stop
    logprobs: list[TokenLogprob] = field(default_factory=list)

    @property
    def position(self) -> int:
        """Where the last sampled token goes in the cache when it is fed back."""
        return len(self.request.prompt) + len(self.tokens) - 1

    def finished(self) -> str | None:
        if self.ended or (self.tokens and self.tokens[-1] in self.request.stop_ids):
            return "stop"
        return "length" if len(self.tokens) >= self.request.max_tokens else None


class Scheduler:
    """Continuous batching of completion requests over one model's compiled step shapes."""

    def __init__(
        self,
        steps: CompiledSteps,
        buckets: BucketSet,
        tactics: dict[StepShape, Tactic],
        max_model_len: int,
        observe: Callable[[StepShape, int], None] | None = None,
    ):
        """`observe(shape, real_rows)` is told of every step run (for metrics)."""
        self.steps, self.buckets, self.tactics = steps, buckets, tactics
        self.max_model_len = max_model_len
        self._observe = observe or (lambda shape, rows: None)
        prefill_tokens = [s.tokens for s in step_shapes(buckets, max_model_len) if s.phase == "prefill"]
        if not prefill_tokens:
            raise RequestRejected("the bucket set has no prefill bucket without cached context; rebuild the buckets")
        config = steps.model.config
        self.limits = Limits(max(prefill_tokens), max_model_len, config.vocab_size)
        self._free = list(range(steps.cache.num_slots))
        self._waiting: deque[tuple[Request, Future, Sink | None]] = deque()
        self._inbox: queue.SimpleQueue[tuple[Request, Future, Sink | None]] = queue.SimpleQueue()
        self._running: list[_Running] = []

    def submit(self, request: Request, sink: Sink | None = None) -> Future:
        """Queue a request (any thread); its Future resolves to a Completion. Raises RequestRejected."""
        self.limits.check(request)
        future: Future = Future()
        self._inbox.put((request, future, sink))
        return future

    @property
    def idle(self) -> bool:
        return not self._running and not self._waiting and self._inbox.empty()

    def load(self) -> Load:
        """Requests running and waiting, and how full the KV cache is (read from any thread: a
        snapshot, not a lock; the figures are for /metrics)."""
        running = list(self._running)
        slots = self.steps.cache.num_slots
        held = sum(len(r.request.prompt) + len(r.tokens) for r in running)
        return Load(len(running), len(self._waiting) + self._inbox.qsize(), held / (slots * self.max_model_len))

    def step(self) -> None:
        """One iteration: admit what fits, decode everything running, finish what is done."""
        self._drain_inbox()
        try:
            self._admit()
            if self._running:
                self._decode()
        except Exception as exc:  # a failing step fails its requests, not the server
            for run in self._running:
                run.future.set_exception(exc)
                self._free.append(run.slot)
            self._running = []

    def run_until_idle(self) -> None:
        while not self.idle:
            self.step()

    def serve_forever(self, stop: threading.Event, poll_s: float = 0.05) -> None:
        """The serving loop: wait for work, then step until idle; returns when `stop` is set."""
        while not stop.is_set():
            if self.idle:
                try:
                    self._waiting.append(self._inbox.get(timeout=poll_s))
                except queue.Empty:
                    continue
            self.step()

    def _drain_inbox(self) -> None:
        while True:
            try:
                self._waiting.append(self._inbox.get_nowait())
            except queue.Empty:
                return

    def _admit(self) -> None:
        if any(future.cancelled() for _, future, _ in self._waiting):  # their clients left: never started
            self._waiting = deque(w for w in self._waiting if not w[1].cancelled())
        while self._waiting and self._free:
            group = self._prefill_group()
            if group is None:  # unreachable for checked requests; fail the head rather than spin on it
                request, future, _ = self._waiting.popleft()
                future.set_exception(RequestRejected(f"no prefill bucket holds a {len(request.prompt)}-token prompt"))
                continue
            runs = []
            for _ in range(len(group[1])):
                request, future, sink = self._waiting.popleft()
                if future.set_running_or_notify_cancel():
                    runs.append(_Running(request, future, self._free.pop(0), _generator(request), sink))
            if runs:
                self._running.extend(runs)  # before the step runs, so a failing step fails them too
                self._prefill(group[0], runs)

    def _prefill_group(self) -> tuple[StepShape, list[Request]] | None:
        """The longest FIFO run of waiting requests that fits free slots and one prefill bucket."""
        best = None
        longest = 0
        for n, (request, _, _) in enumerate(list(self._waiting)[: len(self._free)], start=1):
            longest = max(longest, len(request.prompt))
            shape = prefill_for(self.buckets, n, longest)
            if shape is None:
                break
            best = (shape, [r for r, _, _ in list(self._waiting)[:n]])
        return best

    def _prefill(self, shape: StepShape, runs: list[_Running]) -> None:
        rows = [(list(r.request.prompt), len(r.request.prompt), r.slot) for r in runs]
        rows += self._padding(len(rows), shape.batch, rows[0], lambda: ([0], 1))
        ids = torch.tensor([p + [0] * (shape.tokens - len(p)) for p, _, _ in rows])
        lengths = torch.tensor([n for _, n, _ in rows])
        slots = torch.tensor([s for _, _, s in rows])
        logits = self.steps.prefill(ids, lengths, slots, self.tactics.get(shape, Tactic()))
        self._observe(shape, len(runs))
        self._sample(runs, logits)
        self._finish()

    def _decode(self) -> None:
        for chunk, shape in self._decode_chunks():
            rows = [(r.tokens[-1], r.position, r.slot) for r in chunk]
            rows += self._padding(len(rows), shape.batch, rows[0], lambda: (0, 0))
            ids = torch.tensor([t for t, _, _ in rows])
            positions = torch.tensor([p for _, p, _ in rows])
            slots = torch.tensor([s for _, _, s in rows])
            logits = self.steps.decode(ids, positions, slots, shape.ctx_len, self.tactics.get(shape, Tactic()))
            self._observe(shape, len(chunk))
            self._sample(chunk, logits)
        self._finish()

    def _decode_chunks(self) -> list[tuple[list[_Running], StepShape]]:
        """Running requests split into decode steps: all of them in one when a bucket holds them."""
        pending = sorted(self._running, key=lambda r: r.position, reverse=True)
        chunks = []
        while pending:
            for n in range(len(pending), 0, -1):
                shape = decode_for(self.buckets, n, pending[0].position + 1, self.max_model_len)
                if shape is not None:
                    chunks.append((pending[:n], shape))
                    pending = pending[n:]
                    break
            else:
                raise RequestRejected(f"no decode bucket holds a context of {pending[0].position + 1} positions")
        return chunks

    def _padding(self, real: int, batch: int, first_row: tuple, blank) -> list[tuple]:
        """Rows that fill a step up to its bucket's batch: free slots first, else repeats of a real row."""
        spare = self._free[: batch - real]
        return [(*blank(), slot) for slot in spare] + [first_row] * (batch - real - len(spare))

    def _sample(self, runs: list[_Running], logits: torch.Tensor) -> None:
        for i, run in enumerate(runs):
            r = run.request
            row = adjusted_logits(logits[i], r.options, r.prompt, run.tokens, r.stop_ids)
            token = draw(row, r.temperature, r.top_p, r.options, run.generator)
            run.tokens.append(token)
            if r.top_logprobs is not None:
                run.logprobs.append(_logprob(logits[i], token, r.top_logprobs))
            if run.sink is not None:
                run.ended = not _tell(run.sink, token)

    def _finish(self) -> None:
        still = []
        for run in self._running:
            reason = run.finished()
            if reason is None:
                still.append(run)
            else:
                run.future.set_result(Completion(tuple(run.tokens), reason, tuple(run.logprobs)))
                self._free.append(run.slot)
        self._running = still
        self._free.sort()


def _logprob(logits: torch.Tensor, token: int, k: int) -> TokenLogprob:
    """One row's log-softmax at the sampled token, and its k likeliest tokens (k <= MAX_TOP_LOGPROBS)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(logp, min(k, logp.shape[-1])) if k else None
    pairs = tuple(zip(top.indices.tolist(), top.values.tolist(), strict=True)) if top is not None else ()
    return TokenLogprob(token, float(logp[token]), pairs)


def _tell(sink: Sink, token: int) -> bool:
    try:
        return bool(sink(token))
    except Exception:  # a broken sink ends its own request, never the scheduler's loop
        return False


def _generator(request: Request) -> torch.Generator | None:
    if is_greedy(request.temperature):
        return None
    seed = request.seed if request.seed is not None else random.SystemRandom().randrange(2**63)
    return torch.Generator().manual_seed(seed)
