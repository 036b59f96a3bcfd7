"""The run's plan (roll_device/pipeline/run_plan.py): everything the run derives from its
configuration and a cluster's nodes, made in one place. Planned on declared inventories: no Ray."""

import ast
from pathlib import Path

import pytest

from roll_device.cluster import Inventory, NodeInfo
from roll_device.errors import ConfigError
from roll_device.pipeline.run_plan import build_run_plan, plan_here
from tests.configs import run_config

ROOT = Path(__file__).resolve().parents[2]
HOST = Inventory((NodeInfo("h" * 56, "10.0.0.1", "head", cpus=4, is_head=True),))
MIXED = Inventory(
    (
        NodeInfo("h" * 56, "10.0.0.1", "head", cpus=8, is_head=True, devices={"npu": 2}),
        NodeInfo("g" * 56, "10.0.0.2", "gpus", cpus=8, devices={"cuda": 2}),
    )
)
# what only the plan derives: placing roles, choosing the sync path
PLANNING_CALLS = {"build_plan", "plan_sync"}
# the vLLM engine's own in-process update (one process feeding itself), not a run's sync
OWN_SYNC = {"strategies/inference/vllm.py"}


def test_the_default_plan_hosts_the_reference_and_bridges_to_the_rollout():
    plan = build_run_plan(run_config(), HOST)
    assert plan.sync.path == "bridge" and not plan.colocated
    assert plan.hosted == {"reference": "actor_train"}
    assert {role: p.kind for role, p in plan.platforms.items()} == dict.fromkeys(plan.roles, "cpu")
    assert [(r.role, r.colocated) for r in plan.requests] == [
        ("actor_infer", False),
        ("actor_train", False),
        ("reference", False),
        ("reward", False),
    ]


def test_two_kinds_sync_by_the_bridge_and_take_no_turns():
    config = run_config(
        "roles.actor_train.device=npu",
        "roles.actor_infer.device=cuda",
        "roles.actor_infer.colocate_with=null",
        "rollout=hf",
    )
    plan = build_run_plan(config, MIXED)
    assert (plan.sync.path, plan.sync.src_kind, plan.sync.dst_kind) == ("bridge", "npu", "cuda")
    assert not plan.colocated
    assert plan.strategy("actor_infer").__name__ == "HfStrategy"
    assert plan.summary().startswith("actor_infer on cuda, actor_train on npu")


def test_the_sync_knows_the_node_of_every_trainer_rank_and_every_engine_process():
    """The sharded sync opens one link per trainer rank and engine node: the plan names each end's
    node (every process of a tensor-parallel engine receives, on its worker's node)."""
    config = run_config(
        "roles.actor_train.device=npu",
        "roles.actor_train.num_devices=2",
        "roles.actor_infer.device=cuda",
        "roles.actor_infer.num_devices=2",
        "roles.actor_infer.colocate_with=null",
        "rollout=hf",
    )
    nodes = build_run_plan(config, MIXED).sync_nodes(engine_size=3)
    head, gpus = (node.node_id for node in MIXED.nodes)
    assert nodes.trainer == (head, head)
    assert nodes.engines == (gpus,) * 6


def test_an_engine_that_cannot_take_the_sync_path_is_refused_when_planned():
    config = run_config(
        "weight_sync.path=rdt",
        "rollout.tensor_parallel_size=2",
        "roles.actor_infer.num_devices=2",
        "roles.actor_infer.colocate_with=null",
        "cluster.num_cpus=8",
    )
    with pytest.raises(ConfigError, match=r"weight_sync.path=rdt reaches only a vLLM engine of one rank"):
        plan_here(config)  # what `run` and `plan` do before Ray starts


def test_a_colocated_rollout_takes_turns_with_the_trainer():
    plan = build_run_plan(run_config("roles.actor_infer.colocate_with=actor_train"), HOST)
    assert plan.sync.path == "colocated" and plan.colocated
    assert next(r for r in plan.requests if r.role == "actor_infer").colocated


def _calls(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute)
    }


def test_the_plan_is_derived_in_one_place():
    planners = {
        str(path.relative_to(ROOT))
        for folder in ("roll_device", "strategies")
        for path in (ROOT / folder).rglob("*.py")
        if _calls(path) & PLANNING_CALLS
    }
    assert planners - OWN_SYNC == {"roll_device/pipeline/run_plan.py"}


def test_ppos_critic_is_a_role_of_the_plan_on_the_trainers_devices():
    config = run_config("algorithm=ppo", "critic.lr=2e-5")
    plan = build_run_plan(config, HOST)
    assert list(plan.roles) == ["actor_infer", "actor_train", "reward", "critic"]  # no KL: no reference
    assert plan.placement.colocated("critic", "actor_train")
    assert plan.strategy("critic").__name__ == "FsdpCriticStrategy"
    critic = next(r for r in plan.requests if r.role == "critic")
    assert (critic.strategy_type, critic.strategy, critic.settings.lr) == ("critic", "fsdp", 2e-5)
    assert (
        critic.settings.model_copy(update={"lr": config.trainer.lr}) == config.trainer
    )  # else the trainer's


def test_a_megatron_policys_critic_is_megatrons_on_as_many_devices_as_the_trainer():
    config = run_config(
        "algorithm=ppo", "trainer=megatron", "trainer.pipeline_parallel=2", "roles.actor_train.num_devices=2"
    )
    plan = build_run_plan(config, HOST)
    assert plan.strategy("critic").__name__ == "MegatronCriticStrategy"
    assert config.roles.critic.num_devices == 2, "the critic follows roles.actor_train.num_devices"
    assert plan.placement.colocated("critic", "actor_train")


def test_on_the_simulated_cluster_the_critic_runs_on_the_cpu_beside_an_npu_trainer():
    config = run_config(
        "cluster=sim",
        "experiment=mixed_devices",
        "algorithm=ppo",
        "roles.critic.device=cpu",
        "roles.critic.colocate_with=null",
    )
    plan = plan_here(config)  # the declared nodes: no Ray
    kinds = {role: where.kind for role, where in plan.placement.roles.items()}
    assert kinds == {"actor_infer": "cuda", "actor_train": "npu", "reward": "cpu", "critic": "cpu"}
    assert plan.platforms["critic"].kind == "cpu" and plan.placement.roles["actor_train"].simulated
