"""The pieces a worker and a cluster start from, checked without starting Ray: device-index
mapping, worker identity, sim node entries, cluster settings, a remote cluster's address."""

import socket

import pytest
import ray

from roll_device.cluster import RoleWorker, start_cluster
from roll_device.cluster.launcher import check_reachable
from roll_device.cluster.plan import build_plan, compute_kind
from roll_device.cluster.sim_nodes import node_args
from roll_device.cluster.worker import WorkerSpec, local_device_index, worker_env
from roll_device.errors import ConfigError, DeviceUnavailableError
from tests.cluster.test_plan import MIXED, roles


def test_ray_ids_map_to_the_position_in_the_visible_list():
    assert local_device_index("3", "2,3", "CUDA_VISIBLE_DEVICES") == 1
    assert local_device_index("5", None, "ASCEND_RT_VISIBLE_DEVICES") == 5  # Ray told not to narrow
    assert local_device_index(None, None, None) == 0  # CPU workers
    with pytest.raises(
        DeviceUnavailableError, match=r"Ray assigned device 4, but CUDA_VISIBLE_DEVICES='0,1'"
    ):
        local_device_index("4", "0,1", "CUDA_VISIBLE_DEVICES")


def test_simulated_workers_compute_on_the_simulated_npu_or_the_cpu():
    assert [compute_kind(k, True) for k in ("npu", "cuda", "rocm", "cpu")] == ["npu-sim", "cpu", "cpu", "cpu"]
    assert [compute_kind(k, False) for k in ("npu", "cuda")] == ["npu", "cuda"]


def test_worker_env_carries_identity_and_platform(monkeypatch):
    plan = build_plan(roles(train=("npu", 2)), MIXED)
    env = worker_env(plan, "train", 1)
    assert env["ROLL_DEVICE"] == "npu" and env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert WorkerSpec.from_env() == WorkerSpec("train", 1, 2, "npu", False, "npu-a")


def test_role_worker_outside_a_group_says_how_to_start_it():
    with pytest.raises(ConfigError, match="start role workers through roll_device.cluster.WorkerGroup"):
        RoleWorker()


def test_sim_node_entries_and_cluster_settings_are_checked():
    args = node_args({"name": "n", "num_cpus": 2, "resources": {"NPU": 4}})
    assert '--resources={"NPU": 4}' in args and "--labels=roll-device/simulated=true" in args
    assert not any(a.startswith("--labels") for a in node_args({"name": "cpu-only"}))
    with pytest.raises(ConfigError, match="GPU cannot be a custom resource: use num_cpus / num_gpus"):
        node_args({"name": "n", "resources": {"GPU": 2}})
    with pytest.raises(ConfigError, match="has no name"):
        node_args({"num_cpus": 1})
    with pytest.raises(ConfigError, match="cluster.name='moon'"):
        start_cluster({"name": "moon"})
    with pytest.raises(ConfigError, match="cluster=remote needs the cluster's address"):
        start_cluster({"name": "remote"})
    with pytest.raises(ConfigError, match="has no name"):
        start_cluster({"name": "sim", "nodes": [{"num_gpus": 1}]})
    with pytest.raises(
        ConfigError, match=r"sim cluster node 'head': num_cpus='abc' must be a whole number >= 0"
    ):
        start_cluster({"name": "sim", "head": {"num_cpus": "abc"}})
    with pytest.raises(ConfigError, match=r"sim cluster node 'n': num_gpus=-1 must be a whole number >= 0"):
        node_args({"name": "n", "num_gpus": -1})
    with pytest.raises(ConfigError, match=r"sim cluster node 'n': resources.NPU='x' must be a number >= 0"):
        node_args({"name": "n", "resources": {"NPU": "x"}})


def test_a_remote_address_where_nothing_answers_is_refused_in_seconds():
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(
            ConfigError, match=rf"nothing answers at 127.0.0.1:{port} within 5s \(Connection refused\)"
        ):
            start_cluster({"name": "remote", "address": address})
    assert not ray.is_initialized(), "refused before ray.init, whose retries take minutes"
    for address in ("headnode", "headnode:port", ":6379"):
        with pytest.raises(ConfigError, match=rf"cluster.address='{address}': give <host>:<port>"):
            check_reachable(address)


def test_a_remote_address_that_answers_passes():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}")
    check_reachable("auto")  # Ray's to resolve
