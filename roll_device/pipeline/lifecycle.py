"""The colocated lifecycle: a rollout engine and a trainer that share devices take turns holding
device memory.

`ColocatedTurns(roles)` is active when the weight sync is `colocated` (the rollout shares the
trainer's devices). Around each step the loop calls:

- `for_rollout()`: the trainers (`actor_train`, a reference with workers of its own, a critic) offload
  their parameters, gradients and optimizer state, and the engine wakes (`reload`) to generate;
- `for_training()`: the engine sleeps (`offload`, at `rollout.sleep_level`: vLLM's sleep mode
  where the kind has one; the HF engine drops its KV store and graphs and keeps its weights in its
  host buffer, or at level 2 drops them) and the trainers reload, for logprobs and the policy
  update (the trainers' and the HF engine's turns: strategies/host_turns.py);
- `for_sync()`: the engine wakes to receive the new weights (the trainer, loaded, exports them);
  an engine that slept at level 2 takes all of its weights from this sync.

Each returns the device memory the offloading side gave back to the device, by role: the device's
free memory after over before (`mem_get_info`: memory left in a caching allocator's cache does not
count; on accelerators and the simulated NPU; nothing is counted on the CPU, where "device" memory
is host memory) for the step's metrics: `freed_bytes_<role>`. Inactive (separate
devices), every call does nothing and returns nothing.
"""

from __future__ import annotations

from roll_device.comm.paths import COLOCATED
from roll_device.pipeline.roles import RoleGroups
from roll_device.pipeline.workers import RolloutWorker, TrainWorker

TRAINERS = ("actor_train", "reference", "critic")


class ColocatedTurns:
    def __init__(self, roles: RoleGroups) -> None:
        self.roles = roles
        self.active = roles.sync.path == COLOCATED
        self.trainers = [role for role in TRAINERS if role in roles.groups]

    def for_rollout(self) -> dict[str, int]:
        if not self.active:
            return {}
        freed = {role: sum(self.roles.call(role, TrainWorker.offload)) for role in self.trainers}
        self.roles.call("actor_infer", RolloutWorker.reload)
        return {f"freed_bytes_{role}": n for role, n in freed.items()}

    def for_training(self) -> dict[str, int]:
        if not self.active:
            return {}
        freed = sum(self.roles.call("actor_infer", RolloutWorker.offload))
        for role in self.trainers:
            self.roles.call(role, TrainWorker.reload)
        return {"freed_bytes_actor_infer": freed}

    def for_sync(self) -> None:
        if self.active:
            self.roles.call("actor_infer", RolloutWorker.reload)
