"""Kernels and the collective backend of the simulated NPU.

Factories on `npu` (no tensor argument to carry the device) reach the PrivateUse1 boxed
fallback, which builds the result on the CPU and wraps it. Ops torch calls on a simulated tensor
with the Python key excluded (so past the wrapper's dispatch) trip an internal assert through the
fallback and are registered explicitly: `aten::_copy_from` (`torch.tensor(data, device="npu")`)
and `aten::_local_scalar_dense` (`torch.tensor` of a list of device scalars reads each with
`item()`, as megatron's grad-norm fallback does; a device gives a host tensor of their values).
A few composite `out=` ops take a path for tensor subclasses that writes a new tensor instead of
`out` (`linalg.matrix_rank(out=)` leaves `out` unwritten): on a real device, whose tensors are plain,
they do not, so they get a PrivateUse1 kernel and reach the CPU whole (`_WHOLE_ON_CPU`).
The `hccl` backend is gloo registered under HCCL's name for `npu` and `cpu`: a collective on
simulated tensors reaches the wrapper's dispatch, which hands their CPU data to the CPU kernel of
the c10d op, and so to gloo. It simulates the interface of HCCL, not HCCL.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from roll_device.sim.tensor import run_on_cpu

_libraries: list = []  # keep registrations alive


def _fallback(op, *args, **kwargs):
    return run_on_cpu(op, args, kwargs)


def _copy_from(self, dst, non_blocking=False):
    # Through the same path as every op: counted, recorded under capture, refused where a device would.
    return run_on_cpu(torch.ops.aten.copy_.default, (dst, self, non_blocking), {})


def _local_scalar_dense(self):
    # Through the same path as every op: refused while a graph captures, as a device refuses it.
    return run_on_cpu(torch.ops.aten._local_scalar_dense.default, (self,), {})


# Composite out= overloads whose subclass path skips `out` (torch 2.13's matrix_rank_impl assigns
# `result = at::sum(...)` when isTensorSubclassLike(input)): found by tests/sim/opinfo_checks.py.
_WHOLE_ON_CPU = (
    "linalg_matrix_rank.out",
    "linalg_matrix_rank.out_tol_tensor",
    "linalg_matrix_rank.atol_rtol_tensor_out",
    "linalg_matrix_rank.atol_rtol_float_out",
)


def _whole_on_cpu(name: str):
    packet, overload = name.split(".")
    op = getattr(getattr(torch.ops.aten, packet), overload)
    return lambda *args, **kwargs: run_on_cpu(op, args, kwargs)


def register_kernels() -> None:
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_fallback, dispatch_key="PrivateUse1", with_keyset=False)
    aten = torch.library.Library("aten", "IMPL")
    aten.impl("_copy_from", _copy_from, "PrivateUse1")
    aten.impl("_local_scalar_dense", _local_scalar_dense, "PrivateUse1")
    for name in _WHOLE_ON_CPU:
        aten.impl(name, _whole_on_cpu(name), "PrivateUse1")
    _libraries.extend([fallback, aten])


def register_hccl() -> None:
    if "hccl" in dist.Backend.backend_list:
        return
    dist.Backend.register_backend("hccl", _create_hccl_group, devices=["npu", "cpu"])


def _create_hccl_group(store, rank, world_size, timeout=timedelta(minutes=30)):
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)
