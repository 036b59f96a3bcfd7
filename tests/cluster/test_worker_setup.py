"""The pieces a worker and a cluster start from, checked without starting Ray: device-index
mapping, worker identity, sim node entries, cluster settings, a remote cluster's address."""

import socket

import pytest
import ray

from roll_device.cluster import RoleWorker, start_cluster
from roll_device.cluster.launcher import check_reachable
from roll_device.cluster.plan import compute_kind
from roll_device.cluster.settings import SimNode
from roll_device.cluster.sim_nodes import node_args
from roll_device.cluster.worker import WorkerSpec, local_device_index, worker_env
from roll_device.errors import ConfigError, DeviceUnavailableError
from roll_device.settings import read_section
from tests.cluster.test_plan import plan_of, roles
from tests.configs import cluster_settings

SIM = "cluster=sim"


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
    plan = plan_of(roles(train=("npu", 2)))
    env = worker_env(plan, "train", 1)
    assert env["ROLL_DEVICE"] == "npu" and env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert WorkerSpec.from_env() == WorkerSpec("train", 1, 2, "npu", False, "npu-a")


def test_role_worker_outside_a_group_says_how_to_start_it():
    with pytest.raises(ConfigError, match="start role workers through roll_device.cluster.WorkerGroup"):
        RoleWorker()


def sim_node(**values) -> SimNode:
    """One entry of `cluster.nodes`, read as the sim cluster reads it."""
    return read_section(SimNode, values, "cluster.nodes.0")


def test_sim_node_entries_become_ray_start_arguments():
    args = node_args("n", sim_node(name="n", num_cpus=2, resources={"NPU": 4}))
    assert '--resources={"NPU": 4}' in args and "--labels=roll-device/simulated=true" in args
    assert "--node-name=n" in args and "--num-cpus=2" in args and "--num-gpus=0" in args
    assert not any(a.startswith(("--labels", "--resources")) for a in node_args("cpu-only", sim_node()))
    amd = node_args("amd", sim_node(num_gpus=1, accelerator_type="AMD-Instinct-MI300X"))
    assert '--resources={"accelerator_type:AMD-Instinct-MI300X": 1}' in amd
    assert "--labels=roll-device/simulated=true" in amd


def test_the_shipped_sim_cluster_is_known_before_it_starts():
    cluster = cluster_settings(SIM)
    assert [name for name, _ in cluster.entries()] == ["head", "npu-node", "gpu-node"]
    nodes = {node.name: node for node in cluster.inventory_here().nodes}
    assert nodes["head"].is_head and nodes["head"].devices == {} and not nodes["head"].simulated
    assert nodes["npu-node"].devices == {"npu": 4} and nodes["npu-node"].simulated
    assert nodes["gpu-node"].devices == {"cuda": 2} and nodes["gpu-node"].simulated


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            [SIM, "cluster.nodes=[{name: n, resources: {GPU: 2}}]"],
            "cluster.nodes.0.resources={'GPU': 2}: GPU cannot be a custom resource: use num_cpus / num_gpus",
        ),
        ([SIM, "cluster.nodes=[{num_gpus: 1}]"], "cluster.nodes.0 has no name: give each sim node a `name`"),
        (["cluster.name=moon"], "cluster.name='moon': choose one of local, sim, remote (cluster=<name>)"),
        (
            ["cluster=remote"],
            "cluster=remote needs the cluster's address: cluster.address=<host:port>, ray://<host>:10001 or auto",
        ),
        ([SIM, "cluster.head.num_cpus=abc"], "cluster.head.num_cpus='abc': input should be a valid integer"),
        (
            [SIM, "cluster.nodes=[{name: n, num_gpus: -1}]"],
            "cluster.nodes.0.num_gpus=-1: input should be greater than or equal to 0",
        ),
        (
            [SIM, "cluster.nodes=[{name: n, resources: {NPU: x}}]"],
            "cluster.nodes.0.resources.NPU='x': input should be a valid integer",
        ),
        (
            [SIM, "cluster.nodes=[{name: n, resources: {NPU: true}}]"],
            "cluster.nodes.0.resources.NPU=True: input should be a valid integer",
        ),
        (
            [SIM, "cluster.nodes=[{name: n, resources: {NPU: 1.5}}]"],  # Ray declares whole numbers
            "cluster.nodes.0.resources.NPU=1.5: input should be a valid integer",
        ),
        (
            ["cluster.cpu_per_worker=0"],
            "cluster.cpu_per_worker=0: input should be greater than 0 (CPUs each CPU-role worker reserves)",
        ),
    ],
)
def test_sim_node_entries_and_cluster_settings_are_checked_when_read(overrides, message):
    with pytest.raises(ConfigError) as refused:
        cluster_settings(*overrides)
    assert str(refused.value) == message
    assert not ray.is_initialized(), "refused before any cluster starts"


def test_a_remote_address_where_nothing_answers_is_refused_in_seconds():
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(
            ConfigError, match=rf"nothing answers at 127.0.0.1:{port} within 5s \(Connection refused\)"
        ):
            start_cluster(cluster_settings("cluster=remote", f"cluster.address={address}"))
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
