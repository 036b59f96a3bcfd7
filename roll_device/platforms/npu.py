"""Ascend NPUs through torch_npu (or the simulated NPU): HCCL collectives, ACL graphs.

torch_npu is imported here and nowhere else, lazily: never at module top, and its absence or
breakage ends in a clean `False` from `is_available()` or a `MissingPackageError` that names it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform as host
from pathlib import Path
from types import ModuleType

from roll_device.errors import MissingPackageError
from roll_device.packages import Package
from roll_device.platforms.base import Platform

INSTALL_HINT = (
    "install torch_npu matching your torch and CANN toolkit (see docs/install.md), "
    "or set ROLL_DEVICE=npu-sim to run the NPU code paths on the simulated NPU"
)
# Where the CANN toolkit lives: set_env.sh exports the first two; the rest are install defaults.
TOOLKIT_HOME_ENVS = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
TOOLKIT_DEFAULT_HOMES = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")
TOOLKIT_INFO_FILE = "ascend_toolkit_install.info"  # in <home>/<arch>-linux/, a `version=` line


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
    compile_backend = "eager"  # as SGLang's NPU piecewise graphs: no inductor kernels for Ascend
    allocator_conf_env = "PYTORCH_NPU_ALLOC_CONF"
    required_package = "torch_npu"
    torch_companion = Package("torch_npu", "torch-npu", matches=("torch", 2))
    toolkit_name = "CANN"
    install_hint = INSTALL_HINT

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

    @classmethod
    def toolkit_version(cls) -> str | None:
        homes = [os.environ[e] for e in TOOLKIT_HOME_ENVS if os.environ.get(e)] + list(TOOLKIT_DEFAULT_HOMES)
        for home in homes:
            info = Path(home) / f"{host.machine()}-linux" / TOOLKIT_INFO_FILE
            try:
                lines = info.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                key, _, value = line.partition("=")
                if key.strip() == "version" and value.strip():
                    return value.strip()
        return None

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
