"""`RewardWorker` (`reward`): scores responses with the run's reward
(`roll_device.inputs.rewards`). The driver decodes the responses with the tokenizer that encoded
the prompts and sends text, so this worker needs neither a tokenizer nor the strategies: its
process imports little beyond torch (through the platform) and starts in about a second.
"""

from __future__ import annotations

from roll_device.inputs.rewards import Scores, Scoring, caller, resolve_reward, score_all
from roll_device.pipeline.worker_base import PipelineWorker
from roll_device.tracking.phases import phase


class RewardWorker(PipelineWorker):
    """Rewards on the CPU: each response scored against its answer."""

    def setup(self, function: str | None, task: str, name: str, kwargs: dict | None = None) -> None:
        """Score with `function` (`reward.function`; None: `task`'s rule), reported as `name`, given
        `kwargs` (`reward.kwargs`) beside each sample."""
        self.call, self.name = caller(resolve_reward(function, task, kwargs), name, kwargs), name

    @phase("reward")
    def score(self, items: list[Scoring]) -> Scores:
        return score_all(self.name, self.call, items)
