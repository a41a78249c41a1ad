"""Replay a request trace through a model of the serving engine's batching, step by step.

Each step, in the order vLLM's scheduler gives them: arrivals join the queue (timestamps scaled to
`rate`, or a closed loop of max_num_seqs clients), requests are admitted up to max_num_seqs, every
running sequence decodes one token, the token budget left goes to prompts in arrival order
(chunked prefill, at most max_num_prefill_seqs), and time advances by the step's modelled cost
(StepCost). Context blocks are counted as vllm-gaudi buckets them (hpu_model_runner.py at 091bbad).
Deterministic: the same trace and settings give the same shapes. The model in full: docs/buckets.md.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from dataclasses import dataclass, field

from prebake.artifacts.buckets.limits import ServingLimits
from prebake.artifacts.buckets.traces import Request
from prebake.artifacts.errors import BucketError

PromptShape = tuple[int, int, int]  # (batch, query, ctx_blocks)
DecodeShape = tuple[int, int]  # (batch, ctx_blocks)


@dataclass(frozen=True)
class StepCost:
    """Modelled seconds per step: only the replay's clock uses it (who is batched with whom)."""

    step_s: float = 0.015
    prefill_token_s: float = 0.0001
    decode_seq_s: float = 0.0002


@dataclass(frozen=True)
class ReplaySettings:
    rate: float | None = None  # requests per second; None: the trace's own arrival times
    closed_loop: bool = False  # max_num_seqs clients instead of arrival times
    cost: StepCost = field(default_factory=StepCost)


@dataclass(frozen=True)
class Shapes:
    """The step shapes a replay produced, each with how many steps had it."""

    prompt: dict[PromptShape, int]
    decode: dict[DecodeShape, int]


@dataclass
class _Seq:
    prompt: int
    output: int
    done: int  # prompt tokens in the KV cache
    generated: int = 0


def replay(requests: tuple[Request, ...], limits: ServingLimits, settings: ReplaySettings = ReplaySettings()) -> Shapes:
    if settings.rate is not None and settings.closed_loop:
        raise BucketError("a replay is either at a rate or a closed loop, not both; drop --rate or the closed loop")
    engine = _Engine(limits, settings.cost)
    arrivals = _arrivals(requests, settings, limits.max_num_seqs)
    pending = deque(requests[len(arrivals) :]) if settings.closed_loop else deque()
    heap = [(t, i, r) for i, (t, r) in enumerate(arrivals)]
    heapq.heapify(heap)
    order = len(heap)
    while heap or engine.busy():
        while heap and heap[0][0] <= engine.now:
            engine.waiting.append(engine.start(heapq.heappop(heap)[2]))
        if not engine.busy():
            engine.now = heap[0][0]
            continue
        for _ in range(engine.step()):
            if pending:  # a closed-loop client sends its next request as soon as one finishes
                heapq.heappush(heap, (engine.now, order, pending.popleft()))
                order += 1
    return Shapes(dict(engine.prompt), dict(engine.decode))


def _arrivals(requests: tuple[Request, ...], settings: ReplaySettings, clients: int) -> list[tuple[float, Request]]:
    if settings.closed_loop:
        return [(0.0, r) for r in requests[:clients]]
    if settings.rate is None:
        return [(r.arrival_s, r) for r in requests]
    span = requests[-1].arrival_s - requests[0].arrival_s
    if span <= 0:
        return [(i / settings.rate, r) for i, r in enumerate(requests)]
    scale = len(requests) / (settings.rate * span)
    return [(r.arrival_s * scale, r) for r in requests]


class _Engine:
    def __init__(self, limits: ServingLimits, cost: StepCost):
        self.limits, self.cost = limits, cost
        self.now = 0.0
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.prompt: Counter[PromptShape] = Counter()
        self.decode: Counter[DecodeShape] = Counter()

    def start(self, request: Request) -> _Seq:
        mml, block = self.limits.max_model_len, self.limits.block_size
        prompt = min(request.prompt_tokens, mml - 1)
        output = max(1, min(request.output_tokens, mml - prompt))
        cached = request.cached_tokens // block * block if self.limits.enable_prefix_caching else 0
        return _Seq(prompt, output, min(cached, (prompt - 1) // block * block))

    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> int:
        """Run one engine step; return how many sequences finished."""
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            self.running.append(self.waiting.popleft())
        block = self.limits.block_size
        decoding = [s for s in self.running if s.done == s.prompt]
        if decoding:
            blocks = sum(-(-(s.prompt + s.generated) // block) for s in decoding)
            self.decode[(len(decoding), blocks)] += 1
        chunks = self._prefill_chunks(self.limits.max_num_batched_tokens - len(decoding))
        for s in decoding:
            s.generated += 1
        for s, chunk in chunks:
            s.done += chunk
            s.generated = 1 if s.done == s.prompt else 0
        self.now += self.cost.step_s + self.cost.decode_seq_s * len(decoding)
        self.now += self.cost.prefill_token_s * sum(c for _, c in chunks)
        finished = [s for s in self.running if s.done == s.prompt and s.generated >= s.output]
        self.running = [s for s in self.running if not (s.done == s.prompt and s.generated >= s.output)]
        return len(finished)

    def _prefill_chunks(self, budget: int) -> list[tuple[_Seq, int]]:
        block, ctx = self.limits.block_size, 0
        chunks: list[tuple[_Seq, int]] = []
        for s in self.running:
            if s.done == s.prompt or len(chunks) == self.limits.prefill_seqs:
                continue
            left = s.prompt - s.done
            chunk = min(left, budget)
            if chunk <= 0:
                break
            longest = max([chunk, *(c for _, c in chunks)])
            if chunks and (len(chunks) + 1) * longest > self.limits.max_num_batched_tokens:
                break  # padded to its longest prompt the batch would pass the step's token limit, which
                # no bucket vllm-gaudi warms up may do (its prompt filter): the prompt waits a step
            chunks.append((s, chunk))
            ctx = max(ctx, -(-s.done // block))
            budget -= chunk
        if chunks:
            self.prompt[(len(chunks), max(c for _, c in chunks), ctx)] += 1
        return chunks
