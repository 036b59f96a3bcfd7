"""The path planner: automatic choices for every pair of kinds and placements, forced paths, and
refusals of impossible ones; the `weight_sync` options."""

from __future__ import annotations

import pytest

import roll_device as rd
from roll_device.comm import WeightSyncOptions, plan_sync
from roll_device.errors import ConfigError, UnknownDeviceError
from roll_device.settings import read_section
from tests.configs import run_config, weight_sync

KINDS = ["cuda", "rocm", "npu", "cpu"]


@pytest.mark.parametrize("src", KINDS)
@pytest.mark.parametrize("dst", KINDS)
def test_auto_path_for_every_pair_of_kinds(src, dst):
    for same_node in (True, False):
        plan = plan_sync(src, dst, colocated=False, same_node=same_node)
        if src != dst:
            assert plan.path == "bridge" and plan.staging == "host"
            assert plan.transport == ("shm" if same_node else "broadcast")
            assert plan.backend == (None if same_node else "gloo")
        elif src == "cpu" and same_node:
            assert (plan.path, plan.transport) == ("bridge", "shm"), "shared memory beats loopback gloo"
        else:
            assert (plan.path, plan.transport, plan.staging) == ("collective", "broadcast", "device")
            assert plan.backend == rd.get_platform(src).dist_backend


def test_colocated_uses_ipc_where_the_platform_has_it_else_shared_memory():
    assert plan_sync("cuda", "cuda", colocated=True, same_node=True).transport == "ipc"
    assert plan_sync("rocm", "rocm", colocated=True, same_node=True).transport == "ipc"
    for kind in ("npu", "cpu", "npu-sim"):
        plan = plan_sync(kind, kind, colocated=True, same_node=True)
        assert (plan.path, plan.transport, plan.staging) == ("colocated", "shm", "host")


def test_simulated_ends_are_labelled_and_count_as_their_kind():
    plan = plan_sync("npu-sim", "npu", colocated=False, same_node=False)
    assert plan.path == "collective" and plan.backend == "hccl" and plan.simulated
    assert plan.describe() == "collective: npu -> npu via hccl broadcast (device buckets) [simulated device]"
    assert "[simulated" not in plan_sync("npu", "cuda", colocated=False, same_node=False).describe()


def test_platform_objects_are_accepted_like_kinds():
    assert (
        plan_sync(rd.get_platform("cuda"), rd.get_platform("npu"), colocated=False, same_node=False).path
        == "bridge"
    )


@pytest.mark.parametrize(
    ("src", "dst", "colocated", "same_node", "forced", "path", "transport"),
    [
        ("cuda", "cuda", False, True, "colocated", "colocated", "ipc"),
        ("npu", "npu", False, True, "colocated", "colocated", "shm"),
        ("cpu", "cpu", False, True, "collective", "collective", "broadcast"),
        ("cuda", "cuda", True, True, "bridge", "bridge", "shm"),
        ("npu", "npu", False, False, "bridge", "bridge", "broadcast"),
        ("npu", "cuda", False, True, "auto", "bridge", "shm"),
    ],
)
def test_forced_paths_that_work(src, dst, colocated, same_node, forced, path, transport):
    plan = plan_sync(src, dst, colocated=colocated, same_node=same_node, forced=forced)
    assert (plan.path, plan.transport) == (path, transport)


@pytest.mark.parametrize(
    ("src", "dst", "colocated", "same_node", "forced", "message"),
    [
        ("cuda", "cuda", False, False, "colocated", "IPC handles and shared memory work within one node"),
        ("npu", "cuda", False, True, "colocated", "device handles cannot cross kinds"),
        (
            "npu",
            "cuda",
            False,
            True,
            "collective",
            "one collective backend cannot join two kinds (hccl vs nccl)",
        ),
        ("cpu", "npu", False, False, "collective", "(gloo vs hccl); use bridge"),
        ("cuda", "cuda", True, False, "auto", "colocated roles share devices, so they must be on one node"),
        ("npu", "cuda", True, True, "auto", "roles on two kinds cannot share devices"),
        ("cuda", "cuda", False, True, "nvlink", "weight_sync.path='nvlink' is not a path"),
    ],
)
def test_impossible_choices_are_refused_up_front(src, dst, colocated, same_node, forced, message):
    with pytest.raises(ConfigError) as info:
        plan_sync(src, dst, colocated=colocated, same_node=same_node, forced=forced)
    assert message in str(info.value)


def test_unknown_kind_is_refused():
    with pytest.raises(UnknownDeviceError, match="unknown device kind 'tpu'"):
        plan_sync("tpu", "cuda", colocated=False, same_node=True)


def test_options_from_the_composed_config():
    shipped = {"path": "auto", "bucket_bytes": 64 << 20, "verify": False, "timeout_s": 600}
    assert run_config().weight_sync == read_section(WeightSyncOptions, shipped, "weight_sync")
    forced = run_config(
        "weight_sync.path=bridge", "weight_sync.verify=true", "weight_sync.bucket_bytes=1048576"
    ).weight_sync
    assert (forced.path, forced.verify, forced.bucket_bytes) == ("bridge", True, 1 << 20)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"path": "rdma"},
            "weight_sync.path='rdma' is not a path: choose one of auto, colocated, collective, bridge, rdt",
        ),
        (
            {"bucket_bytes": 100},
            (
                "weight_sync.bucket_bytes=100: input should be greater than or equal to 4096 "
                "(bytes per bucket; 64 MiB is a good default)"
            ),
        ),
        (
            {"bucket_bytes": 1.5e6},
            (
                "weight_sync.bucket_bytes=1500000.0: input should be a valid integer "
                "(bytes per bucket; 64 MiB is a good default)"
            ),
        ),
        (
            {"verify": "yes"},
            (
                "weight_sync.verify='yes': input should be a valid boolean "
                "(a CRC32 per bucket; a mismatch keeps the old weights)"
            ),
        ),
        (
            {"timeout_s": 0},
            "weight_sync.timeout_s=0: input should be greater than 0 (seconds one end waits for the other)",
        ),
        (
            {"timeout_s": True},
            "weight_sync.timeout_s=True: input should be a valid number (seconds one end waits for the other)",
        ),
        (
            {"bucket_size": 4096},
            "unknown key weight_sync.bucket_size: the keys here are path, bucket_bytes, verify, timeout_s",
        ),
    ],
)
def test_bad_options_are_refused(values, message):
    with pytest.raises(ConfigError) as info:
        weight_sync(**values)
    assert str(info.value) == message


def test_options_have_no_defaults_of_their_own():
    """The YAML holds the values a run starts from; a section without a key names it."""
    with pytest.raises(ConfigError) as info:
        read_section(WeightSyncOptions, {"timeout_s": 1}, "weight_sync")
    assert str(info.value) == "weight_sync.path is missing: set it (docs/configuration.md lists every key)"


def test_bad_options_are_refused_when_the_config_is_read():
    with pytest.raises(ConfigError) as info:
        run_config("weight_sync.bucket_bytes=100")
    assert str(info.value).startswith(
        "weight_sync.bucket_bytes=100: input should be greater than or equal to 4096"
    )
