"""NVIDIA GPUs through torch's CUDA build: NCCL collectives, CUDA graphs, CUDA IPC."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import ClassVar

import torch

from roll_device.platforms.base import Platform
from roll_device.platforms.determinism import Determinism
from roll_device.platforms.groups import group
from roll_device.platforms.kernel_env import Kernels
from roll_device.platforms.memory import Memory
from roll_device.platforms.process_env import ProcessEnv
from roll_device.platforms.profiling import NvtxMarker, Profiling
from roll_device.platforms.topology import Topology

# ---- the groups as CUDA fills them (ROCm's derive from these) ------------------------------


class CudaEnv(ProcessEnv):
    """NCCL's variables and CUDA's hardware queues."""

    training_env_vars: ClassVar[dict[str, str]] = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    collective_debug_var = "NCCL_DEBUG"
    switch_reduction_var = "NCCL_NVLS_ENABLE"
    device_connections_var = "CUDA_DEVICE_MAX_CONNECTIONS"


class CudaKernels(Kernels):
    """CUDA's extension builder, lazy module loading, Transformer Engine and cuDNN."""

    kernel_arch_var = "TORCH_CUDA_ARCH_LIST"
    module_loading_var = ("CUDA_MODULE_LOADING", "LAZY", "EAGER")
    has_transformer_engine = True
    toolkit_home_envs = ("CUDA_HOME", "CUDA_PATH")
    toolkit_default_homes = ("/usr/local/cuda",)

    def kernel_arch(self, index: int | None = None) -> str:
        """`9.0` on an H100: the form `TORCH_CUDA_ARCH_LIST` takes."""
        return "{}.{}".format(*self.platform.facts.device_capability(index))

    def set_dnn_library_enabled(self, enabled: bool) -> None:
        torch.backends.cudnn.enabled = enabled


class CudaProfiling(Profiling):
    """NVTX ranges and the Nsight capture range."""

    range_marker = NvtxMarker()
    profiler_activity_name = "CUDA"
    supports_capture_range = True


class CudaDeterminism(Determinism):
    """cuBLAS's workspace setting and cuDNN's flags."""

    deterministic_env_vars: ClassVar[dict[str, str]] = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}

    def _set_library_determinism(self, enabled: bool) -> None:
        torch.backends.cudnn.deterministic = enabled
        if enabled:  # autotuning picks kernels by timing: off while determinism is asked for
            torch.backends.cudnn.benchmark = False


class CudaTopology(Topology):
    """The PCI address from the device's properties."""

    def _pci_address(self, index: int) -> str:
        props = self.platform.facts.device_properties(index)
        ids = [getattr(props, f"pci_{part}_id", None) for part in ("domain", "bus", "device")]
        if None in ids:
            self._unsupported("pci_bus_id", "this torch build's device properties have no PCI ids")
        return "{:04x}:{:02x}:{:02x}.0".format(*ids)


class CudaMemory(Memory):
    """The caching allocator's settings, read and changed through torch's accelerator API."""

    def expandable_segments_enabled(self) -> bool:
        """Whether the caching allocator makes expandable segments now: as the settings last given
        to it say (torch 2.11+ reports them), else as this process's allocator variable says."""
        getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
        sources = [getter() if getter is not None else ""]
        names = (self.platform.allocator_conf_env, "PYTORCH_ALLOC_CONF")
        sources += [os.environ.get(name, "") for name in names]
        for settings in sources:
            pairs = dict(pair.split(":", 1) for pair in settings.split(",") if ":" in pair)
            value = pairs.get("expandable_segments")
            if value is not None:
                return value.strip().lower() == "true"
        return False

    def set_allocator_settings(self, settings: str) -> None:
        """torch 2.11+ changes them through the accelerator-wide setter (torch.cuda's own is
        deprecated there); older builds have only torch.cuda's."""
        setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
        if setter is None:
            super().set_allocator_settings(settings)
        else:
            setter(settings)


class CudaPlatform(Platform):
    kind = "cuda"
    device_type = "cuda"
    dispatch_key = "CUDA"
    ray_resource = "GPU"
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    ray_noset_visible_devices_env = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
    dist_backend = "nccl"
    graph_class_name = "CUDAGraph"
    supports_ipc = True
    allocator_conf_env = "PYTORCH_CUDA_ALLOC_CONF"
    install_hint = "install a torch build for this kind's GPUs (docs/install.md)"
    torch_build = "cuda"  # the `torch.version` attribute set by a build for this kind (CUDA vs ROCm)
    # cuMem-based NCCL buffers break sleep/wake memory release (ROLL and verl set it for that reason);
    # without record_stream, tensors freed by collectives return to the pool at once.
    collective_tuning_env: ClassVar[dict[str, str]] = {
        "NCCL_CUMEM_ENABLE": "0",
        "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
    }
    env = group(CudaEnv)
    kernels = group(CudaKernels)
    profiling = group(CudaProfiling)
    determinism = group(CudaDeterminism)
    topology = group(CudaTopology)
    memory = group(CudaMemory)

    @classmethod
    def unavailable_hint(cls) -> str:
        build = f"cuda={torch.version.cuda}, hip={getattr(torch.version, 'hip', None)}"
        return (
            f"no {cls.kind} device is visible to this torch ({build}): install a torch build for "
            f"{cls.kind} (docs/install.md) or choose another kind"
        )

    @classmethod
    def is_available(cls) -> bool:
        try:
            return getattr(torch.version, cls.torch_build, None) is not None and torch.cuda.is_available()
        except Exception:  # noqa: BLE001 - a broken driver must not break detection
            return False

    @contextlib.contextmanager
    def ipc_allocation(self) -> Iterator[None]:
        """Expandable segments off while inside: their memory (mapped with cuMem) is not what a
        CUDA IPC handle of the caching allocator shares, so a slot allocated from one could not be
        opened by the engine. Allocations inside take ordinary segments; on exit the setting goes
        back to on if it was on (worker processes get it on from `allocator_env`)."""
        expandable = self.memory.expandable_segments_enabled()
        if expandable:
            self.memory.set_expandable_segments(False)
        try:
            yield
        finally:
            if expandable:
                self.memory.set_expandable_segments(True)
