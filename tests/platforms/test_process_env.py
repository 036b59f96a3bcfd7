"""The environment each kind gives its processes: collective tuning and timeouts, training,
determinism, and the visible-device pin of one rank (readable without the device)."""

import pytest

import roll_device as rd

COLLECTIVE = {
    "cuda": {"NCCL_CUMEM_ENABLE": "0", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"},
    "rocm": {"NCCL_CUMEM_ENABLE": "0", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"},
    "npu": {"HCCL_CONNECT_TIMEOUT": "900", "HCCL_EXEC_TIMEOUT": "900"},
    "cpu": {},
}
DETERMINISTIC = {
    "cuda": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
    "rocm": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
    "npu": {"HCCL_DETERMINISTIC": "true", "CLOSE_MATMUL_K_SHIFT": "1"},
    "cpu": {},
}
PIN = {
    "cuda": {"CUDA_VISIBLE_DEVICES": "2,3", "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"},
    "rocm": {
        "HIP_VISIBLE_DEVICES": "2,3",
        "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1",
        "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES": "1",
    },
    "npu": {"ASCEND_RT_VISIBLE_DEVICES": "2,3", "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"},
    "cpu": {},
}


@pytest.mark.parametrize("kind", sorted(COLLECTIVE))
def test_collective_env_with_a_timeout(kind):
    assert rd.get_platform(kind).collective_env(timeout_s=900) == COLLECTIVE[kind]


def test_collective_env_without_a_timeout_keeps_only_tuning():
    assert rd.get_platform("npu").collective_env() == {}
    assert rd.get_platform("cuda").collective_env() == COLLECTIVE["cuda"]


@pytest.mark.parametrize("kind", sorted(DETERMINISTIC))
def test_deterministic_env(kind):
    assert rd.get_platform(kind).determinism.deterministic_env() == DETERMINISTIC[kind]


@pytest.mark.parametrize("kind", ["cuda", "rocm", "npu"])
def test_training_env_asks_for_one_hardware_queue(kind):
    assert rd.get_platform(kind).env.training_env() == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


@pytest.mark.parametrize("kind", sorted(PIN))
def test_rank_env_pins_devices_and_keeps_ray_off(kind):
    assert rd.get_platform(kind).env.rank_env([2, 3]) == PIN[kind]


def test_pin_devices_drops_amd_second_visibility_variable():
    env = {"ROCR_VISIBLE_DEVICES": "0,1,2,3", "OTHER": "x"}
    rd.get_platform("rocm").env.pin_devices(env, 1)
    assert "ROCR_VISIBLE_DEVICES" not in env and env["HIP_VISIBLE_DEVICES"] == "1"
    assert env["RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES"] == "1" and env["OTHER"] == "x"


def test_profiler_identity_by_kind():
    assert rd.get_platform("cuda").profiling.profiler_activity_name == "CUDA"
    assert rd.get_platform("npu").profiling.profiler_package == "torch_npu.profiler"
    assert rd.get_platform("npu").profiling.profiler_activity_name == "NPU"
    assert (
        rd.get_platform("cuda").profiling.supports_capture_range
        and not rd.get_platform("npu").profiling.supports_capture_range
    )
