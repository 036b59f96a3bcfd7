"""Checks of the SIMULATED NPU's device models (ACL graphs, streams, memory), run in a process of
their own (the simulation renames PrivateUse1 once per process). Every result is a simulation."""

from __future__ import annotations

import os

import torch

from tests.isolated import error_of, simulated_npu


def _capture(p, fn, pool=None, stream=None):
    graph = p.graph_class()()
    with p.graph_capture(graph, pool=pool, stream=stream):
        out = fn()
    return graph, out


def replay() -> dict:
    """Replay reruns the captured work on the same tensors; what needs the host is refused."""
    p = simulated_npu()
    d = p.device()
    weight = torch.randn(8, 8, device=d)
    x = torch.zeros(4, 8, device=d)

    def step():
        acc = torch.zeros(4, 8, device=d)  # made inside the capture: zeroed again on every replay
        acc += x @ weight
        return torch.tanh(acc).softmax(-1)

    graph, out = _capture(p, step)
    pointer, results = out.untyped_storage().data_ptr(), []
    for _ in range(2):
        x.copy_(torch.randn(4, 8))
        graph.replay()
        results.append(torch.allclose(out.cpu(), torch.tanh(x @ weight).softmax(-1).cpu()))
    host_buffer = torch.zeros(4, 8)
    copier, _ = _capture(p, lambda: host_buffer.copy_(x, non_blocking=True))
    x.fill_(3.0)
    copier.replay()
    refused = {}
    for name, fn in {
        "item": lambda: x.sum().item(),
        "tolist": lambda: x.tolist(),
        "cpu": lambda: x.cpu(),
        "print": lambda: print(x),
        "bool": lambda: bool(x[0, 0]),
        "equal": lambda: torch.equal(x, x),
        "synchronize": p.synchronize,
        "copy_to_host": lambda: torch.empty(4, 8).copy_(x),
    }.items():
        graph = p.graph_class()()
        refused[name] = error_of(lambda fn=fn, graph=graph: _capture_into(p, graph, fn))
        refused[name + "_left_capture"] = not p.device_module().is_current_stream_capturing()
        refused[name + "_no_replay"] = error_of(graph.replay)
    return {
        "replays_match": results,
        "same_output_memory": out.untyped_storage().data_ptr() == pointer,
        "non_blocking_copy_replayed": bool((host_buffer == 3.0).all()),
        "refused": refused,
    }


def _capture_into(p, graph, fn):
    with p.graph_capture(graph):
        fn()


def capture_rules() -> dict:
    """torch_npu's own checks on capture: stream, reuse, pool id, task queue level."""
    p = simulated_npu()
    npu = p.device_module()
    d = p.device()
    x = torch.ones(3, device=d)
    handle = p.graph_pool_handle()
    graph = npu.NPUGraph()
    out = {"pool_before_capture": error_of(graph.pool), "replay_before_capture": error_of(graph.replay)}
    out["default_stream"] = error_of(graph.capture_begin)
    inside = []
    with p.graph_capture(graph, pool=handle):
        inside.append(npu.is_current_stream_capturing())
        x.mul_(2)
    out["capturing_inside_outside"] = [inside[0], npu.is_current_stream_capturing()]
    out["pool_is_handle"] = graph.pool() == handle
    out["capture_twice"] = error_of(lambda: _capture_into(p, graph, lambda: x.add_(1)))
    other = npu.NPUGraph()
    with npu.stream(npu.Stream()):
        other.capture_begin()
    out["end_on_other_stream"] = error_of(other.capture_end)
    other.abort_capture()
    os.environ["TASK_QUEUE_ENABLE"] = "2"
    out["task_queue_2"] = error_of(lambda: _capture(p, lambda: x.add_(1)))
    del os.environ["TASK_QUEUE_ENABLE"]
    return out


def stream_budget() -> dict:
    """ROLL_SIM_NPU_STREAMS=36: the default stream and the pool of 32 leave 3 for graphs."""
    p = simulated_npu()
    x = torch.ones(3, device=p.device())
    graphs = [_capture(p, lambda: x * 2)[0] for _ in range(3)]
    out = {"fourth": error_of(lambda: _capture(p, lambda: x * 2))}
    graphs.pop().reset()
    out["after_reset"] = error_of(lambda: graphs.append(_capture(p, lambda: x * 2)[0]))
    os.environ["STREAMS_PER_DEVICE"] = "8"  # a device whose pool opens now: 8 streams, not 32
    p.set_device(1)
    x1, side = torch.ones(3, device=p.device()), p.new_stream()
    graphs += [_capture(p, lambda: x1 * 2, stream=side)[0] for _ in range(36 - 1 - 8)]
    out["graphs_on_npu1"] = len(graphs) - 3
    out["one_more"] = error_of(lambda: _capture(p, lambda: x1 * 2, stream=side))
    return out


def memory() -> dict:
    """Pools shared and counted once, released after reset and empty_cache; the capacity."""
    p = simulated_npu()
    d = p.device()
    x = torch.ones(256, 1024, device=d)  # 1 MiB

    def reserved_after(fn):
        before = p.memory.memory_reserved()
        fn()
        return p.memory.memory_reserved() - before

    handle = p.graph_pool_handle()
    kept = []
    shared = reserved_after(
        lambda: kept.extend(_capture(p, lambda: (x * 2).sum(0), pool=handle) for _ in range(3))
    )
    private = reserved_after(lambda: kept.extend(_capture(p, lambda: (x * 2).sum(0)) for _ in range(3)))
    held = p.memory.memory_reserved()
    while kept:
        kept.pop()[0].reset()  # no loop variable left holding an output
    after_reset = p.memory.memory_reserved()
    p.empty_cache()
    free, total = p.mem_get_info()
    out = {
        "shared_pool_bytes": shared,
        "private_pools_bytes": private,
        "held_until_empty_cache": after_reset == held,
        "free_plus_reserved_is_total": free + p.memory.memory_reserved() == total,
        "after_empty_cache": p.memory.memory_reserved(),
    }
    os.environ["ROLL_SIM_NPU_MEMORY_BYTES"] = str(3 << 20)  # 3 MiB: x holds one
    out["oom"] = error_of(lambda: torch.empty(3 << 20, dtype=torch.uint8, device=d))
    y = torch.empty(1 << 20, dtype=torch.uint8, device=d)  # fits beside x
    out["fits"] = p.memory_allocated() == 2 << 20
    del y
    out["oom_in_capture"] = error_of(
        lambda: _capture(p, lambda: torch.zeros(4 << 20, dtype=torch.uint8, device=d))
    )
    out["no_capture_left"] = not p.device_module().is_current_stream_capturing()
    return out


def device_graph_tests() -> dict:
    """The device graph tests of tests/graph/test_graphs_on_device.py, on the simulated NPU."""
    from tests.graph import test_graphs_on_device as device_tests

    p = simulated_npu()
    device_tests.test_replay_equals_eager_for_every_batch(p)
    device_tests.test_buckets_share_one_memory_pool(p)
    return {"platform": p.name, "passed": 2}
