"""The HF strategy's decode and prefill graphs after a weight update and after offload/reload, on
the SIMULATED NPU (ROLL_DEVICE=npu-sim), in a process of its own (the simulation renames
PrivateUse1 once per process). Results are simulations: CPU compute behind `npu` tensors and
simulated graph capture and replay."""

from __future__ import annotations

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]


def graphs_after_update(model_path: str, new_model_path: str) -> dict:
    """Greedy tokens and their logprobs from the graph engine and from an eager engine, both given
    the weights of `new_model_path`: after the update, and after an offload and a reload."""
    from safetensors.torch import load_file

    from strategies.base import SamplingConfig
    from strategies.inference.hf import HfStrategy
    from tests.isolated import simulated_npu
    from tests.strategies.inference.sim_checks import _start

    platform = simulated_npu()
    greedy = SamplingConfig(max_tokens=8, temperature=0.0)
    new = load_file(f"{new_model_path}/model.safetensors")
    graphs = _start(HfStrategy, model_path, max_batch_size=4, max_model_len=32, prefill_graphs=True)
    eager = _start(HfStrategy, model_path, max_batch_size=4, max_model_len=32, use_graphs=False)

    def run(strategy) -> list:
        return [(c.token_ids, c.logprobs) for c in strategy.generate(PROMPTS, greedy)]

    try:
        out = {
            "platform": platform.name,
            "graphs": [graphs.runner.use_graphs, graphs.packed_prefill is not None],
            "eager": [eager.runner.use_graphs, eager.packed_prefill is not None],
            "before": run(graphs),
        }
        graphs.update_weights(new.items())
        eager.update_weights(new.items())
        out["updated"], out["updated_eager"] = run(graphs), run(eager)
        graphs.offload()
        graphs.reload()
        out["reloaded"] = run(graphs)
        return out
    finally:
        graphs.shutdown()
        eager.shutdown()
