"""Process-environment members of `Platform`: the variables a training or rollout process of this
kind needs (collective tuning and timeouts, Megatron's single hardware queue), the visible-device
pin of one rank with Ray's hands kept off it, and the device ids Ray assigned to this worker.

Values are per kind, set as class attributes in each kind's file. Nothing here reads or writes
`os.environ`: callers put the dicts into a worker's environment (a Ray `runtime_env`, a subprocess).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import ClassVar


class ProcessEnv:
    """Mixed into `Platform`."""

    # Collective-library tuning every process of the kind gets (the NCCL_* / HCCL_* family).
    collective_tuning_env: ClassVar[dict[str, str]] = {}
    # Variables that bound how long the collective library waits (seconds), set to one timeout.
    collective_timeout_envs: ClassVar[tuple[str, ...]] = ()
    # What a training process needs: one hardware queue, so Megatron's overlapped communication
    # is issued in order (Megatron-LM and MindSpeed check CUDA_DEVICE_MAX_CONNECTIONS=1).
    training_env_vars: ClassVar[dict[str, str]] = {}
    # Further variables that narrow device visibility on this kind, and Ray's flags for them.
    extra_visible_devices_envs: ClassVar[tuple[str, ...]] = ()
    extra_ray_noset_envs: ClassVar[tuple[str, ...]] = ()

    def collective_env(self, timeout_s: int | None = None) -> dict[str, str]:
        """Variables for a process that runs this kind's collectives. On kinds whose library has
        no timeout variable (NCCL), the timeout is the process group's `timeout` argument."""
        env = dict(self.collective_tuning_env)
        if timeout_s is not None:
            if timeout_s <= 0:
                raise ValueError(f"platform '{self.name}': collective timeout {timeout_s} s must be positive")
            env.update(dict.fromkeys(self.collective_timeout_envs, str(int(timeout_s))))
        return env

    def training_env(self) -> dict[str, str]:
        """Variables for a training process on this kind."""
        return dict(self.training_env_vars)

    def ray_noset_env(self) -> dict[str, str]:
        """Flags that stop Ray from rewriting this kind's visible-device variables."""
        names = (self.ray_noset_visible_devices_env, *self.extra_ray_noset_envs)
        return {name: "1" for name in names if name}

    def rank_env(self, device_ids: int | str | list) -> dict[str, str]:
        """Variables that pin a process to `device_ids` (physical ids) and keep Ray from changing
        the pin. The kind's `extra_visible_devices_envs` must be absent (see `pin_devices`)."""
        if self.visible_devices_env is None:
            return {}
        ids = device_ids if isinstance(device_ids, list) else [device_ids]
        return {self.visible_devices_env: ",".join(str(i) for i in ids), **self.ray_noset_env()}

    def pin_devices(self, env: MutableMapping[str, str], device_ids: int | str | list) -> None:
        """Apply `rank_env(device_ids)` to `env` (`os.environ`, a runtime_env's env_vars) and drop
        the kind's other visibility variables, which would narrow the pin further (ROCR on AMD)."""
        for name in self.extra_visible_devices_envs:
            env.pop(name, None)
        env.update(self.rank_env(device_ids))

    def ray_device_ids(self) -> list[str]:
        """The ids of this kind's devices that Ray assigned to the calling worker (physical ids;
        empty outside a Ray worker and for kinds Ray does not schedule)."""
        if self.ray_resource is None:
            return []
        import ray

        if not ray.is_initialized():
            return []
        ids = ray.get_runtime_context().get_accelerator_ids().get(self.ray_resource, [])
        return [str(i) for i in ids]
