"""Simulated NPU tensors: a wrapper subclass on the renamed PrivateUse1 device (`npu`) that keeps a
real CPU tensor inside and computes every op on the CPU.

Every op on a simulated tensor passes `run_on_cpu`, which is where the device's rules apply: a new
storage is counted against its device's memory (and refused past the capacity, `memory.py`); while
a graph captures on the current stream, the op is recorded for replay (`graphs.py`), and an op that
needs the host (`.item()`, `.tolist()`, a blocking copy to the host, printing) fails as torch_npu
fails (`errors.py`). No NPU kernel is modelled: the numerics are the CPU's.

A wrapper reports what its data reports (shape, strides, offset, dtype, layout, conj/neg bits),
after every op: an op that changes its data's metadata in place (`resize_`, `t_`, an `out=` result
resized by its kernel) is followed by the wrapper (`_resync`). Sparse layouts are wrapped too.
`tests/sim/test_opinfo_conformance.py` holds it to the CPU over PyTorch's OpInfo database.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import get_alias_info
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from roll_device.sim import errors, graphs
from roll_device.sim.devices import DEVICE_TYPE, checked, current_index
from roll_device.sim.memory import LEDGER

aten = torch.ops.aten


class SimNpuTensor(torch.Tensor):
    """A tensor that reports `npu:N` and holds its data in a CPU tensor `elem`."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, index: int, tracked: bool = True):
        strided = elem.layout == torch.strided
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride() if strided else None,
            storage_offset=elem.storage_offset() if strided else None,
            dtype=elem.dtype,
            layout=elem.layout,
            device=torch.device(DEVICE_TYPE, index),
            requires_grad=elem.requires_grad,
            # A wrapper cannot hold a compressed sparse layout (CSR, CSC, BSR, BSC) itself: asked
            # for its layout (`prim::layout`), it answers with the wrapped data's.
            dispatch_layout=elem.layout not in _OWN_LAYOUTS,
        )
        _copy_math_bits(wrapper, elem)
        wrapper.elem = elem
        if tracked:
            _track(wrapper, elem, index)
        return wrapper

    @property
    def data(self) -> torch.Tensor:
        """A detached alias, as torch gives it."""
        return _TENSOR_DATA.__get__(self)

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        """`t.data = other` makes `t` a tensor on `other`'s memory, as on a device (megatron's DDP
        maps every parameter into its contiguous buffer so): the swap alone gives the wrapper
        `other`'s metadata while it would go on computing with, and counting, its old CPU data."""
        _TENSOR_DATA.__set__(self, new)
        if isinstance(new, SimNpuTensor) and new.elem is not self.elem:
            # a deep copy's `_counted` is a copy of its original's release, registered nowhere and
            # inert: its old storage is then counted until it dies
            released = getattr(self, "_counted", None)
            self.elem = new.elem
            _track(self, new.elem, self.device.index)
            if released is not None:
                released()

    def untyped_storage(self) -> torch.UntypedStorage:
        """The wrapped CPU data's storage: the wrapper's own is a placeholder without a data
        pointer, and code that compares or resizes storages (FSDP2) must see the real one."""
        return self.elem.untyped_storage()

    def tolist(self):
        """The values on the host, as a device gives them (a copy to the host)."""
        _refuse_in_capture(self, errors.host_copy_in_capture, "Tensor.tolist()")
        return self.elem.tolist()

    def __repr__(self, *, tensor_contents=None) -> str:
        _refuse_in_capture(self, errors.host_copy_in_capture, "printing a device tensor")
        return f"SimNpuTensor({self.elem!r}, device='{self.device}')"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return run_on_cpu(func, args, kwargs or {})

    def __reduce_ex__(self, protocol):
        # Pickling (torch.save, Ray) keeps the device: the data travels as a CPU tensor.
        return (_rebuild, (self.elem.detach().clone(), self.device.index or 0))


def _copy_math_bits(wrapper: SimNpuTensor, elem: torch.Tensor) -> None:
    """The conjugate and negative bits of the wrapped data: composite ops read them on the wrapper
    (`resolve_conj` before an FFT, for one), and the Conjugate/Negative fallbacks act on them."""
    torch._C._set_conj(wrapper, elem.is_conj())
    torch._C._set_neg(wrapper, elem.is_neg())


def _track(wrapper: SimNpuTensor, elem: torch.Tensor, index: int) -> None:
    if elem.layout != torch.strided:  # sparse: the memory of its indices and values
        nbytes = sum(part.untyped_storage().nbytes() for part in _sparse_parts(elem))
        key = (index, -id(elem))
    else:
        storage = elem.untyped_storage()
        nbytes, key = storage.nbytes(), _storage_key(storage, index)
    capture = graphs.capture_for(index)
    wrapper._counted = LEDGER.track(wrapper, key, nbytes, capture.pool if capture else None)


def _storage_key(storage: torch.UntypedStorage, index: int) -> tuple[int, int]:
    """The ledger's key of a storage: the storage itself, which keeps its identity when resized in
    place (its data pointer does not) and is shared by every view of it."""
    return (index, storage._cdata)


def _sparse_parts(elem: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if elem.layout == torch.sparse_coo:
        return elem._indices(), elem._values()
    if elem.layout in (torch.sparse_csr, torch.sparse_bsr):
        return elem.crow_indices(), elem.col_indices(), elem.values()
    return elem.ccol_indices(), elem.row_indices(), elem.values()


def _metadata(t: torch.Tensor) -> tuple:
    """What a wrapper reports about itself and must share with the data it wraps."""
    if t.layout != torch.strided:
        return t.shape, t.is_conj(), t.is_neg()
    return t.shape, t.stride(), t.storage_offset(), t.is_conj(), t.is_neg()


def _resync(wrapper: SimNpuTensor) -> None:
    """Give `wrapper` its data's shape, strides and offset again after an op changed them in place
    (`resize_`, `unsqueeze_`, `t_`, an `out=` result resized by the kernel, as `arange` and `eye`
    do), and count a storage that grew or shrank with it."""
    if _metadata(wrapper) == _metadata(wrapper.elem):
        return
    wrapper.data = SimNpuTensor(wrapper.elem, wrapper.device.index, tracked=False)
    if wrapper.layout == torch.strided:
        storage = wrapper.elem.untyped_storage()
        LEDGER.resize(_storage_key(storage, wrapper.device.index), storage.nbytes())


def follow_storage_resizes() -> None:
    """Count a storage resized directly (`UntypedStorage.resize_`, which bypasses every op) in the
    memory ledger, as a device allocator frees or allocates the storage's block; a storage of no
    simulated tensor is not in the ledger and costs one lookup."""
    resize = torch._C.StorageBase.resize_

    def resize_and_count(storage: torch.UntypedStorage, nbytes: int) -> torch.UntypedStorage:
        resize(storage, nbytes)
        LEDGER.storage_resized(storage._cdata, storage.nbytes())
        return storage

    torch.UntypedStorage.resize_ = resize_and_count


def _refuse_in_capture(tensor: SimNpuTensor, error, what: str) -> None:
    if graphs.capture_for(tensor.device.index) is not None:
        raise error(what)


def _histc_of_integers(input, bins=100, min=0, max=0):
    """`histc` of an integer tensor, which device kernels count (transformers' grouped MoE experts
    count their tokens so off the CPU) and the CPU's refuses: counted in float64, returned in the
    input's dtype; a floating-point input as the CPU counts it."""
    if input.is_floating_point():
        return aten.histc.default(input, bins, min, max)
    return aten.histc.default(input.double(), bins, min, max).to(input.dtype)


class _DeviceKernel:
    """An op computed as a device computes it where the CPU's kernel lacks that: called in the op's
    place, and recorded in its place by a graph capture (with the op's schema)."""

    def __init__(self, op, compute) -> None:
        self._schema = op._schema
        self.compute = compute

    def __call__(self, *args, **kwargs):
        return self.compute(*args, **kwargs)


# ops whose CPU kernel lacks what a device's has, and how the simulation computes them instead
_DEVICE_KERNELS = {aten.histc.default: _DeviceKernel(aten.histc.default, _histc_of_integers)}


def run_on_cpu(func, args, kwargs):
    """Run `func` on the CPU data of its arguments and give results the device the op asked for.

    An in-place or `out=` result comes back as the very tensor the caller passed; a result bound
    for the CPU (`.cpu()`, `.item()`, `copy_` into a CPU tensor) stays a CPU tensor.
    """
    flat, spec = tree_flatten((args, kwargs))  # once: every op of a simulated run passes here
    index = _first_index(flat, kwargs)
    capture = graphs.capture_for(index)
    if capture is not None:
        _refuse_host_access(func, args, kwargs)
    # id(cpu data) -> the tensor the caller passed (a wrapper or a plain CPU tensor)
    passed = {
        id(x.elem if isinstance(x, SimNpuTensor) else x): x for x in flat if isinstance(x, torch.Tensor)
    }
    cpu_args, cpu_kwargs = tree_unflatten([_unwrap(x) for x in flat], spec)
    kernel = _DEVICE_KERNELS.get(func, func)
    out = _call_as_passed(kernel, cpu_args, cpu_kwargs, passed.values())
    if capture is not None:
        capture.record(kernel, cpu_args, cpu_kwargs, out)
    if func in _RETURNS_CPU or _to_host(kwargs):
        return out
    if func in _SETS_STORAGE:  # a view of memory set from a data pointer (a weak reference)
        return _point_at(args[0], out)
    if func._schema.is_mutable:
        for tensor in passed.values():
            if isinstance(tensor, SimNpuTensor):
                _resync(tensor)

    def rewrap(t):
        if isinstance(t, torch.Tensor):
            return passed[id(t)] if id(t) in passed else SimNpuTensor(t, index)
        return t

    result = rewrap(out) if isinstance(out, torch.Tensor) else tree_map(rewrap, out)
    _share_storage_with_bases(func, args, result)
    return result


def _share_storage_with_bases(func, args, result) -> None:
    """Give the results of a view op their base's storage, as a device's views have: composite
    kernels ask whether two tensors alias (`is_alias_of`), and a wrapper's own storage is not its
    data's. `matmul(out=)` with a batch of matrices and a vector copied its result onto itself
    when the view of `out` it had computed into seemed to be other memory, and the CPU refused."""
    matches = get_alias_info(func).read_only_alias_match_indexes
    if not matches:
        return
    outs = result if isinstance(result, tuple) else (result,)
    for arg_index, out_index in matches:
        base, views = args[arg_index], outs[out_index]
        for view in views if isinstance(views, list) else [views]:
            if _strided_wrapper(base) and _strided_wrapper(view) and view is not base:
                torch._functionalize_unsafe_set(view, base)


def _strided_wrapper(t) -> bool:
    """A simulated tensor with a storage to share (sparse layouts have none)."""
    return isinstance(t, SimNpuTensor) and t.elem.layout == torch.strided


def _call_as_passed(func, cpu_args, cpu_kwargs, passed):
    """`func` on the CPU data, which report the `requires_grad` of the tensors the caller passed.

    A device kernel sees its own tensors, flag included, and a few kernels decide from it what to
    compute: `sparse.mm(csr, dense, "amax"/"amin")` keeps the argmax its backward reads only when an
    input requires grad; without it the backward read past an empty index and took the process down.
    The wrapped data are plain tensors: the flag is set for the call and cleared after it, and the
    call runs below autograd (as this point of the dispatch already is), so nothing is recorded."""
    flagged = [
        t.elem for t in passed if isinstance(t, SimNpuTensor) and t.requires_grad and not t.elem.requires_grad
    ]
    if not flagged:
        return func(*cpu_args, **cpu_kwargs)
    for elem in flagged:
        elem.requires_grad_(True)
    try:
        with torch._C._AutoDispatchBelowAutograd():
            return func(*cpu_args, **cpu_kwargs)
    finally:
        for elem in flagged:
            elem.requires_grad_(False)


def _point_at(wrapper: SimNpuTensor, elem: torch.Tensor) -> SimNpuTensor:
    """Make `wrapper` a view of `elem` in place (shape included), not counted as new memory."""
    wrapper.elem = elem
    _resync(wrapper)
    return wrapper


def _rebuild(elem: torch.Tensor, index: int) -> SimNpuTensor:
    return SimNpuTensor(elem, index)


_TENSOR_DATA = torch._C.TensorBase.__dict__["data"]  # torch's own `Tensor.data` (get and set)
_OWN_LAYOUTS = (torch.strided, torch.sparse_coo)
_RETURNS_CPU = {aten._local_scalar_dense.default}
_SETS_STORAGE = {aten.set_.source_Storage, aten.set_.source_Storage_storage_offset}
# Ops whose result is a host value read from device memory: a stream synchronization.
_HOST_READS = {
    aten._local_scalar_dense.default: "Tensor.item() or bool(tensor) (aten::_local_scalar_dense)",
    aten.equal.default: "torch.equal",
}


def _to_host(kwargs) -> bool:
    target = kwargs.get("device")
    return target is not None and torch.device(target).type != DEVICE_TYPE


def _refuse_host_access(func, args, kwargs) -> None:
    """Raise torch_npu's error for an op that needs the host while a graph captures."""
    if func in _HOST_READS:
        raise errors.host_sync_in_capture(_HOST_READS[func])
    if func is aten._to_copy.default and _to_host(kwargs) and not kwargs.get("non_blocking"):
        raise errors.host_copy_in_capture("a copy to the host (Tensor.cpu(), Tensor.to('cpu'))")
    if func is aten.copy_.default and _blocking_to_host(args, kwargs):
        raise errors.host_copy_in_capture("a blocking copy into a host tensor (Tensor.copy_)")


def _blocking_to_host(args, kwargs) -> bool:
    """Whether `copy_(dst, src, non_blocking)` copies a device tensor into a host one and waits."""
    non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    return not isinstance(args[0], SimNpuTensor) and isinstance(args[1], SimNpuTensor) and not non_blocking


def _unwrap(x):
    if isinstance(x, SimNpuTensor):
        return x.elem
    if isinstance(x, torch.device) and x.type == DEVICE_TYPE:
        return torch.device("cpu")
    if isinstance(x, torch.UntypedStorage) and x.device.type == DEVICE_TYPE:
        return _host_storage(x)
    return x


def _host_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """The CPU memory an `npu` storage built from a data pointer points at: the captured tensor
    that owns it where there is one (kept alive with the view), else the bare memory."""
    owner = graphs.storage_owner(storage.data_ptr())
    if owner is not None:
        return owner.untyped_storage()
    return torch._C._construct_storage_from_data_pointer(
        storage.data_ptr(), torch.device("cpu"), storage.nbytes()
    )


def _first_index(flat: list, kwargs) -> int:
    """The device index of the op's results: the `device` it names (checked: torch_npu refuses an
    index the machine does not have), else that of its first simulated tensor among the op's
    arguments (`flat`, in order), else the current one."""
    target = kwargs.get("device")
    if target is not None and torch.device(target).type == DEVICE_TYPE:
        target = torch.device(target)
        return checked(target.index if target.index is not None else current_index())
    for x in flat:
        if isinstance(x, SimNpuTensor):
            return x.device.index or 0
        if isinstance(x, torch.device) and x.type == DEVICE_TYPE:
            return checked(x.index if x.index is not None else current_index())
    return checked(current_index())
