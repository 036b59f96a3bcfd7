"""The new platform members on the simulated NPU, run in a process of their own (ROLL_DEVICE=npu-sim).

Every result here comes from the simulation: CPU compute behind tensors that report `npu:N`.
"""

from __future__ import annotations

import os

import torch

from tests.isolated import error_of, simulated_npu


def profiling() -> dict:
    from roll_device.sim.markers import RECORDED

    p = simulated_npu()
    with p.profiling.range("step"):
        p.profiling.range_push("forward")
        p.profiling.mark("loss")
        p.profiling.range_pop()
    with p.profiling.profile() as prof:
        torch.ones(4, device=p.device()).sum()
    return {
        "recorded": [list(r) for r in RECORDED],
        "activity": str(p.profiling.profiler_activity()),
        "profiled_ops": sorted({e.name for e in prof.events() if e.name.startswith("aten::")}),
        "profiler_start": error_of(p.profiling.profiler_start),
        "profiler_stop": error_of(p.profiling.profiler_stop),
    }


def device_facts() -> dict:
    p = simulated_npu()
    p.runtime.init()
    p.set_device(1)
    return {
        "name": p.device_name(),
        "arch": p.facts.device_arch(0),
        "total": p.total_memory(),
        "properties_name": p.facts.device_properties().name,
        "uuid": p.facts.device_uuid(),
        "capability": error_of(p.facts.device_capability),
        "on_device": p.is_device_tensor(torch.ones(1, device=p.device())),
        "cpu_on_device": p.is_device_tensor(torch.ones(1)),
        **new_members(p),
    }


def memory() -> dict:
    p = simulated_npu()
    p.reset_peak_memory_stats()
    x = torch.empty(1 << 20, dtype=torch.uint8, device=p.device())
    stats = p.memory.memory_stats()
    peak_reserved = p.memory.max_memory_reserved()
    del x
    out = {
        "allocated": stats["allocated_bytes.all.current"],
        "reserved_peak": stats["reserved_bytes.all.peak"],
        "max_reserved": peak_reserved,
        "reserved_after_free": p.memory.memory_reserved(),
    }
    p.empty_cache()
    out["reserved_after_empty_cache"] = p.memory.memory_reserved()
    p.memory.set_memory_fraction(0.5)
    half = p.total_memory() // 2
    out["over_fraction"] = error_of(
        lambda: torch.empty(half + (1 << 20), dtype=torch.uint8, device=p.device())
    )
    out["under_fraction"] = error_of(lambda: torch.empty(1 << 20, dtype=torch.uint8, device=p.device()))
    p.memory.set_memory_fraction(1.0)
    p.memory.ipc_collect()
    p.memory.clear_library_workspaces()
    p.memory.set_expandable_segments(False)
    from roll_device.sim.allocator import current_settings

    out["settings"] = current_settings()
    out["bad_setting"] = error_of(lambda: p.memory.set_allocator_settings("no_such_key:1"))
    out.update(memory_history(p))
    p.empty_cache()
    out["used"] = p.memory.device_memory_used()
    t = torch.ones(2)
    out["pinned"] = p.supports_pinned_memory
    out["pin_is_identity"] = p.memory.pin_memory(t) is t
    return out


def memory_history(p) -> dict:
    """What torch_npu's memory history records of one kept and one freed allocation ("all"), and of
    one more kept allocation while only the state of live memory is recorded ("state")."""
    import pickle
    import tempfile

    p.memory.record_memory_history(True)
    kept = torch.empty(3 << 10, dtype=torch.uint8, device=p.device())
    torch.empty(5 << 10, dtype=torch.uint8, device=p.device())
    with tempfile.TemporaryDirectory() as tmp:
        p.memory.dump_memory_snapshot(f"{tmp}/snapshot.pickle")
        with open(f"{tmp}/snapshot.pickle", "rb") as f:
            snapshot = pickle.load(f)
    p.device_module().memory._record_memory_history("state")
    also_kept = torch.empty(2 << 20, dtype=torch.uint8, device=p.device())
    state = p.device_module().memory._snapshot()
    p.memory.record_memory_history(False)
    trace = snapshot["device_traces"][kept.device.index]
    blocks = {s["total_size"]: (s["segment_type"], s["blocks"][0]["frames"]) for s in state["segments"]}
    del also_kept
    return {
        "segments": sorted(s["total_size"] for s in snapshot["segments"]),
        "trace": [[e["action"], e["size"]] for e in trace],
        "stack_names_this_check": any(fr["name"] == "memory_history" for fr in trace[0]["frames"]),
        "block_stack_names_this_check": any(fr["name"] == "memory_history" for fr in blocks[3 << 10][1]),
        "state_trace_unchanged": len(state["device_traces"][kept.device.index]) == len(trace),
        "segment_types": {str(size): kind for size, (kind, _) in blocks.items()},
        "bad_mode": error_of(lambda: p.device_module().memory._record_memory_history("everything")),
    }


def new_members(p) -> dict:
    """The members added for the frameworks' remaining needs, as the simulated NPU answers them."""
    return {
        "uuid_index": p.facts.device_index_of_uuid("NPU-6"),
        "bare_uuid_index": p.facts.device_index_of_uuid("7"),
        "unknown_uuid": error_of(lambda: p.facts.device_index_of_uuid("NPU-1")),
        "visible": p.env.visible_device_ids(),
        "debug": p.env.collective_debug_env("trace"),
        "ports": p.env.collective_ports_env(),
        "connections": p.env.device_connections_env(1),
        "switch_off": p.env.switch_reduction_env(False),
        "kernel_build": p.kernels.kernel_build_env(),
        "attention": p.kernels.attention_backend(),
        "pci": error_of(p.topology.pci_bus_id),
        "numa": error_of(p.topology.numa_node),
        **host_registration(p),
        "dnn": error_of(lambda: p.kernels.set_dnn_library_enabled(False)),
    }


def host_registration(p) -> dict:
    """Host memory page-locked in place through torch_npu's runtime bindings, and released."""
    host = torch.ones(1024)
    registered = error_of(lambda: p.memory.register_host_memory(host))
    twice = error_of(lambda: p.memory.register_host_memory(host))
    released = error_of(lambda: p.memory.unregister_host_memory(host))
    return {
        "register": registered,
        "register_twice": twice,
        "unregister": released,
        "unregister_again": error_of(lambda: p.memory.unregister_host_memory(host)),
    }


def rng_and_determinism() -> dict:
    p = simulated_npu()
    p.manual_seed(3)
    states = p.determinism.get_rng_state_all()
    a = torch.rand(3, device=p.device()).cpu()
    p.determinism.set_rng_state_all(states)
    b = torch.rand(3, device=p.device()).cpu()
    try:
        p.determinism.set_deterministic(True)
        enabled = torch.are_deterministic_algorithms_enabled()
        env = {k: os.environ.get(k) for k in p.determinism.deterministic_env()}
    finally:
        p.determinism.set_deterministic(False)
    return {"states": len(states), "same": torch.equal(a, b), "enabled": enabled, "env": env}


def process_env() -> dict:
    p = simulated_npu()
    env = {"ASCEND_RT_VISIBLE_DEVICES": "0,1"}
    p.env.pin_devices(env, [6, 7])
    return {
        "pinned": env,
        "noset": p.env.ray_noset_env(),
        "collective": p.collective_env(timeout_s=1200),
        "rank": p.env.rank_env(5),
        "training": p.env.training_env(),
        "ray_ids_outside_ray": p.ray_device_ids(),
    }
