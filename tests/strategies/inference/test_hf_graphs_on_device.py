"""Greedy output of the HF strategy with captured decode graphs equals its output without graphs,
token for token, at batch sizes 1 to 16 (each captured bucket, and 13 rows padded into 16); and
with piecewise prefill graphs equals its output with the eager prefill, for prompts of mixed
lengths packed into each token-count bucket; on a device with graphs (CUDA, ROCm, NPU). Skipped
cleanly elsewhere."""

import pytest

import roll_device as rd
from strategies.base import SamplingConfig
from strategies.inference.hf import HfStrategy
from tests.configs import rollout_settings

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
        strategy.initialize(tiny_model_path, rollout_settings("hf", max_batch_size=16, use_graphs=use_graphs))
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


PREFILL_SIZES = [16, 64, 128]
PREFILL_BATCHES = ((1, 5), (3, 9), (16, 6), (16, 20))  # (rows, longest prompt)


def mixed_prompts(rows: int, longest: int) -> list[list[int]]:
    return [[3 + (7 * i + 3 * j) % 40 for j in range(1 + (5 * i + 2) % longest)] for i in range(rows)]


def counted(run, sizes: list[int]):
    """`run` of a prefill runner, appending each call's bucket to `sizes`."""

    def wrapper(size, inputs, rows):
        sizes.append(size)
        return run(size, inputs, rows)

    return wrapper


def test_greedy_with_prefill_graphs_equals_eager_prefill(tiny_model_path):
    platform = rd.current_platform()
    if not platform.supports_graphs:
        pytest.skip(f"platform '{platform.name}' has no device graphs here")
    sampling = SamplingConfig(max_tokens=10, temperature=0.0)
    outputs, packed_runs = {}, []
    for prefill_graphs in (True, False):  # decode eager in both: the prefill is what differs
        sizes = PREFILL_SIZES if prefill_graphs else None
        settings = rollout_settings(
            "hf",
            max_batch_size=16,
            use_graphs=False,
            prefill_graphs=prefill_graphs,
            prefill_capture_sizes=sizes,
        )
        strategy = HfStrategy(platform)
        strategy.initialize(tiny_model_path, settings)
        try:
            if prefill_graphs:
                runner = strategy.packed_prefill.runner
                assert runner.capture_order == PREFILL_SIZES[::-1]
                layers = strategy.model.config.num_hidden_layers
                assert [runner.pieces(size) for size in PREFILL_SIZES] == [layers + 1] * len(PREFILL_SIZES)
                runner.run = counted(runner.run, packed_runs)
            outputs[prefill_graphs] = {
                batch: [c.token_ids for c in strategy.generate(mixed_prompts(*batch), sampling)]
                for batch in PREFILL_BATCHES
            }
        finally:
            strategy.shutdown()
    for batch in PREFILL_BATCHES:
        assert outputs[True][batch] == outputs[False][batch], f"{batch} (rows, longest prompt)"
    tokens = [sum(map(len, mixed_prompts(*batch))) for batch in PREFILL_BATCHES]
    assert tokens[-1] > PREFILL_SIZES[-1]  # the last batch is longer than the largest bucket: eager
    assert packed_runs == [next(s for s in PREFILL_SIZES if s >= n) for n in tokens[:-1]]
