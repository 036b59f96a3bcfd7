"""Checks of the simulated NPU, each run in a process of its own (the rename is once per process).

Every result here comes from the simulation: CPU compute behind tensors that report `npu:N`.
"""

from __future__ import annotations

import copy
import io
import os
import socket

import torch

from tests.isolated import error_of, simulated_npu


def platform_contract() -> dict:
    p = simulated_npu()
    out = {"name": p.name, "kind": p.kind, "count": p.device_count(), "graphs": p.supports_graphs}
    p.set_device(2)
    out["current"] = p.current_device()
    out["device"] = str(p.device())
    try:
        p.set_device(p.device_count())
    except ValueError as exc:
        out["bad_index"] = str(exc)
    p.synchronize()
    p.empty_cache()
    base = p.memory_allocated()
    x = torch.empty(1024, dtype=torch.float32, device=p.device())
    view = x[:10]
    out["tensor_device"] = str(view.device)
    out["allocated_delta"] = p.memory_allocated() - base
    storage = view.untyped_storage()  # the wrapped CPU data's: shared by views, resizable
    out["view_shares_storage"] = storage.data_ptr() == x.untyped_storage().data_ptr() != 0
    out["storage_nbytes"] = storage.nbytes()
    free, total = p.mem_get_info()
    out["free_plus_allocated_is_total"] = free + p.memory_allocated() == total
    del x, view
    out["after_free_delta"] = p.memory_allocated() - base
    out["peak_delta"] = p.max_memory_allocated() - base
    p.reset_peak_memory_stats()
    out["peak_after_reset_delta"] = p.max_memory_allocated() - base
    p.manual_seed(3)
    a = torch.randn(5, device=p.device())
    state = p.get_rng_state()
    b = torch.randn(5, device=p.device())
    p.set_rng_state(state)
    out["rng_roundtrip"] = torch.equal(b.cpu(), torch.randn(5, device=p.device()).cpu())
    p.manual_seed(3)
    out["seeded"] = torch.equal(a.cpu(), torch.randn(5, device=p.device()).cpu())
    stream, event = p.new_stream(), p.new_event()
    with p.stream(stream):
        event.record()
    event.synchronize()
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(3.0, device=p.device())}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)["w"]
    out["saved_device"] = str(loaded.device)
    out["saved_values"] = loaded.cpu().tolist()
    out["graph_class"] = p.graph_class().__name__
    return out


def allocator_cache() -> dict:
    """What freed memory does to `memory_reserved` and `mem_get_info` until `empty_cache`."""
    p = simulated_npu()
    mib = 2**20
    p.empty_cache()

    def reserved() -> int:
        return (p.memory.memory_reserved() - base) // mib

    base, free_before = p.memory.memory_reserved(), p.mem_get_info()[0]
    x = torch.empty(4 * mib, dtype=torch.uint8, device=p.device())
    del x
    out = {
        "freed_still_reserved": reserved(),
        "free_still_reduced": p.mem_get_info()[0] == free_before - 4 * mib,
    }
    y = torch.empty(1 * mib, dtype=torch.uint8, device=p.device())
    out["reused"] = reserved()
    z = torch.empty(8 * mib, dtype=torch.uint8, device=p.device())
    out["grown"] = reserved()
    del y, z
    p.empty_cache()
    out["after_empty_cache"] = reserved()
    out["free_back"] = p.mem_get_info()[0] == free_before
    return out


def qwen_step() -> dict:
    """A tiny Qwen2 forward + backward + AdamW step on npu:0 against the same on the CPU."""
    p = simulated_npu()
    from transformers import Qwen2ForCausalLM

    from roll_device.models.tiny import build_config

    torch.manual_seed(0)
    config = build_config()
    config._attn_implementation = "eager"  # the same attention kernel on both sides
    cpu_model = Qwen2ForCausalLM(config).float()
    npu_model = copy.deepcopy(cpu_model).to(p.device(0))
    ids = torch.randint(3, 40, (2, 12))
    results = {}
    for name, model, device in (("cpu", cpu_model, "cpu"), ("npu", npu_model, p.device(0))):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        batch = ids.to(device)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        results[name] = (loss.item(), {k: v.detach().cpu() for k, v in model.state_dict().items()})
    max_diff = max(
        (results["cpu"][1][k] - results["npu"][1][k]).abs().max().item() for k in results["cpu"][1]
    )
    return {
        "cpu_loss": results["cpu"][0],
        "npu_loss": results["npu"][0],
        "max_weight_diff": max_diff,
        "param_device": str(next(npu_model.parameters()).device),
    }


def _allreduce_rank(rank: int, port: int, queue) -> None:
    import torch.distributed as dist

    p = simulated_npu()
    p.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(p.dist_backend, rank=rank, world_size=2)
    t = torch.full((4,), float(rank + 1), device=p.device())
    dist.all_reduce(t)
    gathered = torch.empty(8, device=p.device())
    dist.all_gather_into_tensor(gathered, t)
    queue.put((rank, p.dist_backend, str(t.device), t.cpu().tolist(), gathered.cpu().tolist()))
    dist.destroy_process_group()


def hccl_allreduce() -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_rank, args=(r, port, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = sorted(queue.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    return {"ranks": results, "exitcodes": [proc.exitcode for proc in procs]}


def metadata_after_ops() -> dict:
    """The faults the OpInfo comparison found, one line each: what a simulated tensor reports."""
    p = simulated_npu()
    dev = p.device()
    out = {"arange": list(torch.arange(5, device=dev).shape), "eye": list(torch.eye(2, 3, device=dev).shape)}
    base = p.memory_allocated()
    grown = torch.arange(1000, dtype=torch.float32, device=dev)  # an out= result resized by its kernel
    out["arange_bytes"] = p.memory_allocated() - base
    grown.resize_(2000)
    out["resized_bytes"] = p.memory_allocated() - base
    del grown
    x = torch.zeros(2, 3, device=dev)
    out["unsqueeze_"] = list(x.unsqueeze_(0).shape)
    out["t_"] = list(torch.zeros(2, 3, device=dev).t_().stride())
    out["resize_"] = list(torch.zeros(4, device=dev).resize_(2, 5).shape)
    out["matmul_1d"] = list(torch.matmul(torch.ones(3, device=dev), torch.ones(3, 4, device=dev)).shape)
    batch, vector, into = (
        torch.ones(2, 3, 4, device=dev),
        torch.ones(4, device=dev),
        torch.empty(0, device=dev),
    )
    torch.matmul(batch, vector, out=into)  # computed into a view of `into`, which must alias it
    out["matmul_out"] = into.cpu().tolist()
    c = torch.randn(4, dtype=torch.complex64, device=dev)
    out["conj"] = c.conj().is_conj()
    w = torch.randn(8, device=dev, requires_grad=True)
    torch.fft.hfft(w.to(torch.complex64)).sum().backward()
    out["hfft_grad"] = list(w.grad.shape)
    out["to_cpu"] = str(torch.ones(2, device=dev).to("cpu").device)
    coo = torch.eye(3, device=dev).to_sparse()
    csr = torch.eye(3, device=dev).to_sparse_csr()
    out["sparse"] = [
        str(coo.layout),
        str(coo.device),
        str(csr.layout),
        (csr @ torch.ones(3, device=dev)).cpu().tolist(),
    ]
    # what a device counts and the CPU refuses (transformers' grouped MoE experts, off the CPU)
    ids = torch.tensor([3, 0, 3, 1, 7], dtype=torch.int32, device=dev)
    counted = torch.histc(ids, bins=8, min=0, max=7)
    out["histc_int"] = [str(counted.dtype), counted.cpu().tolist()]
    return out


def device_limits() -> dict:
    """What torch_npu refuses on the machine `ROLL_SIM_NPU_COUNT` and `ROLL_SIM_NPU_MEMORY_BYTES`
    describe: a device index it does not have, an int fraction, an allocation past the fraction."""
    p = simulated_npu()
    missing = f"npu:{torch.npu.device_count()}"
    out = {
        "factory": error_of(lambda: torch.ones(2, device=missing)),
        "copy": error_of(lambda: torch.zeros(2).to(missing)),
        "set_device": error_of(lambda: torch.npu.set_device(missing)),
        "last": str(torch.ones(2, device=f"npu:{torch.npu.device_count() - 1}").device),
        "int_fraction": error_of(lambda: torch.npu.set_per_process_memory_fraction(1)),
    }
    half = p.total_memory() // 2
    torch.npu.set_per_process_memory_fraction(0.25)
    out["oom"] = error_of(lambda: torch.empty(half, dtype=torch.uint8, device="npu:0"))
    p.memory.set_memory_fraction(1)  # the platform hands torch_npu the float it needs
    out["whole_device"] = error_of(lambda: torch.empty(half, dtype=torch.uint8, device="npu:0"))
    return out


def sparse_mm_reduce_backward() -> dict:
    """The gradients of `torch.sparse.mm(csr, dense, reduce)` on `npu:0` and on the CPU, per reduction
    (the backward of "amax" and "amin" read an index the forward had not kept, and the process died)."""
    p = simulated_npu()
    out = {}
    for reduce in ("sum", "mean", "amax", "amin"):
        torch.manual_seed(0)
        a, b = torch.randn(5, 5).relu().to_sparse_csr(), torch.randn(5, 3)
        grads = []
        for device in ("cpu", p.device()):
            a_, b_ = (t.detach().to(device).requires_grad_() for t in (a, b))
            torch.sparse.mm(a_, b_, reduce).sum().backward()
            grads.append((a_.grad.to_dense().cpu(), b_.grad.cpu(), str(b_.grad.device)))
        (cpu_a, cpu_b, _), (npu_a, npu_b, device) = grads
        out[reduce] = [torch.equal(cpu_a, npu_a) and torch.equal(cpu_b, npu_b), device]
    return out


def data_swap() -> dict:
    """`t.data = other` on `npu:0`, as megatron's DDP maps each parameter into its buffer: `t` then
    computes with `other`'s values, writes land in `other`'s memory, and `t`'s old storage is freed."""
    p = simulated_npu()
    dev = p.device()
    base = p.memory_allocated()
    param = torch.nn.Parameter(torch.zeros(4, device=dev))
    buffer = torch.arange(6.0, device=dev)
    param.data = buffer[2:]
    out = {"allocated_after_swap": p.memory_allocated() - base}  # the buffer's 24 bytes alone
    out["computes_with"] = (param * 1).cpu().tolist()
    (param * 2).sum().backward()
    out["grad"] = param.grad.cpu().tolist()
    with torch.no_grad():
        param.add_(1)
    out["buffer_after_update"] = buffer.cpu().tolist()
    out["data_type"] = type(param.data).__name__
    return out


def device_scalars_to_host() -> dict:
    """`torch.tensor` of a list of device scalars (megatron's grad-norm fallback without apex):
    read with `item()` below the wrapper's dispatch, a host tensor of their values, as on a device."""
    p = simulated_npu()
    norms = [torch.tensor(3.0, device=p.device()), torch.tensor(4.0, device=p.device())]
    made = torch.tensor([norms])
    return {"device": str(made.device), "values": made.tolist(), "norm": torch.norm(made).item()}


def backward_on_a_later_device() -> dict:
    """A forward and backward with `npu:1` current (a second rank's device), against the CPU: the
    autograd engine sizes its device queues by the device guard's count at its first backward."""
    p = simulated_npu()
    torch.manual_seed(0)
    cpu_layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    p.set_device(1)
    try:
        layer = copy.deepcopy(cpu_layer).to(p.device())
        layer(x.to(p.device())).square().sum().backward()
    finally:
        p.set_device(0)
    cpu_layer(x).square().sum().backward()
    return {
        "grad_device": str(layer.weight.grad.device),
        "grad_diff": (layer.weight.grad.cpu() - cpu_layer.weight.grad).abs().max().item(),
    }


def parameter_marks_on_the_device() -> dict:
    """`Module.to("npu")` makes new parameters here (a CPU tensor cannot take a wrapper's data in
    place), without the attributes megatron marks its parameters with; the Megatron trainer's move
    keeps them (each rank's expert gradients were summed with another rank's without)."""
    from strategies.training.megatron_model import to_device

    p = simulated_npu()
    out = {}
    for how, move in (
        ("Module.to", lambda m: m.to(p.device())),
        ("trainer", lambda m: to_device(m, p.device())),
    ):
        layer = torch.nn.Linear(2, 2)
        layer.weight.allreduce = False
        move(layer)
        out[how] = [str(layer.weight.device), getattr(layer.weight, "allreduce", "lost")]
    return out
