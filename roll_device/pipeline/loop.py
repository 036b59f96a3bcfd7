"""One GRPO step, from prompts to synced weights, and the metrics it reports.

prompts (from the run's prompt source) -> rollout (`actor_infer`, n samples each) -> rewards
(`reward`) -> group-normalized advantages -> old logprobs (`actor_train`) and reference logprobs (`reference`, when KL is on) ->
clipped policy update (`actor_train`) -> weight sync to the rollout workers.

`run(state)` goes up to the policy update and advances `state`; `sync(record)` then sends the new
weights, so a step whose sync is cut short (a lost rollout worker) is still a finished step.
`training` is true while the trainer's weights may be ahead of `state` (an update in flight); a
first update the trainer refused (`NonFiniteUpdateError`: a loss or gradient norm not finite) left
them at `state`.
"""

from __future__ import annotations

import time

import torch

from roll_device.cluster import shard
from roll_device.inputs import Sample
from roll_device.inputs.loading import RunInputs
from roll_device.pipeline.batching import build_batch
from roll_device.pipeline.config import RunConfig
from roll_device.pipeline.lifecycle import ColocatedTurns
from roll_device.pipeline.reward_worker import RewardWorker
from roll_device.pipeline.roles import RoleGroups
from roll_device.pipeline.state import PipelineState
from roll_device.pipeline.workers import RolloutWorker, TrainWorker
from strategies.base import Completion, NonFiniteUpdateError, SamplingConfig
from strategies.training.losses import group_normalized_advantages


class GrpoStep:
    def __init__(self, config: RunConfig, roles: RoleGroups, inputs: RunInputs) -> None:
        self.config, self.roles = config, roles
        self.source, self.encoder = inputs.source, inputs.encoder
        self.tokens = inputs.encoder.tokens
        self.algo = config.algorithm
        self.use_reference = roles.has("reference")
        self.training = False
        self.turns = ColocatedTurns(roles)  # a colocated engine and trainer take turns on the devices

    def sampling(self, step: int) -> SamplingConfig:
        return SamplingConfig(
            n=self.algo.samples_per_prompt,
            max_tokens=self.algo.max_new_tokens,
            temperature=self.algo.temperature,
            seed=self.config.seed * 1_000_003 + step,
            stop_token_ids=list(self.tokens.stop),
        )

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> list[Completion]:
        """Responses from the `actor_infer` workers, each prompt's index into `prompt_ids`."""
        shards = shard(prompt_ids, self.roles.groups["actor_infer"].world_size)
        completions, offset = [], 0
        for part, result in zip(
            shards, self.roles.scatter("actor_infer", RolloutWorker.generate, shards, sampling)
        ):
            for c in result:
                c.prompt_index += offset
            completions.extend(result)
            offset += len(part)
        return completions

    def score(self, samples: list[Sample], completions: list[Completion]) -> list[float]:
        """One reward per completion from the `reward` workers (sent as text, decoded here)."""
        responses = self.encoder.decode([c.token_ids for c in completions])
        items = [
            (samples[c.prompt_index].prompt, text, samples[c.prompt_index].answer)
            for c, text in zip(completions, responses)
        ]
        scored = self.roles.scatter(
            "reward", RewardWorker.score, shard(items, self.roles.groups["reward"].world_size)
        )
        return [r for part in scored for r in part]

    def logprobs(self, role: str, batch) -> torch.Tensor:
        return torch.cat(self.roles.logprobs(role, batch))

    def run(self, state: PipelineState) -> dict:
        """One step at `state` up to the policy update (`state` advanced in place); returns the
        step's metrics record, its sync still to come."""
        timings, start = {}, time.perf_counter()

        def lap(name: str, since: float) -> float:
            now = time.perf_counter()
            timings[name] = now - since
            return now

        samples = self.source.batch(state.data_position, self.config.data.prompts_per_step)
        prompt_ids = [self.encoder.encode(s.prompt) for s in samples]
        freed = self.turns.for_rollout()
        completions = self.generate(prompt_ids, self.sampling(state.step))
        freed.update(self.turns.for_training())
        t = lap("rollout_s", start)
        rewards = torch.tensor(self.score(samples, completions))
        t = lap("reward_s", t)
        advantages = group_normalized_advantages(rewards, self.algo.samples_per_prompt)
        batch, sampler_logprobs = build_batch(prompt_ids, completions, self.tokens.pad, advantages)
        batch.old_logprobs = self.logprobs("actor_train", batch)
        if self.use_reference:
            batch.ref_logprobs = self.logprobs("reference", batch)
        t = lap("logprob_s", t)
        self.training = True
        for epoch in range(self.algo.ppo_epochs):
            try:
                metrics = self.roles.data_parallel(
                    "actor_train", TrainWorker.train, batch, self.algo.clip_ratio, self.algo.kl_coef
                )[0]
            except NonFiniteUpdateError:  # refused, not applied: after no earlier epoch, the
                self.training = epoch > 0  # trainer holds exactly `state`'s step
                raise
        state.step += 1
        state.data_position += len(samples)
        state.data_epoch = self.source.epoch(state.data_position)
        self.training = False
        lap("train_s", t)
        mask = batch.response_mask
        mismatch = ((sampler_logprobs - batch.old_logprobs).abs() * mask).sum() / mask.sum().clamp(min=1)
        return {
            "step": state.step,
            "epoch": state.data_epoch,
            "reward_mean": rewards.mean().item(),
            "reward_std": rewards.std(unbiased=False).item(),
            "response_len": mask.sum(dim=1).mean().item(),
            "loss": metrics.get("loss", 0.0),
            "kl": metrics.get("kl", 0.0),
            "grad_norm": metrics["grad_norm"],
            "lr": metrics["lr"],
            "rollout_vs_train_logprob_gap": mismatch.item(),
            "weights_version": None,
            "sync_path": None,
            **timings,
            **freed,
            "sync_s": 0.0,
            "step_s": time.perf_counter() - start,
        }

    def sync(self, record: dict) -> None:
        """Send step `record["step"]`'s weights to the rollout; adds the sync to `record`."""
        start = time.perf_counter()
        self.turns.for_sync()
        sync = self.roles.sync_weights(version=record["step"])
        record.update(weights_version=sync["version"], sync_path=sync["path"])
        record["sync_s"] = time.perf_counter() - start
        record["step_s"] += record["sync_s"]
