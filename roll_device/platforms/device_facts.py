"""Device-fact members of `Platform`: name, compute capability, architecture, UUID (and the device
a UUID names here), total memory, properties, and whether a tensor lives on this kind's device.

Each reads the kind's torch device module (`get_device_name`, `get_device_properties`,
`get_device_capability`); a kind that has no such fact raises `NotImplementedError` naming it.
"""

from __future__ import annotations

import os
from typing import Any

import torch


class DeviceFacts:
    """Mixed into `Platform`; kinds override what their device reports differently."""

    def _index(self, index: int | None) -> int:
        return self.current_device() if index is None else index

    def device_name(self, index: int | None = None) -> str:
        """The product name of device `index` (default: the current one)."""
        return str(self._call_as("device_name", "get_device_name", self._index(index)))

    def device_properties(self, index: int | None = None) -> Any:
        """The device module's properties object (name, total_memory, ...)."""
        return self._call_as("device_properties", "get_device_properties", self._index(index))

    def total_memory(self, index: int | None = None) -> int:
        """Bytes of memory device `index` has in all."""
        return int(self.device_properties(index).total_memory)

    def device_capability(self, index: int | None = None) -> tuple[int, int]:
        """The (major, minor) compute capability (on ROCm: what torch maps the GFX version to)."""
        major, minor = self._call_as("device_capability", "get_device_capability", self._index(index))
        return int(major), int(minor)

    def device_arch(self, index: int | None = None) -> str:
        """The architecture kernels are built for (`sm_90` on an H100)."""
        major, minor = self.device_capability(index)
        return f"sm_{major}{minor}"

    def device_uuid(self, index: int | None = None) -> str:
        """A UUID that names the physical device across processes (as `nvidia-smi -L` prints it)."""
        return f"GPU-{self.device_properties(index).uuid}"

    def device_index_of_uuid(self, uuid: str) -> int:
        """The index, in this process's numbering, of the visible device `device_uuid` names `uuid`
        (with or without its `GPU-` / `NPU-` prefix): how a process opens a handle that another
        process, with other visible devices, made."""
        for index in range(self.device_count()):
            own = self.device_uuid(index)
            if uuid in (own, own.split("-", 1)[-1]):
                return index
        raise ValueError(
            f"platform '{self.name}': no visible device has UUID {uuid} (check {self.visible_devices_env})"
        )

    def is_device_tensor(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` lives on this kind's device (what `tensor.is_cuda` answers on CUDA)."""
        return tensor.device.type == self.device_type


def physical_device_id(visible_env: str, index: int) -> str:
    """The physical id of visible device `index`: its entry in `visible_env`, or `index` itself."""
    visible = [v.strip() for v in os.environ.get(visible_env, "").split(",") if v.strip()]
    if not visible:
        return str(index)
    if index >= len(visible):
        raise ValueError(f"device index {index} out of range: {visible_env}='{','.join(visible)}'")
    return visible[index]
