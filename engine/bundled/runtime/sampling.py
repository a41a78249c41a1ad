"""vLLM's sampling options on one row of logits, on the host, after the compiled step.

The compiled steps end at the logits, so no option changes a step shape or adds a compile at
serving time. The order is vLLM v1's sampler: logit_bias, min_tokens (stop ids masked),
repetition, frequency and presence penalties; then argmax at temperature 0, else temperature,
min_p, top_k, top_p and an exponential race (argmax of p / Exp(1): exact, shape-free). Neutral
options pass the row through untouched. Each option's rule: docs/http-api.md ("Sampling").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prebake.engine.bundled.runtime.model import is_greedy

LOGIT_BIAS_BOUND = 100.0  # vLLM clamps each bias to [-100, 100]


@dataclass(frozen=True)
class SamplingOptions:
    """What shapes the logits before a token is drawn (temperature and top_p live on the Request)."""

    top_k: int = 0  # 0 (or -1, vLLM's old spelling): off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), clamped to +-LOGIT_BIAS_BOUND
    min_tokens: int = 0

    def problems(self, vocab_size: int) -> list[str]:
        """What is out of range, each with its bound (empty: fine)."""
        out = []
        if not (self.top_k in (-1, 0) or self.top_k >= 1):
            out.append(f"top_k must be -1 or 0 (off) or at least 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            out.append(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0:
            out.append(f"repetition_penalty must be above 0 (1 is off), got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                out.append(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if bad := [t for t, _ in self.logit_bias if not 0 <= t < vocab_size]:
            out.append(f"logit_bias names token ids {bad[:5]} outside the vocabulary 0..{vocab_size - 1}")
        if self.min_tokens < 0:
            out.append(f"min_tokens must be at least 0, got {self.min_tokens}")
        return out

    @property
    def shapes_logits(self) -> bool:
        """Whether any option before temperature changes the row (else it is passed through)."""
        return bool(
            self.logit_bias
            or self.min_tokens
            or self.repetition_penalty != 1.0
            or self.presence_penalty
            or self.frequency_penalty
        )


def adjusted_logits(
    logits: torch.Tensor,
    options: SamplingOptions,
    prompt: tuple[int, ...],
    output: list[int],
    stop_ids: frozenset[int],
) -> torch.Tensor:
    """One row [vocab] after logit_bias, min_tokens and the penalties (float32); the row itself when neutral."""
    if not options.shapes_logits:
        return logits
    row = logits.float().clone()
    vocab = row.shape[-1]
    for token, bias in options.logit_bias:
        row[token] += max(-LOGIT_BIAS_BOUND, min(LOGIT_BIAS_BOUND, bias))
    if len(output) < options.min_tokens and stop_ids:
        row[torch.tensor(sorted(t for t in stop_ids if t < vocab), dtype=torch.long)] = float("-inf")
    counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=vocab)[:vocab].float()
    if options.repetition_penalty != 1.0:
        seen = counts > 0
        if prompt:
            seen[torch.tensor([t for t in prompt if t < vocab], dtype=torch.long)] = True
        penalty = torch.where(seen, options.repetition_penalty, 1.0)
        row = torch.where(row > 0, row / penalty, row * penalty)
    row -= options.frequency_penalty * counts
    row -= options.presence_penalty * (counts > 0).float()
    return row


def draw(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    options: SamplingOptions,
    generator: torch.Generator | None,
) -> int:
    """A token from one adjusted row [vocab]: argmax at temperature 0, else min_p, top_k, top_p and the race."""
    if is_greedy(temperature):
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    filtered = options.min_p > 0 or options.top_k >= 1
    if options.min_p > 0:
        probs = torch.where(probs < options.min_p * probs.max(), 0.0, probs)
    if 1 <= options.top_k < probs.shape[-1]:
        kth = torch.topk(probs, options.top_k).values[-1]
        probs = torch.where(probs < kth, 0.0, probs)
    if filtered:
        probs = probs / probs.sum()
    if top_p < 1:
        ordered, order = probs.sort(descending=True)
        keep = (ordered.cumsum(dim=-1) - ordered) < top_p  # the mass before a token is short of top_p
        probs = probs * torch.zeros_like(keep).scatter(-1, order, keep)
    noise = torch.empty_like(probs).exponential_(generator=generator).clamp_min(torch.finfo(torch.float32).tiny)
    return int((probs / noise).argmax())
