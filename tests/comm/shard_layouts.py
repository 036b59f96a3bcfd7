"""The full tensors that trainer ranks' slices make together, for tests of an `export_shards`:
each rank's (name, local part, Shard) placed at its box, once the sharded sync's plan accepts the
ranks' layouts (every element held, slices disjoint or identical replicas)."""

from __future__ import annotations

import torch

from roll_device.comm.shards import Box, Shard, ShardPlan, plan_shards

Slices = list[tuple[str, torch.Tensor, Shard]]


def assembled(ranks: list[Slices]) -> tuple[dict[str, torch.Tensor], ShardPlan]:
    """The whole tensors of every rank's `Slices` (in rank order), and the plan that sends them
    to one engine rank that needs every tensor whole."""
    plan = plan_shards([{name: shard for name, _, shard in rank} for rank in ranks], [None])
    full: dict[str, torch.Tensor] = {}
    for rank in ranks:
        for name, part, shard in rank:
            whole = full.setdefault(name, torch.full(shard.full_shape, float("nan"), dtype=part.dtype))
            whole[shard.box.within(Box.whole(shard.full_shape))] = part
    return full, plan
