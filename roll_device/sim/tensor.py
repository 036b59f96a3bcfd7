"""Simulated NPU tensors: a wrapper subclass on the renamed PrivateUse1 device (`npu`) that keeps a
real CPU tensor inside and computes every op on the CPU.

This is a simulation: no NPU kernel, memory limit or stream semantics are modelled. The memory
accounting counts the bytes of live simulated storages per device index, nothing more.
"""

from __future__ import annotations

import threading
import weakref

import torch
from torch.utils._pytree import tree_map

DEVICE_TYPE = "npu"


class _MemoryLedger:
    """Bytes held by live simulated storages, per device index, with a peak per device."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[tuple[int, int], list[int]] = {}  # (device, storage key) -> [nbytes, refs]
        self.allocated: dict[int, int] = {}
        self.peak: dict[int, int] = {}

    def track(self, wrapper: torch.Tensor, elem: torch.Tensor, index: int) -> None:
        storage = elem.untyped_storage()
        try:
            key = (index, storage.data_ptr())
        except RuntimeError:  # a wrapper tensor (an async collective's result) owns no storage
            key = (index, -id(elem))
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                entry = self._live[key] = [storage.nbytes(), 0]
                self.allocated[index] = self.allocated.get(index, 0) + entry[0]
                self.peak[index] = max(self.peak.get(index, 0), self.allocated[index])
            entry[1] += 1
        weakref.finalize(wrapper, self._release, key)

    def _release(self, key: tuple[int, int]) -> None:
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del self._live[key]
                self.allocated[key[0]] -= entry[0]

    def reset_peak(self, index: int) -> None:
        with self._lock:
            self.peak[index] = self.allocated.get(index, 0)


LEDGER = _MemoryLedger()


class SimNpuTensor(torch.Tensor):
    """A tensor that reports `npu:N` and holds its data in a CPU tensor `elem`."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, index: int):
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=torch.device(DEVICE_TYPE, index),
            requires_grad=elem.requires_grad,
        )
        wrapper.elem = elem
        LEDGER.track(wrapper, elem, index)
        return wrapper

    def untyped_storage(self) -> torch.UntypedStorage:
        """The wrapped CPU data's storage: the wrapper's own is a placeholder without a data
        pointer, and code that compares or resizes storages (FSDP2) must see the real one."""
        return self.elem.untyped_storage()

    def __repr__(self) -> str:  # pragma: no cover - convenience only
        return f"SimNpuTensor({self.elem!r}, device='{self.device}')"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return run_on_cpu(func, args, kwargs or {})

    def __reduce_ex__(self, protocol):
        # Pickling (torch.save, Ray) keeps the device: the data travels as a CPU tensor.
        return (_rebuild, (self.elem.detach().clone(), self.device.index or 0))


def run_on_cpu(func, args, kwargs):
    """Run `func` on the CPU data of its arguments and give results the device the op asked for.

    An in-place or `out=` result comes back as the very tensor the caller passed; a result bound
    for the CPU (`.cpu()`, `.item()`, `copy_` into a CPU tensor) stays a CPU tensor.
    """
    index = _first_index(args, kwargs)
    passed = {}  # id(cpu data) -> the tensor the caller passed (a wrapper or a plain CPU tensor)

    def remember(x):
        if isinstance(x, torch.Tensor):
            passed[id(x.elem if isinstance(x, SimNpuTensor) else x)] = x
        return x

    tree_map(remember, args)
    tree_map(remember, kwargs)
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    target = kwargs.get("device")
    if func in _RETURNS_CPU or (target is not None and torch.device(target).type != DEVICE_TYPE):
        return out

    def rewrap(t):
        if isinstance(t, torch.Tensor):
            return passed[id(t)] if id(t) in passed else SimNpuTensor(t, index)
        return t

    return tree_map(rewrap, out)


def _rebuild(elem: torch.Tensor, index: int) -> SimNpuTensor:
    return SimNpuTensor(elem, index)


_RETURNS_CPU = {torch.ops.aten._local_scalar_dense.default}


def _unwrap(x):
    if isinstance(x, SimNpuTensor):
        return x.elem
    if isinstance(x, torch.device) and x.type == DEVICE_TYPE:
        return torch.device("cpu")
    return x


def _first_index(args, kwargs) -> int:
    found = []

    def visit(x):
        if not found:
            if isinstance(x, SimNpuTensor):
                found.append(x.device.index or 0)
            elif isinstance(x, torch.device) and x.type == DEVICE_TYPE:
                found.append(x.index if x.index is not None else current_index())
        return x

    tree_map(visit, args)
    tree_map(visit, kwargs or {})
    return found[0] if found else current_index()


_current = {"index": 0}


def current_index() -> int:
    """The process-wide current simulated device index."""
    return _current["index"]


def set_current_index(index: int) -> None:
    _current["index"] = index
