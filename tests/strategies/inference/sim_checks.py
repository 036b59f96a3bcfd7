"""The HF strategy on the SIMULATED NPU (ROLL_DEVICE=npu-sim), run in a process of its own (the
simulation renames PrivateUse1 once per process). Results are simulations: CPU compute behind
tensors that report `npu:N`."""

from __future__ import annotations

import os


def hf_on_simulated_npu(model_path: str) -> dict:
    os.environ["ROLL_DEVICE"] = "npu-sim"
    import roll_device as rd
    from strategies.base import SamplingConfig
    from strategies.inference.hf import HfStrategy
    from tests.strategies.inference.conftest import rollout_config
    from tests.strategies.inference.test_hf_strategy import GREEDY, PROMPTS

    platform = rd.current_platform()
    strategy = HfStrategy(platform)
    strategy.initialize(model_path, rollout_config("hf", "max_batch_size=8"))
    try:
        sampled = strategy.generate(PROMPTS, SamplingConfig(n=2, max_tokens=8, temperature=1.0, seed=3))
        return {
            "platform": platform.name,
            "weights_on": str(next(strategy.model.parameters()).device),
            "uses_graphs": strategy.runner.use_graphs,
            "greedy": [c.token_ids for c in strategy.generate(PROMPTS, GREEDY)],
            "sampled": [c.token_ids for c in sampled],
        }
    finally:
        strategy.shutdown()
