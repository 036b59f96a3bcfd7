"""Weight-sync paths from a GPU trainer process: colocated through device IPC handles (every
process on GPU 0), and the bridge to CPU rollout processes. Needs a CUDA or ROCm GPU; skipped
cleanly without one (CI has none). The same-kind collective needs one GPU per process (NCCL
refuses two ranks on one device) and is not covered here."""

from __future__ import annotations

import pytest
import torch

import roll_device as rd
from tests.comm.scenarios import assert_synced, run_twice

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
]


@pytest.fixture(scope="module")
def gpu_kind():
    return rd.current_platform().kind


@pytest.mark.parametrize(
    ("dst", "placement", "expected", "device"),
    [
        ("same", {"colocated": True}, "colocated: {kind} -> {kind} via device IPC handles", "cuda:0"),
        ("cpu", {}, "bridge: {kind} -> cpu via host shared memory", "cpu"),
    ],
    ids=["colocated-ipc", "bridge-to-cpu"],
)
def test_gpu_path(cpu_workers, gpu_kind, dst, placement, expected, device):
    run = run_twice(cpu_workers, gpu_kind, gpu_kind if dst == "same" else dst, "auto", **placement)
    assert run.plan.startswith(expected.format(kind=gpu_kind))
    assert_synced(run, device)
