"""The HF strategy's prefill graphs on the SIMULATED NPU (ROLL_DEVICE=npu-sim), in a process of its
own (the simulation renames PrivateUse1 once per process). Results are simulations."""

from __future__ import annotations


def hf_prefill_graphs(model_path: str) -> dict:
    """Greedy output with prefill graphs equal to eager; graphs counted against the budget; a
    reload captures again."""
    import time

    from roll_device.platforms.npu import NpuPlatform
    from strategies.base import SamplingConfig
    from strategies.inference.hf import HfStrategy
    from tests.isolated import error_of, simulated_npu
    from tests.strategies.inference.sim_checks import _start
    from tests.strategies.inference.test_hf_graphs_on_device import (
        test_greedy_with_prefill_graphs_equals_eager_prefill as greedy_prefill_graphs_equal_eager,
    )

    platform = simulated_npu()
    out = {"platform": platform.name}
    start = time.monotonic()
    greedy_prefill_graphs_equal_eager(model_path)  # asserts inside
    out["greedy_seconds"] = time.monotonic() - start
    out["greedy_prefill_graphs_equal_eager"] = True

    strategy = _start(HfStrategy, model_path, max_batch_size=4, max_model_len=16, prefill_graphs=True)
    out["default_sizes"] = strategy.prefill_capture_sizes
    out["graphs"] = strategy.runner.capture_order, strategy.packed_prefill.runner.graph_count
    greedy = SamplingConfig(max_tokens=6, temperature=0.0)
    before = [c.token_ids for c in strategy.generate([[5, 6, 7], [8]], greedy)]
    strategy.offload()
    out["offloaded_prefill"] = strategy.packed_prefill is None
    strategy.reload()
    out["recaptured"] = strategy.packed_prefill.runner.capture_order
    out["same_after_reload"] = before == [c.token_ids for c in strategy.generate([[5, 6, 7], [8]], greedy)]
    strategy.shutdown()

    NpuPlatform.graph_budget = 10  # decode [1, 2, 4] takes 3; each prefill size 3 (2 layers + 1)
    fitted = _start(HfStrategy, model_path, max_batch_size=4, max_model_len=16, prefill_graphs=True)
    out["thinned_sizes"] = fitted.prefill_capture_sizes
    fitted.shutdown()
    out["over_budget"] = error_of(
        lambda: _start(
            HfStrategy,
            model_path,
            max_batch_size=4,
            max_model_len=16,
            prefill_graphs=True,
            prefill_capture_sizes=[16, 32, 64],
        )
    )
    return out
