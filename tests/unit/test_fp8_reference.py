"""prebake's FP8 W8A8 against an independent reference of the scheme (benchmarks/fp8_reference.py:
plain torch fake-quant, per-channel weight and per-token activation scales of amax / 448, round to
nearest, fp32 products, nothing of prebake's FP8 code): a linear equals it to fp32 rounding, and a
model with fused q/k/v and gate/up serves its logits. On SmolLM2 the benchmark finds them bitwise
equal (docs/fp8.md); here the tolerances only allow another host's fp32 summation order."""

from __future__ import annotations

import torch

from benchmarks.fp8_reference import fake_quant_rows, with_reference_linears
from prebake.artifacts.recipe.quantization import QUANTIZE_ON_LOAD
from prebake.engine.bundled.runtime.fp8_linear import FP8, Fp8Linear, QuantLinear, quantize_rows
from prebake.engine.bundled.runtime.fp8_load import build_fp8_model, quantize_on_load
from prebake.engine.bundled.runtime.model import KVCache, build_model
from tests.support.fp8_checkpoints import CONFIG, plain_weights

PROMPT = torch.tensor([[5, 17, 200, 42, 7, 99, 3, 64, 11, 250, 0, 128]])


def test_an_fp8_linear_is_the_scheme_to_fp32_rounding():
    generator = torch.Generator().manual_seed(7)
    weight = (torch.randn(96, 64, generator=generator) * 0.05).to(torch.bfloat16)
    weight[5] = 0  # an all-zero row: its scale floored, its codes zero
    x = (torch.randn(9, 64, generator=generator) * torch.logspace(-3, 2, 9)[:, None]).to(torch.bfloat16)
    x[4] = 0  # an all-zero token: finite, zero out

    codes, scale = quantize_rows(weight)
    reference_scale = weight.float().abs().amax(dim=1) / 448
    assert torch.equal(scale[reference_scale > 0], reference_scale[reference_scale > 0])
    assert torch.equal(codes.float() * scale[:, None], fake_quant_rows(weight))  # the FP8 weight, bit for bit

    linear = Fp8Linear(64, 96, bias=False, static=False, dtype=torch.bfloat16)
    linear.load_state_dict(Fp8Linear.state_of(QuantLinear(codes, scale), torch.bfloat16), assign=True)
    assert linear.weight.dtype == FP8
    # fp32 out, bf16 values in: the activations' FP8 codes are the served ones and the products are not
    # rounded, so the outputs differ by fp32 summation order only (within 1e-5 of the sum of the terms'
    # sizes); one code off (a rounding, a scale) moves a term by 1/16 of itself, about 1e-3 of that sum
    got = linear(x.float())
    want = fake_quant_rows(x) @ fake_quant_rows(weight).t()
    sizes = fake_quant_rows(x).abs() @ fake_quant_rows(weight).abs().t()
    assert bool(((got - want).abs() <= 1e-5 * sizes).all()), float(((got - want).abs() / sizes.clamp_min(1e-30)).max())
    assert torch.equal(got[4], torch.zeros(96))
    torch.testing.assert_close(linear(x), want.to(torch.bfloat16), rtol=8e-3, atol=1e-5)  # served: bf16 out


def test_an_fp8_model_with_fused_linears_serves_the_reference_schemes_logits():
    plain = {k: v.to(torch.bfloat16) for k, v in plain_weights().items()}
    fp8 = build_fp8_model(CONFIG, quantize_on_load(CONFIG, plain, QUANTIZE_ON_LOAD), QUANTIZE_ON_LOAD, torch.bfloat16)
    reference = with_reference_linears(build_model(CONFIG, plain, torch.bfloat16), "div, fp32 scale")

    def logits(model) -> torch.Tensor:
        cache = KVCache.allocate(CONFIG, 1, 16, dtype=torch.bfloat16)
        return model.prefill(PROMPT, torch.tensor([PROMPT.shape[1]]), torch.tensor([0]), cache)[0]

    got, want = logits(fp8), logits(reference)
    assert int(got.argmax()) == int(want.argmax())
    torch.testing.assert_close(got, want, rtol=0, atol=0.02)


def test_the_e4m3_cast_both_use_rounds_to_the_nearest_value_ties_to_even():
    # prebake and the reference round with torch's float32 -> float8_e4m3fn cast; checked here against
    # the 253 finite e4m3 values themselves, at every midpoint between two of them and at random points
    values = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    values = values[torch.isfinite(values)].unique()
    x = torch.cat([(values[1:] + values[:-1]) / 2, torch.empty(20000).uniform_(-448, 448), torch.randn(20000) / 64])
    distance = (x[:, None] - values[None, :]).abs()
    nearest = distance == distance.min(dim=1, keepdim=True).values
    even = (values.to(FP8).view(torch.uint8) & 1) == 0
    nearest = torch.where(nearest.sum(dim=1, keepdim=True) > 1, nearest & even, nearest)
    assert torch.equal(x.to(FP8).float(), values[nearest.float().argmax(dim=1)])
