"""Tensor parallelism of the Llama runtime: the shard each rank holds, and tp=2 answering as tp=1.

The equality tests run real ranks: two processes over gloo on 127.0.0.1 (tests/support/tp_model.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from prebake.engine.bundled.runtime.parallel import Parallel, local_config, shard_state_dict, split_problem
from prebake.engine.bundled.runtime.weights import LlamaConfig, parameter_shapes, tiny_random_weights
from tests.support.baking import REPO
from tests.support.ports import free_port
from tests.support.tp_model import CONFIG, DECODES, PREFILLS

TINY = LlamaConfig.from_hf(CONFIG)


def test_each_rank_holds_its_heads_and_columns_and_the_rest_replicated():
    full = tiny_random_weights(TINY)
    for rank in (0, 1):
        shard = shard_state_dict(TINY, full, Parallel(rank, 2))
        local = local_config(TINY, Parallel(rank, 2))
        assert {k: tuple(v.shape) for k, v in shard.items()} == parameter_shapes(local)
        q = full["layers.0.self_attn.q_proj.weight"]
        assert torch.equal(shard["layers.0.self_attn.q_proj.weight"], q[rank * 128 : (rank + 1) * 128])
        down = full["layers.0.mlp.down_proj.weight"]
        assert torch.equal(shard["layers.0.mlp.down_proj.weight"], down[:, rank * 256 : (rank + 1) * 256])
        assert torch.equal(shard["lm_head.weight"], full["lm_head.weight"])  # replicated: every rank's logits whole


def test_more_ranks_than_kv_heads_replicate_each_kv_head_to_the_ranks_of_its_query_heads():
    full = tiny_random_weights(TINY)
    k = full["layers.0.self_attn.k_proj.weight"]  # 2 KV heads of 64
    for rank in range(4):
        shard = shard_state_dict(TINY, full, Parallel(rank, 4))
        assert torch.equal(shard["layers.0.self_attn.k_proj.weight"], k[(rank // 2) * 64 : (rank // 2 + 1) * 64])


def test_a_size_that_does_not_split_the_heads_is_refused_naming_the_fix():
    assert split_problem(TINY, 2) is None
    assert "use a TP size that divides them" in (split_problem(TINY, 3) or "")
    with pytest.raises(ValueError, match="tp 3 does not split 4 attention heads"):
        local_config(TINY, Parallel(0, 3))


def _ranks(world: int, dtype: str, out) -> dict:
    port = free_port()
    command = [sys.executable, "-m", "tests.support.tp_model"]
    procs = [
        subprocess.Popen([*command, str(r), str(world), str(port), dtype, str(out)], cwd=REPO) for r in range(world)
    ]
    assert [p.wait(300) for p in procs] == [0] * world
    return torch.load(out)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_ranks_answer_as_one_on_every_step_shape(tmp_path, dtype):
    one, two = _ranks(1, dtype, tmp_path / "tp1.pt"), _ranks(2, dtype, tmp_path / "tp2.pt")
    assert two["tokens"] == one["tokens"]  # greedy generation: prefill, then decode over the cache
    names = [f"prefill-b{b}-t{t}" for b, t in PREFILLS] + [f"decode-b{b}-c{c}" for b, c in DECODES]
    for name in names:
        largest = one[name].abs().max()
        if dtype == "float32":  # the same sums in another order: within 1e-4 of the largest logit
            assert (two[name] - one[name]).abs().max() <= 1e-4 * largest, name
            assert torch.equal(two[name].argmax(-1), one[name].argmax(-1)), name
            continue
        # bf16 rounds each rank's partial sum before the all-reduce adds them: logits move by up to
        # ~1% of the largest (measured), so rows whose top two tp=1 itself holds within 2% (ties
        # among them) may pick either; every other row picks the same token
        top = one[name].topk(2, dim=-1).values
        clear = (top[:, 0] - top[:, 1]) > 0.02 * largest
        assert (two[name] - one[name]).abs().max() <= 0.02 * largest, name
        assert torch.equal(two[name].argmax(-1)[clear], one[name].argmax(-1)[clear]), name


def test_the_variants_traced_on_one_rank_refuse_tp2_naming_why_and_the_package_serves_it():
    from prebake.artifacts.recipe.schema import Target
    from prebake.engine.bundled.variants import variant

    one, two = Target("m", "cpu", 1, "fp32"), Target("m", "cpu", 2, "fp32")
    assert variant("aoti-package").refuses(two) is None
    for name in ("dynamo-precompile", "inductor-cache"):
        assert variant(name).refuses(one) is None
        why = variant(name).refuses(two) or ""
        assert "does not serve at tp 2" in why and "set [compile] variant = 'aoti-package'" in why, name


def test_a_rank_context_round_trips_through_its_variable_and_a_bad_one_names_the_fix():
    from prebake.engine.bundled.ranks import RANK_ENV, RankContext

    context = RankContext(1, 2, 29500, -1, -1)
    assert RankContext.from_environ({RANK_ENV: context.encode()}) == context
    assert RankContext.from_environ({}) is None
    with pytest.raises(ValueError, match="never by hand: unset it"):
        RankContext.from_environ({RANK_ENV: "1,2"})


def test_the_first_rank_that_says_no_decides_and_is_named():
    from prebake.engine.bundled.runtime.lockstep import agree, first_refusal

    assert agree(None, "why") == ["why"]
    assert first_refusal([None, None]) is None
    assert first_refusal([None, "lacks AVX512", "damaged"]) == "rank 1: lacks AVX512"


_AGREE = """
import json, sys
from prebake.engine.bundled.runtime.lockstep import agree, from_rank0, join, leave
rank, port = int(sys.argv[1]), int(sys.argv[2])
parallel = join(rank, 2, port)
answers = agree(parallel, None if rank == 0 else "rank one's reason, longer than rank zero's" * rank)
decided = from_rank0(parallel, {"shapes": [[1, 2, 3]], "from": rank})
leave()
print(json.dumps([answers, decided]))
"""


def test_two_real_ranks_gather_answers_of_different_sizes_and_rank0s_decision():
    port = free_port()
    procs = [
        subprocess.Popen([sys.executable, "-c", _AGREE, str(r), str(port)], cwd=REPO, stdout=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    expected = [[None, "rank one's reason, longer than rank zero's"], {"shapes": [[1, 2, 3]], "from": 0}]
    assert [json.loads(out) for out in outs] == [expected, expected]
