"""Device operations of the CPU platform, for real, and the loud failures of what it lacks."""

import pytest
import torch

import roll_device as rd
from roll_device.platforms import process_status
from tests.isolated import run_isolated


@pytest.fixture
def cpu():
    return rd.get_platform("cpu")


def test_devices(cpu):
    assert cpu.device_count() == 1 and cpu.current_device() == 0
    assert cpu.device() == torch.device("cpu")
    cpu.set_device(0)
    with pytest.raises(ValueError, match="device index 1 out of range"):
        cpu.set_device(1)
    cpu.synchronize()
    cpu.empty_cache()


def test_memory_reports_the_process_and_machine(cpu):
    before = cpu.memory_allocated()
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, touched
    assert cpu.memory_allocated() - before > 32 << 20
    assert cpu.max_memory_allocated() >= cpu.memory_allocated() - (8 << 20)
    free, total = cpu.mem_get_info()
    assert 0 < free <= total
    del block


def _anon_bytes() -> int:
    return process_status("RssAnon")["RssAnon"]


def freed_then_released() -> dict:
    """MiB this fresh process holds over its start: with 3,000 tensors of 64 KiB alive (the C
    allocator's heap), after freeing all but the last (which keeps the heap from shrinking by
    itself), and after the platform's `empty_cache`."""
    start = _anon_bytes()
    held = [torch.ones(16384) for _ in range(3000)]
    alive = _anon_bytes()
    del held[:-1]
    freed = _anon_bytes()
    rd.get_platform("cpu").empty_cache()
    return {
        k: (v - start) >> 20 for k, v in {"alive": alive, "freed": freed, "released": _anon_bytes()}.items()
    }


def test_empty_cache_gives_the_heaps_free_memory_back():
    """Freed host tensors stay resident in glibc's heap until `empty_cache` (`malloc_trim`)."""
    mib = run_isolated("tests.platforms.test_cpu_operations:freed_then_released")
    assert mib["freed"] > mib["alive"] // 2 > 64, mib  # freed, still resident
    assert mib["released"] < mib["freed"] - mib["alive"] // 2, mib


def test_seed_and_rng_state_roundtrip(cpu):
    cpu.manual_seed(7)
    a = torch.randn(4)
    cpu.manual_seed(7)
    state = cpu.get_rng_state()
    b = torch.randn(4)
    cpu.set_rng_state(state)
    assert torch.equal(a, b) and torch.equal(b, torch.randn(4))


def test_streams_and_events(cpu):
    stream = cpu.new_stream()
    with cpu.stream(stream):
        torch.ones(2).sum()
    assert cpu.current_stream() is not None
    event = cpu.new_event()
    event.record()
    event.synchronize()


@pytest.mark.parametrize(
    "member, call",
    [
        ("graph_class", lambda p: p.graph_class()),
        ("graph_capture", lambda p: p.graph_capture(None)),
        ("graph_pool_handle", lambda p: p.graph_pool_handle()),
        ("weak_ref_tensor", lambda p: p.weak_ref_tensor(torch.ones(1))),
        ("ipc_handle", lambda p: p.ipc_handle(torch.ones(1))),
    ],
)
def test_unsupported_members_fail_loudly_with_platform_and_member(cpu, member, call):
    assert not cpu.supports_graphs
    with pytest.raises(NotImplementedError, match=f"platform 'cpu' does not support {member}"):
        call(cpu)


def test_no_attribute_fall_through(cpu):
    with pytest.raises(AttributeError):
        cpu.is_bf16_supported  # noqa: B018 - not a member: no silent None
