"""One member of a `Platform.device_communicator` group, run in a process of its own (two of them
make a group): what each operation gave this rank, and which backend carried it."""

from __future__ import annotations

import os

import torch


def member(kind: str, port: str, rank: str) -> dict:
    if kind == "npu-sim":
        os.environ["ROLL_DEVICE"] = "npu-sim"
    import roll_device as rd

    p = rd.current_platform() if kind == "npu-sim" else rd.get_platform(kind)
    me = int(rank)
    comm = p.runtime.device_communicator("127.0.0.1", int(port), me, 2, timeout_s=60)
    device = p.device()
    sent = (
        torch.arange(4, dtype=torch.float32, device=device) * 10 if me == 0 else torch.zeros(4, device=device)
    )
    comm.broadcast(sent, src=0)
    total = comm.all_reduce(torch.full((2,), float(me + 1), device=device))
    if me == 0:
        comm.send(torch.tensor([7.0, 8.0], device=device), dst=1)
        got = []
    else:
        got = comm.recv(torch.zeros(2, device=device), src=0).cpu().tolist()
    comm.barrier()
    out = {
        "backend": torch.distributed.get_backend(comm.group),
        "device": str(sent.device),
        "broadcast": sent.cpu().tolist(),
        "all_reduce": total.cpu().tolist(),
        "recv": got,
        "default_group": torch.distributed.is_initialized(),
    }
    comm.close()
    return out
