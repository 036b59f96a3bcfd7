"""`RewardWorker` (`reward`): scores responses by the role's strategy (`roles.reward.strategy`):

- `rule`: the run's reward function (`roll_device.inputs.rewards`). This needs neither a tokenizer
  nor the strategies: the process imports little beyond torch (through the platform) and starts in
  about a second;
- `model`: the reward model `reward.model_path` on the worker's device (its kind's accelerator with
  `roles.reward.device=auto`; `roll_device.inputs.reward_model`).

Either way the driver decodes the responses with the tokenizer that encoded the prompts and sends
text, with the prompt's text (or chat messages) beside each.
"""

from __future__ import annotations

from collections.abc import Callable

from roll_device.inputs.rewards import Scores, Scoring, reward_caller, score_all
from roll_device.inputs.settings import MODEL, RULE, RewardSettings
from roll_device.pipeline.worker_base import PipelineWorker
from roll_device.tracking.phases import phase

Scorer = Callable[[list[Scoring]], Scores]


def rule_scorer(worker: PipelineWorker, reward: RewardSettings, task: str) -> Scorer:
    """`reward.function` (None: `task`'s rule) with `reward.kwargs`, sample by sample."""
    name = reward.name(task)
    call = reward_caller(reward.function, task, name, reward.kwargs)
    return lambda items: score_all(name, call, items)


def model_scorer(worker: PipelineWorker, reward: RewardSettings, task: str) -> Scorer:
    """The reward model on `worker`'s device, in micro-batches."""
    from roll_device.inputs.reward_model import RewardModel

    model = RewardModel(reward.model_path, worker.device, reward.dtype, reward.micro_batch_size)
    return lambda items: Scores(model.score(items), {})


SCORERS = {RULE: rule_scorer, MODEL: model_scorer}  # by roles.reward.strategy (REWARD_STRATEGIES)


class RewardWorker(PipelineWorker):
    """Rewards of responses, each scored against its prompt (and its answer, for a rule)."""

    def setup(self, strategy: str, reward: RewardSettings, task: str) -> None:
        """Score by `strategy` with the `reward` section; `task`: the toy task whose rule a rule
        without `reward.function` applies."""
        self.scorer = SCORERS[strategy](self, reward, task)

    @phase("reward")
    def score(self, items: list[Scoring]) -> Scores:
        return self.scorer(items)
