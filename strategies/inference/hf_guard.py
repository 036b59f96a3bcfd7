"""The HF strategy's graph guard (`roll_device.graph.GraphGuard`): its probe, its re-capture and its
eager switch.

The probe prefills the fixed probe prompt into row 0 of the KV store (through the packed prefill's
graphs where they are on, else eagerly) and then runs one decode step at every captured batch size,
the probe's row first and padding rows after it, through that bucket's graph; the eager reference
runs the same prefill and steps eagerly. Compared: the log-probabilities of the probe's fixed
tokens after the prefill and after each step. Every captured graph is replayed once, so a stale
graph of any bucket shows. What the probe writes into the KV store is overwritten by the next
generation's prefill.

Re-capture releases every graph and captures them again from the weights as they are now (a
module that derives a copy of its weights when captured derives it again); the eager switch
releases them and keeps the strategy eager for the rest of the run, an offload and reload included.
"""

from __future__ import annotations

from typing import Any

import torch

from roll_device.graph.guard import GraphGuard, probe_prompt, probe_tokens

# The strategy is an `HfStrategy` (strategies/inference/hf.py), which imports this module.
HfStrategy = Any


def hf_guard(strategy: HfStrategy, model_name: str) -> GraphGuard:
    """The guard of `strategy` (started), naming its model `model_name`."""
    return GraphGuard(
        model_name,
        strategy.model.dtype,
        probe=lambda eager: probe(strategy, eager),
        graphs_on=lambda: graphs_on(strategy),
        go_eager=strategy.stop_graphs,
        recapture=strategy.recapture_graphs,
    )


def graphs_on(strategy: HfStrategy) -> bool | str:
    """True where the strategy replays graphs now, else why it does not."""
    if strategy.store is None:
        return "the engine is offloaded: its graphs are captured again, with these weights, at reload"
    if strategy.runner.use_graphs or strategy.packed_prefill is not None:
        return True
    if not strategy.platform.supports_graphs:
        return f"platform '{strategy.platform.name}' has no device graphs"
    return "rollout.use_graphs=false"


def probe(strategy: HfStrategy, eager: bool) -> torch.Tensor:
    """The probe's log-probabilities (see the module docstring), on the CPU: through the graphs,
    or with `eager` without them. Called with gradients off and the strategy's attention kernels."""
    from strategies.inference.hf_cache import set_length

    prompt = probe_prompt(strategy.vocab_size)[: strategy.settings.max_model_len - 1]
    tokens = probe_tokens(strategy.vocab_size)
    first, mask, width = strategy._prefill([prompt], eager=eager)
    found = [first[0, tokens].to("cpu")]
    mask[..., width] = True  # the probe's step attends to its own new token too
    for size in strategy.runner.sizes:
        set_length(strategy.bucket_caches[size], width)
        step = _step_inputs(size, mask[0], tokens[1], width, strategy.pad_id)
        found.append(strategy.runner.run(step, eager=eager)[0, tokens].to("cpu"))
    return torch.cat(found)


def _step_inputs(size: int, row_mask: torch.Tensor, token: int, position: int, pad_id: int) -> dict:
    """A decode step of `size` rows: row 0 the probe's, the others padding (attending to slot 0)."""
    device = row_mask.device
    tokens = torch.full((size, 1), pad_id, dtype=torch.long, device=device)
    tokens[0, 0] = token
    positions = torch.zeros(size, 1, dtype=torch.long, device=device)
    positions[0, 0] = position
    mask = torch.zeros(size, *row_mask.shape, dtype=torch.bool, device=device)
    mask[..., 0] = True
    mask[0] = row_mask
    return {"tokens": tokens, "positions": positions, "mask": mask}
