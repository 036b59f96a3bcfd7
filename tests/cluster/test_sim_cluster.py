"""Roles on the simulated heterogeneous cluster (real Ray nodes on this machine that declare NPUs
and GPUs they do not have): where each worker lands, what it binds, colocation, dispatch, and
plans refused before any worker starts. Every device result here is a simulation."""

import pytest
import ray

from roll_device.cluster import DispatchError, WorkerGroup, read_inventory, shard, start_cluster
from roll_device.cluster.placement import release
from roll_device.commands.plan import plan_command
from roll_device.errors import ConfigError, PlanError
from roll_device.pipeline.run_plan import build_run_plan
from tests.cluster.role_workers import DeviceIdentityWorker, ProbeWorker
from tests.configs import cluster_settings, run_config

NODES = (
    "[{name: npu-node, num_cpus: 1, resources: {NPU: 4}}, {name: gpu-node, num_cpus: 1, num_gpus: 2}, "
    "{name: amd-node, num_cpus: 1, num_gpus: 1, accelerator_type: AMD-Instinct-MI300X}]"
)
SIM = ["cluster=sim", "cluster.head.num_cpus=1", f"cluster.nodes={NODES}"]
ROLES = [
    "roles.actor_train.device=npu",
    "roles.actor_train.num_devices=2",
    "roles.reference.device=auto",
    "roles.reference.num_devices=2",
    "roles.reference.colocate_with=actor_train",
    "roles.actor_infer.device=cuda",
    "roles.actor_infer.num_devices=2",
    "roles.reward.device=cpu",
    "roles.reward.num_devices=1",
]


@pytest.fixture(scope="module")
def cluster():
    handle = start_cluster(cluster_settings(*SIM))
    yield handle
    handle.shutdown()


@pytest.fixture(scope="module")
def placed(cluster):
    config = run_config(*SIM, *ROLES)
    plan = build_run_plan(config, read_inventory()).placement
    groups = {role: WorkerGroup(plan, role, ProbeWorker, scale=2.0) for role in plan.roles}
    yield plan, groups
    for group in groups.values():
        group.kill()
    release(plan)


def test_inventory_reads_declared_accelerators(cluster):
    nodes = {n.name: n for n in read_inventory().nodes}
    assert set(nodes) == {"head", "npu-node", "gpu-node", "amd-node"}
    assert nodes["head"].is_head and nodes["head"].devices == {} and not nodes["head"].simulated
    assert nodes["npu-node"].devices == {"npu": 4} and nodes["npu-node"].simulated
    assert nodes["gpu-node"].devices == {"cuda": 2} and nodes["gpu-node"].simulated
    assert (
        nodes["amd-node"].devices == {"rocm": 1}
        and nodes["amd-node"].accelerator_type == "AMD-Instinct-MI300X"
    )


def test_each_worker_lands_on_its_planned_node_and_binds_its_kind(placed):
    plan, groups = placed
    expected = {  # kind, visible-devices variable, platform the worker computes with
        "actor_train": ("npu", "ASCEND_RT_VISIBLE_DEVICES", "npu (simulated)"),
        "reference": ("npu", "ASCEND_RT_VISIBLE_DEVICES", "npu (simulated)"),
        "actor_infer": ("cuda", "CUDA_VISIBLE_DEVICES", "cpu"),
        "reward": ("cpu", None, "cpu"),
    }
    for role, (kind, visible_env, platform) in expected.items():
        for rank, info in enumerate(groups[role].infos):
            slot = plan.roles[role].slots[rank]
            assert (info["role"], info["rank"], info["kind"]) == (role, rank, kind)
            assert info["node_id"] == slot.node_id and info["node_name"] == slot.node_name
            assert info["platform"] == platform and info["simulated"] == (kind != "cpu")
            assert info["visible_devices_env"] == visible_env
            if visible_env:
                assert info["visible_devices"] == ",".join(info["accelerator_ids"])
                assert len(info["accelerator_ids"]) == 1 and info["local_device_index"] == 0
            else:
                assert info["accelerator_ids"] == [] and info["visible_devices"] is None
    names = {role: {i["node_name"] for i in groups[role].infos} for role in expected}
    assert names == {
        "actor_train": {"npu-node"},
        "reference": {"npu-node"},
        "actor_infer": {"gpu-node"},
        "reward": {"head"},
    }
    train_ids = [i["accelerator_ids"][0] for i in groups["actor_train"].infos]
    assert len(set(train_ids)) == 2, "the two NPU workers must get distinct devices"
    assert [i["device"] for i in groups["actor_train"].infos] == ["npu:0", "npu:0"]


def test_colocated_reference_shares_the_trainer_devices(placed):
    plan, groups = placed
    train, ref = groups["actor_train"].infos, groups["reference"].infos
    assert [(i["node_id"], i["accelerator_ids"]) for i in ref] == [
        (i["node_id"], i["accelerator_ids"]) for i in train
    ]
    assert {i["pid"] for i in ref}.isdisjoint(i["pid"] for i in train)
    assert plan.roles["reference"].shares == (0.5, 0.5)


def test_dispatch_patterns(placed):
    _, groups = placed
    infer = groups["actor_infer"]
    assert infer.scatter_gather(ProbeWorker.weighted_sum, shard([1.0, 2.0, 3.0, 4.0, 5.0], 2)) == [
        (0, 6.0, "cpu"),
        (1, 24.0, "cpu"),
    ]  # shards [1, 2] and [3, 4, 5], times 2
    assert groups["actor_train"].call_all(ProbeWorker.weighted_sum, [1.0]) == [
        (0, 2.0, "npu:0"),
        (1, 2.0, "npu:0"),
    ]
    assert groups["reward"].call_rank0(ProbeWorker.weighted_sum, [0.5]) == (0, 1.0, "cpu")
    refs = infer.async_call_all(ProbeWorker.weighted_sum, [3.0])
    assert [r[1] for r in ray.get(refs)] == [6.0, 6.0]
    addr, port = groups["actor_train"].master_addr_port()
    assert addr == groups["actor_train"].infos[0]["ip"] and 0 < port < 65536
    with pytest.raises(DispatchError, match=r"3 shards for the 2 workers of role 'actor_infer'"):
        infer.scatter_gather(ProbeWorker.weighted_sum, [[1.0]] * 3)


def test_dispatch_takes_the_worker_method_itself(placed):
    """A method's name in a string, or another worker class's method, is refused before any call."""
    _, groups = placed
    infer = groups["actor_infer"]
    by_name = (
        "'weighted_sum' is not a method of ProbeWorker: pass the worker method itself "
        "(e.g. ProbeWorker.info), not its name or another class's"
    )
    elsewhere = by_name.replace("'weighted_sum'", "DeviceIdentityWorker.identity")
    one, shards = ([1.0],), ([[1.0], [2.0]],)
    dispatches = [
        (infer.call_all, one),
        (infer.async_call_all, one),
        (infer.call_rank0, one),
        (infer.async_call_rank0, one),
        (infer.scatter_gather, shards),
        (infer.async_scatter, shards),
    ]
    for method, message in (("weighted_sum", by_name), (DeviceIdentityWorker.identity, elsewhere)):
        for dispatch, args in dispatches:
            with pytest.raises(DispatchError) as refused:
                dispatch(method, *args)
            assert str(refused.value) == message, dispatch.__name__
    assert infer.call_all(ProbeWorker.info)[0]["role"] == "actor_infer", "inherited methods pass"


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (  # counts the batch splits into: the config is fine, the cluster too small
            ["roles.actor_train.num_devices=8"],
            PlanError,
            r"role 'actor_train' wants 8 npu device\(s\), but only 4 of the cluster's 4 are available",
        ),
        (
            ["roles.actor_infer.num_devices=4"],
            PlanError,
            r"role 'actor_infer' wants 4 cuda device\(s\), but only 2",
        ),
        (
            ["roles.reference.device=cuda"],
            PlanError,
            r"role 'reference' wants 2 cuda device\(s\) colocated with 'actor_train', which runs on npu",
        ),
        (
            ["roles.reward.device=hypothetical"],
            ConfigError,
            r"roles.reward.device='hypothetical': valid values",
        ),
    ],
)
def test_plans_that_do_not_fit_fail_before_any_worker_starts(cluster, overrides, error, message):
    groups_before = ray.util.placement_group_table()
    with pytest.raises(error, match=message):
        plan_command(SIM + ROLES + overrides)  # the CLI's plan step, on the connected sim cluster
    assert ray.util.placement_group_table() == groups_before, "no placement group, so no worker, was made"
    assert ray.is_initialized(), "plan must not tear down a connection it did not make"


def test_plan_command_prints_the_device_map(cluster, capsys):
    assert plan_command(SIM + ROLES) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.split("device plan:")[1].strip().splitlines()[1:]}
    assert rows["actor_train"][:5] == ["actor_train", "npu", "2", "npu-node", "0,1"]
    assert rows["reference"][7] == "actor_train"
    assert rows["actor_infer"][:4] == ["actor_infer", "cuda", "2", "gpu-node"]
    assert rows["reward"][:4] == ["reward", "cpu", "1", "head"]
