"""Ascend NPUs through torch_npu (or the simulated NPU): HCCL collectives, ACL graphs.

torch_npu is imported here and nowhere else, lazily: never at module top, and its absence or
breakage ends in a clean `False` from `is_available()` or a `MissingPackageError` that names it.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from roll_device.errors import MissingPackageError
from roll_device.platforms.base import Platform

INSTALL_HINT = (
    "install torch_npu matching your torch and CANN toolkit (see docs/install.md), "
    "or set ROLL_DEVICE=npu-sim to run the NPU code paths on the simulated NPU"
)


class NpuPlatform(Platform):
    kind = "npu"
    device_type = "npu"
    dispatch_key = "PrivateUse1"
    ray_resource = "NPU"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    ray_noset_visible_devices_env = "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"
    dist_backend = "hccl"
    graph_class_name = "NPUGraph"
    # vLLM-Ascend's limit: every ACL graph takes at least one of the device's ~2,048 streams, less a reserve.
    graph_budget = 1800
    allocator_conf_env = "PYTORCH_NPU_ALLOC_CONF"
    required_package = "torch_npu"

    @classmethod
    def is_available(cls) -> bool:
        from roll_device import sim

        if sim.is_installed():
            return True
        try:
            if importlib.util.find_spec("torch_npu") is None:
                return False
            import torch

            importlib.import_module("torch_npu")
            return bool(torch.npu.is_available()) and torch.npu.device_count() > 0
        except Exception:  # noqa: BLE001 - broken torch_npu, missing CANN libraries, a CPU-only head
            return False

    def device_module(self) -> ModuleType:
        if self.simulated:
            from roll_device import sim

            sim.install()
        else:
            try:
                importlib.import_module("torch_npu")
            except Exception as exc:
                raise MissingPackageError(
                    f"platform 'npu' needs the package torch_npu, which could not be imported "
                    f"({type(exc).__name__}: {exc}): {INSTALL_HINT}"
                ) from exc
        import torch

        return torch.npu

    def rollout_env(self, graph_mode: bool) -> dict[str, str]:
        # Task queue level 1 is what ACL graph capture supports; level 2 is faster when eager.
        return {"TASK_QUEUE_ENABLE": "1" if graph_mode else "2", "VLLM_ASCEND_ENABLE_NZ": "0"}
