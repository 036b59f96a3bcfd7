"""`Platform.ipc_allocation`, the context the weight-sync IPC slots are allocated in: on CUDA (and
ROCm) expandable segments are off inside it and back on after where they were on; elsewhere it
changes nothing. Checked on the CPU against torch's real allocator settings, which the CPU build
keeps too (accelerator-wide); that a slot then lands in an ordinary segment needs a GPU
(tests/platforms/test_gpu_device_members.py)."""

import pytest
import torch

import roll_device as rd
from roll_device.comm.buffers import IpcSlot


def allocator_settings() -> str:
    return torch._C._accelerator_getAllocatorSettings()


@pytest.fixture
def gpu_kind(monkeypatch):
    """The CUDA platform (its allocator settings only: no device is touched), with no allocator
    variables of the environment and the settings back off afterwards."""
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    yield rd.get_platform("cuda")
    torch._C._accelerator_setAllocatorSettings("expandable_segments:False")


def test_expandable_segments_are_off_inside_and_back_on_after(gpu_kind):
    gpu_kind.memory.set_expandable_segments(True)
    assert gpu_kind.memory.expandable_segments_enabled()
    with gpu_kind.ipc_allocation():
        assert allocator_settings() == "expandable_segments:False"
        assert not gpu_kind.memory.expandable_segments_enabled()
    assert gpu_kind.memory.expandable_segments_enabled()
    with pytest.raises(ValueError, match="slot"), gpu_kind.ipc_allocation():
        raise ValueError("the slot allocation failed")
    assert gpu_kind.memory.expandable_segments_enabled(), "restored after a failure too"


def test_segments_left_off_stay_untouched(gpu_kind):
    gpu_kind.memory.set_expandable_segments(False)
    with gpu_kind.ipc_allocation():
        assert not gpu_kind.memory.expandable_segments_enabled()
    assert allocator_settings() == "expandable_segments:False"


def test_the_allocator_variable_tells_when_the_settings_do_not(gpu_kind, monkeypatch):
    torch._C._accelerator_setAllocatorSettings("max_split_size_mb:256")  # says nothing of segments
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert gpu_kind.memory.expandable_segments_enabled()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:256")
    assert not gpu_kind.memory.expandable_segments_enabled()


def test_elsewhere_the_context_changes_nothing():
    cpu = rd.get_platform("cpu")
    before = allocator_settings()
    with cpu.ipc_allocation():
        assert allocator_settings() == before
    slot = IpcSlot.create(4096, cpu)  # through the same context
    assert slot.tensor.numel() == 4096 and allocator_settings() == before
