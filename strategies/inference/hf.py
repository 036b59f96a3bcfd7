"""`HfStrategy`: rollout with a transformers causal LM on any platform, with a static KV cache,
batched sampling and per-token logprobs, the decode step captured as a device graph per
batch-size bucket where the platform has graphs (`roll_device.graph.DecodeGraphRunner`), and, with
`prefill_graphs: true`, the prefill captured per token-count bucket in pieces split at attention
(`hf_prefill.PackedPrefill`, `roll_device.graph.PrefillGraphRunner`).

One batch (up to `max_batch_size` rows; `n` samples per prompt are rows of their own) runs as:
prefill of the prompts into the first rows of the shared KV store, left-padded (eager, or packed
and replayed piecewise when prefill graphs are on and the batch fits a bucket); then one
decode step per token through the runner, which pads the batch to the smallest captured bucket,
replays that bucket's graph (or runs it eagerly) and returns the raw log-probabilities of the
next token; sampling happens outside the graph. Attention masks are built here (4-D, boolean)
and handed to the model, so nothing in the step depends on host-side values.

Requests (`submit` / `finished`, and `generate` built on them) are served by one thread that owns
the engine (strategies/inference/serving.py) from a request queue of its own (hf_queue.py): each
step runs the waiting rows of one sampling setting as one batch, as above; requests that arrive
meanwhile form the next batch. Each sample draws from a generator of its request's seed, so it
does not depend on what it is batched with. What changes the engine (weight updates, sleep and
wake, the graph guard) first waits for the requests in flight (`holding_engine`).

Prefill, capture and eager decoding run with the same attention kernels, chosen from
`DECODE_ATTENTION` (PyTorch's scaled-dot-product backends without cuDNN's): measured on an H100
(docs/benchmarks.md), cuDNN attention, which torch picks for bf16 there, let greedy tokens of
captured and eager decoding part after about 55 tokens at batch 16, while with these backends
they agree token for token.

transformers and the modules built on it (`hf_cache`, `hf_prefill`) are imported when a strategy
starts, not with this module: the strategy registry imports it in every process, the driver's
config checks included, which then start without transformers (about 1 s on 2 cores).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from roll_device.comm import SyncStats
from roll_device.comm.buffers import own_aligned_memory
from roll_device.errors import ConfigError
from roll_device.graph import DecodeGraphRunner, fit_capture_sizes, graphs_per_size
from roll_device.platforms import get_platform
from strategies.base import (
    NO_GRAPHS,
    Completion,
    InferenceStrategy,
    NamedTensors,
    Request,
    Requirements,
    SamplingConfig,
    SettingsNeed,
)
from strategies.host_turns import HostTurn
from strategies.inference.adapters import MergedAdapters
from strategies.inference.hf_guard import hf_guard
from strategies.inference.hf_queue import RowQueue, row_generator
from strategies.inference.hf_sampling import sample
from strategies.inference.requests import check_request
from strategies.inference.serving import Server, holding_engine
from strategies.inference.settings import HfSettings
from strategies.inference.weights import check_update
from strategies.routes import RouteRecorder
from strategies.tied_weights import state_once

if TYPE_CHECKING:
    from strategies.inference.hf_prefill import PackedPrefill

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DECODE_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# vLLM's names for what is captured: decode graphs, piecewise prefill graphs, both.
DECODE_GRAPHS = "FULL_DECODE_ONLY"
PREFILL_GRAPHS = "PIECEWISE"
BOTH_GRAPHS = "FULL_AND_PIECEWISE"
# 1: the weights wait in the engine's host buffer; 2: dropped, the next sync refills them
SLEEP_LEVELS = (1, 2)
GRAPH_MODES = {  # (decode graphs, prefill graphs) asked for -> the mode
    (False, False): NO_GRAPHS,
    (True, False): DECODE_GRAPHS,
    (False, True): PREFILL_GRAPHS,
    (True, True): BOTH_GRAPHS,
}


class HfStrategy(InferenceStrategy):
    """transformers + static KV cache + decode graphs behind the rollout interface."""

    model: Any = None
    packed_prefill: PackedPrefill | None = None
    graphs_stopped = False  # the graph guard found graphs it could not trust: eager from then on
    settings_cls = HfSettings

    @classmethod
    def serves_adapters(cls, kind: str) -> bool:
        """LoRA adapters merged into the engine's weights (strategies/inference/adapters.py)."""
        return True

    @classmethod
    def lacks_route_records(cls, kind: str) -> str | None:
        """A forward hook on each router records its top-k (strategies/routes.py), eagerly."""
        return None

    @classmethod
    def requirements(cls, kind: str) -> Requirements:
        """Sleep levels 1 and 2 on every kind (strategies/host_turns.py moves or drops the weights)."""
        graphs = get_platform(kind).graph_class_name is not None
        modes = tuple(GRAPH_MODES.values()) if graphs else (NO_GRAPHS,)
        return Requirements(graph_modes=modes, sleep_levels=SLEEP_LEVELS)

    @classmethod
    def settings_need(cls, kind: str, settings: HfSettings, colocated: bool = False) -> SettingsNeed:
        """Graphs only when asked for (`use_graphs: true`, `prefill_graphs: true`); null decode
        graphs take them where they exist."""
        asked = (settings.use_graphs is True, settings.prefill_graphs)
        if asked[1] and PREFILL_GRAPHS not in cls.requirements(kind).graph_modes:
            raise ConfigError(
                f"rollout.prefill_graphs=true but kind '{kind}' has no device graphs: "
                "set rollout.prefill_graphs to false"
            )
        level = (settings.sleep_level or SLEEP_LEVELS[0]) if colocated else None
        return SettingsNeed(graph_mode=GRAPH_MODES[asked], sleep_level=level)

    def initialize(self, model_path: str, settings: HfSettings, sync_path: str | None = None) -> None:
        self.sync_path = sync_path
        self.settings = settings
        self.turn = HostTurn(self.platform)
        self.unfilled: set[str] = set()  # weights dropped at sleep level 2 and not yet synced
        self.merged = None if self.adapters is None else MergedAdapters(self.adapters)
        if settings.prefill_graphs and not self.platform.supports_graphs:
            raise ConfigError(
                f"rollout.prefill_graphs=true but platform '{self.platform.name}' has no device graphs: "
                "set rollout.prefill_graphs to false"
            )
        self.capture_sizes = self._budgeted()
        from transformers import AutoModelForCausalLM

        from strategies.inference.hf_prefill import PIECEWISE_ATTENTION

        dtype = settings.dtype
        model = AutoModelForCausalLM.from_pretrained(
            model_path,
            dtype=dtype if dtype == "auto" else DTYPES[dtype],
            attn_implementation=PIECEWISE_ATTENTION if settings.prefill_graphs else "sdpa",
        )
        self.prefill_capture_sizes = (
            self._budgeted_prefill(model.config.num_hidden_layers) if settings.prefill_graphs else None
        )
        self.model = model.to(self.platform.device()).eval()
        own_aligned_memory(self.model)  # on the host: out of the file's mapping, where syncs copy fast
        self.vocab_size = int(self.model.config.vocab_size)
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set() if eos is None else ({eos} if isinstance(eos, int) else set(eos))
        self.pad_id = self.model.config.pad_token_id or 0
        self.recorder = self._route_recorder()
        self._start_decoding()
        self.guard = hf_guard(self, model_path)
        self.queue = RowQueue()
        device = None if self.platform.is_host else self.platform.current_device()
        self.server = Server(
            self, lambda: self.weights_version, lambda: self._bind(device), "roll-device-hf-serving"
        )

    def _bind(self, device: int | None) -> None:
        """The serving thread computes on the worker's device (current per thread)."""
        if device is not None:
            self.platform.set_device(device)

    def _budgeted(self) -> list[int]:
        """The capture sizes within the platform's graph budget (one full graph per size), by the
        rule vLLM's arguments use: derived sizes thinned, listed sizes over it refused."""
        graphs = self.settings.use_graphs is not False and self.platform.supports_graphs
        budget = self.platform.graph_budget if graphs else None
        explicit = self.settings.capture_sizes is not None
        return fit_capture_sizes(
            self.settings.decode_sizes(), 1, budget, explicit=explicit, key="rollout.capture_sizes"
        )

    def _budgeted_prefill(self, num_layers: int) -> list[int]:
        """The prefill capture sizes within what the decode graphs leave of the graph budget, by the
        same rule: a piecewise prefill costs layers + 1 graphs per size."""
        budget = self.platform.graph_budget
        if budget is not None and self.settings.use_graphs is not False:
            budget -= len(self.capture_sizes)
        return fit_capture_sizes(
            self.settings.prefill_sizes(),
            graphs_per_size(PREFILL_GRAPHS, num_layers),
            budget,
            explicit=self.settings.prefill_capture_sizes is not None,
            key="rollout.prefill_capture_sizes",
            fewer_graphs="set rollout.prefill_graphs=false",
        )

    def _route_recorder(self) -> RouteRecorder | None:
        """Hooks that record each token's routed experts, when asked to (`record_routes`). Hooks do
        not run inside a replayed graph: an engine that records decodes and prefills eagerly."""
        if not self.records_routes:
            return None
        config = self.model.config
        return RouteRecorder(self.model, config.num_hidden_layers, config.num_experts_per_tok)

    @property
    def eager(self) -> bool:
        """Whether every forward runs eagerly: graphs found untrustworthy, or routes recorded."""
        return self.graphs_stopped or self.records_routes

    # ---- decode machinery ---------------------------------------------------------------------
    def _start_decoding(self) -> None:
        from strategies.inference.hf_cache import SharedKVStore
        from strategies.inference.hf_prefill import PackedPrefill

        s = self.settings
        device = self.platform.device()
        self.store = SharedKVStore(
            self.model.config, s.max_batch_size, s.max_model_len, self.model.dtype, device
        )
        self.bucket_caches: dict[int, Any] = {}
        use_graphs = False if self.eager else s.use_graphs
        self.runner = DecodeGraphRunner(
            self.platform, self.capture_sizes, self._make_inputs, self._decode_step, use_graphs
        )
        self.packed_prefill = (
            PackedPrefill(self.model, self.store, self.platform, self.prefill_capture_sizes, self.pad_id)
            if s.prefill_graphs and not self.eager
            else None
        )
        self._capture()

    def _capture(self) -> None:
        """Allocate every bucket and, with graphs, capture them (decode steps, packed prefills)."""
        with torch.no_grad(), sdpa_kernel(DECODE_ATTENTION):
            self.runner.prepare()
            if self.packed_prefill is not None:
                self.packed_prefill.runner.prepare()

    def _make_inputs(self, size: int) -> dict[str, torch.Tensor]:
        device = self.platform.device()
        self.bucket_caches[size] = self.store.cache(size)
        mask = torch.zeros(size, 1, 1, self.store.max_len, dtype=torch.bool, device=device)
        mask[..., 0] = True  # padding rows attend somewhere: no all-masked softmax
        return {
            "tokens": torch.full((size, 1), self.pad_id, dtype=torch.long, device=device),
            "positions": torch.zeros(size, 1, dtype=torch.long, device=device),
            "mask": mask,
        }

    def _decode_step(self, size: int, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        # a 4-D mask is used as it is by every transformers model (a mapping by layer type only by
        # some: Qwen3-MoE and Llama take none)
        out = self.model(
            input_ids=inputs["tokens"],
            position_ids=inputs["positions"],
            attention_mask=inputs["mask"],
            past_key_values=self.bucket_caches[size],
            use_cache=True,
        )
        return out.logits[:, -1, :].float().log_softmax(dim=-1)

    def _prefill(
        self, prompts: list[list[int]], eager: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Prefill of `prompts` into the store, left-padded (packed and replayed where prefill
        graphs hold them, unless `eager`); returns the first raw logprobs, the decode mask
        (rows, 1, 1, max_len) and the padded prompt length."""
        device = self.platform.device()
        width, max_len = max(len(p) for p in prompts), self.store.max_len
        pads = torch.tensor([width - len(p) for p in prompts], device=device)
        key = torch.arange(max_len, device=device)
        real = key[None, :] >= pads[:, None]  # (n, max_len): not a left pad
        size = self.packed_prefill.bucket(prompts) if self.packed_prefill is not None and not eager else None
        if size is None:
            logprobs = self._padded_prefill(prompts, width, pads, real)
        else:
            logprobs = self.packed_prefill(prompts, width, size)
        decode_mask = (real & (key[None, :] < width))[:, None, None, :]
        return logprobs, decode_mask, width

    def _padded_prefill(
        self, prompts: list[list[int]], width: int, pads: torch.Tensor, real: torch.Tensor
    ) -> torch.Tensor:
        """The eager prefill: prompts left-padded to `width` in one forward of (rows, width)."""
        device = self.platform.device()
        n, max_len = len(prompts), self.store.max_len
        tokens = torch.full((n, width), self.pad_id, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            tokens[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        query = torch.arange(width, device=device)
        key = torch.arange(max_len, device=device)
        allowed = (key[None, None, :] <= query[None, :, None]) & real[:, None, :]
        allowed |= key[None, None, :] == query[None, :, None]  # pad queries attend to themselves
        out = self.model(
            input_ids=tokens.to(device),
            position_ids=(query[None, :] - pads[:, None]).clamp(min=0),
            attention_mask=allowed[:, None],
            past_key_values=self.store.cache(n),
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float().log_softmax(dim=-1)

    def _generate_rows(
        self, prompts: list[list[int]], sampling: SamplingConfig, generators: list[torch.Generator | None]
    ) -> list[tuple[list[int], list[float], str]]:
        """One batch of rows (at most `max_batch_size`), each drawn from its own generator."""
        from strategies.inference.hf_cache import set_length

        n = len(prompts)
        size = self.runner.bucket(n)
        logprobs, mask, width = self._prefill(prompts)
        set_length(self.bucket_caches[size], width)
        positions = torch.tensor([[len(p)] for p in prompts], device=mask.device)
        stop = self.eos_ids | set(sampling.stop_token_ids)
        tokens: list[list[int]] = [[] for _ in range(n)]
        token_logprobs: list[list[float]] = [[] for _ in range(n)]
        reasons: list[str | None] = [None] * n
        for step in range(sampling.max_tokens):
            drawn, drawn_logprobs = sample(logprobs, sampling, generators, self.settings.logprobs_mode)
            for row, (token, logprob) in enumerate(
                zip(drawn.to("cpu").tolist(), drawn_logprobs.to("cpu").tolist())
            ):
                if reasons[row] is None:
                    tokens[row].append(token)
                    token_logprobs[row].append(logprob)
                    if token in stop:
                        reasons[row] = "stop"
            if all(reasons) or step == sampling.max_tokens - 1:
                break
            mask[..., width + step] = True
            logprobs = self.runner.run({"tokens": drawn[:, None], "positions": positions, "mask": mask})
            positions += 1
        return [(t, lp, r or "length") for t, lp, r in zip(tokens, token_logprobs, reasons)]

    # ---- interface ----------------------------------------------------------------------------
    def check_prompts(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> None:
        self._require_started("submit")
        if self.store is None:
            raise ConfigError("requests to an offloaded hf strategy: call reload() first")
        if self.unfilled:
            raise ConfigError(
                f"requests to an hf engine that slept at rollout.sleep_level=2: {len(self.unfilled)} "
                "weights were dropped and not synced since: sync the weights before generating"
            )
        check_request(prompt_token_ids, sampling, self.settings.max_model_len, self.vocab_size)

    def serve(self, admitted: list[Request]) -> list[tuple[str, list[Completion]]]:
        """The serving thread's step (strategies/inference/serving.py): `admitted` queued, then one
        batch of the queue (strategies/inference/hf_queue.py) run to its end, its routed experts
        recorded when asked to (`record_routes`)."""
        self.queue.add(admitted)
        batch = self.queue.next_batch(self.settings.max_batch_size)
        if not batch:
            return []
        prompts = [list(r.prompt_token_ids) for r, _ in batch]
        recording = contextlib.nullcontext() if self.recorder is None else self.recorder.recording()
        with torch.no_grad(), sdpa_kernel(DECODE_ATTENTION), recording as recorder:
            results = self._generate_rows(
                prompts, batch[0][0].sampling, [row_generator(r.sampling.seed, k) for r, k in batch]
            )
        return self.queue.record(batch, results, self._routes(recorder, prompts, results))

    def _routes(self, recorder: RouteRecorder | None, prompts: list[list[int]], results: list) -> list:
        """Each row's recorded routes (None each when not recording)."""
        if recorder is None:
            return [None] * len(prompts)
        return recorder.decoded_rows([len(p) for p in prompts], [len(tokens) for tokens, _, _ in results])

    @holding_engine
    def receive_weights(self) -> SyncStats:
        """The sync with the engine held throughout: pieces of a sharded sync land in the weights
        (`weight_targets`) outside `update_weights`."""
        return super().receive_weights()

    def weight_targets(self) -> dict[str, torch.Tensor] | None:
        """The model's weights (its state dict: the parameters' own memory), unless serving LoRA
        (adapters are merged into the weights after the load)."""
        self._require_started("weight_targets")
        return None if self.merged is not None else dict(self.model.state_dict())

    @holding_engine
    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Copy HF-named tensors into the model in place as they come (addresses kept, so
        captured graphs stay valid). Each is checked (a name the model has, its shape) and copied
        straight from the tensor it is given (in a weight sync a view of the received bucket: no
        copy in between) and let go of at once, so the sync can reuse its buffer. Copies to a
        device are awaited every `update_bucket_bytes` and at the end; the tensors they read are
        held until then. Serving LoRA, adapter tensors are kept and merged into the weights they
        adapt once the rest is loaded (strategies/inference/adapters.py)."""
        self._require_started("update_weights")
        if self.merged is not None:
            named_tensors = self.merged.split(named_tensors)
        targets = self.model.state_dict(keep_vars=True)
        known = set(targets)
        pending: list[torch.Tensor] = []  # read by copies not yet awaited
        size = 0
        with torch.no_grad():
            for name, tensor in named_tensors:
                check_update([name], known, [])
                target = targets[name]
                if tuple(tensor.shape) != tuple(target.shape):
                    raise ConfigError(
                        f"weight '{name}' has shape {tuple(tensor.shape)}, the model expects "
                        f"{tuple(target.shape)}: send weights of the same architecture"
                    )
                target.data.copy_(tensor, non_blocking=True)
                self.unfilled.discard(name)
                if not (target.is_cpu and tensor.is_cpu):
                    pending.append(tensor)
                    size += tensor.numel() * tensor.element_size()
                    if size >= self.settings.update_bucket_bytes:
                        self.platform.synchronize()
                        pending, size = [], 0
                del name, tensor, target  # nothing of this tensor held while the next is fetched
            if self.merged is not None:
                self.merged.merge(targets)
        self.platform.synchronize()

    @holding_engine
    def guard_graphs(self, version: int | None) -> dict:
        """The graph guard after a weight update (strategies/inference/hf_guard.py): graphs checked
        against eager on the probe; re-captured, or eager from then on, where they differ."""
        self._require_started("guard_graphs")
        with torch.no_grad(), sdpa_kernel(DECODE_ATTENTION):
            self.graph_guard = self.guard.check(version).as_dict()
        return self.graph_guard

    @holding_engine
    def recapture_graphs(self) -> None:
        """Release every graph and capture them again from the weights as they are now."""
        self.runner.release()
        if self.packed_prefill is not None:
            self.packed_prefill.runner.release()
        self._capture()

    @holding_engine
    def stop_graphs(self) -> None:
        """Eager for the rest of the run, offload and reload included (the graph guard's fallback)."""
        self.graphs_stopped = True
        self._release_graphs()
        self.runner.use_graphs = False
        self._capture()

    @holding_engine
    def read_weights(self) -> dict[str, torch.Tensor]:
        """The model's weights in HF names, copied to the CPU, for verification; a tied head is
        the embedding, named once (strategies/tied_weights.py), as the trainers export it."""
        self._require_started("read_weights")
        held = state_once(self.model)
        if self.merged is not None:  # the base and the adapters, as the trainer exports them
            held = self.merged.named_weights(held)
        return {name: t.detach().to("cpu").clone() for name, t in held.items()}

    @holding_engine
    def offload(self) -> None:
        """Sleep: drop graphs and the KV store; the weights' device storages released at the sleep
        level (strategies/host_turns.py): copied into the engine's host buffer with the model's
        buffers (1), or dropped (2: the next weight sync refills them; until then `generate` is
        refused; the buffers, rotary tables and the like that no sync carries, stay on the device)."""
        self._require_started("offload")
        if self.store is None:
            return
        self._release_graphs()
        self.bucket_caches.clear()
        self.store = None
        if self.settings.sleep_level == 2:
            self.turn.release(self.model.parameters(), keep=False)
            self.unfilled = {name for name, _ in self.model.named_parameters()}
        else:
            self.turn.release([*self.model.parameters(), *self.model.buffers()])
        self.platform.empty_cache()

    @holding_engine
    def reload(self) -> None:
        """Wake: the weights back on the device (or, after level 2, their storages regrown for the
        sync), KV store reallocated, graphs captured again."""
        self._require_started("reload")
        if self.store is None:
            self.turn.restore()
            self._start_decoding()

    def shutdown(self) -> None:
        if self.model is None:
            return
        self.server.stop()
        self.server = None
        self._release_graphs()
        self.bucket_caches.clear()
        self.store = None
        self.model = None
        self.platform.empty_cache()

    def _release_graphs(self) -> None:
        self.runner.release()
        if self.packed_prefill is not None:
            self.packed_prefill.runner.release()
            self.packed_prefill = None

    def _require_started(self, member: str) -> None:
        if self.model is None:
            raise ConfigError(f"HfStrategy.{member} before initialize() (or after shutdown())")
