"""DAPO's dynamic sampling (arXiv 2503.14476): the rows of groups whose rewards are all equal are
left out of the update (their advantage is zero under every group estimator, so they only dilute
the batch), and generation goes on with the next prompts, round after round, until the step holds
`data.prompts_per_step` informative groups or `algorithm.max_sampling_rounds` rounds ran (verl's
`max_num_gen_batches`); the step's record says how many groups were dropped (`dropped_groups`) and
how many rounds it took (`sampling_rounds`).

The rows kept are at most `prompts_per_step` groups and stay a multiple of the trainer's
data-parallel size (every rank trains as many rows): informative groups beyond that are dropped
too. A step whose rounds found no informative group trains on all its rows (zero advantages); one
whose rounds ran out trains on the informative groups it has.
"""

from __future__ import annotations

import torch

from roll_device.pipeline.algorithm_settings import AlgorithmSettings
from strategies.training.advantages import informative_groups


class SamplingFilter:
    """Which rows of a step's rollout the update uses (`algorithm.dynamic_sampling`), and whether
    the step samples another round (`algorithm.max_sampling_rounds`)."""

    def __init__(self, algo: AlgorithmSettings, prompts_per_step: int) -> None:
        self.on = algo.dynamic_sampling
        self.group_size = algo.samples_per_prompt
        self.target = prompts_per_step  # informative groups a full step holds
        self.max_rounds = algo.max_sampling_rounds
        self.refills = self.on and self.max_rounds > 1
        self.dropped = 0
        self.rounds = 1

    def wants_more(self, rewards: torch.Tensor, rounds: int) -> bool:
        """Whether a step with `rewards` after `rounds` rounds samples another."""
        if not self.refills or rounds >= self.max_rounds:
            return False
        return int(informative_groups(rewards, self.group_size).sum()) < self.target

    def keep(self, rewards: torch.Tensor, data_parallel_size: int) -> torch.Tensor:
        """The indices of the rows to train on, in order, for a trainer of `data_parallel_size`."""
        rows = torch.arange(rewards.numel())
        if not self.on:
            return rows
        groups = torch.nonzero(informative_groups(rewards, self.group_size)).squeeze(1)[: self.target]
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
        """`record` with the groups dropped and the rounds sampled this step (dynamic sampling on)."""
        if self.on:
            record["dropped_groups"] = self.dropped
            record["sampling_rounds"] = self.rounds
        return record
