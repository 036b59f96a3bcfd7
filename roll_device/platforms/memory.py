"""`platform.memory`: memory beyond the counters the framework reads (`memory_allocated`,
`max_memory_allocated`, `mem_get_info` stay on the platform): the reserved bytes and their peak, the
allocator's stats, the memory every process uses on a device, a per-process fraction, IPC
collection, memory history and snapshots, allocator settings changed in the running process,
library workspaces, pinned host memory (a tensor pinned, a buffer allocated pinned), and host memory
registered (page-locked) in place.

Caching-allocator internals (`memory._record_memory_history`, `_dump_snapshot`,
`_set_allocator_settings`) are reached under the same names in `torch.cuda.memory` and torch_npu's
`torch.npu.memory`; a module without one makes the member raise `NotImplementedError`.
"""

from __future__ import annotations

from typing import Any

import torch

from roll_device.platforms.groups import PlatformGroup


class Memory(PlatformGroup):
    """The memory group; the CPU and CUDA name subclasses (`CpuMemory`, `CudaMemory`)."""

    attribute = "memory"

    def _memory_call(self, member: str, torch_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call `torch.<device>.memory.<torch_name>` for the member `member`."""
        fn = getattr(getattr(self.platform.device_module(), "memory", None), torch_name, None)
        if fn is None:
            self._unsupported(member, f"torch.{self.platform.device_type}.memory has no '{torch_name}'")
        return fn(*args, **kwargs)

    def memory_reserved(self) -> int:
        """Bytes the caching allocator holds from the device (in use or cached for reuse)."""
        return int(self._call("memory_reserved", "memory_reserved"))

    def max_memory_reserved(self) -> int:
        return int(self._call("max_memory_reserved", "max_memory_reserved"))

    def memory_stats(self) -> dict[str, Any]:
        """The allocator's counters under torch's names (`allocated_bytes.all.current`, ...)."""
        return dict(self._call("memory_stats", "memory_stats"))

    def device_memory_used(self, index: int | None = None) -> int:
        """Bytes in use on device `index` by every process (what the vendor's tool reports), not
        only by this one: the device's total less what the driver reports free."""
        free, total = self._call("device_memory_used", "mem_get_info", self._index(index))
        return int(total) - int(free)

    def set_memory_fraction(self, fraction: float) -> None:
        """Cap this process's allocations on the current device at `fraction` of its memory."""
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"platform '{self.platform.name}': memory fraction {fraction} is not in (0, 1]")
        # As a float: torch_npu and torch.cuda refuse an int (TypeError), even 1.
        self._call("set_memory_fraction", "set_per_process_memory_fraction", float(fraction))

    def ipc_collect(self) -> None:
        """Free memory that other processes opened through IPC handles and have released."""
        self._call("ipc_collect", "ipc_collect")

    def record_memory_history(self, enabled: bool = True, max_entries: int = 100_000) -> None:
        """Start (or stop) recording allocations with stack traces, for `dump_memory_snapshot`."""
        self._memory_call(
            "record_memory_history",
            "_record_memory_history",
            "all" if enabled else None,
            max_entries=max_entries,
        )

    def dump_memory_snapshot(self, path: str) -> None:
        """Write the recorded allocation history to `path` (pickle for pytorch.org/memory_viz)."""
        self._memory_call("dump_memory_snapshot", "_dump_snapshot", path)

    def set_allocator_settings(self, settings: str) -> None:
        """Change the caching allocator's settings in this process (`"expandable_segments:False"`)."""
        self._memory_call("set_allocator_settings", "_set_allocator_settings", settings)

    def set_expandable_segments(self, enabled: bool) -> None:
        """Turn expandable segments on or off in this process (off around sleep and IPC sharing)."""
        self.set_allocator_settings(f"expandable_segments:{enabled}")

    def clear_library_workspaces(self) -> None:
        """Release the workspaces math libraries keep (cuBLAS / hipBLAS) before sleeping."""
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is None:
            self._unsupported("clear_library_workspaces", "this torch build has no cuBLAS workspaces")
        clear()

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` in page-locked host memory where the platform `supports_pinned_memory`; else
        unchanged."""
        if not self.platform.supports_pinned_memory or tensor.is_pinned():
            return tensor
        return tensor.pin_memory()

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        """A flat uint8 host buffer of `nbytes`, allocated page-locked where the platform
        `supports_pinned_memory` (so this kind's devices copy to and from it asynchronously), else
        in ordinary host memory."""
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.platform.supports_pinned_memory)

    def _host_memory(self, member: str, tensor: torch.Tensor) -> tuple[int, int]:
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError(
                f"platform '{self.platform.name}': memory.{member} takes a contiguous host tensor, "
                f"not {tensor.device}"
            )
        return tensor.data_ptr(), tensor.numel() * tensor.element_size()

    def register_host_memory(self, tensor: torch.Tensor) -> None:
        """Page-lock `tensor`'s host memory in place (no copy, unlike `pin_memory`), so that this
        kind's devices copy to and from it asynchronously; `unregister_host_memory` undoes it."""
        address, nbytes = self._host_memory("register_host_memory", tensor)
        self._runtime_call("register_host_memory", "cudaHostRegister", address, nbytes, 0)

    def unregister_host_memory(self, tensor: torch.Tensor) -> None:
        address, _ = self._host_memory("unregister_host_memory", tensor)
        self._runtime_call("unregister_host_memory", "cudaHostUnregister", address)

    def _runtime_call(self, member: str, name: str, *args: Any) -> None:
        """`<device module>.cudart().<name>(*args)`: the runtime bindings torch has for CUDA and
        ROCm and torch_npu for Ascend, under CUDA's names; a status other than 0 raises."""
        cudart = getattr(self.platform.device_module(), "cudart", None)
        if cudart is None:
            self._unsupported(
                member, "this kind's runtime bindings have no host registration: use memory.pin_memory()"
            )
        status = getattr(cudart(), name)(*args)
        if int(status) != 0:
            raise RuntimeError(f"platform '{self.platform.name}': {name} failed with status {int(status)}")
