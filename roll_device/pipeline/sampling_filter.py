"""DAPO's dynamic sampling (arXiv 2503.14476): the rows of groups whose rewards are all equal are
left out of the update (their advantage is zero under every group estimator, so they only dilute
the batch), and the step's record says how many groups were dropped (`dropped_groups`).

The rows kept stay a multiple of the trainer's data-parallel size (every rank trains as many
rows): informative groups beyond that multiple are dropped too. A step with no informative group
trains on all its rows (zero advantages). The step does not yet generate extra rounds to refill
the batch: it trains on fewer rows.
"""

from __future__ import annotations

import torch

from roll_device.pipeline.config import AlgorithmSettings
from strategies.training.advantages import informative_groups


class SamplingFilter:
    """Which rows of a step's rollout the update uses (`algorithm.dynamic_sampling`)."""

    def __init__(self, algo: AlgorithmSettings) -> None:
        self.on = algo.dynamic_sampling
        self.group_size = algo.samples_per_prompt
        self.dropped = 0

    def keep(self, rewards: torch.Tensor, data_parallel_size: int) -> torch.Tensor:
        """The indices of the rows to train on, in order, for a trainer of `data_parallel_size`."""
        rows = torch.arange(rewards.numel())
        if not self.on:
            return rows
        groups = torch.nonzero(informative_groups(rewards, self.group_size)).squeeze(1)
        usable = len(groups) - len(groups) % self.groups_per_split(data_parallel_size)
        self.dropped = rewards.numel() // self.group_size - usable
        if usable == 0:
            return rows
        return (groups[:usable, None] * self.group_size + torch.arange(self.group_size)).reshape(-1)

    def groups_per_split(self, data_parallel_size: int) -> int:
        """The fewest groups whose rows split evenly over `data_parallel_size` ranks."""
        groups = 1
        while (groups * self.group_size) % data_parallel_size:
            groups += 1
        return groups

    def report(self, record: dict) -> dict:
        """`record` with the groups dropped this step (only when dynamic sampling is on)."""
        if self.on:
            record["dropped_groups"] = self.dropped
        return record
