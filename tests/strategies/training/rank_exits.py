"""Rank functions for tests/strategies/training/test_local_ranks.py, run in spawned ranks."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def exits(rank: int, code: int) -> None:
    """Rank 0's process ends at once, without a result (as a killed or crashed one does), once
    every rank is past the group's set-up (a rank still joining it would fail with a connection
    error of its own first); the others keep running, as ranks waiting on a lost peer do."""
    dist.barrier()
    if rank == 0:
        os._exit(code)
    time.sleep(600)


def threads(rank: int) -> tuple[int, int]:
    """This rank's world size and the intra-op threads its torch computes with."""
    return dist.get_world_size(), torch.get_num_threads()
