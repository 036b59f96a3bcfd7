"""The HF strategy on the SIMULATED NPU (ROLL_DEVICE=npu-sim), run in a process of its own (the
simulation renames PrivateUse1 once per process). Results are simulations: CPU compute behind
tensors that report `npu:N`."""

from __future__ import annotations

import gc
import os


def hf_on_simulated_npu(model_path: str) -> dict:
    from strategies.base import SamplingConfig
    from strategies.inference.hf import HfStrategy
    from tests.configs import rollout_settings
    from tests.isolated import simulated_npu
    from tests.strategies.inference.test_hf_strategy import GREEDY, PROMPTS

    platform = simulated_npu()
    strategy = HfStrategy(platform)
    strategy.initialize(model_path, rollout_settings("hf", max_batch_size=8))
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


def _start(cls, model_path: str, **changes):
    import roll_device as rd
    from tests.configs import rollout_settings

    strategy = cls(rd.current_platform())
    strategy.initialize(model_path, rollout_settings("hf", **changes))
    return strategy


def _resident(platform, baseline_free: int) -> int:
    """Device bytes held beyond what was free at `baseline_free`, as `mem_get_info` reports them."""
    return baseline_free - platform.mem_get_info()[0]


def hf_device_limits(model_path: str) -> dict:
    """The HF strategy against the device's limits on the simulated NPU: decode graphs equal to
    eager, a host read in the captured step, more capture sizes than streams, an offload that leaves
    the weights behind, a model larger than the device."""
    import time

    from strategies.inference.hf import HfStrategy
    from tests.isolated import error_of, simulated_npu
    from tests.strategies.inference.test_hf_graphs_on_device import (
        test_greedy_with_graphs_equals_eager_at_every_batch_size as greedy_graphs_equal_eager,
    )

    platform = simulated_npu()
    out = {"platform": platform.name}
    greedy_graphs_equal_eager(model_path)  # batches 1, 2, 4, 8, 13, 16: asserts inside
    out["greedy_graphs_equal_eager"] = True

    class ItemInStep(HfStrategy):
        """A decode step that checks a length on the host: fine eagerly, fatal in a capture."""

        def _decode_step(self, size, inputs):
            if int(inputs["positions"].max().item()) >= self.store.max_len:
                raise ValueError("sequence too long")
            return super()._decode_step(size, inputs)

    out["item_in_step"] = error_of(lambda: _start(ItemInStep, model_path, max_batch_size=4))

    os.environ["ROLL_SIM_NPU_STREAMS"] = "36"  # the default stream, a pool of 32, three graphs
    out["five_sizes_three_streams"] = error_of(lambda: _start(HfStrategy, model_path, max_batch_size=16))
    fitting = _start(HfStrategy, model_path, max_batch_size=16, capture_sizes=[2, 8, 16])
    out["three_sizes_captured"] = fitting.runner.capture_order
    fitting.shutdown()
    del os.environ["ROLL_SIM_NPU_STREAMS"]

    class WeightsStay(HfStrategy):
        """An offload that drops graphs and the KV cache but forgets to move the weights."""

        def offload(self):
            self.runner.release()
            self.bucket_caches.clear()
            self.store = None
            self.platform.empty_cache()

    for name, cls in (("offload", HfStrategy), ("buggy_offload", WeightsStay)):
        gc.collect()  # strategies the checks above left in reference cycles (failed starts) go first
        platform.empty_cache()  # and their memory back to the device, out of the allocator's cache
        baseline = platform.mem_get_info()[0]
        strategy = _start(cls, model_path, max_batch_size=8)
        out[f"{name}_weight_bytes"] = sum(p.numel() * p.element_size() for p in strategy.model.parameters())
        out[f"{name}_resident_started"] = _resident(platform, baseline)
        strategy.offload()
        out[f"{name}_resident_after"] = _resident(platform, baseline)
        strategy.shutdown()

    os.environ["ROLL_SIM_NPU_MEMORY_BYTES"] = str(out["offload_weight_bytes"] // 2)
    start = time.monotonic()
    out["too_large"] = error_of(lambda: _start(HfStrategy, model_path, max_batch_size=8))
    out["too_large_seconds"] = time.monotonic() - start
    return out
