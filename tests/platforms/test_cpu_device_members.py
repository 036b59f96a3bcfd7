"""The members frameworks ask of a device beyond the basics, on the CPU platform, for real: the
platform's groups (profiling, facts, memory, determinism, env, kernels, topology, runtime)."""

import mmap
import os
import platform as host

import pytest
import torch

import roll_device as rd


@pytest.fixture
def cpu():
    return rd.get_platform("cpu")


def test_init_is_a_no_op(cpu):
    cpu.runtime.init()


def test_ranges_and_marks_are_no_ops_that_still_pair(cpu):
    cpu.profiling.range_push("step")
    cpu.profiling.mark("half way")
    cpu.profiling.range_pop()
    with cpu.profiling.range("forward"):
        torch.ones(2).sum()
    with pytest.raises(RuntimeError, match="platform 'cpu': range_pop without an open range"):
        cpu.profiling.range_pop()


def test_profiler_records_host_ops(cpu):
    assert cpu.profiling.profiler_activity() == torch.profiler.ProfilerActivity.CPU
    assert cpu.profiling.profiler_module() is torch.profiler
    with cpu.profiling.profile() as prof:
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    assert any(e.name == "aten::mm" for e in prof.events())
    with cpu.profiling.profile(activities=["device"]) as prof:  # the CPU's device is the host
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    assert any(e.name == "aten::mm" for e in prof.events())
    with pytest.raises(ValueError, match=r"platform 'cpu': unknown profiler activities \['gpu'\]"):
        cpu.profiling.profile(activities=["cpu", "gpu"])


def test_device_facts_describe_the_host(cpu):
    assert cpu.device_name() == (host.processor() or host.machine())
    assert cpu.facts.device_arch() == host.machine()
    assert cpu.total_memory() == cpu.mem_get_info()[1] > 0
    assert cpu.is_device_tensor(torch.ones(1))
    assert not rd.get_platform("cuda").is_device_tensor(torch.ones(1))


def test_memory_group(cpu):
    stats = cpu.memory.memory_stats()
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"] > 0
    assert cpu.memory.max_memory_reserved() == cpu.max_memory_allocated()
    cpu.memory.ipc_collect()
    cpu.memory.clear_library_workspaces()
    assert not cpu.supports_pinned_memory
    t = torch.ones(4)
    assert cpu.memory.pin_memory(t) is t
    buffer = cpu.memory.host_buffer(4096)
    assert (buffer.dtype, buffer.numel(), buffer.device.type, buffer.is_pinned()) == (
        torch.uint8,
        4096,
        "cpu",
        False,
    )


def test_rng_state_of_all_devices_roundtrip(cpu):
    states = cpu.determinism.get_rng_state_all()
    a = torch.rand(3)
    cpu.determinism.set_rng_state_all(states)
    assert len(states) == 1 and torch.equal(a, torch.rand(3))


def test_set_deterministic_switches_torch(cpu):
    assert cpu.determinism.deterministic_env() == {}
    try:
        cpu.determinism.set_deterministic(True)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        cpu.determinism.set_deterministic(False)
    assert not torch.are_deterministic_algorithms_enabled()


def test_process_env_is_empty_and_ray_ids_are_none(cpu):
    assert cpu.collective_env(timeout_s=60) == {} and cpu.env.training_env() == {}
    assert cpu.env.rank_env(0) == {} and cpu.env.ray_noset_env() == {}
    env = {"X": "1"}
    cpu.env.pin_devices(env, [0])
    assert env == {"X": "1"}
    assert cpu.ray_device_ids() == []


@pytest.mark.parametrize(
    "member, call",
    [
        ("profiling.profiler_start", lambda p: p.profiling.profiler_start()),
        ("profiling.profiler_stop", lambda p: p.profiling.profiler_stop()),
        ("facts.device_capability", lambda p: p.facts.device_capability()),
        ("facts.device_uuid", lambda p: p.facts.device_uuid()),
        ("facts.device_index_of_uuid", lambda p: p.facts.device_index_of_uuid("GPU-0")),
        ("topology.pci_bus_id", lambda p: p.topology.pci_bus_id()),
        ("env.switch_reduction_env", lambda p: p.env.switch_reduction_env(True)),
        ("env.collective_ports_env", lambda p: p.env.collective_ports_env("30000-30100")),
        ("kernels.attention_backend_env", lambda p: p.kernels.attention_backend_env("flash")),
        ("kernels.sm_margin_env", lambda p: p.kernels.sm_margin_env(backward=4)),
        ("memory.set_memory_fraction", lambda p: p.memory.set_memory_fraction(0.5)),
        ("memory.record_memory_history", lambda p: p.memory.record_memory_history()),
        ("memory.dump_memory_snapshot", lambda p: p.memory.dump_memory_snapshot("x.pickle")),
        (
            "memory.set_allocator_settings",
            lambda p: p.memory.set_allocator_settings("expandable_segments:False"),
        ),
        ("memory.set_allocator_settings", lambda p: p.memory.set_expandable_segments(False)),
    ],
)
def test_what_the_cpu_lacks_fails_loudly(cpu, member, call):
    with pytest.raises(NotImplementedError, match=f"platform 'cpu' does not support {member}"):
        call(cpu)


def test_bad_values_name_the_platform_and_value():
    npu = rd.get_platform("npu")
    with pytest.raises(ValueError, match=r"platform 'npu': collective timeout 0 s must be positive"):
        npu.collective_env(timeout_s=0)
    with pytest.raises(ValueError, match=r"platform 'npu': memory fraction 1.5 is not in \(0, 1\]"):
        npu.memory.set_memory_fraction(1.5)


def test_deterministic_env_is_exported_for_libraries_read_at_init(monkeypatch):
    cuda = rd.get_platform("cuda")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        cuda.determinism.set_deterministic(True)  # cuDNN flags are settable on a CPU build too
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    finally:
        cuda.determinism.set_deterministic(False)
    assert not torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark


def test_the_peak_resets_to_the_resident_set_now(cpu):
    # 64 MiB touched in a mapping of its own, unmapped when closed (a freed tensor's memory may stay
    # with the process: a vLLM engine started in this process keeps freed memory, host_malloc.py)
    block = mmap.mmap(-1, 64 << 20)
    block.write(b"\1" * (64 << 20))
    high = cpu.max_memory_allocated()
    block.close()
    cpu.reset_peak_memory_stats()
    assert cpu.max_memory_allocated() < high - (32 << 20)


def test_host_properties_memory_used_and_topology(cpu):
    props = cpu.facts.device_properties()
    assert props.name == cpu.device_name() and props.total_memory == cpu.total_memory()
    assert props.multi_processor_count == len(os.sched_getaffinity(0))
    _, total = cpu.mem_get_info()
    assert 0 < cpu.memory.device_memory_used() <= total
    assert cpu.topology.cpu_affinity() == sorted(os.sched_getaffinity(0)) == cpu.topology.set_cpu_affinity()
    assert cpu.topology.numa_node() >= 0


def test_process_and_kernel_env_have_nothing_to_set(cpu):
    assert cpu.env.collective_debug_env("info") == cpu.env.switch_reduction_env(False) == {}
    assert cpu.env.collective_ports_env() == cpu.env.device_connections_env(4) == {}
    assert cpu.kernels.kernel_build_env() == cpu.kernels.module_loading_env(lazy=False) == {}
    assert cpu.kernels.attention_backend_env("auto") == cpu.kernels.sm_margin_env() == {}
    assert cpu.kernels.attention_backend({"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0"}) == "auto"
    assert cpu.env.visible_device_ids() == [] and cpu.kernels.toolkit_home() is None


def test_dnn_library_switch_is_onednn(cpu):
    try:
        cpu.kernels.set_dnn_library_enabled(False)
        assert not torch.backends.mkldnn.enabled
    finally:
        cpu.kernels.set_dnn_library_enabled(True)
    assert torch.backends.mkldnn.enabled


def test_registering_host_memory_is_a_no_op(cpu):
    t = torch.ones(8)
    cpu.memory.register_host_memory(t)
    cpu.memory.unregister_host_memory(t)
    with pytest.raises(
        ValueError, match="platform 'cpu': memory.register_host_memory takes a contiguous host tensor"
    ):
        cpu.memory.register_host_memory(torch.ones(4, 4).t())


@pytest.mark.parametrize("kind", ["cuda", "rocm", "npu"])
def test_process_env_by_name_per_kind(kind):
    p = rd.get_platform(kind)
    debug = {"cuda": {"NCCL_DEBUG": "INFO"}, "rocm": {"NCCL_DEBUG": "INFO"}}
    assert p.env.collective_debug_env("info") == debug.get(kind, {"ASCEND_MODULE_LOG_LEVEL": "HCCL=1"})
    assert p.env.device_connections_env(4) == {"CUDA_DEVICE_MAX_CONNECTIONS": "4"}
    if kind == "cuda":
        assert p.env.switch_reduction_env(False) == {"NCCL_NVLS_ENABLE": "0"}
        assert p.env.switch_reduction_env(True) == {"NCCL_NVLS_ENABLE": "1"}
    else:
        assert p.env.switch_reduction_env(False) == {}
        with pytest.raises(
            NotImplementedError, match=f"platform '{kind}' does not support env.switch_reduction_env"
        ):
            p.env.switch_reduction_env(True)
    ports = {"HCCL_HOST_SOCKET_PORT_RANGE": "auto", "HCCL_NPU_SOCKET_PORT_RANGE": "auto"}
    assert p.env.collective_ports_env() == (ports if kind == "npu" else {})
    with pytest.raises(ValueError, match=f"platform '{kind}': collective log level 'LOUD'"):
        p.env.collective_debug_env("LOUD")
    with pytest.raises(ValueError, match=f"platform '{kind}': device connections 0 must be at least 1"):
        p.env.device_connections_env(0)


@pytest.mark.parametrize("kind", ["cuda", "rocm"])
def test_transformer_engine_switches(kind):
    p = rd.get_platform(kind)
    env = p.kernels.attention_backend_env("fused")
    assert env == {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"}
    assert p.kernels.attention_backend(env) == "fused" and p.kernels.attention_backend({}) == "auto"
    assert p.kernels.attention_backend(p.kernels.attention_backend_env("local")) == "local"
    assert p.kernels.sm_margin_env(backward=8) == {
        "NVTE_FWD_LAYERNORM_SM_MARGIN": "0",
        "NVTE_BWD_LAYERNORM_SM_MARGIN": "8",
    }
    with pytest.raises(ValueError, match=f"platform '{kind}': attention backend 'sdpa' is not one of"):
        p.kernels.attention_backend_env("sdpa")


def test_module_loading_and_toolkit_home(monkeypatch):
    cuda, rocm = rd.get_platform("cuda"), rd.get_platform("rocm")
    assert cuda.kernels.module_loading_env() == {"CUDA_MODULE_LOADING": "LAZY"}
    assert cuda.kernels.module_loading_env(lazy=False) == {"CUDA_MODULE_LOADING": "EAGER"}
    assert rocm.kernels.module_loading_env() == {}
    monkeypatch.setenv("ROCM_PATH", "/somewhere/rocm")
    assert rocm.kernels.toolkit_home() == "/somewhere/rocm"


def test_visible_device_ids_follow_the_variable(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 1")
    assert rd.get_platform("cuda").env.visible_device_ids() == ["3", "1"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert rd.get_platform("cuda").env.visible_device_ids() == []


def test_what_the_npu_kind_cannot_do_is_named():
    npu = rd.get_platform("npu")
    for member, call in [
        ("kernels.attention_backend_env", lambda: npu.kernels.attention_backend_env("flash")),
        ("kernels.sm_margin_env", lambda: npu.kernels.sm_margin_env(forward=2)),
        ("kernels.set_dnn_library_enabled", lambda: npu.kernels.set_dnn_library_enabled(False)),
    ]:
        with pytest.raises(NotImplementedError, match=f"platform 'npu' does not support {member}"):
            call()
    assert (
        npu.kernels.kernel_build_env() == npu.kernels.module_loading_env() == {}
        and npu.kernels.attention_backend() == "auto"
    )
