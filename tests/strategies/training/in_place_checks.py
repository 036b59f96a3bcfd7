"""Run in each of 2 gloo ranks (tests/strategies/training/test_in_place_collectives.py): the
in-place collectives next to torch's own on the same inputs, and the whole-tensor gather to one
rank, with the sends, receives and broadcasts each rank made (`point_to_point_calls`, which the
FSDP checks use too)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from strategies.training.in_place_collectives import InPlaceAllGather, InPlaceReduceScatter, whole_tensor


@contextlib.contextmanager
def point_to_point_calls() -> Iterator[list[tuple[str, torch.dtype]]]:
    """The calls this rank makes to torch.distributed's send, recv and broadcast while inside, as
    (function, dtype of the tensor), in order; the real functions run."""
    calls: list[tuple[str, torch.dtype]] = []
    real = {name: getattr(dist, name) for name in ("send", "recv", "broadcast")}

    def recording(name):
        def call(tensor, *args, **kwargs):
            calls.append((name, tensor.dtype))
            return real[name](tensor, *args, **kwargs)

        return call

    try:
        for name in real:
            setattr(dist, name, recording(name))
        yield calls
    finally:
        for name, function in real.items():
            setattr(dist, name, function)


def compare(rank: int) -> dict:
    group = dist.group.WORLD
    world = group.size()
    g = torch.Generator().manual_seed(rank)
    out: dict[str, bool] = {}
    shard = torch.randn(6, generator=g)
    gathered = InPlaceAllGather().allocate((6 * world,), dtype=shard.dtype, device=shard.device)
    gathered.view(world, -1)[rank].copy_(shard)  # where FSDP copies the shard in
    InPlaceAllGather()(gathered, gathered.view(world, -1)[rank], group)
    expected = torch.empty(6 * world)
    dist.all_gather_into_tensor(expected, shard)
    out["all_gather"] = torch.equal(gathered, expected)
    for name, op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG)):
        grads = torch.randn(4 * world, generator=g)
        reduced = torch.empty(4)
        InPlaceReduceScatter()(reduced, grads.clone(), group, op)
        expected = torch.empty(4)
        dist.reduce_scatter_tensor(expected, grads, op=dist.ReduceOp.SUM)
        if op == dist.ReduceOp.AVG:
            expected /= world
        out[f"reduce_scatter_{name}"] = torch.allclose(reduced, expected, atol=1e-6)
    mesh = init_device_mesh("cpu", (world,))
    for rows in (7, 1):  # uneven shards; a rank with none
        full = torch.arange(rows * 3, dtype=torch.float32).view(rows, 3)
        out[f"whole_{rows}_rows"] = torch.equal(
            whole_tensor(distribute_tensor(full, mesh, [Shard(0)]), True), full
        )
        with point_to_point_calls() as calls:
            to_first = whole_tensor(distribute_tensor(full, mesh, [Shard(0)]), True, to_rank=0)
        out[f"to_rank_0_{rows}_rows"] = torch.equal(to_first, full) if rank == 0 else to_first is None
        # rank 0 only receives, the other rank only sends its shard (none when it holds none)
        expected = [("recv", full.dtype)] * (rows > 1) if rank == 0 else [("send", full.dtype)] * (rows > 1)
        out[f"to_rank_0_{rows}_rows_calls"] = calls == expected
    replicated = distribute_tensor(torch.ones(2, 2), mesh, [Replicate()])
    out["whole_replicated"] = torch.equal(whole_tensor(replicated, True), torch.ones(2, 2))
    to_second = whole_tensor(replicated, True, to_rank=1)
    out["replicated_to_rank_1"] = torch.equal(to_second, torch.ones(2, 2)) if rank == 1 else to_second is None
    return out
