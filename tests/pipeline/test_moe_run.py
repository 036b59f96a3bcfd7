"""`experiment=moe`: GRPO on the tiny Qwen3-MoE (FSDP2 trainer, HF engine, a weight sync each
step) raises the digits task's reward on the CPU, with the router's metrics in every record."""

import json

import pytest

from roll_device.commands.run import run_checked
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
def test_megatron_expert_parallel_runs_on_two_simulated_npus(tmp_path):
    """SIMULATED: Megatron with expert_parallel=2 on the sim cluster's NPU node (each rank holds 4
    of the 8 experts; the all-to-all over the simulated hccl backend), the HF engine on the CPU head;
    two steps, each rank sending its own experts to the engine."""
    seen = {"records": []}

    def on_step(record, roles):
        seen["records"].append(record)
        seen["infos"] = roles.groups["actor_train"].infos

    overrides = [
        "experiment=moe",
        "cluster=sim",
        "trainer=megatron",
        "trainer.expert_parallel=2",
        "rollout=hf",
        "roles.actor_train.device=npu",
        "roles.actor_train.num_devices=2",
        "roles.actor_infer.device=cpu",
        "algorithm.kl_coef=0",
        "max_steps=2",
        "save_every=0",
    ]
    run_checked(run_config(*overrides), tmp_path / "run", on_step=on_step)
    assert [(i["platform"], i["device"]) for i in seen["infos"]] == [("npu (simulated)", "npu:0")] * 2
    records = seen["records"]
    assert [(r["step"], r["weights_version"], r["sync_senders"]) for r in records] == [(1, 1, 2), (2, 2, 2)]
    for record in records:
        assert 1.0 <= record["expert_imbalance"] <= 4.0 and record["sync_bytes"] > 0
        assert record["rollout_vs_train_logprob_gap"] < 0.05, "the engine follows the trainer"
