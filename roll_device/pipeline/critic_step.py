"""PPO's critic in the step (roll_device/pipeline/loop.py), when the run has a `critic` role:

- before the advantages, the critic's values of the batch's response tokens (`add_values`);
- with the advantages, the critic's targets: the returns A + V of `gae` (`add_returns`);
- after the policy update, `ppo_epochs` steps of the clipped value loss towards them (`train`);
- in the step's record: the value loss, the share of clipped values, the critic's gradient norm
  and learning rate, how much of the returns' variance the values explained before the update, and
  the seconds its values and updates took (`critic_s`, part of `logprob_s` and `train_s`)
  (`critic_*`, `report`).

Without a critic role every call does nothing and the record gains no keys.
"""

from __future__ import annotations

import time

import torch

from roll_device.pipeline.algorithm_settings import AlgorithmSettings
from roll_device.pipeline.metrics import CRITIC_EXPLAINED, CRITIC_LOSS
from roll_device.pipeline.record import StepRecord
from roll_device.pipeline.roles import RoleGroups
from roll_device.pipeline.workers import CriticWorker
from strategies.base import TrainBatch
from strategies.training.advantages import AdvantageInputs, AdvantageSpec, gae_returns
from strategies.training.critic import explained_variance

ROLE = "critic"


class CriticStep:
    def __init__(self, roles: RoleGroups, algo: AlgorithmSettings) -> None:
        self.roles, self.algo = roles, algo
        self.active = roles.has(ROLE)
        self.metrics: dict[str, float] = {}
        self.seconds = 0.0  # the step's critic calls so far

    def add_values(self, batch: TrainBatch) -> None:
        if self.active:
            start = time.perf_counter()
            batch.values = torch.cat(self.roles.data_parallel(ROLE, CriticWorker.values, batch))
            self.seconds = time.perf_counter() - start

    def add_returns(self, batch: TrainBatch, inputs: AdvantageInputs, spec: AdvantageSpec) -> None:
        """The returns of the estimator's `spec` (the step's KL coefficient with it)."""
        if self.active:
            batch.returns = gae_returns(inputs, spec)

    def train(self, batch: TrainBatch) -> None:
        """`ppo_epochs` updates of the critic on `batch`; the last one's metrics for the record."""
        if not self.active:
            return
        start = time.perf_counter()
        for _ in range(self.algo.ppo_epochs):
            update = self.roles.data_parallel(ROLE, CriticWorker.train_values, batch, self.algo.value_clip)[0]
        self.metrics = {
            "critic_s": self.seconds + time.perf_counter() - start,
            CRITIC_LOSS: update["loss"],
            "critic_vf_clipfrac": update["value_clipfrac"],
            CRITIC_EXPLAINED: explained_variance(batch.values, batch.returns, batch.response_mask),
            "critic_grad_norm": update["grad_norm"],
            "critic_lr": update["lr"],
        }

    def report(self, record: StepRecord) -> StepRecord:
        record.update(self.metrics)
        return record
