"""`platform.facts`: what a device is beyond its name and memory (`device_name`, `total_memory` and
`is_device_tensor` stay on the platform): its properties, compute capability, architecture, UUID,
and the device a UUID names here.

Each reads the kind's torch device module (`get_device_properties`, `get_device_capability`); a
kind that has no such fact raises `NotImplementedError` naming it.
"""

from __future__ import annotations

import os
from typing import Any

from roll_device.platforms.groups import PlatformGroup


class DeviceFacts(PlatformGroup):
    """The facts group; kinds name a subclass for what their device reports differently."""

    attribute = "facts"

    def device_properties(self, index: int | None = None) -> Any:
        """The device module's properties object (name, total_memory, ...)."""
        return self._call("device_properties", "get_device_properties", self._index(index))

    def device_capability(self, index: int | None = None) -> tuple[int, int]:
        """The (major, minor) compute capability (on ROCm: what torch maps the GFX version to)."""
        major, minor = self._call("device_capability", "get_device_capability", self._index(index))
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
        for index in range(self.platform.device_count()):
            own = self.device_uuid(index)
            if uuid in (own, own.split("-", 1)[-1]):
                return index
        raise ValueError(
            f"platform '{self.platform.name}': no visible device has UUID {uuid} "
            f"(check {self.platform.visible_devices_env})"
        )


def physical_device_id(visible_env: str, index: int) -> str:
    """The physical id of visible device `index`: its entry in `visible_env`, or `index` itself."""
    visible = [v.strip() for v in os.environ.get(visible_env, "").split(",") if v.strip()]
    if not visible:
        return str(index)
    if index >= len(visible):
        raise ValueError(f"device index {index} out of range: {visible_env}='{','.join(visible)}'")
    return visible[index]
