"""One trajectory: the first prompt's ids, then every token after it as the engine or the
environment's rendering made it, with a mask that is 1 on the model's own tokens only (the
losses score exactly those: `TrainBatch.response_mask`), the engine's logprobs of them, and the
reward of each turn. `ended` says why it stopped: the environment said done, a budget (`BUDGETS`)
ran out, or the environment faulted.

With an engine that records routes (routing replay), `routes` holds the experts each position of
the context was routed to by the request that first fed it to the model: a turn's request
prefills the whole context again, but only the positions new to it (the environment's tokens,
the last turn's final token) are taken from its prefill, then its own decoded tokens. Each
model token's logprob is so computed from the routes the engine sampled it with, even when a
weight sync between turns (or the prefill's numerics) would route the re-read context otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

DONE, FAULT = "done", "env_fault"
MAX_TURNS, TOTAL_TOKENS = "max_turns", "max_total_tokens"
BUDGETS = (MAX_TURNS, TOTAL_TOKENS)


@dataclass
class Trajectory:
    prompt_index: int
    sample_index: int
    prompt_ids: list[int]
    messages: list[dict[str, Any]]  # the chat so far, for rendering the next environment part
    tokens: list[int] = field(default_factory=list)  # everything after the first prompt
    mask: list[float] = field(default_factory=list)  # 1.0: the model's token
    logprobs: list[float] = field(default_factory=list)  # the engine's; 0.0 on environment tokens
    turn_rewards: list[float] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)  # each turn's last model token, in `tokens`
    ended: str | None = None
    tool_calls: int = 0
    tool_failures: int = 0
    env_seconds: list[float] = field(default_factory=list)
    turn_versions: list[int] = field(default_factory=list)  # the weights version of each model turn
    routes: torch.Tensor | None = None  # (positions, layers, k): see the module docstring

    @property
    def context(self) -> list[int]:
        """What the engine continues from: the prompt and every token since."""
        return self.prompt_ids + self.tokens

    @property
    def turns(self) -> int:
        return len(self.turn_rewards)

    @property
    def version(self) -> int | None:
        """The oldest weights version of its turns (None: no model turn)."""
        return min(self.turn_versions, default=None)

    @property
    def reward(self) -> float:
        """The trajectory's reward: the sum of its turns' rewards."""
        return float(sum(self.turn_rewards))

    def add_model(
        self, token_ids: list[int], logprobs: list[float], version: int, routes: torch.Tensor | None = None
    ) -> None:
        """A model turn made with weights `version` (its reward, in `turn_rewards`, sits on its
        last token), and the routes its request recorded (`Completion.routed_experts`: the
        context's positions, then the turn's tokens but the last; None: none recorded)."""
        self.turn_versions.append(version)
        self.tokens += token_ids
        self.mask += [1.0] * len(token_ids)
        self.logprobs += logprobs
        self.turn_ends.append(len(self.tokens) - 1)
        self.keep_new_routes(routes)

    def keep_new_routes(self, recorded: torch.Tensor | None) -> None:
        """The routes of the positions `recorded` is the first record of (those beyond `routes`,
        within the context: a turn cut at the budget keeps its kept tokens' only)."""
        if recorded is None:
            return
        known = 0 if self.routes is None else len(self.routes)
        fresh = recorded[known : len(self.context)]
        self.routes = fresh if self.routes is None else torch.cat([self.routes, fresh])

    def add_environment(self, token_ids: list[int]) -> None:
        self.tokens += token_ids
        self.mask += [0.0] * len(token_ids)
        self.logprobs += [0.0] * len(token_ids)

    def end(self, reason: str) -> None:
        self.ended = self.ended or reason


TURNS, TOOL_CALLS, TOOL_FAILURES = (
    "turns_mean",
    "tool_calls",
    "tool_failures",
)  # record keys metrics.png plots


def trajectory_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """A step's multi-turn metrics: turns per trajectory, tool calls and their failures, seconds
    per environment step, the trajectories that ended on a budget or an environment's fault."""
    count = max(len(trajectories), 1)
    steps = [s for t in trajectories for s in t.env_seconds]
    turn_rewards = [r for t in trajectories for r in t.turn_rewards]
    return {
        TURNS: sum(t.turns for t in trajectories) / count,
        TOOL_CALLS: sum(t.tool_calls for t in trajectories),
        TOOL_FAILURES: sum(t.tool_failures for t in trajectories),
        "env_step_s": sum(steps) / max(len(steps), 1),
        "ended_on_budget": sum(t.ended in BUDGETS for t in trajectories),
        "env_faults": sum(t.ended == FAULT for t in trajectories),
        "turn_reward_mean": sum(turn_rewards) / max(len(turn_rewards), 1),
    }
