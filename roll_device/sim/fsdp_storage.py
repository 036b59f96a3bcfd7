"""FSDP2 on the simulated NPU: free and re-allocate the CPU data of simulated parameters.

FSDP2 frees an unsharded parameter after use by resizing its storage to zero, and allocates it
again before the next all-gather. A simulated tensor's own storage is a placeholder (its data
lives in the CPU tensor it wraps), so resizing it fails ("invalid python storage"). Here the
two FSDP helpers resize the wrapped CPU storage instead, which frees real memory as FSDP means
to; tensors of any other device go to FSDP's own helpers unchanged.
"""

from __future__ import annotations

import torch

from roll_device.sim.tensor import SimNpuTensor


def _resize(tensor: SimNpuTensor, nbytes: int) -> None:
    storage = tensor.elem.untyped_storage()
    if storage.size() != nbytes:
        storage.resize_(nbytes)


def patch() -> None:
    """Route FSDP2's storage helpers through the simulation for simulated tensors (idempotent)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    original_alloc, original_free = _fsdp_param.alloc_storage, _fsdp_param.free_storage
    if getattr(original_alloc, "roll_device_sim", False):
        return

    def alloc_storage(tensor: torch.Tensor) -> None:
        if isinstance(tensor, SimNpuTensor):
            _resize(tensor, tensor.numel() * tensor.itemsize)
        else:
            original_alloc(tensor)

    def free_storage(tensor: torch.Tensor) -> None:
        if isinstance(tensor, SimNpuTensor):
            _resize(tensor, 0)
        else:
            original_free(tensor)

    alloc_storage.roll_device_sim = True
    _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc_storage
    _fsdp_param.free_storage = free_storage
