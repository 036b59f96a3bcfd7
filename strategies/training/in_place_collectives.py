"""All-gather and reduce-scatter in the caller's buffers, for a collective backend whose own ones
copy the whole tensor through a temporary (`Platform.collectives_copy_whole`: gloo, whose
`all_gather_into_tensor`, `reduce_scatter_tensor` and so `DTensor.full_tensor` peak at twice the
gathered bytes, where an in-place `all_reduce` or `broadcast` takes none). An FSDP2 trainer of a
Qwen2.5-0.5B-shaped model gathers and reduces its root unit (the 151,936 x 896 embedding, 519 MiB
in fp32) in every forward, backward and weight export: each would hold one more copy of it.

- `InPlaceAllGather` (FSDP2's all-gather): FSDP copies each rank's shard into its place in the
  output first; each rank's part is then broadcast from it, in place.
- `InPlaceReduceScatter` (FSDP2's reduce-scatter): an in-place all-reduce of the input (a buffer
  FSDP frees afterwards), then this rank's part copied out (divided by the world for AVG).
- `whole_tensor`: a DTensor sharded on dim 0 gathered into one new tensor (the weight export),
  on every rank by broadcasts, or on one rank only (a weight sync's sender) by sends to it: the
  other ranks then receive nothing and allocate nothing.

On gloo they also take less time (0.5x to 0.7x at that size, benchmarks/rank_memory.py). They
move more bytes than fused collectives (the all-reduce twice a reduce-scatter's): for a backend
whose collectives stage, not for NCCL or HCCL.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.distributed.tensor import DTensor, Shard

SUMS = (dist.ReduceOp.SUM, dist.ReduceOp.AVG)  # the reductions done by an all-reduce here


def broadcast_parts(parts: Sequence[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Rank r's `parts[r]` to every rank, in place (empty parts skipped)."""
    for rank, part in enumerate(parts):
        if part.numel():
            dist.broadcast(part, src=dist.get_global_rank(group, rank), group=group)


class _Allocate:
    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class InPlaceAllGather(_Allocate, AllGather):
    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False) -> None:
        parts = output_tensor.view(group.size(), -1)
        own = parts[group.rank()]
        if own.data_ptr() != input_tensor.data_ptr():
            own.copy_(input_tensor)
        broadcast_parts(parts.unbind(0), group)


class InPlaceReduceScatter(_Allocate, ReduceScatter):
    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        if op not in SUMS:
            return dist.reduce_scatter_tensor(
                output_tensor, input_tensor, op=op, group=group, async_op=async_op
            )
        dist.all_reduce(input_tensor, op=dist.ReduceOp.SUM, group=group)
        output_tensor.copy_(input_tensor.view(group.size(), -1)[group.rank()])
        if op == dist.ReduceOp.AVG:
            output_tensor.div_(group.size())
        return None


def use_in_place_collectives(model: torch.nn.Module) -> None:
    """Every FSDP unit of `model` gathers and reduces in place."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(InPlaceAllGather())
            module.set_custom_reduce_scatter(InPlaceReduceScatter())


def receive_parts(parts: Sequence[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Each other rank r's `parts[r]` into its place on this rank, in place (empty parts
    skipped): the receiving end of every other rank sending its own part here."""
    for rank, part in enumerate(parts):
        if rank != group.rank() and part.numel():
            dist.recv(part, group_src=rank, group=group)


def whole_tensor(tensor: torch.Tensor, in_place: bool, to_rank: int | None = None) -> torch.Tensor | None:
    """The full tensor of a DTensor (every rank calls), on every rank, or with `to_rank` (a global
    rank) on that rank alone: the others get None. With `in_place`, one sharded on dim 0 of a 1-D
    mesh of several ranks is gathered into one new tensor (by sends to `to_rank` alone, where
    given), any other by `full_tensor` (on one rank that is the local tensor, not a copy); a plain
    tensor is returned as it is."""
    if isinstance(tensor, DTensor):
        mesh = tensor.device_mesh
        if in_place and tensor.placements == (Shard(0),) and mesh.ndim == 1 and mesh.size() > 1:
            return _gathered_shards(tensor, to_rank)
        tensor = tensor.full_tensor()  # on one rank: the local tensor itself, no copy
    return tensor if to_rank is None or dist.get_rank() == to_rank else None


def _gathered_shards(tensor: DTensor, to_rank: int | None) -> torch.Tensor | None:
    group = tensor.device_mesh.get_group()
    local = tensor.to_local()
    dst = None if to_rank is None else dist.get_group_rank(group, to_rank)
    if dst is not None and group.rank() != dst:  # a sender of its shard only
        if local.numel():
            dist.send(local.contiguous(), group_dst=dst, group=group)
        return None
    out = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    parts = list(out.chunk(group.size())) if out.shape[0] else []  # Shard(0)'s split: torch.chunk's
    parts += [out[:0]] * (group.size() - len(parts))
    if parts[group.rank()].shape != local.shape:
        raise RuntimeError(
            f"shard of shape {tuple(local.shape)} is not torch.chunk's part of {tuple(out.shape)}"
        )
    parts[group.rank()].copy_(local)
    if dst is None:
        broadcast_parts(parts, group)
    else:
        receive_parts(parts, group)
    return out
