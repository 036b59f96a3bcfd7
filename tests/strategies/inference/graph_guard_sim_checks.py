"""The HF strategy's graph guard on the SIMULATED NPU (ROLL_DEVICE=npu-sim), in a process of its own
(the simulation renames PrivateUse1 once per process). Results are simulations: CPU compute behind
`npu` tensors, simulated graph capture and replay.

The stale weight-derived caches are linear layers (the MLP's down projections) whose class is
swapped for one of the two below, keeping their parameters and names: a captured graph reads a
copy of the weight made outside the graph, as a layout cast or a pre-cast copy made when weights
are processed, while an eager forward reads the weight itself.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]


class DerivedOnEagerForward(torch.nn.Linear):
    """Derives its copy (a new tensor) on every eager forward, the capture's warm-up included, so
    a graph captured again after an update reads a fresh one: re-capture cures it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if capturing():
            return F.linear(x, self.derived, self.bias)
        self.derived = self.weight.detach().clone()
        return F.linear(x, self.weight, self.bias)


class DerivedOnce(torch.nn.Linear):
    """Derives its copy once, at its first forward, and never again (processed at load, not at a
    reload): graphs captured again still read the old copy, so only eager is right."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if getattr(self, "derived", None) is None:
            self.derived = self.weight.detach().clone()
        return F.linear(x, self.derived if capturing() else self.weight, self.bias)


def capturing() -> bool:
    import roll_device as rd

    return rd.current_platform().device_module().is_current_stream_capturing()


class Said(logging.Handler):
    """The graph guard's lines, as said."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []
        logging.getLogger("roll_device.graph.guard").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines


def _strategy_class(stale: type | None):
    """HfStrategy, or a subclass whose down projections are `stale` before its graphs are captured."""
    from strategies.inference.hf import HfStrategy

    if stale is None:
        return HfStrategy

    class WithStaleCache(HfStrategy):
        def _start_decoding(self) -> None:
            for layer in self.model.model.layers:
                layer.mlp.down_proj.__class__ = stale  # parameters and their names kept
            super()._start_decoding()

    return WithStaleCache


ENGINES = {"eager": None, "clean": None, "recapture": DerivedOnEagerForward, "once": DerivedOnce}


def graph_guard(model_path: str, new_model_path: str) -> dict:
    """Engines given the weights of `new_model_path` after starting from `model_path`: an eager one
    (the reference), one with nothing stale, one with a cache re-capture cures, one only eager
    cures. For each: its greedy tokens before the update, after it with the graphs as they were
    (`unguarded`: what a run without the guard would sample), and after the guard, with the guard's
    report and the lines it said."""
    from safetensors.torch import load_file

    from strategies.base import SamplingConfig
    from tests.isolated import simulated_npu
    from tests.strategies.inference.sim_checks import _start

    platform = simulated_npu()
    said = Said()
    greedy = SamplingConfig(max_tokens=6, temperature=0.0)
    new = load_file(f"{new_model_path}/model.safetensors")
    out: dict = {"platform": platform.name}

    def tokens(strategy) -> list[list[int]]:
        return [c.token_ids for c in strategy.generate(PROMPTS, greedy)]

    for name, stale in ENGINES.items():
        strategy = _start(
            _strategy_class(stale),
            model_path,
            max_batch_size=2,
            max_model_len=16,
            capture_sizes=[2],
            use_graphs=name != "eager",
        )
        try:
            out[name] = {"before": tokens(strategy)}
            strategy.update_weights(new.items())
            out[name]["unguarded"] = tokens(strategy)
            said.take()
            out[name]["report"] = strategy.guard_graphs(1)
            out[name].update(said=said.take(), tokens=tokens(strategy), graphs=strategy.runner.use_graphs)
            if name == "once":
                strategy.offload()
                strategy.reload()
                out[name]["graphs_after_reload"] = strategy.runner.use_graphs
                out[name]["after_reload"] = strategy.guard_graphs(2)
        finally:
            strategy.shutdown()
    return out
