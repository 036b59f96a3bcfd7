"""CUDA / ROCm device operations and graph members on a real GPU; skipped cleanly without one.

CI has no GPU. These run where one is visible (the `device` machine, when a task has one).
"""

import os
import subprocess
import sys

import pytest
import torch

import roll_device as rd

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
]


@pytest.fixture
def gpu():
    return rd.current_platform()


def test_detected_kind_matches_build(gpu):
    assert gpu.kind == ("rocm" if torch.version.hip else "cuda")


def test_device_memory_seed_and_streams(gpu):
    gpu.set_device(0)
    assert gpu.device_count() >= 1 and gpu.current_device() == 0
    gpu.reset_peak_memory_stats()
    before = gpu.memory_allocated()
    x = torch.empty(1 << 20, dtype=torch.float32, device=gpu.device())
    assert gpu.memory_allocated() - before >= 4 << 20
    assert gpu.max_memory_allocated() >= gpu.memory_allocated()
    free, total = gpu.mem_get_info()
    assert 0 < free <= total
    gpu.manual_seed(5)
    a = torch.randn(8, device=gpu.device())
    gpu.manual_seed(5)
    assert torch.equal(a, torch.randn(8, device=gpu.device()))
    stream, event = gpu.new_stream(), gpu.new_event()
    with gpu.stream(stream):
        x.add_(1)
        event.record()
    event.synchronize()
    gpu.synchronize()
    del x
    gpu.empty_cache()


def test_graph_capture_replay_and_weak_ref(gpu):
    assert gpu.supports_graphs
    static_in = torch.zeros(16, device=gpu.device())
    pool = gpu.graph_pool_handle()
    graph = gpu.graph_class()()
    warm = gpu.new_stream()
    with gpu.stream(warm):
        static_out = static_in * 2 + 1  # warm-up outside capture
    gpu.synchronize()
    with gpu.graph_capture(graph, pool=pool):
        static_out = static_in * 2 + 1
    static_in.copy_(torch.arange(16.0, device=gpu.device()))
    graph.replay()
    gpu.synchronize()
    assert torch.equal(static_out, torch.arange(16.0, device=gpu.device()) * 2 + 1)
    weak = gpu.weak_ref_tensor(static_out)
    assert weak.data_ptr() == static_out.data_ptr() and torch.equal(weak, static_out)


def test_rng_state_round_trip_reserved_memory_and_timing_events(gpu):
    state = gpu.get_rng_state()
    a = torch.rand(4, device=gpu.device())
    gpu.set_rng_state(state)
    assert torch.equal(a, torch.rand(4, device=gpu.device()))
    x = torch.empty(1 << 22, device=gpu.device())
    assert gpu.memory.memory_reserved() >= gpu.memory_allocated() >= x.numel() * 4
    start, end = gpu.new_event(enable_timing=True), gpu.new_event(enable_timing=True)
    start.record(gpu.current_stream())
    x.mul_(2)
    end.record(gpu.current_stream())
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0


def test_allocator_env_is_accepted_by_a_fresh_process(gpu):
    """The allocator settings the platform gives worker processes (expandable segments)."""
    env = {**os.environ, **gpu.allocator_env()}
    code = "import torch; x = torch.ones(1 << 20, device='cuda'); print(torch.cuda.memory_allocated())"
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and int(proc.stdout.split()[-1]) >= 4 << 20, proc.stderr[-2000:]
    assert "expandable_segments" in next(iter(gpu.allocator_env().values()))


def _open_and_add_one(handle, done):
    platform = rd.current_platform()
    shared = platform.open_ipc_handle(handle)
    shared.add_(1)
    platform.synchronize()
    done.put(True)


def test_ipc_handle_shares_memory_with_another_process(gpu):
    import torch.multiprocessing as mp

    t = torch.arange(4.0, device=gpu.device())
    ctx = mp.get_context("spawn")
    done = ctx.Queue()
    child = ctx.Process(target=_open_and_add_one, args=(gpu.ipc_handle(t), done))
    child.start()
    assert done.get(timeout=120)
    child.join(timeout=60)
    assert torch.equal(t.cpu(), torch.arange(4.0) + 1)
