"""What one device kind can do here, read from the platform that computes for it: device graphs,
IPC, collective backend, visible-devices variable and value, device count, free memory.

On a simulated node the platform is the simulated one (`compute_kind`): the simulated NPU for the
NPU kind, the CPU for the others. A kind with no usable device here says why instead of counting.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from roll_device.cluster.plan import compute_kind
from roll_device.errors import RollDeviceError
from roll_device.platforms import get_platform
from roll_device.platforms.base import Platform


@dataclass(frozen=True)
class Capabilities:
    """One kind as this machine serves it; `platform` names who computes (e.g. 'npu (simulated)')."""

    kind: str
    platform: str
    compute_kind: str  # the kind the workers compute as: the CPU on a simulated GPU node
    # its `ROLL_DEVICE` value (npu-sim on a simulated NPU node): what strategies are asked about,
    # so that a simulation answers as itself (megatron needs no MindSpeed there)
    compute_platform: str
    accelerator: bool
    available: bool
    unavailable_reason: str = ""
    install_hint: str = ""
    graph_class: str | None = None
    ipc: bool = False
    backend: str = ""
    visible_env: str | None = None
    visible_value: str | None = None
    device_count: int | None = None
    memory: tuple[int, int] | None = None  # free, total bytes of the current device

    @property
    def computes_as_kind(self) -> bool:
        return self.compute_kind == self.kind


def computing_platform(kind: str, simulated: bool) -> Platform:
    """The platform a worker of `kind` computes with (on a simulated node: the simulated one)."""
    return get_platform(compute_kind(kind, simulated))


def capabilities_of(kind: str, simulated: bool) -> Capabilities:
    platform = computing_platform(kind, simulated)
    identity = get_platform(kind)
    common = {
        "kind": kind,
        "platform": platform.name,
        "compute_kind": platform.kind,
        "compute_platform": compute_kind(kind, simulated),
        "accelerator": identity.ray_resource is not None,
        "ipc": platform.supports_ipc,
        "backend": platform.dist_backend,
        "visible_env": identity.visible_devices_env,
        "visible_value": os.environ.get(identity.visible_devices_env)
        if identity.visible_devices_env
        else None,
        "install_hint": platform.install_hint,
    }
    if not (platform.simulated or platform.is_available()):
        return Capabilities(**common, available=False, unavailable_reason=f"no usable {kind} device here")
    try:
        count = platform.device_count()
        graphs = platform.graph_class_name if platform.supports_graphs else None
    except (NotImplementedError, RollDeviceError, RuntimeError) as exc:
        return Capabilities(**common, available=False, unavailable_reason=f"{type(exc).__name__}: {exc}")
    return Capabilities(
        **common, available=True, graph_class=graphs, device_count=count, memory=_memory(platform)
    )


def _memory(platform: Platform) -> tuple[int, int] | None:
    try:
        return platform.mem_get_info()
    except (NotImplementedError, RollDeviceError, RuntimeError):
        return None
