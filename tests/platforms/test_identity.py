"""Identity of every platform class: readable without the device or its package."""

import pytest

import roll_device as rd

EXPECTED = {
    #  kind: (device_type, dispatch_key, ray_resource, visible_devices_env, noset env, backend)
    "cuda": (
        "cuda",
        "CUDA",
        "GPU",
        "CUDA_VISIBLE_DEVICES",
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
        "nccl",
    ),
    "rocm": (
        "cuda",
        "CUDA",
        "GPU",
        "HIP_VISIBLE_DEVICES",
        "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES",
        "nccl",
    ),
    "npu": (
        "npu",
        "PrivateUse1",
        "NPU",
        "ASCEND_RT_VISIBLE_DEVICES",
        "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",
        "hccl",
    ),
    "cpu": ("cpu", "CPU", None, None, None, "gloo"),
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_identity(kind):
    p = rd.get_platform(kind)
    assert p.kind == kind
    assert (
        p.device_type,
        p.dispatch_key,
        p.ray_resource,
        p.visible_devices_env,
        p.ray_noset_visible_devices_env,
        p.dist_backend,
    ) == EXPECTED[kind]
    assert rd.get_platform(kind) is p, "one instance per kind and process"


def test_simulated_npu_shares_npu_identity_and_says_so():
    sim, real = rd.get_platform("npu-sim"), rd.get_platform("npu")
    assert sim.kind == real.kind == "npu" and sim.ray_resource == "NPU"
    assert sim.simulated and not real.simulated
    assert sim.name == "npu (simulated)"


@pytest.mark.parametrize(
    "kind, fraction, options",
    [
        ("cuda", 1, {"num_gpus": 1}),
        ("rocm", 0.5, {"num_gpus": 0.5}),
        ("npu", 0.5, {"resources": {"NPU": 0.5}}),
        ("cpu", 1, {}),
    ],
)
def test_ray_actor_options(kind, fraction, options):
    assert rd.get_platform(kind).ray_actor_options(fraction) == options


@pytest.mark.parametrize(
    "kind, env",
    [
        ("cuda", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
        ("rocm", {"PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True"}),
        ("npu", {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}),
        ("cpu", {}),
    ],
)
def test_allocator_env(kind, env):
    assert rd.get_platform(kind).allocator_env() == env


def test_npu_rollout_env_follows_graph_mode():
    npu = rd.get_platform("npu")
    assert npu.rollout_env(graph_mode=True) == {"TASK_QUEUE_ENABLE": "1"}
    assert npu.rollout_env(graph_mode=False)["TASK_QUEUE_ENABLE"] == "2"
    assert rd.get_platform("cpu").rollout_env(graph_mode=False) == {}


def test_ipc_support_by_kind():
    assert rd.get_platform("cuda").supports_ipc and rd.get_platform("rocm").supports_ipc
    assert not rd.get_platform("npu").supports_ipc and not rd.get_platform("cpu").supports_ipc


def test_simulation_facts_are_the_platforms():
    npu, cpu = rd.get_platform("npu"), rd.get_platform("cpu")
    assert npu.simulated_kind == "npu-sim" and cpu.simulated_kind is None
    assert rd.get_platform("npu-sim").simulated_devices_env(2) == {"ROLL_SIM_NPU_COUNT": "2"}
    with pytest.raises(NotImplementedError, match="platform 'cpu' does not support simulated devices"):
        cpu.simulated_devices_env(2)
    assert npu.launch_blocking_env == "ASCEND_LAUNCH_BLOCKING" and cpu.launch_blocking_env is None
