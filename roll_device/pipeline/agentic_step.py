"""`AgenticStep`: the GRPO step with multi-turn trajectories (`agentic.environment` set).

`launch` rolls out the step's trajectories, `samples_per_prompt` per task (one task per prompt of
the data source; a group shares the task's seed, so GRPO compares trajectories of the same task):
the `env` workers reset an environment per trajectory, the first prompt is the chat template's
rendering of its first observation, and then every trajectory advances on its own: its next turn
is a request to the `actor_infer` workers (roll_device/pipeline/request_pool.py), which batch the
requests in flight continuously; as turns finish, their tokens are kept as the engine made them,
their texts sent to the trajectories' env workers, whose replies are rendered and appended as the
environment's tokens (roll_device/agentic/chat.py), and the next turns submitted at once. A trajectory
ends when its environment says done, on a budget (`agentic.max_turns`, `max_total_tokens`), or on
an environment's fault (or the run ends: `agentic.on_env_fault=run`).

Each trajectory trains as one row: its whole context, the mask 1 on the model's tokens only
(`Completion.mask`), the reward the sum of its turns' rewards for the sequence-level estimators
(grpo, rloo, ...), and for the token-level ones (gae, reinforce_pp) each turn's reward on its
last model token (`Completion.turn_rewards`, placed on the batch's tokens by `build_batch`). With
routing replay its routes go with it: each position's as the turn that first fed it to the engine
routed it (roll_device/agentic/trajectory.py). The rest of the step is GRPO's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from roll_device.agentic.chat import ChatRenderer
from roll_device.agentic.environment import EnvironmentFaultError, Task
from roll_device.agentic.host import Reply
from roll_device.agentic.registry import resolve_tool
from roll_device.agentic.trajectory import (
    DONE,
    FAULT,
    MAX_TURNS,
    TOTAL_TOKENS,
    Trajectory,
    trajectory_metrics,
)
from roll_device.errors import ConfigError
from roll_device.inputs.rewards import Scores
from roll_device.pipeline.env_worker import EnvWorker
from roll_device.pipeline.loop import ROUND_SEEDS, Collected, GrpoStep
from roll_device.pipeline.overlap import Rollout
from roll_device.pipeline.record import StepRecord
from roll_device.pipeline.request_pool import RequestPool
from roll_device.pipeline.rollout_thread import InFlight, RolloutThread
from roll_device.pipeline.state import PipelineState
from strategies.base import Completion, Request, SamplingConfig, Served

TASK_SEEDS = 1_000_003  # a task's seed: the run's seed times this, plus the task's data position


@dataclass
class TrajectoryCompletion(Completion):
    """A trajectory as one completion: its whole row (first prompt included) and its reward (the
    sum of its turns')."""

    reward: float = 0.0


@dataclass
class CollectedTrajectories(Collected):
    """A multi-turn rollout, made: its completions and the trajectories they come from."""

    trajectories: list[Trajectory] = field(default_factory=list)


EnvCall = Callable[[str, list[tuple[int, Any]]], list]  # "reset" | "step" | "close", (key, item) pairs


class Engines(Protocol):
    """What a `TurnDriver` asks of the engines (roll_device/pipeline/request_pool.py)."""

    def submit(self, requests: list[Request]) -> None:
        """Queue `requests`; returns at once."""

    def finished(self) -> list[Served]:
        """Requests finished since the last call; waits for one while any is in flight."""


class TurnDriver:
    """The turns of a step's trajectories (see the module docstring): `engines` serve each turn as
    a request of its own, `env_call` runs the env workers' `reset` or `step` on (trajectory key,
    item) pairs."""

    def __init__(
        self, agentic, renderer: ChatRenderer, tokenizer, tokens, engines: Engines, env_call: EnvCall
    ) -> None:
        self.agentic, self.renderer, self.tokenizer, self.tokens = agentic, renderer, tokenizer, tokens
        self.engines, self.env_call = engines, env_call

    def roll_out(
        self, tasks: list[Task], n: int, first: SamplingConfig, halt: threading.Event | None = None
    ) -> list[Trajectory]:
        """`n` trajectories of each of `tasks`, task-major (a group per task), run to their end:
        each trajectory's next turn is submitted as soon as its environment has answered the last.
        Once `halt` is set no more turns are submitted (a dropped rollout): the turns in flight
        come back and the environments are closed."""
        self.n, self.in_flight, self.halt = n, {}, halt  # in_flight: request id -> its trajectory
        self.sampling = replace(first, n=1, max_tokens=self.agentic.max_turn_tokens)
        trajectories = [Trajectory(i, s, [], []) for i in range(len(tasks)) for s in range(n)]
        replies = self.env_call("reset", [(k, tasks[t.prompt_index]) for k, t in enumerate(trajectories)])
        for trajectory, reply in zip(trajectories, replies):
            self.begin(trajectory, reply)
        self.submit([t for t in trajectories if t.ended is None])
        while self.in_flight:
            self.advance(self.engines.finished())
        self.env_call("close", [(k, None) for k in range(len(trajectories))])  # those ended on a budget
        return trajectories

    def submit(self, live: list[Trajectory]) -> None:
        """The next turn of each of `live`, one request each (none once halted)."""
        if self.halt is not None and self.halt.is_set():
            return
        requests = [self.request(t) for t in live]
        self.in_flight.update({r.request_id: t for r, t in zip(requests, live)})
        if requests:
            self.engines.submit(requests)

    def request(self, trajectory: Trajectory) -> Request:
        """The trajectory's next turn, seeded by the trajectory and the turn alone (not by when it
        is served or with what): the same seed rolls out the same trajectories."""
        key, turn = self.key(trajectory, self.n), trajectory.turns
        seed = None if self.sampling.seed is None else self.sampling.seed + turn * ROUND_SEEDS + key
        return Request(f"{key}.{turn}", tuple(trajectory.context), replace(self.sampling, seed=seed))

    def advance(self, served: list[Served]) -> None:
        """Finished turns: their tokens kept, their texts sent to the environments, whose replies
        are appended, and the next turns of the trajectories still live submitted."""
        finished = [(self.in_flight.pop(s.request_id), s) for s in served]
        texts = {id(t): self.model_turn(t, s.completions[0], s.version or 0) for t, s in finished}
        acting = [t for t, _ in finished if t.ended is None]
        if not acting:
            return
        replies = self.env_call("step", [(self.key(t, self.n), texts[id(t)][0]) for t in acting])
        for trajectory, reply in zip(acting, replies):
            self.answer(trajectory, reply, *texts[id(trajectory)])
        self.submit([t for t in acting if t.ended is None])

    def begin(self, trajectory: Trajectory, reply: Reply) -> None:
        """The first prompt from the environment's first observation (or the fault that ends it)."""
        if reply.fault:
            self.fault(trajectory, reply.fault)
            return
        trajectory.messages = list(reply.messages)
        trajectory.prompt_ids = self.renderer.first(trajectory.messages)
        if len(trajectory.prompt_ids) > self.agentic.max_prompt_tokens:
            raise ConfigError(
                f"the first prompt has {len(trajectory.prompt_ids)} tokens, more than agentic.max_prompt_tokens="
                f"{self.agentic.max_prompt_tokens}: raise it (within rollout.max_model_len)"
            )

    @staticmethod
    def key(trajectory: Trajectory, n: int) -> int:
        """The trajectory's id on the env workers (its position in the step's trajectories)."""
        return trajectory.prompt_index * n + trajectory.sample_index

    def model_turn(self, trajectory: Trajectory, completion: Completion, version: int) -> tuple[str, str]:
        """Append the engine's tokens, made with weights `version` (cut at the total budget);
        returns the turn's text and the text of the stop token that ended it ("" when cut off)."""
        room = self.agentic.max_total_tokens - len(trajectory.tokens)
        ids = completion.token_ids[:room]
        trajectory.add_model(ids, completion.logprobs[:room], version, completion.routed_experts)
        if len(completion.token_ids) > room:
            trajectory.turn_rewards.append(0.0)
            trajectory.end(TOTAL_TOKENS)
        stopped = bool(ids) and ids[-1] in self.tokens.stop
        text = self.tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=True)
        return text, self.tokenizer.decode(ids[-1:]) if stopped else ""

    def answer(self, trajectory: Trajectory, reply: Reply, text: str, stop_text: str) -> None:
        """The environment's reply to the trajectory's last turn: its reward, and its messages
        rendered and appended unless the trajectory ends here."""
        trajectory.tool_calls += reply.tool_calls
        trajectory.tool_failures += reply.tool_failures
        trajectory.env_seconds.append(reply.seconds)
        trajectory.turn_rewards.append(reply.reward)
        if reply.fault:
            self.fault(trajectory, reply.fault)
        elif reply.done:
            trajectory.end(DONE)
        elif trajectory.turns >= self.agentic.max_turns:
            trajectory.end(MAX_TURNS)
        if trajectory.ended is not None:
            return
        ids = self.renderer.after_model(trajectory.messages, text, stop_text, reply.messages)
        trajectory.messages += [{"role": "assistant", "content": text}, *reply.messages]
        if len(trajectory.tokens) + len(ids) >= self.agentic.max_total_tokens:  # no room for a turn
            trajectory.end(TOTAL_TOKENS)
            return
        trajectory.add_environment(ids)

    def fault(self, trajectory: Trajectory, why: str) -> None:
        if self.agentic.on_env_fault == "run":
            raise EnvironmentFaultError(
                f"environment {self.agentic.environment} failed (task {trajectory.prompt_index}, sample "
                f"{trajectory.sample_index}): {why}; agentic.on_env_fault=run ends the run "
                "(agentic.on_env_fault=trajectory ends only that trajectory)"
            )
        trajectory.end(FAULT)


def completion(trajectory: Trajectory, pad: int) -> TrajectoryCompletion:
    """A trajectory as one completion: its whole row, the mask over the model's tokens."""
    prompt = trajectory.prompt_ids or [pad]  # a reset that faulted has no prompt
    return TrajectoryCompletion(
        trajectory.prompt_index,
        trajectory.sample_index,
        prompt + trajectory.tokens,
        [0.0] * len(prompt) + trajectory.logprobs,
        trajectory.ended or DONE,
        mask=[0.0] * len(prompt) + trajectory.mask,
        routed_experts=trajectory.routes,
        reward=trajectory.reward,
        turn_rewards=[
            (len(prompt) + end, r) for end, r in zip(trajectory.turn_ends, trajectory.turn_rewards)
        ],
    )


class AgenticStep(GrpoStep):
    """GRPO's step on the trajectories a `TurnDriver` rolls out through the run's roles: made at
    `launch` (`algorithm.max_staleness=0`), or in the background (`RolloutThread`) while the
    trainer trains, `collect` waiting for them."""

    def __init__(self, config, roles, inputs, renderer: ChatRenderer) -> None:
        super().__init__(config, roles, inputs)
        self.renderer = renderer
        overlapped = config.algorithm.max_staleness > 0
        self.background = RolloutThread(roles.fail_in_background) if overlapped else None

    def launch(self, step: int, position: int, version: int) -> Rollout:
        samples = self.source.batch(position, self.config.data.prompts_per_step)
        self.take_turn(self.turns.for_rollout)
        if self.background is None:
            made = self.roll_out(samples, step, position, version)
        else:
            made = self.background.launch(lambda halt: self.roll_out(samples, step, position, version, halt))
        return Rollout(step, position, len(samples), version, made)

    def collect(self, launched: CollectedTrajectories | InFlight) -> Collected:
        if not isinstance(launched, InFlight):
            return launched
        start = time.perf_counter()
        got = self.background.result(launched)
        return replace(got, waited_s=time.perf_counter() - start)  # the trainer's wait, not the thread's

    def drop(self, rollout: Rollout) -> None:
        """A rollout in the background is halted (its turns in flight drained, its result unread)."""
        if isinstance(rollout.pending, InFlight):
            self.background.drop(rollout.pending)

    def close(self) -> None:
        if self.background is not None:
            self.background.close()

    def texts(self, samples, completions: list[Completion]) -> tuple[list[str], list[str]]:
        """Each trajectory's first prompt (its row up to the model's first token) and the rest."""
        starts = [next((i for i, m in enumerate(c.mask) if m > 0), len(c.token_ids)) for c in completions]
        decode = self.encoder.decode
        return (
            decode([c.token_ids[:start] for c, start in zip(completions, starts)]),
            decode([c.token_ids[start:] for c, start in zip(completions, starts)]),
        )

    def score(self, samples, completions: list[Completion]) -> Scores:
        """Each trajectory's reward, the sum of its turns' from the environment (no reward workers)."""
        return Scores([c.reward for c in completions], {})

    def train(self, state: PipelineState, rollout: Rollout, got: CollectedTrajectories) -> StepRecord:
        record = super().train(state, rollout, got)
        record.update(trajectory_metrics(got.trajectories))
        return record

    def roll_out(
        self, samples, step: int, position: int, version: int, halt: threading.Event | None = None
    ) -> CollectedTrajectories:
        """The step's trajectories through the `actor_infer` workers' request path (launched to be
        made with weights `version`); its version is the oldest of its trajectories' (each the
        oldest of its turns': a weight sync during the rollout serves the later turns)."""
        tasks = [
            Task(s.prompt, s.answer, self.config.seed * TASK_SEEDS + position + i)
            for i, s in enumerate(samples)
        ]
        pool = RequestPool(self.roles)
        driver = TurnDriver(
            self.config.agentic, self.renderer, self.encoder.tokenizer, self.tokens, pool, self.env_call
        )
        trajectories = driver.roll_out(tasks, self.algo.samples_per_prompt, self.sampling(step), halt)
        pool.close()
        now = time.time()
        return CollectedTrajectories(
            samples,
            [[] for _ in samples],  # each row is its trajectory's whole context (`completion`)
            [completion(t, self.tokens.pad) for t in trajectories],
            version=min((t.version for t in trajectories if t.version is not None), default=version),
            started=pool.started or now,
            finished=pool.ended or now,
            engine_idle_s=pool.idle_s,
            waited_s=pool.waited_s,
            trajectories=trajectories,
        )

    def env_call(self, method: str, items: list[tuple[int, Any]]) -> list[Reply]:
        """`method` on the env workers, each trajectory's items on worker `key % workers`; the
        replies in the order of `items`."""
        group = self.roles.groups["env"]
        shards = [
            [item for item in items if item[0] % group.world_size == w] for w in range(group.world_size)
        ]
        # its own wait: this may run in the rollout thread, beside the main thread's waits
        parts = self.roles.wait_alone("env", group.async_scatter(ENV_METHODS[method], shards))
        by_key = {key: reply for shard, part in zip(shards, parts) for (key, _), reply in zip(shard, part)}
        return [by_key[key] for key, _ in items]


ENV_METHODS = {"reset": EnvWorker.reset, "step": EnvWorker.step, "close": EnvWorker.close}


def chat_renderer(config, tokenizer) -> ChatRenderer | None:
    """The run's chat renderer with its tools (None for a single-turn run); refuses, before Ray, a
    chat template that cannot serve the run (none, or no tool support when tools are asked for)."""
    if not config.agentic.on:
        return None
    tools = [resolve_tool(name).rendered() for name in config.agentic.tools]
    return ChatRenderer(tokenizer, config.agentic.chat_template, tools, config.model.chat_template_kwargs)
