"""The pipeline's role workers (Ray actors through `roll_device.cluster.WorkerGroup`).

- `TrainWorker` (`actor_train`, `reference`): a train strategy on its platform; the ranks of a
  group form one torch.distributed world over the platform's backend. Rank 0 also sends weights;
  every rank sends its own slices where the trainer syncs sharded (`open_sender`).
  An `actor_train` worker may also host the reference model (`setup_reference`), when the
  reference shares its devices and strategy (roll_device/pipeline/roles.py, `hosted_reference`).
- `CriticWorker` (`critic`): a `TrainWorker` whose strategy is a value model (PPO's critic,
  strategies/training/critic.py): values of a batch's response tokens, and a step of the clipped
  value loss; it saves and loads checkpoints as the trainer does, and sends no weights.
- `RolloutWorker` (`actor_infer`): an inference strategy; receives weights into its engine. Each
  generation comes back as `Generated`: the weight version that produced it (an overlapped
  pipeline trains on samples of older weights) and when the engine worked and waited. It also
  serves single requests as they come (`submit_requests` / `finished_requests`: the multi-turn
  driver's path), each stamped with its weights version likewise.

The reward role's worker has its own module (`reward_worker.py`): it imports neither the
strategies nor transformers, so it starts in about a second beside the heavy workers.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace

import ray
import torch
import torch.distributed as dist

from roll_device.comm import (
    Endpoint,
    ShardedSender,
    SyncNodes,
    SyncPlan,
    WeightSender,
    WeightSyncOptions,
    weights_hash,
)
from roll_device.comm.segments import keep_in_shared_memory
from roll_device.comm.shards import Shard
from roll_device.comm.timing import Stopwatch
from roll_device.pipeline.worker_base import PipelineWorker
from roll_device.platforms import HOST_KIND, get_platform, release_host_heap
from roll_device.tracking.phases import phase
from strategies.base import Completion, Request, SamplingConfig, Served, TrainBatch
from strategies.inference.serving import serve_one_at_a_time
from strategies.inference.settings import RolloutSettings
from strategies.training.losses import LossSpec, policy_loss
from strategies.training.settings import LoraSettings, TrainSettings


def share_for_one_copy(strategy, plan: SyncPlan) -> None:
    """A sender's set-up on a shared-memory path: the trainer's own tensors moved into shared
    memory, where the engines read them (the one-copy path, roll_device/comm/segments.py); not for
    a trainer that exports no shards or syncs LoRA adapters (temporaries: packed)."""
    if plan.transport == "shm" and strategy.exports_shards and not strategy.lora:
        keep_in_shared_memory(local for _, local, _ in strategy.export_shards())


def freed_by(platform, release) -> int:
    """The device bytes `release()` gives back to the device on `platform`: the device's free memory
    after it over before, as `mem_get_info` reports it, so memory a release leaves in the caching
    allocator's cache (or in storages still alive) does not count. 0 where device memory is host
    memory."""
    if platform.device_type == get_platform(HOST_KIND).device_type:
        release()
        return 0
    before = platform.mem_get_info()[0]
    release()
    return max(platform.mem_get_info()[0] - before, 0)


class TrainWorker(PipelineWorker):
    """One rank of a train strategy."""

    sender_rank = 0  # the rank that sends the weights to the engines

    def setup(self, model_path: str, strategy: str, settings: TrainSettings, master: tuple[str, int]) -> int:
        """Start the strategy (`strategy`: its qualified class name, strategies/registry.py);
        returns this rank's data-parallel rank."""
        if self.world_size > 1:
            addr, port = master
            dist.init_process_group(
                self.platform.dist_backend,
                init_method=f"tcp://{addr}:{port}",
                rank=self.rank,
                world_size=self.world_size,
            )
        self.strategy = self.new_strategy(strategy)
        self.strategy.initialize(model_path, settings)
        self.sender: WeightSender | None = None
        return self.strategy.data_parallel_rank

    def setup_reference(self, model_path: str, strategy: str, settings: TrainSettings) -> int:
        """Start the reference model in this worker, beside the policy (same device and process
        group); returns its data-parallel rank."""
        self.reference = self.new_strategy(strategy)
        self.reference.initialize(model_path, settings)
        return self.reference.data_parallel_rank

    @phase("logprobs")
    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self.strategy.forward_logprobs(batch)

    @phase("logprobs")
    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self.reference.forward_logprobs(batch)

    def base_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """The LoRA policy's base model's logprobs (its adapters disabled): a LoRA run's reference."""
        return self.strategy.base_logprobs(batch)

    @phase("update")
    def train(self, batch: TrainBatch, loss: LossSpec) -> dict[str, float]:
        """One update of the policy loss `loss` names (strategies/training/losses.py) on `batch`."""
        return self.strategy.train_step(batch, policy_loss(loss))

    def save(self, directory: str) -> None:
        """A checkpoint, from the device (a trainer offloaded for a colocated rollout comes back
        first: the save's collectives run on the device's backend)."""
        self.reload()
        self.strategy.save_checkpoint(directory)

    def load(self, directory: str) -> None:
        self.strategy.load_checkpoint(directory)

    @phase("turns")
    def offload(self) -> int:
        """Move the model(s) and optimizer state off the device (a colocated engine generates);
        returns the device bytes freed (0 where device memory is host memory)."""
        return freed_by(self.platform, lambda: [m.offload() for m in self._models()])

    @phase("turns")
    def reload(self) -> None:
        for model in self._models():
            model.reload()

    def _models(self) -> list:
        return [self.strategy] + ([self.reference] if getattr(self, "reference", None) else [])

    def export_hash(self) -> str:
        """Hash of the full exported weights (every rank must call: the export gathers)."""
        return weights_hash(self.strategy.export_weights())

    # ---- weight sync: every rank sends its slices (a sharded trainer), or rank 0 the whole model --
    def open_sender(
        self, plan: SyncPlan, nodes: SyncNodes, options: WeightSyncOptions, engine_dtype: str | None
    ) -> Endpoint | None:
        """Open this rank's sender, if it sends, to the engine ranks on `nodes.engines`; returns
        its endpoint. A trainer of several ranks that exports shards (not LoRA: its adapters travel
        alone) syncs sharded: every rank sends its own slices, one link per engine node
        (roll_device/comm/sharded.py); any other sends from rank 0 (every rank exports: the export
        gathers). Weights leave the trainer cast to the engine's `engine_dtype` (None: as trained;
        the engine casts)."""
        self.export_dtype = None if engine_dtype is None else getattr(torch, engine_dtype)
        self.sharded = self.world_size > 1 and self.strategy.exports_shards and not self.strategy.lora
        host = ray.util.get_node_ip_address()
        share_for_one_copy(self.strategy, plan)
        if self.sharded:
            layouts: list = [None] * self.world_size
            dist.all_gather_object(
                layouts, {name: self._cast_shard(s) for name, _, s in self.strategy.export_shards()}
            )
            self.sender = ShardedSender(
                plan,
                self.platform,
                self.rank,
                layouts,
                nodes.engines,
                options,
                nodes.trainer[self.rank],
                host,
            )
            return self.sender.endpoint
        if self.rank != self.sender_rank:
            return None
        self.sender = WeightSender(plan, self.platform, len(nodes.engines), options, host=host)
        return self.sender.endpoint

    def _cast_shard(self, shard: Shard) -> Shard:
        return shard if self.export_dtype is None else replace(shard, dtype=self.export_dtype)

    def connect_sender(self) -> None:
        if self.sender is not None:
            self.sender.connect()

    @phase("sync")
    def send_weights(self, version: int) -> dict | None:
        """The step's last call on a trainer: afterwards the free memory the C allocator keeps
        from the step and the export goes back to the OS (the rollout runs next, on the same hosts)."""
        cast = Stopwatch()
        if self.sharded:
            stats = self.sender.send(self._cast_slices(cast), version=version)
            release_host_heap()
            return {**asdict(stats), "cast_s": cast.seconds, "adapters_only": False}
        # a LoRA policy's frozen base is not sent: the engines loaded it from the same checkpoint
        adapters_only = self.strategy.lora
        exporter = self.strategy.export_adapters if adapters_only else self.strategy.export_weights
        export = exporter(dtype=self.export_dtype, snapshot=False, to_rank=self.sender_rank)
        if self.sender is None:
            collections.deque(export, maxlen=0)
            stats = None
        else:
            stats = {**asdict(self.sender.send(export, version=version)), "adapters_only": adapters_only}
        del export
        release_host_heap()
        return stats

    def _cast_slices(self, cast: Stopwatch) -> Iterator[tuple[str, torch.Tensor]]:
        """This rank's slices, each cast to the engine's dtype as it goes (the casts timed)."""
        for name, local, _ in self.strategy.export_shards():
            if self.export_dtype is not None:
                with cast.timing():
                    local = local.to(self.export_dtype)
            yield name, local

    def close_sender(self) -> None:
        if self.sender is not None:
            self.sender.close()
            self.sender = None


class CriticWorker(TrainWorker):
    """One rank of a critic strategy."""

    def values(self, batch: TrainBatch) -> torch.Tensor:
        return self.strategy.forward_values(batch)

    def train_values(self, batch: TrainBatch, value_clip: float) -> dict[str, float]:
        return self.strategy.train_values(batch, value_clip)


@dataclass
class Generated:
    """One worker's share of a rollout: its completions, the weight version the engine computed
    them with (0 before any sync: the model's own weights), the wall-clock seconds it started
    and finished, and how long the engine stood idle before it: since its last generation, less
    the weight syncs in between (None for its first call)."""

    completions: list[Completion]
    version: int
    started: float
    finished: float
    idle_s: float | None


class RolloutWorker(PipelineWorker):
    """One inference engine (on one device or, with tensor parallelism, several): it receives
    weights as receivers `rank * engine_size + 1` on (every process of the engine receives)."""

    def setup(
        self,
        model_path: str,
        strategy: str,
        settings: RolloutSettings,
        sync_path: str,
        lora: LoraSettings | None = None,
        record_routes: bool = False,
    ) -> None:
        """Start the engine (`strategy`: its qualified class name; `sync_path`: the weight-sync
        path that feeds it, `colocated` where it shares its devices with a trainer; `lora`: the
        trainer's adapters, which the engine serves on its base; `record_routes`: completions carry
        their routed experts, for the trainer's routing replay)."""
        self.strategy = self.new_strategy(strategy)
        if lora is not None:
            self.strategy.use_adapters(lora)
        if record_routes:
            self.strategy.record_routes()
        self.strategy.initialize(model_path, settings, sync_path)
        serve_one_at_a_time(self.strategy)  # an engine with a `generate` only: its requests one by one
        self.engine_size = self.strategy.engine_size(settings)
        self.last_finished: float | None = None  # the end of the last generation
        self.syncing_s = 0.0  # seconds of weight syncs since then
        self.in_flight = 0  # requests submitted and not yet taken back (`finished_requests`)

    @phase("rollout")
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> Generated:
        started = time.time()
        completions = self.strategy.generate(prompt_token_ids, sampling)
        idle = self._idle_until(started)
        self._work_ended()
        return Generated(completions, self.weights_version() or 0, started, self.last_finished, idle)

    def _idle_until(self, now: float) -> float | None:
        """How long the engine stood idle before `now` since its last work ended, weight syncs left
        out (None before its first work)."""
        return None if self.last_finished is None else now - self.last_finished - self.syncing_s

    def _work_ended(self) -> None:
        self.last_finished, self.syncing_s = time.time(), 0.0

    @phase("rollout")
    def submit_requests(self, requests: list[Request]) -> float | None:
        """Queue `requests` on the engine beside those in flight; returns at once: how long the
        engine stood idle before them when nothing was in flight (less weight syncs; None for its
        first work or while it was busy)."""
        idle = None if self.in_flight else self._idle_until(time.time())
        self.strategy.submit(requests)
        self.in_flight += len(requests)
        return idle

    @phase("rollout")
    def finished_requests(self, wait_s: float) -> list[Served]:
        """The requests finished since the last call (waiting up to `wait_s` seconds for one while
        some are in flight), each stamped with the weights version the engine made it with (0
        before any sync: the model's own weights)."""
        served = self.strategy.finished(wait_s)
        self.in_flight -= len(served)
        if served and not self.in_flight:
            self._work_ended()
        return [replace(s, version=s.version or 0) for s in served]

    @phase("turns")
    def offload(self) -> int:
        """Sleep (a colocated trainer steps); returns the device bytes freed."""
        return freed_by(self.platform, self.strategy.offload)

    @phase("turns")
    def reload(self) -> None:
        self.strategy.reload()

    def connect_receiver(self, endpoint: Endpoint, timeout_s: float) -> None:
        self.strategy.connect_weights(endpoint, self.rank * self.engine_size + 1, timeout_s)

    @phase("sync")
    def receive_weights(self) -> dict:
        """The sync's stats, with the engine's graph guard report under `graph_guard` (None where the
        engine declares no guard; roll_device/graph/guard.py)."""
        started = time.time()
        stats = asdict(self.strategy.receive_weights())
        stats["graph_guard"] = self.strategy.graph_guard
        self.syncing_s += time.time() - started  # a weight sync is work, not idle time
        return stats

    def weights_version(self) -> int | None:
        return self.strategy.weights_version

    def engine_hash(self) -> str:
        """Hash of the weights the engine computes with (HF names), for verification."""
        return self.strategy.weights_hash()

    def close_receiver(self) -> None:
        self.strategy.close_weights()

    def shutdown(self) -> None:
        self.strategy.shutdown()
