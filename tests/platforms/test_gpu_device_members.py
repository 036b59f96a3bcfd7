"""The platform's groups (profiling, facts, memory, determinism, topology, ...) on a real CUDA or
ROCm GPU; skipped cleanly without one (run where one is visible, as test_gpu_operations.py)."""

import os
import pickle

import pytest
import torch

import roll_device as rd

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
]


@pytest.fixture
def gpu():
    p = rd.current_platform()
    p.runtime.init()
    p.set_device(0)
    return p


def test_ranges_marks_capture_range_and_profiler(gpu):
    with gpu.profiling.range("step"):
        gpu.profiling.range_push("forward")
        gpu.profiling.mark("loss")
        gpu.profiling.range_pop()
    gpu.profiling.profiler_start()
    gpu.profiling.profiler_stop()
    assert gpu.profiling.profiler_activity() == torch.profiler.ProfilerActivity.CUDA
    x = torch.ones(256, 256, device=gpu.device())
    with gpu.profiling.profile() as prof:
        (x @ x).sum().item()
    assert any(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events())


def test_device_facts_agree_with_torch(gpu):
    props = torch.cuda.get_device_properties(0)
    assert gpu.device_name() == torch.cuda.get_device_name(0) == props.name
    assert gpu.total_memory() == props.total_memory > 0
    assert gpu.facts.device_capability() == torch.cuda.get_device_capability(0)
    arch = gpu.facts.device_arch()
    assert (
        arch.startswith("gfx")
        if gpu.kind == "rocm"
        else arch == "sm_{}{}".format(*gpu.facts.device_capability())
    )
    uuid = gpu.facts.device_uuid()
    assert uuid.startswith("GPU-") and len(uuid) > 20 and uuid == gpu.facts.device_uuid(0)
    assert gpu.is_device_tensor(torch.ones(1, device=gpu.device())) and not gpu.is_device_tensor(
        torch.ones(1)
    )


def test_memory_group(gpu, tmp_path):
    gpu.memory.record_memory_history(True)
    x = torch.empty(1 << 22, device=gpu.device())
    stats = gpu.memory.memory_stats()
    assert stats["allocated_bytes.all.current"] >= x.numel() * 4
    assert gpu.memory.max_memory_reserved() >= gpu.memory.memory_reserved() >= x.numel() * 4
    snapshot = tmp_path / "snapshot.pickle"
    gpu.memory.dump_memory_snapshot(str(snapshot))
    gpu.memory.record_memory_history(False)
    assert "segments" in pickle.loads(snapshot.read_bytes())
    gpu.memory.set_memory_fraction(0.95)
    gpu.memory.set_memory_fraction(1.0)
    gpu.memory.set_expandable_segments(True)
    y = torch.empty(1 << 20, device=gpu.device())
    gpu.memory.set_expandable_segments(False)
    segments = torch.cuda.memory._snapshot()["segments"]
    y_segment = next(s for s in segments if s["address"] <= y.data_ptr() < s["address"] + s["total_size"])
    x_segment = next(s for s in segments if s["address"] <= x.data_ptr() < s["address"] + s["total_size"])
    assert y_segment["is_expandable"] and not x_segment["is_expandable"]  # the setting took effect
    (y[:256].view(16, 16) @ y[:256].view(16, 16)).sum().item()  # makes a cuBLAS workspace
    gpu.memory.clear_library_workspaces()
    gpu.memory.ipc_collect()
    assert gpu.supports_pinned_memory
    pinned = gpu.memory.pin_memory(torch.ones(1024))
    assert pinned.is_pinned() and gpu.memory.pin_memory(pinned) is pinned
    assert gpu.memory.host_buffer(4096).is_pinned()  # the colocated turns' buffer
    del x, y


def test_rng_state_of_all_devices_roundtrip(gpu):
    states = gpu.determinism.get_rng_state_all()
    assert len(states) == gpu.device_count()
    a = torch.rand(4, device=gpu.device())
    gpu.determinism.set_rng_state_all(states)
    assert torch.equal(a, torch.rand(4, device=gpu.device()))


def test_determinism_switches(gpu):
    try:
        gpu.determinism.set_deterministic(True)
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark
    finally:
        gpu.determinism.set_deterministic(False)
    assert not torch.backends.cudnn.deterministic


def test_topology_kernel_env_and_host_registration(gpu):
    """The members issue 32 added, answered by the real GPU (NVML's facts come from sysfs here)."""
    bus = gpu.topology.pci_bus_id()
    props = torch.cuda.get_device_properties(0)
    assert bus == f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    assert gpu.topology.numa_node() >= 0 and gpu.topology.cpu_affinity()
    before = os.sched_getaffinity(0)
    try:
        assert set(gpu.topology.set_cpu_affinity()) <= set(gpu.topology.cpu_affinity())
    finally:
        os.sched_setaffinity(0, before)
    assert gpu.facts.device_index_of_uuid(gpu.facts.device_uuid(0)) == 0
    assert 0 < gpu.memory.device_memory_used() <= gpu.total_memory()
    if gpu.kind == "cuda":
        assert gpu.kernels.kernel_build_env() == {"TORCH_CUDA_ARCH_LIST": f"{props.major}.{props.minor}"}
    host = torch.arange(1 << 16, dtype=torch.float32)
    gpu.memory.register_host_memory(host)
    try:
        assert torch.equal(
            host.to(gpu.device(), non_blocking=True).cpu(), torch.arange(1 << 16, dtype=torch.float32)
        )
    finally:
        gpu.memory.unregister_host_memory(host)
    try:
        gpu.kernels.set_dnn_library_enabled(False)
        assert not torch.backends.cudnn.enabled
    finally:
        gpu.kernels.set_dnn_library_enabled(True)
    assert torch.backends.cudnn.enabled


def test_ipc_handle_names_the_device_by_uuid(gpu):
    t = torch.arange(4.0, device=gpu.device())
    _, args = gpu.ipc_handle(t)
    assert gpu.facts.device_uuid(0) in args, "test_gpu_operations.py opens such a handle in another process"


def test_ipc_slots_are_allocated_outside_expandable_segments(gpu):
    """The weight-sync IPC slot takes an ordinary segment while the process makes expandable ones
    (`Platform.ipc_allocation`), and yields a handle."""
    from roll_device.comm.buffers import IpcSlot

    gpu.memory.set_expandable_segments(True)
    try:
        slot = IpcSlot.create(64 << 20, gpu)
        plain = torch.empty(64 << 20, dtype=torch.uint8, device=gpu.device())
        assert gpu.memory.expandable_segments_enabled(), "back on after the slot"
    finally:
        gpu.memory.set_expandable_segments(False)
    segments = torch.cuda.memory._snapshot()["segments"]

    def segment_of(tensor):
        address = tensor.data_ptr()
        return next(s for s in segments if s["address"] <= address < s["address"] + s["total_size"])

    assert not segment_of(slot.tensor)["is_expandable"] and segment_of(plain)["is_expandable"]
    assert slot.descriptor()
