"""The shipped 7B reference layouts plan onto the nodes they are written for (8 NPUs, 8 GPUs)
and are refused, naming what is missing, on a node that is too small. Planned against declared
inventories: no Ray, no devices needed."""

import pytest

from roll_device.cluster import Inventory, NodeInfo
from roll_device.errors import PlanError
from roll_device.pipeline.run_plan import build_run_plan
from tests.configs import run_config


def _node(kind, count):
    return Inventory(
        (NodeInfo(node_id="n0", ip="10.0.0.1", name="node0", cpus=64, devices={kind: count}, is_head=True),)
    )


@pytest.mark.parametrize("experiment, kind", [("qwen2_5_7b_npu8", "npu"), ("qwen2_5_7b_gpu8", "cuda")])
def test_reference_layout_fits_one_eight_device_node(experiment, kind):
    cfg = run_config(f"experiment={experiment}")  # read and checked as a run reads it
    plan = build_run_plan(cfg, _node(kind, 8)).placement
    assert plan.roles["actor_train"].kind == plan.roles["actor_infer"].kind == kind
    train = {s.index for s in plan.roles["actor_train"].slots}
    infer = {s.index for s in plan.roles["actor_infer"].slots}
    assert len(train) == len(infer) == 4 and not train & infer, "training and rollout split the node"
    assert {s.index for s in plan.roles["reference"].slots} == train, "the reference shares the trainer's"
    assert plan.roles["reward"].kind == "cpu"
    assert cfg.trainer.name == "megatron" and cfg.trainer.tensor_parallel == 2


def test_reference_layout_on_a_smaller_node_names_what_is_missing():
    cfg = run_config("experiment=qwen2_5_7b_npu8")
    with pytest.raises(PlanError, match=r"role 'actor_train' wants 4 npu device\(s\), but only 2"):
        build_run_plan(cfg, _node("npu", 6))
