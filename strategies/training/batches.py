"""Checks and splits of a `TrainBatch`, and the token alignment both trainers share.

Alignment: a per-token tensor holds at position t the value for token t given tokens < t; position
0 (no context) and padding positions (attention_mask 0) hold 0. Sequences are right-padded.
"""

from __future__ import annotations

import torch

from roll_device.errors import RollDeviceError
from strategies.base import TrainBatch

PER_TOKEN_FIELDS = (
    "attention_mask",
    "response_mask",
    "old_logprobs",
    "ref_logprobs",
    "rollout_logprobs",
    "values",
    "returns",
)


class TrainBatchError(RollDeviceError, ValueError):
    """A train batch whose shapes, dtypes or padding the trainers cannot use."""


def validate(batch: TrainBatch) -> None:
    """Raise `TrainBatchError` naming the field when `batch` breaks the TrainBatch contract."""
    ids = batch.input_ids
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
        raise TrainBatchError(
            f"TrainBatch.input_ids must be a (B, T) torch.long tensor, got "
            f"{_describe(ids)}: build it with torch.tensor(rows, dtype=torch.long)"
        )
    if ids.shape[0] == 0 or ids.shape[1] < 2:
        raise TrainBatchError(f"TrainBatch.input_ids {tuple(ids.shape)} needs at least 1 row and 2 tokens")
    for name in PER_TOKEN_FIELDS:
        value = getattr(batch, name)
        if value is not None and (not isinstance(value, torch.Tensor) or value.shape != ids.shape):
            raise TrainBatchError(
                f"TrainBatch.{name} must have the shape of input_ids {tuple(ids.shape)}, got {_describe(value)}"
            )
    if batch.advantages is not None and tuple(batch.advantages.shape) not in (
        (ids.shape[0],),
        tuple(ids.shape),
    ):
        raise TrainBatchError(
            f"TrainBatch.advantages must have shape ({ids.shape[0]},) (one per row) or {tuple(ids.shape)} (per token), "
            f"got {_describe(batch.advantages)}"
        )
    routes = batch.routed_experts
    if routes is not None and (routes.dim() != 4 or routes.shape[:2] != ids.shape):
        raise TrainBatchError(
            f"TrainBatch.routed_experts must be (B, T, layers, top-k) with (B, T) = {tuple(ids.shape)}, "
            f"got {_describe(routes)}"
        )
    for name, tensor in _tensors(batch):
        if not tensor.is_cpu:
            raise TrainBatchError(f"TrainBatch.{name} is on {tensor.device}: pass batches on the CPU")
    mask = batch.attention_mask.to(torch.long)
    if bool((mask[:, 1:] > mask[:, :-1]).any()):
        raise TrainBatchError(
            "TrainBatch.attention_mask has a padding position before a real token: the trainers "
            "need right-padded rows (prompt + response first, padding last)"
        )


def _tensors(batch: TrainBatch):
    for name, value in vars(batch).items():
        if isinstance(value, torch.Tensor):
            yield name, value


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def micro_batches(batch: TrainBatch, size: int) -> list[TrainBatch]:
    """Consecutive row slices of at most `size` rows."""
    return [batch.select(slice(start, start + size)) for start in range(0, len(batch), size)]


def token_bounds(costs: list[int], budget: int) -> list[int]:
    """Start indices of consecutive groups of `costs` (one per row), each group's sum at most
    `budget` (a row costing more than the budget is a group of its own)."""
    starts, used = [0], 0
    for index, cost in enumerate(costs):
        if used and used + cost > budget:
            starts.append(index)
            used = 0
        used += cost
    return starts


def split_to(bounds: list[int], rows: int, count: int) -> list[int]:
    """`bounds` (group starts over `rows` rows) with the largest groups halved until there are
    `count` groups (`count` <= rows): data-parallel ranks must run the same number of passes."""
    bounds = list(bounds)
    while len(bounds) < count:
        ends = bounds[1:] + [rows]
        start, end = max(zip(bounds, ends), key=lambda pair: pair[1] - pair[0])
        bounds.insert(bounds.index(start) + 1, start + (end - start) // 2)
    return bounds


def budget_micro_batches(batch: TrainBatch, budget: int, packing: bool, count: int = 0) -> list[TrainBatch]:
    """Consecutive row slices whose tokens fit `budget`: real tokens when `packing` (the rows
    become one packed row), padded ones otherwise; at least `count` slices."""
    width = batch.input_ids.shape[1]
    costs = batch.attention_mask.sum(dim=1).tolist() if packing else [width] * len(batch)
    bounds = split_to(token_bounds(costs, budget), len(batch), count)
    ends = bounds[1:] + [len(batch)]
    return [batch.select(slice(start, end)) for start, end in zip(bounds, ends)]


def shifted_labels(input_ids: torch.Tensor) -> torch.Tensor:
    """Targets for next-token logits: the label at position t is token t + 1 (the last is unused)."""
    labels = torch.zeros_like(input_ids)
    labels[:, :-1] = input_ids[:, 1:]
    return labels


def align_to_tokens(next_token_logprobs: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) logprobs of token t + 1 at position t -> (B, T) logprob of token t at position t,
    zero at position 0 and on padding."""
    aligned = torch.zeros_like(next_token_logprobs)
    aligned[:, 1:] = next_token_logprobs[:, :-1]
    return aligned * attention_mask.to(aligned.device, aligned.dtype)
