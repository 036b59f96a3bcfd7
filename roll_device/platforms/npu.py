"""Ascend NPUs through torch_npu (or the simulated NPU): HCCL collectives, ACL graphs.

torch_npu is imported here and nowhere else, lazily: never at module top, and its absence or
breakage ends in a clean `False` from `is_available()` or a `MissingPackageError` that names it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform as host
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import ClassVar

from roll_device.packages import Package
from roll_device.platforms.base import Platform
from roll_device.platforms.determinism import Determinism
from roll_device.platforms.device_facts import DeviceFacts, physical_device_id
from roll_device.platforms.groups import group
from roll_device.platforms.kernel_env import Kernels
from roll_device.platforms.memory import Memory
from roll_device.platforms.process_env import ProcessEnv
from roll_device.platforms.profiling import MstxMarker, Profiling
from roll_device.platforms.topology import Topology
from roll_device.sim.devices import COUNT_ENV as SIM_COUNT_ENV

INSTALL_HINT = (
    "install torch_npu matching your torch and CANN toolkit (see docs/install.md), "
    "or set ROLL_DEVICE=npu-sim to run the NPU code paths on the simulated NPU"
)
# Where the CANN toolkit lives: set_env.sh exports the first two; the rest are install defaults.
TOOLKIT_HOME_ENVS = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
TOOLKIT_DEFAULT_HOMES = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")
TOOLKIT_INFO_FILE = "ascend_toolkit_install.info"  # in <home>/<arch>-linux/, a `version=` line
# HCCL logs through CANN's logger: per module, 0 debug, 1 info, 2 warning, 3 error (NCCL's names).
HCCL_LOG_LEVELS = {"TRACE": 0, "INFO": 1, "WARN": 2, "VERSION": 3}
NPU_SMI = "npu-smi"  # Ascend's device tool (NVML's counterpart): where PCI addresses come from
SIMULATED_NPU = "npu-sim"  # the `ROLL_DEVICE` value of the simulated NPU (roll_device/sim)


# ---- the groups as Ascend fills them --------------------------------------------------------


class NpuEnv(ProcessEnv):
    """HCCL's ports and log level; MindSpeed's hardware queues."""

    training_env_vars: ClassVar[dict[str, str]] = {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1"
    }  # read by MindSpeed as by Megatron
    # Processes that share an NPU each need their own HCCL ports: "auto" picks free ones.
    collective_port_range_vars = ("HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE")
    device_connections_var = "CUDA_DEVICE_MAX_CONNECTIONS"  # read by MindSpeed as by Megatron

    def collective_debug_env(self, level: str = "WARN") -> dict[str, str]:
        """HCCL's log level, through CANN's per-module level (NCCL's names, as on the GPUs)."""
        super().collective_debug_env(level)  # checks the name
        return {"ASCEND_MODULE_LOG_LEVEL": f"HCCL={HCCL_LOG_LEVELS[level.upper()]}"}


class NpuKernels(Kernels):
    """CANN's toolkit home; no Transformer Engine."""

    toolkit_home_envs = TOOLKIT_HOME_ENVS
    toolkit_default_homes = TOOLKIT_DEFAULT_HOMES


class NpuDeterminism(Determinism):
    """HCCL's deterministic reductions and Ascend's matmul switch."""

    # Deterministic HCCL reductions, and the matmul switch verl sets for Ascend determinism.
    deterministic_env_vars: ClassVar[dict[str, str]] = {
        "HCCL_DETERMINISTIC": "true",
        "CLOSE_MATMUL_K_SHIFT": "1",
    }


class NpuProfiling(Profiling):
    """mstx ranges and torch_npu's profiler (torch's own on the simulation)."""

    range_marker = MstxMarker()
    profiler_package = "torch_npu.profiler"
    profiler_activity_name = "NPU"

    def profiler_module(self) -> ModuleType:
        if self.platform.simulated:  # the simulation runs CPU kernels: torch's own profiler sees them
            import torch

            return torch.profiler
        return super().profiler_module()

    def profiler_activity(self):
        if self.platform.simulated:
            return self.profiler_module().ProfilerActivity.CPU
        return super().profiler_activity()


class NpuFacts(DeviceFacts):
    """SoC names for architectures, physical ids for UUIDs."""

    def device_capability(self, index: int | None = None) -> tuple[int, int]:
        self._unsupported("device_capability", "Ascend devices have no compute capability: use device_arch()")

    def device_arch(self, index: int | None = None) -> str:
        """The SoC name (`Ascend910B2`): what Ascend kernels are built for."""
        return self.platform.device_name(index)

    def device_uuid(self, index: int | None = None) -> str:
        """`NPU-<physical id>`: torch_npu reports no hardware UUID; the physical id names the device
        on its node (as verl names it)."""
        return f"NPU-{physical_device_id(self.platform.visible_devices_env, self._index(index))}"


class NpuTopology(Topology):
    """PCI addresses from `npu-smi`."""

    def _pci_address(self, index: int) -> str:
        """From `npu-smi`: its map of logical devices to (NPU id, chip id), then that chip's
        board record, whose `PCIe Bus Info` line holds the address (spelled with or without spaces)."""
        logical = physical_device_id(self.platform.visible_devices_env, index)
        for line in self._npu_smi("info", "-m").splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3 and fields[2] == logical:
                board = self._npu_smi("info", "-t", "board", "-i", fields[0], "-c", fields[1])
                found = re.search(r"PCIe\s*Bus\s*Info\s*:\s*([0-9A-Fa-f:.]+)", board)
                if found:
                    return found.group(1)
        self._unsupported("pci_bus_id", f"{NPU_SMI} reports no PCI address for device {logical}")

    def _npu_smi(self, *args: str) -> str:
        """The output of `npu-smi *args`; a missing tool fails naming the member that needed it."""
        tool = shutil.which(NPU_SMI)
        if tool is None:
            self._unsupported("pci_bus_id", f"{NPU_SMI} is not installed here (it comes with the NPU driver)")
        return subprocess.run([tool, *args], check=True, capture_output=True, text=True, timeout=30).stdout


class NpuMemory(Memory):
    """torch_npu's allocator, which has no workspace call of its own."""

    def clear_library_workspaces(self) -> None:
        """torch_npu offers no Python call that frees its operator workspaces alone (its workspace
        allocator empties itself when an allocation fails); `empty_cache` frees the caching
        allocator's unused blocks, the closest it offers."""
        self.platform.empty_cache()


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
    # HCCL's link-setup and per-operation timeouts (seconds); its default 120 s connect timeout is
    # shorter than a large model's first weight sync.
    collective_timeout_envs = ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT")
    launch_blocking_env = "ASCEND_LAUNCH_BLOCKING"  # incompatible with ACL graph mode
    simulated_kind = SIMULATED_NPU
    simulated_count_env = SIM_COUNT_ENV
    env = group(NpuEnv)
    kernels = group(NpuKernels)
    determinism = group(NpuDeterminism)
    profiling = group(NpuProfiling)
    facts = group(NpuFacts)
    topology = group(NpuTopology)
    memory = group(NpuMemory)

    @classmethod
    def unavailable_hint(cls) -> str:
        return f"no usable Ascend NPU: {INSTALL_HINT}"

    @classmethod
    def is_available(cls) -> bool:
        from roll_device import sim

        if sim.is_installed():
            return True
        try:
            if importlib.util.find_spec(cls.required_package) is None:
                return False
            import torch

            importlib.import_module(cls.required_package)
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
            self._import_required_package()
        import torch

        return torch.npu

    def rollout_env(self, graph_mode: bool) -> dict[str, str]:
        # Task queue level 1 is what ACL graph capture supports; level 2 is faster when eager.
        return {"TASK_QUEUE_ENABLE": "1" if graph_mode else "2"}
