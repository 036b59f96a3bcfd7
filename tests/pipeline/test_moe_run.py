"""`experiment=moe`: GRPO on the tiny Qwen3-MoE (FSDP2 trainer, HF engine, a weight sync each
step) raises the digits task's reward on the CPU, with the router's metrics in every record; the
Megatron expert-parallel layout runs on the simulated NPU node (a simulation)."""

import json

import pytest

from roll_device.commands.run import run_checked
from roll_device.pipeline.workers import RolloutWorker, TrainWorker
from tests.configs import run_config


@pytest.mark.slow
def test_the_moe_experiment_raises_the_reward_in_30_steps(tmp_path, shared_cluster):
    config = run_config(*shared_cluster, "experiment=moe", "max_steps=30", "save_every=0")
    run_dir = run_checked(config, tmp_path / "run")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in records]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.05, f"reward did not rise: {rewards}"
    for record in records:
        assert record["weights_version"] == record["step"]
        assert 1.0 <= record["expert_imbalance"] <= 4.0 and record["router_aux_loss"] > 1.9


@pytest.mark.slow
def test_routing_replay_runs_with_the_hf_engines_routes(tmp_path, shared_cluster):
    """The HF engine records routes, the batch carries them to the FSDP2 trainer, which replays them:
    in fp32 on both sides the trainer's logprobs are the sampler's."""
    overrides = ["experiment=moe", "rollout=hf", "trainer.routing_replay=true", "max_steps=3", "save_every=0"]
    run_dir = run_checked(run_config(*shared_cluster, *overrides), tmp_path / "run")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert record["rollout_vs_train_logprob_gap"] < 1e-4


@pytest.mark.slow
def test_megatron_expert_parallel_on_the_simulated_npu_node(tmp_path):
    """A SIMULATION: `cluster=sim` (a local Ray cluster whose NPU node declares NPUs it does not have),
    the Megatron trainer with expert_parallel=2 on two simulated NPUs of that node (megatron-core
    through the CUDA redirects, the all-to-all dispatcher over the simulated hccl, which is gloo),
    the HF engine on a third. Two steps: each trains (the exported weights change), and the engine
    holds the trainer's weights after each sync."""
    seen = {"records": [], "trainer_hashes": [], "engine_hashes": []}

    def on_step(record, roles):
        seen["records"].append(record)
        seen["infos"] = roles.groups["actor_train"].infos
        seen["trainer_hashes"].append(roles.call("actor_train", TrainWorker.export_hash))
        seen["engine_hashes"].append(roles.call("actor_infer", RolloutWorker.engine_hash))

    overrides = [
        "cluster=sim",
        "experiment=moe",
        "trainer=megatron",
        "trainer.expert_parallel=2",
        "roles.actor_train.device=npu",
        "roles.actor_train.num_devices=2",
        "roles.actor_infer.device=npu",
        "rollout=hf",
        "algorithm.kl_coef=0",
        "max_steps=2",
        "save_every=0",
    ]
    run_checked(run_config(*overrides), tmp_path / "run", on_step=on_step)

    for info in seen["infos"]:
        assert (info["platform"], info["node_name"], info["simulated"]) == (
            "npu (simulated)",
            "npu-node",
            True,
        )
    records = seen["records"]
    assert [(r["weights_version"], r["sync_senders"]) for r in records] == [(1, 2), (2, 2)]
    assert all(r["rollout_vs_train_logprob_gap"] < 0.05 for r in records), "the rollout follows the trainer"
    first, second = seen["trainer_hashes"]
    assert first[0] == first[1] and second[0] == second[1], "both ranks export every expert"
    assert first[0] != second[0], "the second step trained"
    assert seen["engine_hashes"] == [[first[0]], [second[0]]], "the engine holds the trainer's weights"
