"""The preflight of `run` on the simulated cluster (real Ray nodes on this machine; the NPU node
declares NPUs it does not have and its task checks it as the simulated NPU): roles the node can
serve pass, a vLLM rollout without vllm_ascend is refused in seconds, before any worker starts."""

import time

import pytest
import ray

from roll_device.cluster import read_inventory, start_cluster
from roll_device.doctor.preflight import PreflightError, preflight
from roll_device.pipeline.run_plan import RunPlan, build_run_plan
from tests.configs import cluster_settings, run_config

SIM = [
    "cluster=sim",
    "cluster.head.num_cpus=1",
    "cluster.nodes=[{name: npu-node, num_cpus: 1, resources: {NPU: 4}}]",
]
NPU_ROLES = [
    "roles.actor_train.device=npu",
    "roles.actor_train.num_devices=2",
    "roles.actor_infer.device=npu",
    "roles.actor_infer.num_devices=2",
]
MISSING_ASCEND = (
    "node npu-node: role actor_infer (npu): the vllm strategy on npu needs the package vllm_ascend "
    "(vllm-ascend), which is not installed"
)


@pytest.fixture(scope="module")
def cluster():
    handle = start_cluster(cluster_settings(*SIM))
    yield handle
    handle.shutdown()


def planned(*overrides: str) -> RunPlan:
    """The run's plan on the connected cluster, as `run` makes it."""
    return build_run_plan(run_config(*overrides), read_inventory())


def test_roles_the_simulated_npu_node_can_serve_pass(cluster):
    plan = planned(*SIM, *NPU_ROLES, "rollout=hf")  # FSDP and the hf rollout need nothing more
    assert preflight(plan.placement, list(plan.requests)) == 2, "the head (reward) and the NPU node"


def test_vllm_without_vllm_ascend_on_a_simulated_npu_node_is_refused_in_seconds(cluster):
    plan = planned(*SIM, *NPU_ROLES)
    started = time.perf_counter()
    with pytest.raises(PreflightError) as refused:
        preflight(plan.placement, list(plan.requests))
    assert time.perf_counter() - started < 30
    message = str(refused.value)
    assert message.startswith("preflight found 2 problem(s) before any worker started:\n")
    assert MISSING_ASCEND in message
    assert "role actor_train" not in message and "node head" not in message


def test_run_is_refused_by_preflight_before_any_worker_starts(cluster, tmp_path, capsys, monkeypatch):
    """`roll-device run` in this process, on the cluster it is connected to (as a run joins one)."""
    from roll_device.cli import main

    monkeypatch.setenv("ROLL_DEVICE_HOME", str(tmp_path))
    remote = ["cluster=remote", f"cluster.address={cluster.address}"]
    assert main(["run", *remote, *NPU_ROLES, "max_steps=1", f"hydra.run.dir={tmp_path / 'run'}"]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "workers ready" not in out
    errors = err[err.index("roll-device run: error:") :].splitlines()
    assert errors[0] == "roll-device run: error: preflight found 2 problem(s) before any worker started:"
    assert len(errors) == 3 and all(
        line.startswith("  node npu-node: role actor_infer (npu): ") for line in errors[1:]
    )
    assert any(line.strip().startswith(MISSING_ASCEND) for line in errors[1:])
    created = {actor["ActorClassName"] for actor in ray._private.state.actors().values()}
    assert not created & {"RolloutWorker", "TrainWorker", "RewardWorker"}, created
