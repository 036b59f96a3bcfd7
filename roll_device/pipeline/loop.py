"""One GRPO step, from prompts to synced weights, and the metrics it reports.

prompts (from the run's prompt source) -> rollout (`actor_infer`, n samples each) -> rewards
(`reward`) -> (DAPO's dynamic sampling: groups of equal rewards dropped) -> old logprobs
(`actor_train`), reference logprobs (`reference`, when KL is on) and, for PPO, the critic's
values (`critic`) -> advantages (`algorithm.advantage`) -> policy update (`actor_train`,
`algorithm.policy_loss`), then the critic's update on the returns -> weight sync to the rollout
workers. The critic's part is `CriticStep` (roll_device/pipeline/critic_step.py). The estimators and losses are registries by name
(strategies/training/advantages.py and losses.py); GRPO is the default recipe.

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
The step's timing (`StepTimeline`, the colocated turns' `TurnLog`) and its metrics record
(`StepRecord`, which the sync extends) live beside it: roll_device/pipeline/timeline.py and
record.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from roll_device.cluster import shard
from roll_device.inputs import Sample
from roll_device.inputs.loading import RunInputs
from roll_device.inputs.rewards import Scores
from roll_device.pipeline.batching import build_batch
from roll_device.pipeline.config import RunConfig
from roll_device.pipeline.critic_step import CriticStep
from roll_device.pipeline.generations import GENERATIONS, shown
from roll_device.pipeline.lifecycle import ColocatedTurns
from roll_device.pipeline.overlap import Rollout
from roll_device.pipeline.record import StepOutcome, StepRecord
from roll_device.pipeline.reward_worker import RewardWorker
from roll_device.pipeline.roles import RoleGroups
from roll_device.pipeline.sampling_filter import SamplingFilter
from roll_device.pipeline.state import PipelineState
from roll_device.pipeline.timeline import StepTimeline, TurnLog, timed
from roll_device.pipeline.updates import Updates
from roll_device.pipeline.workers import Generated, RolloutWorker, TrainWorker
from strategies.base import Completion, NonFiniteUpdateError, SamplingConfig, TrainBatch
from strategies.training.advantages import AdvantageInputs, advantages, overlong_penalty
from strategies.training.kl_control import adapted_kl_coef, reward_kl

ROUND_SEEDS = 1_000_000_007  # a dynamic-sampling round's seed offset: no step's seed of the run collides


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

    def joined(self, more: Collected) -> Collected:
        """This rollout and `more` (of the prompts after it) as one; `more`'s completions' prompt
        indices move past this one's prompts."""
        for c in more.completions:
            c.prompt_index += len(self.samples)
        return Collected(
            self.samples + more.samples,
            self.prompt_ids + more.prompt_ids,
            self.completions + more.completions,
            version=min(self.version, more.version),
            started=min(self.started, more.started),
            finished=max(self.finished, more.finished),
            engine_idle_s=max(self.engine_idle_s, more.engine_idle_s),
            waited_s=self.waited_s + more.waited_s,
        )


@dataclass
class Launched:
    """What `GrpoStep.launch` leaves in flight: the prompts, each worker's shard size and call."""

    samples: list[Sample]
    prompt_ids: list[list[int]]
    shard_sizes: list[int]
    refs: list


class GrpoStep:
    """The GRPO step's phases on the run's roles (`launch`, `collect`, `train`, `sync`, called in
    that order) and the calls they are made of: `generate` and `score` (which the evaluation
    reuses), `logprobs`, `update`. `train` is the algorithm; its timing is a `StepTimeline` and
    its metrics record a `StepRecord` (roll_device/pipeline/timeline.py and record.py)."""

    def __init__(self, config: RunConfig, roles: RoleGroups, inputs: RunInputs) -> None:
        self.config, self.roles = config, roles
        self.source, self.encoder = inputs.source, inputs.encoder
        self.tokens = inputs.encoder.tokens
        self.algo = config.algorithm
        self.use_reference = roles.has("reference")
        self.sampling_filter = SamplingFilter(self.algo, config.data.prompts_per_step)
        self.critic = CriticStep(roles, self.algo)
        self.training = False
        self.turns = ColocatedTurns(roles)  # a colocated engine and trainer take turns on the devices
        self.turn_log = TurnLog()  # the turns taken since the last record, for the next one

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
        samples, prompt_ids = self.prompts_at(position)
        self.take_turn(self.turns.for_rollout)
        launched = self.start_generation(samples, prompt_ids, self.sampling(step))
        return Rollout(step, position, len(samples), version, launched)

    def prompts_at(self, position: int) -> tuple[list[Sample], list[list[int]]]:
        """A step's prompts from data `position` on, and their token ids."""
        samples = self.source.batch(position, self.config.data.prompts_per_step)
        return samples, [self.encoder.encode(s.prompt, s.chat()) for s in samples]

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

    def close(self) -> None:
        """Let go of what the step runs beside the main thread (nothing here: a rollout is Ray calls)."""

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> list[Completion]:
        """Responses from the `actor_infer` workers, each prompt's index into `prompt_ids`."""
        return self.collect(self.start_generation([], prompt_ids, sampling)).completions

    def score(self, samples: list[Sample], completions: list[Completion]) -> Scores:
        """One reward per completion from the `reward` workers (sent as text, decoded here)."""
        responses = self.encoder.decode([c.token_ids for c in completions])
        items = [samples[c.prompt_index].scoring(text) for c, text in zip(completions, responses)]
        scored = self.roles.scatter(
            "reward", RewardWorker.score, shard(items, self.roles.groups["reward"].world_size)
        )
        return Scores.joined(scored)

    def logprobs(self, role: str, batch) -> torch.Tensor:
        return torch.cat(self.roles.logprobs(role, batch))

    def train(self, state: PipelineState, rollout: Rollout, got: Collected) -> StepRecord:
        """Step `state.step` on rollout `rollout` (collected as `got`) up to the policy update
        (`state` advanced in place); returns the step's metrics record, its sync still to come."""
        timeline = StepTimeline([got.started, got.finished], got.waited_s, self.turn_log)
        with timeline.part("reward"):
            scores = self.score(got.samples, got.completions)
        if self.sampling_filter.refills:  # DAPO: more rounds until the batch is full, engines awake
            with timeline.part("refill"):
                rollout, got, scores = self.refill(state.step, rollout, got, scores)
        rewards = torch.tensor(scores.rewards)
        self.take_turn(self.turns.for_training)
        staleness = state.step - got.version
        with timeline.part("logprob"):
            # DAPO's dynamic sampling drops groups of equal rewards; otherwise every row is kept
            kept = self.sampling_filter.keep(rewards, self.roles.data_parallel_size("actor_train"))
            batch, sampler_logprobs = build_batch(
                got.prompt_ids, [got.completions[i] for i in kept.tolist()], self.tokens.pad
            )
            if staleness > 0 or self.algo.importance_correction == "always":  # the loss weighs it by
                batch.rollout_logprobs = sampler_logprobs  # the truncated trainer/rollout ratio
            self.add_logprobs(batch)
            kl_coef = self.kl_coef(state)
            batch.advantages = self.advantages(rewards[kept], batch, kl_coef)
        with timeline.part("update"):
            update = self.update(state, rollout, batch, kl_coef)
        outcome = StepOutcome(
            rewards, batch, sampler_logprobs, update, got.version, staleness, got.engine_idle_s
        )
        record = StepRecord.build(state, outcome, timeline)
        record.update(scores.means("reward_"))  # verl's extra entries, where its dicts gave some
        self.show(record, got, scores)
        self.adapt_kl(state, batch, record, kl_coef)
        return self.critic.report(self.sampling_filter.report(record))

    def show(self, record: StepRecord, got: Collected, scores: Scores) -> None:
        """The step's first `tracking.generations` responses into `record` (generations.py)."""
        count = self.config.tracking.generations
        if count:
            record[GENERATIONS] = shown(self, got.samples, got.completions, scores.rewards, count)

    def texts(self, samples: list[Sample], completions: list[Completion]) -> tuple[list[str], list[str]]:
        """The completions' prompts and responses as text (a generations file's)."""
        prompts = [samples[c.prompt_index].prompt for c in completions]
        return prompts, self.encoder.decode([c.token_ids for c in completions])

    def refill(
        self, step: int, rollout: Rollout, got: Collected, scores: Scores
    ) -> tuple[Rollout, Collected, Scores]:
        """DAPO's dynamic sampling: rounds of the next prompts, each scored, until the rollout holds
        `data.prompts_per_step` groups whose rewards differ or `algorithm.max_sampling_rounds`
        rounds ran; the rollout then spans every prompt the rounds took."""
        rounds, first = 1, self.sampling(step)
        while self.sampling_filter.wants_more(torch.tensor(scores.rewards), rounds):
            samples, prompt_ids = self.prompts_at(rollout.position + len(got.samples))
            sampling = replace(first, seed=first.seed + rounds * ROUND_SEEDS)
            more = self.collect(self.start_generation(samples, prompt_ids, sampling))
            scores = Scores.joined([scores, self.score(more.samples, more.completions)])
            got, rounds = got.joined(more), rounds + 1
        self.sampling_filter.rounds = rounds
        return replace(rollout, size=len(got.samples)), got, scores

    def kl_coef(self, state: PipelineState) -> float:
        """The step's KL coefficient: the adapted one carried in `state`, else `algorithm.kl_coef`."""
        return self.algo.kl_coef if state.kl_coef is None else state.kl_coef

    def adapt_kl(self, state: PipelineState, batch: TrainBatch, record: StepRecord, used: float) -> None:
        """Record the step's KL coefficient and measured KL (the reward's k1 where the KL is in the
        reward), and with `algorithm.kl_target` adapt the next step's (strategies/training/kl_control.py)."""
        if self.algo.kl_in_reward:
            record["kl"] = reward_kl(batch.old_logprobs, batch.ref_logprobs, batch.response_mask)
        record["kl_coef"] = used
        if self.algo.kl_target is not None:
            rows = batch.response_mask.shape[0]
            state.kl_coef = adapted_kl_coef(
                used, record["kl"], self.algo.kl_target, rows, self.algo.kl_horizon
            )

    def advantages(self, scores: torch.Tensor, batch: TrainBatch, kl_coef: float) -> torch.Tensor:
        """`algorithm.advantage`'s advantages of `batch`'s rows (scored `scores`), after DAPO's
        overlong penalty when `algorithm.overlong_buffer` > 0; `kl_coef` the step's KL coefficient."""
        lengths = batch.response_mask.sum(dim=1)
        algo = self.algo
        shaped = scores + overlong_penalty(
            lengths, algo.max_new_tokens, algo.overlong_buffer, algo.overlong_penalty
        )
        inputs = AdvantageInputs(
            shaped,
            algo.samples_per_prompt,
            batch.response_mask,
            batch.old_logprobs,
            batch.ref_logprobs,
            batch.values,
            batch.token_rewards,
        )
        spec = algo.advantage_spec(kl_coef)
        self.critic.add_returns(batch, inputs, spec)
        return advantages(inputs, spec)

    def add_logprobs(self, batch: TrainBatch) -> None:
        """The trainer's logprobs of `batch` before the update, the reference's when KL is on, and
        the critic's values with a critic."""
        batch.old_logprobs = self.logprobs("actor_train", batch)
        if self.use_reference:
            batch.ref_logprobs = self.logprobs("reference", batch)
        self.critic.add_values(batch)

    def update(self, state: PipelineState, rollout: Rollout, batch: TrainBatch, kl_coef: float) -> dict:
        """The clipped policy update on `actor_train` (`ppo_epochs` passes over `batch` in
        `mini_batches` optimizer steps each, the KL weighed by `kl_coef`: updates.py) and the
        critic's, then `state` advanced past `rollout`; returns the policy's metrics over its updates."""
        loss = self.algo.loss_spec(kl_coef)
        updates = Updates(
            self.algo.ppo_epochs, self.algo.mini_batches, self.roles.data_parallel_size("actor_train")
        )
        self.training = True
        try:
            metrics = updates.run(
                lambda part: self.roles.data_parallel("actor_train", TrainWorker.train, part, loss)[0], batch
            )
        except NonFiniteUpdateError:  # refused, not applied: after no earlier update, the
            self.training = updates.applied > 0  # trainer holds exactly `state`'s step
            raise
        self.critic.train(batch)
        state.step += 1
        state.data_position = rollout.position + rollout.size
        state.data_epoch = self.source.epoch(state.data_position)
        self.training = False
        return metrics

    def take_turn(self, turn) -> None:
        """One colocated turn (`self.turns.for_*`); where colocated, logged for the step's record
        (its wall-clock span under the turn's name, the device bytes it freed)."""
        if self.turns.active:
            self.turn_log.take(turn)

    def sync(self, record: StepRecord) -> None:
        """Send step `record["step"]`'s weights to the rollout; adds the sync to `record`."""
        self.take_turn(self.turns.for_sync)
        record.add_turns(self.turn_log.pop_spans())
        with timed() as took:
            sync = self.roles.sync_weights(version=record["step"])
        record.add_sync(sync, took)
