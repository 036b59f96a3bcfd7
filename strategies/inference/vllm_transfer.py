"""The project's weight-transfer engines for vLLM, one per sync path (`colocated`, `collective`,
`bridge`, and `rdt` for an engine of one rank in the Ray actor's process), registered with vLLM's `WeightTransferEngineFactory` under `ENGINES[path]`.

vLLM creates the engine named by `LLM(weight_transfer_config={"backend": name})` in every worker
process of an engine (each tensor-parallel and pipeline rank), so every rank receives the
trainer's weights inside its own process: `LLM.init_weight_transfer_engine` connects each rank's
`roll_device.comm.WeightReceiver` to the trainer's sender (a `ShardedReceiver` to every trainer
rank's, when each sends its slices) as receiver `first_rank + rank`, and per
sync `start_weight_update` (vLLM's layerwise reload, which makes `load_weights` work on weights the
CPU backend repacked), `update_weights` (the receiver streams the buckets into `model.load_weights`,
which keeps each rank's shard of every full HF tensor) and `finish_weight_update`. The transports
themselves (broadcast over the kind's backend, shared-memory or IPC slots) are comm/'s; an engine
checks that the sender's plan is its own path. Names the engine ignores (tied aliases) are dropped,
names it does not have are refused.

`register_engines()` runs when vLLM imports the worker extension (strategies/inference/vllm_worker.py)
in each engine process: a registration on the driver alone does not reach the workers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch
from vllm.distributed.parallel_state import get_world_group
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from roll_device.comm import Endpoint, ShardedReceiver, WeightReceiver, open_receiver
from roll_device.comm.paths import BRIDGE, COLLECTIVE, COLOCATED, DIRECT
from roll_device.errors import ConfigError, WeightSyncError
from roll_device.platforms import get_platform
from strategies.inference.adapters import write_peft_folder
from strategies.inference.vllm_worker import quiet_partial_reload, repack_experts, weight_layout
from strategies.training.lora import is_adapter


@dataclass
class ReceiverInit(WeightTransferInitInfo):
    """Where this engine's ranks find the trainer's sender (one [host, port]; with `sharded`, one per
    trainer rank, each sending its slices), and the first receiver rank they take."""

    endpoints: list
    sharded: bool
    first_rank: int
    kind: str
    timeout_s: float


@dataclass
class SyncRequest(WeightTransferUpdateInfo):
    """One whole sync (the sender streams every bucket of it); `adapter_dir`: where the first rank
    writes the LoRA adapters the sync carries, as a PEFT folder vLLM loads (empty: none expected)."""

    adapter_dir: str = ""
    lora_alpha: float = 0.0


class ReceivingEngine(WeightTransferEngine[ReceiverInit, SyncRequest]):
    """A rank of a vLLM engine that receives through a `WeightReceiver`; subclasses name the path."""

    path: ClassVar[str]
    init_info_cls = ReceiverInit
    update_info_cls = SyncRequest
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        layout = weight_layout(model)
        self.known = set(layout["names"]) | set(layout["ignored"])
        self.ignored = set(layout["ignored"])
        self.receiver: WeightReceiver | ShardedReceiver | None = None
        self.stats: dict | None = None

    def init_transfer_engine(self, init_info: ReceiverInit) -> None:
        self.shutdown()
        rank = init_info.first_rank + get_world_group().rank_in_group
        endpoints = [Endpoint(host, port) for host, port in init_info.endpoints]
        receiver = open_receiver(
            endpoints if init_info.sharded else endpoints[0],
            rank,
            get_platform(init_info.kind),
            timeout_s=init_info.timeout_s,
            device=self.device,
        )
        receiver.connect(path=self.path)  # refused before joining a group when the paths differ
        self.receiver = receiver

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        with quiet_partial_reload():
            finalize_layerwise_reload(self.model, self.model_config)
        repack_experts(self.model)

    def update_weights(self, update_info: dict) -> None:
        """One whole sync; the base class's device synchronize is the platform's (the CPU has none)."""
        self.receive_weights(self.parse_update_info(update_info))
        self.receiver.platform.synchronize()

    def receive_weights(self, update_info: SyncRequest) -> None:
        if self.receiver is None:
            raise WeightSyncError(
                "update_weights before init_weight_transfer_engine: connect to the trainer first"
            )
        self.adapters: dict[str, torch.Tensor] = {}
        self.stats = asdict(self.receiver.receive(self._load))
        if self.adapters and update_info.adapter_dir and get_world_group().rank_in_group == 0:
            write_peft_folder(update_info.adapter_dir, self.adapters, update_info.lora_alpha)

    def _load(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        with torch.no_grad():
            self.model.load_weights(weights=self._checked(self._base(named)))

    def _base(self, named: Iterable[tuple[str, torch.Tensor]]):
        """The base tensors of `named`; the LoRA adapters among them kept aside (copied: the
        sync's buffers are reused), for the adapter folder."""
        for name, tensor in named:
            if is_adapter(name):
                self.adapters[name] = tensor.detach().to("cpu", copy=True)
            else:
                yield name, tensor

    def _checked(self, named: Iterable[tuple[str, torch.Tensor]]):
        for name, tensor in named:
            if name not in self.known:
                raise ConfigError(
                    f"the rollout engine has no weight named '{name}': send HF names of the same architecture"
                )
            if name not in self.ignored:
                yield name, tensor

    @property
    def version(self) -> int | None:
        return None if self.receiver is None else self.receiver.version

    def shutdown(self) -> None:
        if self.receiver is not None:
            receiver, self.receiver = self.receiver, None
            receiver.close()


class ColocatedEngine(ReceivingEngine):
    path = COLOCATED


class CollectiveEngine(ReceivingEngine):
    path = COLLECTIVE


class BridgeEngine(ReceivingEngine):
    path = BRIDGE


class DirectEngine(ReceivingEngine):
    """Ray Direct Transport: the receiving rank must run in the Ray actor's own process (an
    in-process engine of one rank), where Ray delivers the buckets."""

    path = DIRECT
