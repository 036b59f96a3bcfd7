"""Greedy output of the HF strategy with captured decode graphs equals its output without graphs,
token for token, at batch sizes 1 to 16 (each captured bucket, and 13 rows padded into 16), on a
device with graphs (CUDA, ROCm, NPU). Skipped cleanly elsewhere."""

import pytest

import roll_device as rd
from strategies.base import SamplingConfig
from strategies.inference.hf import HfStrategy
from tests.strategies.inference.conftest import rollout_config

pytestmark = pytest.mark.gpu
BATCHES = (1, 2, 4, 8, 13, 16)


def prompts(rows: int) -> list[list[int]]:
    return [[5 + i % 30, 6, 7 + i % 5][: 1 + i % 3] for i in range(rows)]


def test_greedy_with_graphs_equals_eager_at_every_batch_size(tiny_model_path):
    platform = rd.current_platform()
    if not platform.supports_graphs:
        pytest.skip(f"platform '{platform.name}' has no device graphs here")
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
            outputs[use_graphs] = {
                rows: [c.token_ids for c in strategy.generate(prompts(rows), sampling)] for rows in BATCHES
            }
        finally:
            strategy.shutdown()
    for rows in BATCHES:
        assert outputs[True][rows] == outputs[False][rows], f"{rows} rows"
    assert sum(map(len, outputs[True][16])) > 16 * 4  # not stopped at once: many decode steps compared
