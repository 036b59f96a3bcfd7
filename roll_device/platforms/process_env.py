"""`platform.env`: the variables a training or rollout process of this kind is given (the collective
library's logging, in-switch reductions and socket ports, each by name; the device's hardware
queues; what a training process needs), the visible-device pin of one rank with Ray's hands kept off
it, and the device ids this process's visible-devices variable names.

The collective tuning and timeouts every role worker gets (`collective_env`) and the device ids Ray
assigned to a worker (`ray_device_ids`) stay on the platform: the cluster calls them. Values are per
kind, set as class attributes of each kind's `env` group. Nothing here writes `os.environ`: callers
put the dicts into a worker's environment (a Ray `runtime_env`, a subprocess).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import ClassVar

from roll_device.platforms.groups import PlatformGroup

# The collective library's log levels, as NCCL names them (RCCL reads the same variable).
COLLECTIVE_LOG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")


class ProcessEnv(PlatformGroup):
    """The env group; kinds name a subclass that sets the class attributes."""

    attribute = "env"
    # What a training process needs: one hardware queue, so Megatron's overlapped communication
    # is issued in order (Megatron-LM and MindSpeed check CUDA_DEVICE_MAX_CONNECTIONS=1).
    training_env_vars: ClassVar[dict[str, str]] = {}
    # Further variables that narrow device visibility on this kind, and Ray's flags for them.
    extra_visible_devices_envs: ClassVar[tuple[str, ...]] = ()
    extra_ray_noset_envs: ClassVar[tuple[str, ...]] = ()
    # The variable that sets the collective library's log level (None: the library has none).
    collective_debug_var: ClassVar[str | None] = None
    # The variable that switches in-switch reductions (NVLink SHARP) on or off (None: no such
    # hardware path on this kind, so it is always off).
    switch_reduction_var: ClassVar[str | None] = None
    # Variables that bound the socket ports the collective library listens on; several processes
    # on one device need "auto" there (None of them: the library picks free ports itself).
    collective_port_range_vars: ClassVar[tuple[str, ...]] = ()
    # The variable that sets how many hardware work queues (connections) a process opens per
    # device; Megatron, MindSpeed and SGLang read it under this name on every kind they run on.
    device_connections_var: ClassVar[str | None] = None

    def training_env(self) -> dict[str, str]:
        """Variables for a training process on this kind."""
        return dict(self.training_env_vars)

    def collective_debug_env(self, level: str = "WARN") -> dict[str, str]:
        """Variables that set the collective library's log level (NCCL's names: VERSION, WARN,
        INFO, TRACE); empty where the library has no such variable (gloo)."""
        if level.upper() not in COLLECTIVE_LOG_LEVELS:
            raise ValueError(
                f"platform '{self.platform.name}': collective log level '{level}' is not one of "
                f"{COLLECTIVE_LOG_LEVELS}"
            )
        return {self.collective_debug_var: level.upper()} if self.collective_debug_var else {}

    def switch_reduction_env(self, enabled: bool) -> dict[str, str]:
        """Variables that switch the collective library's in-switch reductions (NVLink SHARP) on or
        off. Off is what a kind without them always has (empty); on fails loudly there."""
        if self.switch_reduction_var is None:
            if enabled:
                self._unsupported("switch_reduction_env", "no in-switch reductions on this kind")
            return {}
        return {self.switch_reduction_var: "1" if enabled else "0"}

    def collective_ports_env(self, port_range: str = "auto") -> dict[str, str]:
        """Variables that bound the collective library's socket ports to `port_range` ("auto":
        any free port, what processes sharing one device need; or "start-end"). Empty for "auto"
        where the library picks free ports itself; a fixed range fails loudly there."""
        if not self.collective_port_range_vars:
            if port_range != "auto":
                self._unsupported("collective_ports_env", "the collective library takes no port range")
            return {}
        return dict.fromkeys(self.collective_port_range_vars, port_range)

    def device_connections_env(self, connections: int) -> dict[str, str]:
        """Variables that give a process `connections` hardware work queues per device (Megatron and
        MindSpeed ask for 1, SGLang for 4); empty where the kind has no such queues (the CPU)."""
        if connections < 1:
            raise ValueError(
                f"platform '{self.platform.name}': device connections {connections} must be at least 1"
            )
        return {self.device_connections_var: str(connections)} if self.device_connections_var else {}

    def ray_noset_env(self) -> dict[str, str]:
        """Flags that stop Ray from rewriting this kind's visible-device variables."""
        names = (self.platform.ray_noset_visible_devices_env, *self.extra_ray_noset_envs)
        return {name: "1" for name in names if name}

    def rank_env(self, device_ids: int | str | list) -> dict[str, str]:
        """Variables that pin a process to `device_ids` (physical ids) and keep Ray from changing
        the pin. The kind's `extra_visible_devices_envs` must be absent (see `pin_devices`)."""
        visible_env = self.platform.visible_devices_env
        if visible_env is None:
            return {}
        ids = device_ids if isinstance(device_ids, list) else [device_ids]
        return {visible_env: ",".join(str(i) for i in ids), **self.ray_noset_env()}

    def pin_devices(self, env: MutableMapping[str, str], device_ids: int | str | list) -> None:
        """Apply `rank_env(device_ids)` to `env` (`os.environ`, a runtime_env's env_vars) and drop
        the kind's other visibility variables, which would narrow the pin further (ROCR on AMD)."""
        for name in self.extra_visible_devices_envs:
            env.pop(name, None)
        env.update(self.rank_env(device_ids))

    def visible_device_ids(self) -> list[str]:
        """The physical ids this process's visible-devices variable names, in order (empty when
        it is unset, every device being visible, or the kind has none)."""
        visible_env = self.platform.visible_devices_env
        if visible_env is None:
            return []
        return [v.strip() for v in os.environ.get(visible_env, "").split(",") if v.strip()]
