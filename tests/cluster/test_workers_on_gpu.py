"""On a real GPU, through Ray: what Ray assigns each worker is what the worker computes on. Two
roles share the one GPU with fractional requests (as a colocated trainer and rollout do); each
worker's Ray accelerator id, the visible-device variable Ray set, the device the platform binds and
the UUID of the device its tensors live on must agree with each other and with the driver's list
of GPUs. Needs a CUDA or ROCm GPU and Ray; skipped cleanly without one (CI has none)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
]


def gpu_uuids() -> list[str]:
    """Every GPU's UUID in the driver's order, read here (outside Ray, all devices visible)."""
    return [f"GPU-{torch.cuda.get_device_properties(i).uuid}" for i in range(torch.cuda.device_count())]


def test_colocated_workers_compute_on_the_gpu_ray_assigned():
    from roll_device.cluster import WorkerGroup, build_plan, read_inventory, start_cluster
    from tests.cluster.role_workers import DeviceIdentityWorker
    from tests.cluster.test_plan import roles
    from tests.configs import cluster_settings

    uuids = gpu_uuids()
    cluster = cluster_settings("cluster.num_cpus=2")
    with start_cluster(cluster):
        plan = build_plan(
            roles(train=("auto", 1), infer=("auto", 1, "train")), read_inventory(), cluster.cpu_per_worker
        )
        assert {role: p.kind for role, p in plan.roles.items()} == {"train": "cuda", "infer": "cuda"}
        groups = {role: WorkerGroup(plan, role, DeviceIdentityWorker) for role in plan.roles}
        seen = {role: group.call_rank0(DeviceIdentityWorker.identity) for role, group in groups.items()}
        for group in groups.values():
            group.kill()
    for role, worker in seen.items():
        assert worker["platform"] == "cuda" and worker["visible_devices_env"] == "CUDA_VISIBLE_DEVICES"
        (assigned,) = worker["accelerator_ids"]
        assert worker["visible_devices"] == assigned, f"{role}: Ray narrows the visible list to its GPU"
        assert worker["local_device_index"] == 0 and worker["current_index"] == 0
        assert worker["tensor_device"] == "cuda:0"
        assert worker["uuid"] == uuids[int(assigned)], f"{role} computes on another GPU than Ray assigned"
    assert seen["train"]["accelerator_ids"] == seen["infer"]["accelerator_ids"], "colocated: one GPU"
    assert seen["train"]["pid"] != seen["infer"]["pid"]
