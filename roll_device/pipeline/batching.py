"""Turn prompts and sampled completions into a right-padded `TrainBatch`."""

from __future__ import annotations

import torch

from strategies.base import Completion, TrainBatch
from strategies.routes import NO_ROUTE


def build_batch(
    prompts: list[list[int]],
    completions: list[Completion],
    pad_id: int,
    advantages: torch.Tensor | None = None,
) -> tuple[TrainBatch, torch.Tensor]:
    """Rows are prompt + response; `response_mask` marks the response tokens (a completion's own
    `mask` where it has one: a trajectory's model tokens). Also returns the sampler's per-token
    logprobs aligned the same way (for the rollout/trainer mismatch metric)."""
    rows = [prompts[c.prompt_index] + c.token_ids for c in completions]
    width = max(len(r) for r in rows)
    size = (len(rows), width)
    input_ids = torch.full(size, pad_id, dtype=torch.long)
    attention = torch.zeros(size, dtype=torch.long)
    response = torch.zeros(size, dtype=torch.float32)
    sampler_logprobs = torch.zeros(size, dtype=torch.float32)
    for i, (row, c) in enumerate(zip(rows, completions)):
        start = len(prompts[c.prompt_index])
        input_ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        response[i, start : len(row)] = 1.0 if c.mask is None else torch.tensor(c.mask, dtype=torch.float32)
        sampler_logprobs[i, start : len(row)] = torch.tensor(c.logprobs, dtype=torch.float32)
    batch = TrainBatch(
        input_ids, attention, response, advantages=None if advantages is None else advantages.float()
    )
    batch.routed_experts = routes_of(completions, size)
    batch.token_rewards = turn_rewards_of(prompts, completions, size)
    return batch, sampler_logprobs


def turn_rewards_of(
    prompts: list[list[int]], completions: list[Completion], size: tuple[int, int]
) -> torch.Tensor | None:
    """The completions' turn rewards on their rows' tokens (B, T); None when no completion has
    any (single-turn rows: the score goes on the last response token)."""
    if all(c.turn_rewards is None for c in completions):
        return None
    placed = torch.zeros(size, dtype=torch.float32)
    for row, c in enumerate(completions):
        start = len(prompts[c.prompt_index])
        for position, reward in c.turn_rewards or ():
            placed[row, start + position] += reward
    return placed


def routes_of(completions: list[Completion], size: tuple[int, int]) -> torch.Tensor | None:
    """The completions' recorded routes as (rows, T, layers, k), aligned with their rows' tokens,
    -1 where none was recorded (a row's last token, padding); None when no completion has any."""
    recorded = [c.routed_experts for c in completions]
    shape = next((r.shape[1:] for r in recorded if r is not None), None)
    if shape is None:
        return None
    routes = torch.full((*size, *shape), NO_ROUTE, dtype=torch.int16)
    for row, route in enumerate(recorded):
        if route is not None:
            tokens = min(len(route), size[1])
            routes[row, :tokens] = route[:tokens].to(torch.int16)
    return routes
