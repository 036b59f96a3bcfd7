"""Role plans on given inventories (no Ray): kinds, placement, colocation, and every refusal."""

import pytest

from roll_device.cluster.inventory import Inventory, NodeInfo, inventory_from_nodes
from roll_device.cluster.plan import build_plan
from roll_device.cluster.settings import RoleSettings, check_colocation
from roll_device.errors import ConfigError, PlanError
from roll_device.settings import read_section
from tests.configs import cluster_settings, run_config

HEAD = NodeInfo("h" * 56, "10.0.0.1", "head", cpus=2, is_head=True)
NPU8 = NodeInfo("n" * 56, "10.0.0.2", "npu-a", cpus=8, devices={"npu": 8})
NPU4 = NodeInfo("m" * 56, "10.0.0.3", "npu-b", cpus=8, devices={"npu": 4})
GPU2 = NodeInfo("g" * 56, "10.0.0.4", "gpu-a", cpus=4, devices={"cuda": 2})
MIXED = Inventory((HEAD, NPU8, NPU4, GPU2))
CPU_PER_WORKER = cluster_settings().cpu_per_worker  # the shipped cluster's (configs/cluster/local.yaml)


def role_values(**spec) -> dict[str, dict]:
    """The `roles` section's values: name=(device, num_devices[, colocate_with])."""
    return {
        name: {
            "device": s[0],
            "num_devices": s[1],
            "strategy": "standin",  # the plan does not read it
            "colocate_with": s[2] if len(s) > 2 else None,
        }
        for name, s in spec.items()
    }


def read_roles(values: dict[str, dict]) -> dict[str, RoleSettings]:
    """Each role read as `roles.<name>` is read, then what the roles say of each other checked."""
    roles = {name: read_section(RoleSettings, role, f"roles.{name}") for name, role in values.items()}
    check_colocation(roles)
    return roles


def roles(**spec) -> dict[str, RoleSettings]:
    """Typed roles: name=(device, num_devices[, colocate_with])."""
    return read_roles(role_values(**spec))


def plan_of(
    spec: dict[str, RoleSettings], inventory: Inventory = MIXED, cpu_per_worker: float = CPU_PER_WORKER
):
    return build_plan(spec, inventory, cpu_per_worker)


def test_auto_takes_the_most_numerous_accelerator_kind_else_cpu():
    plan = plan_of(roles(a=("auto", 2)))
    assert plan.roles["a"].kind == "npu"
    assert plan_of(roles(a=("auto", 1)), Inventory((HEAD,))).roles["a"].kind == "cpu"


def test_roles_get_distinct_devices_on_as_few_nodes_as_possible():
    plan = plan_of(roles(train=("npu", 8), infer=("npu", 4), gen=("cuda", 2)))
    train, infer = plan.roles["train"], plan.roles["infer"]
    assert train.node_ids == [NPU8.node_id] and train.device_ids(NPU8.node_id) == list(range(8))
    assert infer.node_ids == [NPU4.node_id] and infer.device_ids(NPU4.node_id) == [0, 1, 2, 3]
    assert plan.roles["gen"].slots[1].node_name == "gpu-a"
    assert plan.groups() == {("npu", NPU8.node_id): 8, ("npu", NPU4.node_id): 4, ("cuda", GPU2.node_id): 2}


def test_a_role_spans_nodes_when_one_is_not_enough():
    plan = plan_of(roles(train=("npu", 10)))
    assert plan.roles["train"].node_ids == [NPU8.node_id, NPU4.node_id]
    assert len(set(plan.roles["train"].slots)) == 10


def test_colocated_role_shares_devices_and_kind():
    plan = plan_of(roles(train=("npu", 2), ref=("auto", 2, "train"), critic=("auto", 1, "ref")))
    train, ref, critic = plan.roles["train"], plan.roles["ref"], plan.roles["critic"]
    assert ref.kind == critic.kind == "npu"
    assert ref.slots == train.slots and critic.slots == train.slots[:1]
    assert train.shares == (0.3333, 0.5) and ref.shares == (0.3333, 0.5) and critic.shares == (0.3333,)
    assert plan.groups() == {("npu", NPU8.node_id): 2}
    assert plan.colocated("critic", "train") and plan.colocated("train", "ref")
    apart = plan_of(roles(train=("npu", 2), infer=("npu", 2)))
    assert not apart.colocated("train", "infer")


def test_cpu_roles_use_cpu_slots_and_keep_off_accelerator_nodes():
    plan = plan_of(roles(reward=("cpu", 10)), cpu_per_worker=0.25)
    assert plan.roles["reward"].node_ids == [HEAD.node_id, NPU8.node_id]  # head first: no accelerators
    assert plan.roles["reward"].device_ids(HEAD.node_id) == list(range(8))
    with pytest.raises(PlanError, match=r"'reward' wants 9 cpu device\(s\), but only 8 of the cluster's 8"):
        plan_of(roles(reward=("cpu", 9)), Inventory((HEAD,)), cpu_per_worker=0.25)


def test_format_lists_each_role_and_node():
    text = plan_of(roles(train=("npu", 10), ref=("auto", 2, "train"))).format()
    lines = text.splitlines()
    assert lines[0].split() == [
        "role",
        "kind",
        "devices",
        "node",
        "device",
        "ids",
        "workers",
        "share",
        "colocated",
        "with",
        "simulated",
    ]
    assert lines[1].split()[:6] == ["train", "npu", "8", "npu-a", "0,1,2,3,4,5,6,7", "8"]
    assert lines[2].split()[:6] == ["train", "npu", "2", "npu-b", "0,1", "2"]
    assert lines[3].split() == ["ref", "npu", "2", "npu-a", "0,1", "2", "0.5", "train", "no"]


def test_engines_of_four_npus_hold_four_devices_of_one_node_each():
    """2 engines x 4 NPUs (tensor parallel 4) beside an 8-NPU trainer on a simulated cluster:
    each engine one worker on 4 devices of one node, one bundle of 4 devices."""
    npu8b = NodeInfo("o" * 56, "10.0.0.5", "npu-c", cpus=8, devices={"npu": 8}, simulated=True)
    npu8a = NodeInfo("n" * 56, "10.0.0.2", "npu-a", cpus=8, devices={"npu": 8}, simulated=True)
    plan = build_plan(
        roles(train=("npu", 8), infer=("npu", 8)),
        Inventory((HEAD, npu8a, npu8b)),
        CPU_PER_WORKER,
        engine_sizes={"infer": 4},
    )
    infer = plan.roles["infer"]
    assert infer.world_size == 2 and infer.engine_size == 4
    assert [[s.index for s in infer.worker_slots(r)] for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len({s.node_id for s in infer.slots}) == 1 and infer.node_ids != plan.roles["train"].node_ids
    assert plan.bundles()[("npu", infer.node_ids[0])] == [4, 4]
    assert [plan.bundle_index("infer", r) for r in range(2)] == [0, 1]
    assert plan.bundles()[("npu", plan.roles["train"].node_ids[0])] == [1] * 8
    row = next(line for line in plan.format().splitlines() if line.startswith("infer"))
    assert row.split()[:8] == [
        "infer",
        "npu",
        "8",
        infer.slots[0].node_name,
        "0+1+2+3,4+5+6+7",
        "2",
        "x",
        "4",
    ]


def test_an_engine_never_spans_two_nodes():
    """4 free NPUs on each of two nodes: two engines of 4, not one over both nodes."""
    plan = build_plan(
        roles(train=("npu", 4), infer=("npu", 8)), MIXED, CPU_PER_WORKER, engine_sizes={"infer": 4}
    )
    infer = plan.roles["infer"]
    assert [len({s.node_id for s in infer.worker_slots(r)}) for r in range(2)] == [1, 1]


@pytest.mark.parametrize(
    ("spec", "sizes", "message"),
    [
        (
            {"infer": ("npu", 6)},
            {"infer": 4},
            r"roles.infer.num_devices=6 is not a multiple of the 4 devices",
        ),
        (
            {"infer": ("cuda", 4)},
            {"infer": 4},
            r"engines of 4 cuda devices, but no node of this cluster has more than 2",
        ),
        ({"infer": ("npu", 16)}, {"infer": 16}, r"no node of this cluster has more than 8"),
        (
            {"train": ("npu", 2), "infer": ("npu", 2, "train")},
            {"infer": 2},
            r"role 'infer' runs engines of 2 devices, which share no devices with another role yet",
        ),
    ],
)
def test_engine_refusals(spec, sizes, message):
    with pytest.raises(PlanError, match=message):
        build_plan(roles(**spec), MIXED, CPU_PER_WORKER, engine_sizes=sizes)


def test_simulated_roles_say_what_they_compute_on():
    sim = Inventory(
        (
            HEAD,
            NodeInfo("s" * 56, "1", "sim-npu", 2, {"npu": 2}, simulated=True),
            NodeInfo("t" * 56, "1", "sim-gpu", 2, {"cuda": 2}, simulated=True),
        )
    )
    plan = plan_of(roles(a=("npu", 1), b=("cuda", 1), c=("cpu", 1)), sim)
    assert [plan.roles[r].simulated for r in "abc"] == [True, True, False]
    assert "yes (computes on npu-sim)" in plan.format() and "yes (computes on cpu)" in plan.format()


@pytest.mark.parametrize(
    "spec, message",
    [
        (roles(train=("npu", 16)), r"role 'train' wants 16 npu device\(s\), but only 12 of the cluster's 12"),
        (
            roles(a=("npu", 10), b=("npu", 4)),
            r"role 'b' wants 4 npu device\(s\), but only 2 of the cluster's 12 are available after 10 for a",
        ),
        (
            roles(a=("rocm", 1)),
            (
                r"role 'a' wants 1 rocm device\(s\), but no node of this cluster has rocm "
                r"devices \(available: 0;"
            ),
        ),
        (
            roles(a=("npu", 2), b=("cuda", 1, "a")),
            (
                r"role 'b' wants 1 cuda device\(s\) colocated with 'a', which runs on npu \(available cuda devices "
                r"to share: 0\)"
            ),
        ),
        (
            roles(a=("npu", 2), b=("auto", 3, "a")),
            r"role 'b' wants 3 npu device\(s\) colocated with 'a', which has 2 available to share",
        ),
    ],
)
def test_plans_that_do_not_fit_name_role_kind_wanted_and_available(spec, message):
    with pytest.raises(PlanError, match=message):
        plan_of(spec)


@pytest.mark.parametrize(
    "values, message",
    [
        (
            role_values(a=("tpu", 1)),
            "roles.a.device='tpu': valid values are auto, npu, cuda, rocm, cpu (a device kind or auto)",
        ),
        (
            role_values(a=("npu", 0)),
            "roles.a.num_devices=0: input should be greater than or equal to 1 (one worker per device)",
        ),
        (
            role_values(a=("npu", 1.5)),
            "roles.a.num_devices=1.5: input should be a valid integer (one worker per device)",
        ),
        (
            role_values(a=("npu", True)),
            "roles.a.num_devices=True: input should be a valid integer (one worker per device)",
        ),
        (
            role_values(a=("npu", 1, "nobody")),
            "roles.a.colocate_with='nobody' names no configured role (roles: a)",
        ),
        (role_values(a=("npu", 1, "a")), "roles.a.colocate_with names the role itself: set it to null"),
        (role_values(a=("npu", 1, "b"), b=("npu", 1, "a")), "colocate_with forms a cycle: a -> b -> a"),
        ({}, "no roles configured: `roles` needs at least one role"),
    ],
)
def test_bad_role_settings_are_config_errors(values, message):
    with pytest.raises(ConfigError) as refused:
        read_roles(values)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "roles.actor_train.device=tpu",
            "roles.actor_train.device='tpu': valid values are auto, npu, cuda, rocm, cpu (a device kind or auto)",
        ),
        (
            "roles.actor_infer.num_devices=0",
            "roles.actor_infer.num_devices=0: input should be greater than or equal to 1 (one worker per device)",
        ),
        (
            "roles.reference.colocate_with=nobody",
            (
                "roles.reference.colocate_with='nobody' names no configured role "
                "(roles: actor_infer, actor_train, reference, reward)"
            ),
        ),
        (
            "roles.actor_train.colocate_with=reference",
            "colocate_with forms a cycle: actor_train -> reference -> actor_train",
        ),
    ],
)
def test_bad_role_settings_are_refused_when_the_config_is_read(override, message):
    """Before any plan: `run`, `plan`, `submit` and `doctor` read the config first."""
    with pytest.raises(ConfigError) as refused:
        run_config(override)
    assert str(refused.value) == message


def test_switched_off_role_is_left_out():
    config = run_config("roles.reference=null", "algorithm.kl_coef=0")
    assert list(config.roles.present()) == ["actor_infer", "actor_train", "reward"]
    assert list(plan_of(config.roles.present()).roles) == ["actor_infer", "actor_train", "reward"]


def test_inventory_maps_ray_resources_to_kinds():
    def record(node_id, name, resources, labels=None, alive=True):
        return {
            "NodeID": node_id,
            "NodeName": name,
            "NodeManagerAddress": "10.0.0.9",
            "Alive": alive,
            "Resources": resources,
            "Labels": labels or {},
        }

    inventory = inventory_from_nodes(
        [
            record("b1", "box", {"CPU": 8.0, "GPU": 4.0, "accelerator_type:AMD-Instinct-MI300X": 1.0}),
            record("a1", "box", {"CPU": 8.0, "GPU": 2.0, "accelerator_type:H100": 1.0}),
            record("c1", "npu", {"CPU": 4.0, "NPU": 8.0}, {"roll-device/simulated": "true"}),
            record("d1", "dead", {"CPU": 4.0, "NPU": 8.0}, alive=False),
            record("h1", "head", {"CPU": 2.0, "node:__internal_head__": 1.0}),
        ]
    )
    assert [(n.name, n.devices, n.simulated) for n in inventory.nodes] == [
        ("head", {}, False),
        ("box/a1", {"cuda": 2}, False),
        ("box/b1", {"rocm": 4}, False),
        ("npu", {"npu": 8}, True),
    ]
    assert inventory.accelerator_kinds() == ["npu", "cuda", "rocm"] and inventory.nodes[0].is_head
