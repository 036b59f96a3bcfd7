"""PPO's critic in the step (roll_device/pipeline/loop.py), when the run has a `critic` role:

- before the advantages, the critic's values of the batch's response tokens (`add_values`);
- with the advantages, the critic's targets: the returns A + V of `gae` (`add_returns`);
- after the policy update, as many steps of the clipped value loss towards them as the policy took
  (`ppo_epochs` passes of `mini_batches`, roll_device/pipeline/updates.py) (`train`);
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
from roll_device.pipeline.updates import Updates
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
        """The critic's updates on `batch`, as many as the policy's (`ppo_epochs` passes of
        `mini_batches` optimizer steps: updates.py); their mean metrics for the record."""
        if not self.active:
            return
        start = time.perf_counter()
        updates = Updates(self.algo.ppo_epochs, self.algo.mini_batches, self.roles.data_parallel_size(ROLE))
        clip = self.algo.value_clip
        update = updates.run(
            lambda part: self.roles.data_parallel(ROLE, CriticWorker.train_values, part, clip)[0], batch
        )
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
