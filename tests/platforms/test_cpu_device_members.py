"""The members frameworks ask of a device beyond the basics, on the CPU platform, for real:
profiling, device facts, memory extras, RNG of all devices, determinism, process environment."""

import os
import platform as host

import pytest
import torch

import roll_device as rd


@pytest.fixture
def cpu():
    return rd.get_platform("cpu")


def test_init_is_a_no_op(cpu):
    cpu.init()


def test_ranges_and_marks_are_no_ops_that_still_pair(cpu):
    cpu.range_push("step")
    cpu.mark("half way")
    cpu.range_pop()
    with cpu.range("forward"):
        torch.ones(2).sum()
    with pytest.raises(RuntimeError, match="platform 'cpu': range_pop without an open range"):
        cpu.range_pop()


def test_profiler_records_host_ops(cpu):
    assert cpu.profiler_activity() == torch.profiler.ProfilerActivity.CPU
    assert cpu.profiler_module() is torch.profiler
    with cpu.profile() as prof:
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    assert any(e.name == "aten::mm" for e in prof.events())


def test_device_facts_describe_the_host(cpu):
    assert cpu.device_name() == (host.processor() or host.machine())
    assert cpu.device_arch() == host.machine()
    assert cpu.total_memory() == cpu.mem_get_info()[1] > 0
    assert cpu.is_device_tensor(torch.ones(1))
    assert not rd.get_platform("cuda").is_device_tensor(torch.ones(1))


def test_memory_extras(cpu):
    stats = cpu.memory_stats()
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"] > 0
    assert cpu.max_memory_reserved() == cpu.max_memory_allocated()
    cpu.ipc_collect()
    cpu.clear_library_workspaces()
    assert not cpu.supports_pinned_memory
    t = torch.ones(4)
    assert cpu.pin_memory(t) is t


def test_rng_state_of_all_devices_roundtrip(cpu):
    states = cpu.get_rng_state_all()
    a = torch.rand(3)
    cpu.set_rng_state_all(states)
    assert len(states) == 1 and torch.equal(a, torch.rand(3))


def test_set_deterministic_switches_torch(cpu):
    assert cpu.deterministic_env() == {}
    try:
        cpu.set_deterministic(True)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        cpu.set_deterministic(False)
    assert not torch.are_deterministic_algorithms_enabled()


def test_process_env_is_empty_and_ray_ids_are_none(cpu):
    assert cpu.collective_env(timeout_s=60) == {} and cpu.training_env() == {}
    assert cpu.rank_env(0) == {} and cpu.ray_noset_env() == {}
    env = {"X": "1"}
    cpu.pin_devices(env, [0])
    assert env == {"X": "1"}
    assert cpu.ray_device_ids() == []


@pytest.mark.parametrize(
    "member, call",
    [
        ("profiler_start", lambda p: p.profiler_start()),
        ("profiler_stop", lambda p: p.profiler_stop()),
        ("device_capability", lambda p: p.device_capability()),
        ("device_properties", lambda p: p.device_properties()),
        ("device_uuid", lambda p: p.device_uuid()),
        ("set_memory_fraction", lambda p: p.set_memory_fraction(0.5)),
        ("record_memory_history", lambda p: p.record_memory_history()),
        ("dump_memory_snapshot", lambda p: p.dump_memory_snapshot("x.pickle")),
        ("set_allocator_settings", lambda p: p.set_allocator_settings("expandable_segments:False")),
        ("set_allocator_settings", lambda p: p.set_expandable_segments(False)),
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
        npu.set_memory_fraction(1.5)


def test_deterministic_env_is_exported_for_libraries_read_at_init(monkeypatch):
    cuda = rd.get_platform("cuda")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        cuda.set_deterministic(True)  # cuDNN flags are settable on a CPU build too
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    finally:
        cuda.set_deterministic(False)
    assert not torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
