"""The two ends of a sharded weight sync, run inside worker processes (tests/comm/workers.py).

Trainer ranks form a gloo world and shard a real tiny Qwen2 with FSDP2 (`fully_shard`); each
opens a `ShardedSender` with the layouts of every rank and sends its local slices. An engine rank
holds another tiny Qwen2 and loads what its `ShardedReceiver` assembles. Each trainer rank
reports the bytes it sent and the peak of its resident memory above where it stood before the
sync (VmHWM reset through /proc/self/clear_refs), so a test can check that no rank held the whole
model.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

import roll_device as rd
from roll_device.comm import plan_sync, weights_hash
from roll_device.comm.segments import keep_in_shared_memory
from roll_device.comm.sharded import ShardedReceiver, ShardedSender
from roll_device.comm.shards import local_shards
from strategies.tied_weights import state_once
from tests.comm.sync_checks import _load_into, _model
from tests.configs import weight_sync

_state: dict = {}


def start_trainer(rank: int, world: int, port: int, seed: int) -> None:
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = _model(seed, rd.get_platform("cpu"))
    for layer in model.model.layers:
        fully_shard(layer)
    _state["model"] = fully_shard(model)


def _local() -> list[tuple[str, torch.Tensor, object]]:
    return list(local_shards(state_once(_state["model"]).items()))


def open_sender(same_node: bool, receivers: int, bucket_bytes: int, verify: bool):
    layout = {name: shard for name, _, shard in _local()}
    layouts: list = [None] * dist.get_world_size()
    dist.all_gather_object(layouts, layout)
    plan = plan_sync("cpu", "cpu", colocated=False, same_node=same_node, forced="bridge")
    options = weight_sync(path="bridge", bucket_bytes=bucket_bytes, verify=verify, timeout_s=30)
    _state["sender"] = ShardedSender(
        plan, rd.get_platform("cpu"), dist.get_rank(), layouts, receivers, options
    )
    return _state["sender"].endpoint


def _memory(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def send(version: int) -> dict:
    """This rank's slices as `version`: the sync's stats, this rank's shard bytes and the peak of
    resident memory above its level before the sync."""
    local = [(name, tensor) for name, tensor, _ in _local()]
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _memory("VmRSS")
    stats = _state["sender"].send(local, version=version)
    return {
        "stats": stats,
        "shard_bytes": sum(t.numel() * t.element_size() for _, t in local),
        "peak_extra": _memory("VmHWM") - before,
    }


def full_hash() -> str:
    """The hash of the whole model (every rank calls it: it gathers)."""
    return weights_hash((name, t.full_tensor()) for name, t in state_once(_state["model"]).items())


def keep_in_shm() -> None:
    """The trainer rank's tensors into shared memory (the one-copy path: sent as they are)."""
    keep_in_shared_memory(t for _, t, _ in _local())


def start_engine(endpoints, rank: int, seed: int, in_place: bool = False) -> None:
    """An engine rank; `in_place`: tensors cut across ranks are assembled in its own weights."""
    _state["model"] = model = _model(seed, rd.get_platform("cpu"))
    targets = dict(model.state_dict()) if in_place else None
    _state["addresses"] = [t.data_ptr() for t in model.state_dict().values()]
    _state["receiver"] = ShardedReceiver(
        endpoints, rank, rd.get_platform("cpu"), timeout_s=30, targets=targets
    )


def connect(side: str) -> None:
    _state[side].connect()


def receive() -> dict:
    receiver = _state["receiver"]
    stats = receiver.receive(_load_into(_state["model"]))
    return {
        "stats": stats,
        "hash": weights_hash(state_once(_state["model"]).items()),
        "assembled": len(receiver.buffers),
        "assembled_in_place": sum(b.data_ptr() in _state["addresses"] for b in receiver.buffers.values()),
        "segments": sum(len(getattr(link.transport, "segments", ())) for link in receiver.links),
    }


def close(side: str) -> None:
    _state.pop(side).close()
