"""The process group a trainer runs in, and the few collectives both trainers share.

With a world size above one the hosting worker initializes torch.distributed (the platform's
backend) before `initialize`. With none initialized, a trainer makes a single-rank group itself
(the platform's backend over an in-memory store, no port) and destroys it at `shutdown`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from roll_device.errors import ConfigError
from roll_device.platforms.base import Platform


def ensure_process_group(platform: Platform) -> bool:
    """Join the existing default group or create a single-rank one; True when created here."""
    if dist.is_initialized():
        backend = dist.get_backend()
        if platform.dist_backend not in str(backend):
            raise ConfigError(
                f"torch.distributed was initialized with backend '{backend}', but this trainer "
                f"runs on {platform.name}, whose backend is '{platform.dist_backend}': initialize "
                "the group with platform.dist_backend"
            )
        return False
    dist.init_process_group(platform.dist_backend, store=dist.HashStore(), rank=0, world_size=1)
    return True


def release_process_group(created: bool) -> None:
    """Destroy the default group if this trainer created it."""
    if created and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: list[float], device: torch.device, group=None) -> list[float]:
    """Element-wise sum of `values` over the ranks of `group` (default: the world)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, group=group)
    return tensor.cpu().tolist()


def all_reduce_max(value: int, device: torch.device, group=None) -> int:
    """The largest `value` over the ranks of `group` (default: the world)."""
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return int(tensor.item())


def check_same_rows(rows: int, device: torch.device, group=None) -> None:
    """Raise on every rank when the ranks of `group` got batches of different sizes (a sharded
    model needs the same number of forward passes on every rank)."""
    if dist.get_world_size(group) == 1:
        return
    bounds = torch.tensor([rows, -rows], dtype=torch.int64, device=device)
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX, group=group)
    largest, smallest = int(bounds[0]), -int(bounds[1])
    if largest != smallest:
        raise ConfigError(
            f"data-parallel ranks got batches of {smallest} to {largest} rows: split the batch "
            "evenly over the trainer's ranks"
        )


def check_same_tokens(input_ids: torch.Tensor, device: torch.device, group) -> None:
    """Raise on every rank when the ranks of `group` (the tensor- and pipeline-parallel ranks
    that compute one model replica together) got different token ids."""
    if dist.get_world_size(group) == 1:
        return
    weights = torch.arange(1, input_ids.numel() + 1, dtype=torch.float64).view_as(input_ids)
    digest = float((input_ids.double() * weights).sum())
    bounds = torch.tensor(
        [digest, -digest, input_ids.numel(), -input_ids.numel()], dtype=torch.float64, device=device
    )
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX, group=group)
    if bounds[0] != -bounds[1] or bounds[2] != -bounds[3]:
        raise ConfigError(
            "ranks of one model replica (its tensor- and pipeline-parallel ranks) got different rows: "
            "give them the same batch (data-parallel ranks get their own)"
        )
