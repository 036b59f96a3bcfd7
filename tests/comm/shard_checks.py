"""The two ends of a sharded weight sync, run inside worker processes (tests/comm/workers.py).

Trainer ranks form a gloo world and hold a real model in slices: a tiny Qwen2 sharded with FSDP2
(`fully_shard`), or a Megatron-core trainer (tensor, pipeline or expert parallel; its
`export_shards`), one after the other in the same world; or random tensors whole on every rank (the
plan spreads them over the ranks). Each opens a `ShardedSender` with the layouts of every rank and sends its local
slices. An engine rank (in the test's own process) loads what its `ShardedReceiver` assembles:
into another tiny Qwen2, or through the HF rollout strategy's own receiver. Each trainer rank reports the bytes it sent, the
pieces it sent (name and box) and the peak of its resident memory above where it stood before the
sync (VmHWM reset through /proc/self/clear_refs), so a test can check that no rank held the whole
model; a rank can be made to die mid-sync (a lost trainer rank).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
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
TIMEOUT_S = 30
TRAINER_NODE = "node-0"  # every trainer rank's (simulated) node


def join(rank: int, world: int, store: str) -> None:
    """This trainer rank's gloo world, met through the file store `store` (every start below holds
    its model in it)."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


def _hold(slices, whole, trainer=None) -> None:
    """The model this rank holds from now on: `slices()` yields its (name, local, Shard),
    `whole()` the whole model; a Megatron trainer held before is shut down (its parallel state
    leaves the world)."""
    previous = _state.pop("trainer", None)
    if previous is not None:
        previous.shutdown()
    _state.update(slices=slices, whole=whole, trainer=trainer)


def start_fsdp(seed: int) -> None:
    """An FSDP2-sharded tiny Qwen2: each rank holds dim-0 slices."""
    from torch.distributed.fsdp import fully_shard

    model = _model(seed, rd.get_platform("cpu"))
    for layer in model.model.layers:
        fully_shard(layer)
    model = fully_shard(model)
    _hold(
        lambda: local_shards(state_once(model).items()),
        lambda: ((name, t.full_tensor()) for name, t in state_once(model).items()),
    )


def start_replica(seed: int, tensors: int) -> None:
    """`tensors` random 128 x 128 tensors of `seed`, whole on every rank: each a replica the plan
    gives one rank to send."""
    torch.manual_seed(seed)
    state = {f"w{i}": torch.randn(128, 128) for i in range(tensors)}
    _hold(lambda: local_shards(state.items()), state.items)


def start_megatron(model_path: str, layout: dict) -> dict:
    """A Megatron-core trainer of `layout` (trainer settings); returns this rank's experts (global
    indices, as [first, stop)) and the whole export's bytes."""
    from tests.strategies.training.megatron_checks import new_trainer

    _hold(None, None)
    trainer = new_trainer(model_path, **layout)
    _hold(trainer.export_shards, trainer.export_weights, trainer)
    experts = trainer.experts.experts(trainer.plan.shape)
    whole = sum(t.numel() * t.element_size() for _, t in trainer.export_weights())
    return {"experts": [experts.start, experts.stop], "whole_bytes": whole}


def _local() -> list[tuple[str, torch.Tensor, object]]:
    return list(_state["slices"]())


def open_sender(engines: list[str], bucket_bytes: int, verify: bool):
    """This rank's sender on node `TRAINER_NODE`, to engine ranks on `engines` (their nodes: the
    bridge's links are shared memory to the trainer's node, gloo to any other)."""
    layout = {name: shard for name, _, shard in _local()}
    layouts: list = [None] * dist.get_world_size()
    dist.all_gather_object(layouts, layout)
    same_node = set(engines) == {TRAINER_NODE}
    plan = plan_sync("cpu", "cpu", colocated=False, same_node=same_node, forced="bridge")
    options = weight_sync(path="bridge", bucket_bytes=bucket_bytes, verify=verify, timeout_s=TIMEOUT_S)
    _state["sender"] = ShardedSender(
        plan, rd.get_platform("cpu"), dist.get_rank(), layouts, engines, options, node=TRAINER_NODE
    )
    return _state["sender"].endpoint


def _memory(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _dying(local: list[tuple[str, torch.Tensor]], after: int) -> Iterator[tuple[str, torch.Tensor]]:
    """`local`, but this process is killed (a lost trainer rank) once `after` tensors went out."""
    for index, item in enumerate(local):
        if index == after:
            os.kill(os.getpid(), signal.SIGKILL)
        yield item


def _slots_handed(sender: ShardedSender) -> int:
    """Buckets this rank's links have packed into slots so far (a slot transport's count)."""
    return sum(sum(getattr(link.sender.transport, "handed", ())) for link in sender.node_links)


def send(version: int, die_after: int | None = None) -> dict:
    """This rank's slices as `version`: the sync's stats, this rank's shard bytes, the pieces it
    sent (name, box offset, box shape), the buckets it packed into slots and the peak of resident
    memory above its level before the sync. `die_after`: the process dies after that many
    tensors."""
    local = [(name, tensor) for name, tensor, _ in _local()]
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _memory("VmRSS")
    sender = _state["sender"]
    handed = _slots_handed(sender)
    stats = sender.send(local if die_after is None else _dying(local, die_after), version=version)
    return {
        "packed_buckets": _slots_handed(sender) - handed,
        "stats": stats,
        "shard_bytes": sum(t.numel() * t.element_size() for _, t in local),
        "pieces": [(p.name, p.box.offset, p.box.shape) for p in sender.shards.sends[sender.link]],
        "peak_extra": _memory("VmHWM") - before,
    }


def send_stray(version: int) -> None:
    """A sync whose export, after this rank's slices, yields a tensor its layout does not hold."""
    stray = [("model.stray.weight", torch.zeros(2))]
    _state["sender"].send([(name, tensor) for name, tensor, _ in _local()] + stray, version=version)


def full_hash() -> str:
    """The hash of the whole model (every rank calls it: it may gather)."""
    return weights_hash(_state["whole"]())


def keep_in_shm() -> None:
    """The trainer rank's tensors into shared memory (the one-copy path: sent as they are)."""
    keep_in_shared_memory(t for _, t, _ in _local())


class ModelEngine:
    """An engine rank that is a plain tiny Qwen2, loaded from its own `ShardedReceiver`;
    `in_place`: tensors cut across ranks are assembled in its own weights."""

    def __init__(self, endpoints, rank: int, seed: int, in_place: bool = False) -> None:
        self.model = _model(seed, rd.get_platform("cpu"))
        targets = dict(self.model.state_dict()) if in_place else None
        self.addresses = [t.data_ptr() for t in self.model.state_dict().values()]
        self.receiver = ShardedReceiver(
            endpoints, rank, rd.get_platform("cpu"), timeout_s=TIMEOUT_S, targets=targets
        )

    def connect(self) -> None:
        self.receiver.connect()

    def receive(self) -> dict:
        receiver = self.receiver
        stats = receiver.receive(_load_into(self.model))
        return {
            "stats": stats,
            "hash": weights_hash(state_once(self.model).items()),
            "assembled": len(receiver.buffers),
            "assembled_in_place": sum(b.data_ptr() in self.addresses for b in receiver.buffers.values()),
            "segments": sum(len(getattr(link.transport, "segments", ())) for link in receiver.links),
            "links": [link.plan.transport for link in receiver.links],  # one per trainer rank
        }

    def close(self) -> None:
        self.receiver.close()


class HfEngine:
    """An engine rank that is the HF rollout strategy, fed through its own `connect_weights` and
    `receive_weights`."""

    def __init__(self, endpoints, rank: int, model_path: str) -> None:
        from strategies.registry import strategy_class
        from tests.configs import rollout_settings

        self.endpoints, self.rank = endpoints, rank
        self.strategy = strategy_class("inference", "hf", "cpu")(rd.get_platform("cpu"))
        self.strategy.initialize(model_path, rollout_settings("hf", max_batch_size=2, use_graphs=False))

    def connect(self) -> None:
        self.strategy.connect_weights(self.endpoints, self.rank, TIMEOUT_S)

    def receive(self) -> dict:
        return {"stats": self.strategy.receive_weights(), "hash": self.strategy.weights_hash()}

    def close(self) -> None:
        self.strategy.close_weights()
        self.strategy.shutdown()


def connect() -> None:
    _state["sender"].connect()


def close() -> None:
    _state.pop("sender").close()
