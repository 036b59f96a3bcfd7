"""`EnvWorker` (`env`): runs environment instances and tools for multi-turn rollouts
(`roll_device.agentic.host.EnvHost`), on the CPU by default. The driver sends each trajectory's
turns to the same worker (by trajectory id), as text; like the reward worker it needs neither a
tokenizer nor the strategies.
"""

from __future__ import annotations

from roll_device.agentic.environment import Task
from roll_device.agentic.host import EnvHost, HostSpec, Reply
from roll_device.pipeline.worker_base import PipelineWorker
from roll_device.tracking.phases import phase


class EnvWorker(PipelineWorker):
    def setup(self, settings: HostSpec) -> None:
        self.host = EnvHost(settings)

    @phase("rollout")  # an environment's part of the rollout
    def reset(self, items: list[tuple[int, Task]]) -> list[Reply]:
        return self.host.reset(items)

    @phase("rollout")  # an environment's part of the rollout
    def step(self, items: list[tuple[int, str]]) -> list[Reply]:
        return self.host.step(items)

    def close(self, items: list[tuple[int, None]]) -> list[None]:
        return self.host.close(items)
