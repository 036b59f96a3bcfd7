"""One GRPO step, from prompts to synced weights, and the metrics it reports.

prompts (from the run's prompt source) -> rollout (`actor_infer`, n samples each) -> rewards
(`reward`) -> group-normalized advantages -> old logprobs (`actor_train`) and reference logprobs
(`reference`, when KL is on) -> clipped policy update (`actor_train`) -> weight sync to the rollout
workers.

The step is split into phases the run calls in order (roll_device/pipeline/experiment.py):
`launch` starts a rollout on the engines and returns at once (Ray ObjectRefs, watched by every
wait in the meantime), `collect` waits for it, `train(state, rollout, generated)` goes up to the
policy update and advances `state`, and `sync(record)` sends the new weights, so a step whose sync
is cut short (a lost rollout worker) is still a finished step. Which rollout is launched when is
`RolloutQueue`'s (roll_device/pipeline/overlap.py, `algorithm.max_staleness`): with k > 0 the next
rollout runs on the engines while this one is scored and trained. Each sample's weight version is
the engine's own report; samples of older weights than the trainer's carry their rollout logprobs
into the loss, whose truncated importance ratio corrects for the gap.
A rollout and a trainer colocated on the same devices take turns (`ColocatedTurns`,
roll_device/pipeline/lifecycle.py; colocation implies k = 0): the trainers offload at `launch`,
the engine sleeps when `train` begins and wakes for `sync`.
`training` is true while the trainer's weights may be ahead of `state` (an update in flight); a
first update the trainer refused (`NonFiniteUpdateError`: a loss or gradient norm not finite) left
them at `state`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from roll_device.cluster import shard
from roll_device.inputs import Sample
from roll_device.inputs.loading import RunInputs
from roll_device.pipeline.batching import build_batch
from roll_device.pipeline.config import RunConfig
from roll_device.pipeline.lifecycle import ColocatedTurns
from roll_device.pipeline.overlap import Rollout
from roll_device.pipeline.reward_worker import RewardWorker
from roll_device.pipeline.roles import RoleGroups
from roll_device.pipeline.state import PipelineState
from roll_device.pipeline.workers import Generated, RolloutWorker, TrainWorker
from strategies.base import Completion, NonFiniteUpdateError, SamplingConfig
from strategies.training.losses import group_normalized_advantages

# each timed part of `train` -> its span's name in the step's timeline ("train" spans all three)
PART_SPANS = {"reward_s": "reward", "logprob_s": "logprob", "train_s": "update"}


@dataclass
class Collected:
    """A rollout's results, joined over the `actor_infer` workers."""

    samples: list[Sample]
    prompt_ids: list[list[int]]
    completions: list[Completion]
    version: int  # the oldest weight version any worker generated with
    started: float  # wall clock, the first worker's start
    finished: float  # wall clock, the last worker's end
    engine_idle_s: float  # the longest any engine stood idle before it
    waited_s: float  # how long the driver (and so the trainer) waited for it


@dataclass
class Launched:
    """What `GrpoStep.launch` leaves in flight: the prompts, each worker's shard size and call."""

    samples: list[Sample]
    prompt_ids: list[list[int]]
    shard_sizes: list[int]
    refs: list


class GrpoStep:
    def __init__(self, config: RunConfig, roles: RoleGroups, inputs: RunInputs) -> None:
        self.config, self.roles = config, roles
        self.source, self.encoder = inputs.source, inputs.encoder
        self.tokens = inputs.encoder.tokens
        self.algo = config.algorithm
        self.use_reference = roles.has("reference")
        self.training = False
        self.turns = ColocatedTurns(roles)  # a colocated engine and trainer take turns on the devices
        self.freed: dict[str, int] = {}  # device bytes each side's turn freed, for the next record
        self.swaps: dict[str, list[float]] = {}  # wall-clock span of each turn, for the next record

    def sampling(self, step: int) -> SamplingConfig:
        return SamplingConfig(
            n=self.algo.samples_per_prompt,
            max_tokens=self.algo.max_new_tokens,
            temperature=self.algo.temperature,
            seed=self.config.seed * 1_000_003 + step,
            stop_token_ids=list(self.tokens.stop),
        )

    def launch(self, step: int, position: int, version: int) -> Rollout:
        """Start rollout `step` (the prompts at data `position`) on the `actor_infer` workers,
        expected to be generated with the weights of step `version`; returns without waiting."""
        samples = self.source.batch(position, self.config.data.prompts_per_step)
        prompt_ids = [self.encoder.encode(s.prompt) for s in samples]
        self.take_turn(self.turns.for_rollout)
        launched = self.start_generation(samples, prompt_ids, self.sampling(step))
        return Rollout(step, position, len(samples), version, launched)

    def start_generation(self, samples, prompt_ids: list[list[int]], sampling: SamplingConfig) -> Launched:
        shards = shard(prompt_ids, self.roles.groups["actor_infer"].world_size)
        refs = self.roles.groups["actor_infer"].async_scatter(RolloutWorker.generate, shards, sampling)
        self.roles.watch("actor_infer", refs)
        return Launched(samples, prompt_ids, [len(part) for part in shards], refs)

    def collect(self, launched: Launched) -> Collected:
        """Wait for a launched rollout; its completions carry each prompt's index into its prompts."""
        self.roles.unwatch(launched.refs)
        start = time.perf_counter()
        parts: list[Generated] = self.roles.wait({"actor_infer": launched.refs})["actor_infer"]
        waited = time.perf_counter() - start
        completions, offset = [], 0
        for size, part in zip(launched.shard_sizes, parts):
            for c in part.completions:
                c.prompt_index += offset
            completions.extend(part.completions)
            offset += size
        return Collected(
            launched.samples,
            launched.prompt_ids,
            completions,
            version=min(p.version for p in parts),
            started=min(p.started for p in parts),
            finished=max(p.finished for p in parts),
            engine_idle_s=max((p.idle_s or 0.0) for p in parts),
            waited_s=waited,
        )

    def drop(self, rollout: Rollout) -> None:
        """Let go of a launched rollout that will not be trained on (its result is ignored)."""
        self.roles.unwatch(rollout.pending.refs)

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> list[Completion]:
        """Responses from the `actor_infer` workers, each prompt's index into `prompt_ids`."""
        return self.collect(self.start_generation([], prompt_ids, sampling)).completions

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

    def train(self, state: PipelineState, rollout: Rollout, got: Collected) -> dict:
        """Step `state.step` on rollout `rollout` (collected as `got`) up to the policy update
        (`state` advanced in place); returns the step's metrics record, its sync still to come."""
        self.take_turn(self.turns.for_training)
        freed, self.freed = self.freed, {}
        swaps, swap_s = self.turn_spans()
        timings, start = {"rollout_s": got.finished - got.started}, time.perf_counter()
        started_wall = time.time()
        spans, span_start = {}, started_wall  # wall-clock spans of the parts, for the timeline

        def lap(name: str, since: float) -> float:
            nonlocal span_start
            now, wall = time.perf_counter(), time.time()
            timings[name] = now - since
            spans[PART_SPANS[name]] = [span_start, wall]
            span_start = wall
            return now

        rewards = torch.tensor(self.score(got.samples, got.completions))
        t = lap("reward_s", start)
        advantages = group_normalized_advantages(rewards, self.algo.samples_per_prompt)
        batch, sampler_logprobs = build_batch(got.prompt_ids, got.completions, self.tokens.pad, advantages)
        staleness = state.step - got.version
        if staleness > 0:  # generated by older weights: the loss weighs it by the importance ratio
            batch.rollout_logprobs = sampler_logprobs
        batch.old_logprobs = self.logprobs("actor_train", batch)
        if self.use_reference:
            batch.ref_logprobs = self.logprobs("reference", batch)
        t = lap("logprob_s", t)
        self.training = True
        for epoch in range(self.algo.ppo_epochs):
            try:
                metrics = self.roles.data_parallel(
                    "actor_train",
                    TrainWorker.train,
                    batch,
                    self.algo.clip_ratio,
                    self.algo.kl_coef,
                    self.algo.importance_ratio_cap,
                )[0]
            except NonFiniteUpdateError:  # refused, not applied: after no earlier epoch, the
                self.training = epoch > 0  # trainer holds exactly `state`'s step
                raise
        state.step += 1
        state.data_position = rollout.position + rollout.size
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
            "entropy": metrics.get("entropy"),  # the policy's mean per-token entropy (None: not reported)
            "lr": metrics["lr"],
            "rollout_vs_train_logprob_gap": mismatch.item(),
            "rollout_version": got.version,
            "staleness": staleness,
            "importance_ratio_mean": metrics.get("importance_ratio_mean", 1.0),
            "importance_clipped_share": metrics.get("importance_clipped_share", 0.0),
            "trainer_wait_s": got.waited_s,
            "rollout_wait_s": got.engine_idle_s,
            "weights_version": None,
            "sync_path": None,
            **timings,
            **freed,
            "sync_s": 0.0,
            "swap_s": swap_s,
            "step_s": time.perf_counter() - start + got.waited_s + swap_s,
            "timeline": {
                "rollout": [got.started, got.finished],
                "train": [started_wall, time.time()],
                **spans,
                **swaps,
            },
        }

    def take_turn(self, turn) -> None:
        """One colocated turn (`self.turns.for_*`): keeps the device bytes it freed and, where
        colocated, its wall-clock span under the turn's name, both for the step's record."""
        if not self.turns.active:
            return
        begin = time.time()
        self.freed.update(turn() or {})
        self.swaps[turn.__name__] = [begin, time.time()]

    def turn_spans(self) -> tuple[dict[str, list[float]], float]:
        """The turns taken since the last call: their spans, and their seconds together."""
        swaps, self.swaps = self.swaps, {}
        return swaps, sum(end - begin for begin, end in swaps.values())

    def sync(self, record: dict) -> None:
        """Send step `record["step"]`'s weights to the rollout; adds the sync to `record`."""
        self.take_turn(self.turns.for_sync)
        swaps, swap_s = self.turn_spans()
        record["swap_s"] += swap_s
        record["step_s"] += swap_s
        record["timeline"].update(swaps)
        start, started_wall = time.perf_counter(), time.time()
        sync = self.roles.sync_weights(version=record["step"])
        record.update(weights_version=sync["version"], sync_path=sync["path"])
        record["sync_s"] = time.perf_counter() - start
        record["step_s"] += record["sync_s"]
        record["timeline"]["sync"] = [started_wall, time.time()]
