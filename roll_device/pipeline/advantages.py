"""Group-normalized advantages (GRPO): each sample's reward against the other samples of its
prompt, scaled by the group's standard deviation."""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """`rewards` is prompt-major (prompt 0's samples first); returns advantages of the same shape.
    A group whose samples all scored the same gets zero advantage."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    groups = rewards.float().view(-1, group_size)
    centered = groups - groups.mean(dim=1, keepdim=True)
    scale = groups.std(dim=1, keepdim=True, unbiased=False) + eps
    return (centered / scale).view(-1)
