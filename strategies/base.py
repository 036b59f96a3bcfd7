"""Device-neutral interfaces of the backends: `InferenceStrategy` (rollout engines) and
`TrainStrategy` (trainers), and the data they exchange. strategies/registry.py picks a class from
(role type, strategy name, device kind).

Each strategy class declares the kinds it serves by capability (`serves(platform)`; the default:
any kind with a torch device), so that a plugin kind is served without being named.

Each strategy class names the type of its config section (`settings_cls`: a `Section` read once
from the run's config and handed to `initialize`), and declares, without importing anything,
what it needs on a kind (`requirements(kind)`: packages, graph modes, sleep levels) and what a
role's settings ask of it (`settings_need(kind, settings, colocated)`): the doctor and the
preflight ask these instead of knowing engines. What the model itself must allow with a role's
settings is `check_model`, asked before any worker starts.

A strategy is bound to the platform of the worker that hosts it (`platform` argument); it never
names a vendor. Tensors cross this interface on the CPU; the strategy moves them to its device.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import ClassVar, Protocol

import torch

from roll_device.comm import Endpoint, ShardedReceiver, SyncStats, WeightReceiver, open_receiver, weights_hash
from roll_device.comm.shards import Shard
from roll_device.compat.vllm import NO_GRAPHS
from roll_device.errors import ConfigError, RollDeviceError
from roll_device.packages import Package
from roll_device.platforms.base import Platform
from roll_device.settings import Section
from strategies.inference.settings import RolloutSettings
from strategies.training.settings import LoraSettings, TrainSettings

NamedTensors = Iterable[tuple[str, torch.Tensor]]
_GENERATE_IDS = itertools.count()  # one per `generate` call: its requests' ids


@dataclass
class SamplingConfig:
    """How to sample responses. `n` samples per prompt; greedy when temperature is 0."""

    n: int = 1
    max_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)


@dataclass
class Completion:
    """One sampled response: its tokens and the sampler's log-probability of each. A multi-turn
    trajectory's tokens hold the environment's turns too: `mask` is then 1.0 on the model's own
    tokens and 0.0 on the others (None: every token is the model's). `routed_experts`, from an
    engine asked to `record_routes` on a mixture of experts: the experts each token the engine fed
    its model was routed to, prompt tokens first, then every response token but the last (which
    no forward took), as an integer (tokens, layers, top-k) tensor (strategies/routes.py); a
    trajectory's: each of its row's tokens as the turn that first fed it routed it. `turn_rewards`,
    a multi-turn trajectory's: each turn's reward at its position in `token_ids` (the turn's last
    model token), for the token-level estimators."""

    prompt_index: int
    sample_index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    mask: list[float] | None = None
    routed_experts: torch.Tensor | None = None
    turn_rewards: list[tuple[int, float]] | None = None


@dataclass(frozen=True)
class Request:
    """One prompt to serve on its own: `sampling.n` samples of `prompt_token_ids`, seeded by
    `sampling.seed` alone (sample k with seed + k), whatever it is batched with."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingConfig


def prompt_sampling(sampling: SamplingConfig, prompt_index: int) -> SamplingConfig:
    """The sampling of prompt `prompt_index` of a batch: its samples seeded apart from every other
    prompt's (seed + index * n; sample k then adds k)."""
    if sampling.seed is None:
        return sampling
    return replace(sampling, seed=sampling.seed + prompt_index * sampling.n)


@dataclass
class Served:
    """A finished request: its `sampling.n` completions (prompt_index 0, in sample order) and the
    weights version the engine made them with (None: the engine's first weights)."""

    request_id: str
    completions: list[Completion]
    version: int | None


@dataclass
class TrainBatch:
    """Sequences (prompt + response, right-padded) and what the loss needs, on the CPU.

    `response_mask[b, t]` is 1 where token t of row b is a response token the loss scores;
    per-token tensors are aligned with `input_ids` (a token's logprob sits at its own position).
    """

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long
    response_mask: torch.Tensor  # (B, T) float
    advantages: torch.Tensor | None = None  # (B,) float, or (B, T) per token
    old_logprobs: torch.Tensor | None = None  # (B, T) float
    ref_logprobs: torch.Tensor | None = None  # (B, T) float
    rollout_logprobs: torch.Tensor | None = None  # (B, T) float; set for samples of older weights
    values: torch.Tensor | None = None  # (B, T) float: the critic's values before its update (PPO)
    returns: torch.Tensor | None = None  # (B, T) float: the critic's targets (PPO)
    # (B, T, layers, top-k) integer: the experts the rollout routed each token to, -1 where it
    # recorded none; with trainer.routing_replay the trainer routes the same way (strategies/routes.py)
    routed_experts: torch.Tensor | None = None
    # (B, T) float: rewards placed on tokens (a multi-turn trajectory's turns' rewards, each on its
    # turn's last model token); None: each row's score sits on its last response token
    token_rewards: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, index: slice | torch.Tensor) -> TrainBatch:
        """Rows `index` of every tensor (for micro-batches and data-parallel shards)."""
        pick = {k: (v[index] if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return TrainBatch(**pick)


LossFn = Callable[[torch.Tensor, TrainBatch], tuple[torch.Tensor, dict[str, float]]]


class RequestServer(Protocol):
    """What serves an engine's requests: strategies/inference/serving.py's `Server`."""

    def submit(self, requests: list[Request]) -> None: ...

    def finished(self, wait_s: float) -> list[Served]: ...

    def wait_for(self, request_ids: list[str]) -> list[Served]: ...


class NonFiniteUpdateError(RollDeviceError, RuntimeError):
    """A policy update whose loss or gradient norm is NaN or infinite. The trainer did not apply
    it: its weights, optimizer state and learning-rate schedule are those before the step."""

    exit_code = 1


INFERENCE = "inference"  # role types: what a strategy does for its role
TRAIN = "train"
CRITIC = "critic"  # a trainer of a value model (PPO's critic)


@dataclass(frozen=True)
class Requirements:
    """What a strategy needs and offers on one device kind: the packages it imports there, the
    device-graph modes and the sleep levels its engine has there."""

    packages: tuple[Package, ...] = ()
    graph_modes: tuple[str, ...] = (NO_GRAPHS,)
    sleep_levels: tuple[int, ...] = ()


@dataclass(frozen=True)
class SettingsNeed:
    """What a role's settings ask of its strategy on one kind: a graph mode and a sleep level."""

    graph_mode: str = NO_GRAPHS
    sleep_level: int | None = None


class Strategy:
    """What every strategy class declares; subclasses override what they use."""

    settings_cls: ClassVar[type[Section]]  # the type of the role's config section

    @classmethod
    def serves(cls, platform: Platform) -> bool:
        """Whether this strategy runs on `platform`'s kind: by default any kind with a torch device."""
        return bool(platform.device_type)

    @classmethod
    def requirements(cls, kind: str) -> Requirements:
        return Requirements()

    @classmethod
    def settings_need(cls, kind: str, settings: Section, colocated: bool = False) -> SettingsNeed:
        """The graph mode and sleep level `settings` (the role's config section) ask for on
        `kind`, for a role that shares its devices with a trainer when `colocated`; a ConfigError
        for settings that cannot work there."""
        return SettingsNeed()

    @classmethod
    def check_model(cls, platform: Platform | None, settings: Section, model_path: str) -> None:
        """What the model at `model_path` must allow with `settings` (the role's config section),
        checked on the driver before any worker loads it: a ConfigError naming the setting to
        change. `platform`: the role's compute platform, or None while its kind is not known (an
        `auto` device before a remote cluster is reached)."""


class InferenceStrategy(Strategy, abc.ABC):
    """A rollout engine bound to one platform.

    It receives a trainer's weights with `connect_weights` (as receivers `first_rank` ..
    `first_rank + engine_size - 1` of the trainer's `WeightSender`), `receive_weights` per sync and
    `close_weights`. By default the hosting process receives and hands the tensors to
    `update_weights`; an engine whose ranks live in processes of their own receives in each
    (vLLM: its weight-transfer API). After each sync the engine's graph guard runs
    (`guard_graphs`; roll_device/graph/guard.py); its report is kept as `graph_guard`.

    It serves single requests as they come (`submit`, `finished`) through its serving thread
    (`server`, strategies/inference/serving.py, started by `initialize`); `generate` is built on
    them. An engine that starts none and implements `generate` itself is given one that serves
    requests one at a time through it (`serve_one_at_a_time`, by the worker that hosts it)."""

    settings_cls: ClassVar[type[RolloutSettings]] = RolloutSettings
    _receiver: WeightReceiver | ShardedReceiver | None = None
    sync_path: str | None = None  # the path that feeds the engine (`initialize`; None: none planned)
    graph_guard: dict | None = None  # the graph guard's report after the last sync (None: no guard)
    adapters: LoraSettings | None = None  # the LoRA adapters served on the base (`use_adapters`)
    records_routes = False  # completions carry their routed experts (`record_routes`)
    server: RequestServer | None = None  # the engine's serving thread (strategies/inference/serving.py)

    def __init__(self, platform: Platform) -> None:
        self.platform = platform

    @classmethod
    def serves_adapters(cls, kind: str) -> bool:
        """Whether this engine serves a LoRA policy (base plus adapters, `use_adapters`) on `kind`."""
        return False

    @classmethod
    def check_adapters(cls, lora: LoraSettings) -> None:
        """A ConfigError when an engine that serves adapters cannot serve `lora`'s (checked when
        the run is planned, before Ray)."""

    @classmethod
    def lacks_expert_adapters(cls, kind: str) -> str | None:
        """None when this engine, where it serves adapters, serves them on a mixture-of-experts
        model on `kind` too, else why it cannot."""
        return None

    @classmethod
    def lacks_route_records(cls, kind: str) -> str | None:
        """None when this engine records each token's routed experts on `kind` (for the trainer's
        routing replay), else why it cannot."""
        return f"the {cls.__name__} engine records no routed experts"

    @classmethod
    def lacks_expert_parallel(cls, kind: str) -> str | None:
        """None when this engine spreads a mixture of experts' experts over its ranks on `kind`
        (`rollout.expert_parallel`), else why it cannot."""
        return f"the {cls.__name__} engine has no expert parallelism"

    def record_routes(self) -> None:
        """Record each token's routed experts into `Completion.routed_experts` (called before
        `initialize`)."""
        self.records_routes = True

    def use_adapters(self, lora: LoraSettings) -> None:
        """Serve the trainer's LoRA adapters `lora` on the base (called before `initialize`): a
        sync's tensors named as adapters (strategies/training/lora.py) update the adapters, the
        others the base."""
        self.adapters = lora

    @classmethod
    def engine_size(cls, settings: RolloutSettings) -> int:
        """Devices of one engine with `settings`, each with a process that receives weights."""
        return 1

    @classmethod
    def check_sync_path(cls, settings: RolloutSettings, sync_path: str) -> None:
        """A ConfigError when an engine with `settings` cannot be fed along `sync_path`, found when
        the run is planned (before Ray), not when the engine starts."""

    @abc.abstractmethod
    def initialize(
        self,
        model_path: str,
        settings: RolloutSettings,
        sync_path: str | None = None,
    ) -> None:
        """Load the model and start the engine on this worker's devices; `sync_path`: the
        weight-sync path it will be fed along (comm/paths.py; None: none planned; `colocated`:
        the engine shares its devices with a trainer and frees memory while the trainer works)."""

    def submit(self, requests: list[Request]) -> None:
        """Queue `requests` beside those in flight and return at once (each checked first: a
        ConfigError naming the request); the engine serves them as they come (`finished`)."""
        server = self._serving("submit")
        for request in requests:
            try:
                self.check_prompts([list(request.prompt_token_ids)], request.sampling)
            except ConfigError as exc:
                raise ConfigError(f"request {request.request_id!r}: {exc}") from None
        server.submit(requests)

    def finished(self, wait_s: float = 0.0) -> list[Served]:
        """The requests finished since the last call, in the order they finished; with requests in
        flight and none finished yet, waits up to `wait_s` seconds for one."""
        return self._serving("finished").finished(wait_s)

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> list[Completion]:
        """Sample `sampling.n` responses per prompt; prompt-major order. Built on the request path:
        one request per prompt (prompt i seeded with seed + i * n, so that no two samples share a
        random stream), all submitted, all awaited."""
        server = self._serving("generate")
        self.check_prompts(prompt_token_ids, sampling)
        batch = next(_GENERATE_IDS)
        requests = [
            Request(f"generate-{batch}-{i}", tuple(prompt), prompt_sampling(sampling, i))
            for i, prompt in enumerate(prompt_token_ids)
        ]
        server.submit(requests)
        served = server.wait_for([r.request_id for r in requests])
        return [replace(c, prompt_index=i) for i, s in enumerate(served) for c in s.completions]

    def check_prompts(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> None:
        """A ConfigError for prompts or sampling this engine cannot serve now (started, awake, the
        prompts within its vocabulary and context: strategies/inference/requests.py); by default
        nothing is checked."""

    def _serving(self, member: str) -> RequestServer:
        if self.server is None:
            raise ConfigError(
                f"{type(self).__name__}.{member} before initialize() (or after shutdown(), or on an engine "
                "that starts no serving thread: give it one with strategies.inference.serving.serve_one_at_a_time)"
            )
        return self.server

    @abc.abstractmethod
    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Load HF-named tensors into the running engine (applied in buckets)."""

    @abc.abstractmethod
    def read_weights(self) -> dict[str, torch.Tensor]:
        """The weights the engine computes with, in HF names, on the CPU (for verification)."""

    def weights_hash(self) -> str:
        """`roll_device.comm.weights_hash` of the weights the engine computes with."""
        return weights_hash(self.read_weights().items())

    def connect_weights(self, endpoint: Endpoint | list[Endpoint], first_rank: int, timeout_s: float) -> None:
        """Join the trainer's sender at `endpoint` (which connects at the same time), or every
        trainer rank's sharded sender (a list of endpoints, in rank order)."""
        self._receiver = open_receiver(
            endpoint, first_rank, self.platform, timeout_s=timeout_s, targets=self.weight_targets()
        )
        self._receiver.connect(path=self.sync_path)

    def weight_targets(self) -> dict[str, torch.Tensor] | None:
        """The engine's own weights by HF name, which a sharded sync may write piece by piece
        (each piece copied once, straight into place; `update_weights` then gets these tensors
        back); None (the default): the sync assembles tensors in buffers of its own first."""
        return None

    def receive_weights(self) -> SyncStats:
        """Receive the next sync (the sender sends at the same time); returns once it is applied
        and the graph guard has checked the engine's graphs against it."""
        stats = self._receiver.receive(self.update_weights)
        self.guard_graphs(stats.version)
        return stats

    def guard_graphs(self, version: int | None) -> dict | None:
        """After the update to weights `version`: the engine's graphs checked against an eager step
        with those weights (re-captured or dropped where they differ), the report kept as
        `graph_guard` and returned; a caller of `update_weights` outside a sync calls it itself.
        None: this engine declares no guard."""
        return None

    @property
    def weights_version(self) -> int | None:
        """The trainer step the weights come from (None before the first sync)."""
        return None if self._receiver is None else self._receiver.version

    def close_weights(self) -> None:
        """Leave the sender (which closes at the same time)."""
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None

    @abc.abstractmethod
    def offload(self) -> None:
        """Release device memory (weights, KV cache) while a colocated trainer runs."""

    @abc.abstractmethod
    def reload(self) -> None:
        """Restore what `offload` released."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop the engine and free its resources."""


class TrainStrategy(Strategy, abc.ABC):
    """A trainer bound to one platform. With a world size above one, torch.distributed is
    initialized by the hosting worker before `initialize` (backend: the platform's).

    `initialize` sets `data_parallel_rank` / `data_parallel_size`: ranks of one model-parallel
    group share a data-parallel rank and must be given the same rows.
    """

    data_parallel_rank: int = 0
    data_parallel_size: int = 1
    # A reference model of this strategy can run in the policy trainer's worker processes, as a
    # second instance beside the first (nothing process-wide of its own to set up twice, unlike
    # Megatron's parallel state): a reference colocated on the trainer's devices then needs no
    # processes of its own (roll_device/pipeline/roles.py, `hosted_reference`).
    hosts_reference: bool = False
    lora: bool = False  # trains LoRA adapters: `base_logprobs` and `export_adapters` serve
    settings_cls: ClassVar[type[TrainSettings]] = TrainSettings

    def __init__(self, platform: Platform) -> None:
        self.platform = platform

    @abc.abstractmethod
    def initialize(self, model_path: str, settings: TrainSettings) -> None:
        """Load the model, wrap it for this strategy's parallelism, build the optimizer."""

    @abc.abstractmethod
    def forward_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Per-token log-probabilities of `batch.input_ids` (B, T) on the CPU, no grad."""

    @abc.abstractmethod
    def train_step(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step on `batch`; returns at least loss, grad_norm, lr. A step whose loss
        or gradient norm is not finite is not applied: it raises `NonFiniteUpdateError` on every
        rank, the model unchanged."""

    @abc.abstractmethod
    def export_weights(
        self, dtype: torch.dtype | None = None, snapshot: bool = True, to_rank: int | None = None
    ) -> Iterator[tuple[str, torch.Tensor | None]]:
        """Full (unsharded) HF-named tensors, for weight sync and export: by default fp32 host
        snapshots that later train steps leave unchanged, on every rank, kind and world size. A
        weight sync asks for `dtype` (the engine's; cast on the device), `snapshot=False` (tensors
        where they are, valid until the next train step: the sync copies them at once) and
        `to_rank` (the global rank that sends them: the others yield each name with None, and a
        trainer may spare them the gather). Every rank must drain the iterator."""

    exports_shards: bool = False  # `export_shards` serves: each rank can send its own slices

    def export_shards(self) -> Iterator[tuple[str, torch.Tensor, Shard]]:
        """This rank's slices of the weights under their HF names, without a gather: (name, the
        local tensor where it is, its `Shard`), valid until the next train step. For a sharded
        weight sync (roll_device/comm/sharded.py), where every rank sends its own."""
        raise NotImplementedError(f"{type(self).__name__} exports whole tensors only (export_weights)")

    @abc.abstractmethod
    def offload(self) -> None:
        """Move parameters, gradients and optimizer state off the device."""

    @abc.abstractmethod
    def reload(self) -> None:
        """Bring back what `offload` moved."""

    @abc.abstractmethod
    def save_checkpoint(self, directory: str) -> None:
        """Save model, optimizer and scheduler state under `directory`."""

    @abc.abstractmethod
    def load_checkpoint(self, directory: str) -> None:
        """Restore what `save_checkpoint` wrote."""

    def shutdown(self) -> None:
        """Free resources; the default has nothing to free."""
