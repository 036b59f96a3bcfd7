"""Greedy output of the HF strategy with captured decode graphs equals its output without graphs,
token for token, on a device with graphs (CUDA, ROCm, NPU). Skipped cleanly elsewhere."""

import pytest

import roll_device as rd
from strategies.base import SamplingConfig
from strategies.inference.hf import HfStrategy
from tests.strategies.inference.conftest import rollout_config

pytestmark = pytest.mark.gpu


def test_greedy_with_graphs_equals_eager(tiny_model_path):
    platform = rd.current_platform()
    if not platform.supports_graphs:
        pytest.skip(f"platform '{platform.name}' has no device graphs here")
    prompts = [[5 + i % 30, 6, 7 + i % 5][: 1 + i % 3] for i in range(13)]  # 13 rows: bucket 16
    sampling = SamplingConfig(max_tokens=24, temperature=0.0)
    outputs = {}
    for use_graphs in (True, False):
        strategy = HfStrategy(platform)
        strategy.initialize(
            tiny_model_path, rollout_config("hf", "max_batch_size=16", f"use_graphs={use_graphs}")
        )
        try:
            assert strategy.runner.use_graphs is use_graphs
            if use_graphs:
                assert strategy.runner.capture_order == [16, 8, 4, 2, 1]
            outputs[use_graphs] = [c.token_ids for c in strategy.generate(prompts, sampling)]
        finally:
            strategy.shutdown()
    assert outputs[True] == outputs[False]
