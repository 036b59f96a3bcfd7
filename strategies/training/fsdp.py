"""FSDP2 trainer: a transformers causal LM sharded with `fully_shard` over the default process
group (the platform's backend), AdamW with gradient clipping, and checkpoints written with
torch.distributed.checkpoint. An update whose loss or gradient norm is not finite is refused
before the optimizer applies it (`NonFiniteUpdateError`).

Each decoder layer (the classes the model names in `_no_split_modules`) is its own FSDP unit, the
root holds embeddings and head. Mixed precision: parameters gathered in bf16 for compute with fp32
gradient reduction and fp32 master weights, where `mixed_precision` (or its default for the kind)
says bf16. Every rank passes its own rows; all ranks must call every method (collectives).

With `trainer.lora` the model is wrapped by PEFT before it is sharded (strategies/training/lora.py):
the base frozen and filled from the checkpoint, the adapters started as PEFT starts them and the
only parameters in the optimizer; `base_logprobs` (the reference of a LoRA run) computes with the
adapters disabled, and `export_adapters` yields the adapters alone (what a weight sync sends once
the engine holds the base).

With `trainer.routing_replay` a mixture of experts' routers take the rollout's recorded experts for
the tokens a batch has routes for (`TrainBatch.routed_experts`; strategies/routes.py), in every
forward and in the recomputation of the backward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from roll_device.comm.shards import Shard, local_shards
from roll_device.errors import ConfigError
from roll_device.models.hf_dir import num_experts
from roll_device.platforms import Platform
from strategies.base import LossFn, TrainBatch, TrainStrategy
from strategies.host_turns import HostTurn
from strategies.routes import RouteReplay, batch_routes
from strategies.tied_weights import state_once
from strategies.training.batches import align_to_tokens, shifted_labels, validate
from strategies.training.common import (
    NonFiniteUpdateError,
    StepAccounting,
    TrainerStateError,
    check_model_path,
    checkpoint_cause,
    export_tensor,
    plan_micro_batches,
    refuse_non_finite,
    weight_decay_groups,
)
from strategies.training.distributed import check_same_rows, ensure_process_group, release_process_group
from strategies.training.fsdp_loading import check_attention, empty_model, fill_shards, materialize
from strategies.training.in_place_collectives import use_in_place_collectives, whole_tensor
from strategies.training.logprobs import (
    GRAD,
    METRIC,
    PACKED_ATTENTION,
    Entropy,
    model_logprobs,
    next_token_logprobs,
)
from strategies.training.lora import (
    ADAPTER_NAME,
    check_targets,
    init_adapters,
    is_adapter,
    saved_name,
    with_adapters,
)
from strategies.training.losses import masked_mean
from strategies.training.routing import Routing, capture, check_routing
from strategies.training.settings import FsdpSettings

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
TRAINER_STATE = "trainer_state.pt"


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Aligned (B, T) logprobs of `input_ids` from full-vocabulary logits (B, T, V)."""
    labels = shifted_labels(input_ids).to(logits.device)
    return align_to_tokens(next_token_logprobs(logits, labels), attention_mask)


def _model_class(model_path: str) -> type:
    """The transformers causal-LM class of `model_path`'s config, without loading weights."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(model_path))]


# a micro-batch's pass in training: its output for the loss, its metrics, the entropy for the loss (or None)
Pass = tuple[torch.Tensor, dict[str, float], torch.Tensor | None]


def _hf_name(name: str) -> str | None:
    """A parameter of a PEFT-wrapped model as the checkpoint names it (None: an adapter)."""
    return None if is_adapter(name) else saved_name(name)


class FsdpTrainStrategy(TrainStrategy):
    """FSDP2 (`torch.distributed.fsdp.fully_shard`) on any platform with a collective backend."""

    hosts_reference = True  # each instance shards its own model over the process's group
    exports_shards = True
    update_name = "policy update"  # what a refused update says it was
    settings_cls = FsdpSettings
    trains_adapters = True  # with trainer.lora: PEFT adapters on the frozen base (the critic: no)
    balances_routers = True  # a mixture of experts' load-balancing loss and routing metrics (routing.py)

    @classmethod
    def serves(cls, platform: Platform) -> bool:
        """Any kind with a torch device and a torch.distributed backend."""
        return super().serves(platform) and bool(platform.dist_backend)

    @classmethod
    def check_model(cls, platform: Platform | None, settings: FsdpSettings, model_path: str) -> None:
        """An attention kernel transformers knows; packing needs one that takes packed rows;
        recomputation a model class that supports gradient checkpointing; the router's
        load-balancing loss and routing replay a router."""
        check_routing(settings, model_path)
        check_attention(settings.attn_implementation)
        if settings.packing and settings.attn_implementation not in PACKED_ATTENTION:
            raise ConfigError(
                f"trainer.packing=true: trainer.attn_implementation={settings.attn_implementation} cannot "
                f"take packed rows: use one of {', '.join(PACKED_ATTENTION)}, or trainer.packing=false"
            )
        if settings.lora.on:
            check_targets(
                settings.lora, empty_model(model_path, settings.attn_implementation, torch.device("cpu"))
            )
        if settings.recompute is False:
            return
        model_class = _model_class(model_path)
        if not model_class.supports_gradient_checkpointing:
            wanted = "true" if settings.recompute else "null (on for accelerators)"
            raise ConfigError(
                f"trainer.recompute={wanted}: {model_class.__name__} (model.path={model_path}) has no "
                "gradient checkpointing: set trainer.recompute=false"
            )

    def initialize(self, model_path: str, settings: FsdpSettings) -> None:
        """Builds the model with meta parameters, shards it, and fills each rank's shards from the
        checkpoint (fsdp_loading.py): no rank holds the whole model, on any kind."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        self.settings = settings
        check_model_path(model_path)
        self._owns_group = ensure_process_group(self.platform)
        self.device = self.platform.device()
        self.data_parallel_rank, self.data_parallel_size = dist.get_rank(), dist.get_world_size()
        mesh = init_device_mesh(self.platform.device_type, (self.data_parallel_size,))
        compute = DTYPES[self.settings.param_dtype_name(self.platform)]
        sharding = {
            "mesh": mesh,
            "mp_policy": MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32),
            "offload_policy": (
                CPUOffloadPolicy(pin_memory=not self.platform.is_host)  # pinning needs a device
                if settings.optimizer_offload
                else OffloadPolicy()
            ),
        }
        model = self._empty_model(model_path)
        self.experts = num_experts(model.config)
        self.lora = settings.lora.on and self.trains_adapters
        if self.lora:
            model = with_adapters(model, settings.lora)
        if settings.recompute_on(self.platform):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        units = set(getattr(model, "_no_split_modules", None) or [])
        for module in model.modules():
            if type(module).__name__ in units:
                fully_shard(module, **sharding)
        self.model = fully_shard(model, **sharding)
        if self.platform.collectives_copy_whole:
            use_in_place_collectives(self.model)
        materialize(self.model, torch.device("cpu") if settings.optimizer_offload else self.device)
        self.replay = RouteReplay(self.model) if settings.routing_replay else None
        self._fill(model_path)
        self.optimizer = torch.optim.AdamW(
            weight_decay_groups(self.model, self.settings.weight_decay), lr=self.settings.lr
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.settings.lr_factor)
        self.turn = HostTurn(self.platform)

    def _empty_model(self, model_path: str) -> torch.nn.Module:
        """The model to shard, with meta parameters (fsdp_loading.py): the causal LM."""
        return empty_model(model_path, self.settings.attn_implementation, self.device)

    def _fill(self, model_path: str) -> None:
        """Each rank's shards from the checkpoint at `model_path`; LoRA's adapters initialised."""
        if self.lora:
            fill_shards(self.model, model_path, hf_name=_hf_name)
            init_adapters(self.model)
        else:
            fill_shards(self.model, model_path)

    # ---- forward ------------------------------------------------------------------------
    def _logprobs(
        self, micro: TrainBatch, entropy: Entropy = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        s = self.settings
        return model_logprobs(self.model, micro, self.device, s.packing, s.logprob_chunk_tokens, entropy)

    def _prepare(self, batch: TrainBatch) -> list[TrainBatch]:
        if self.turn.holding:
            raise TrainerStateError("the FSDP trainer is offloaded: call reload() before using it")
        validate(batch)
        check_same_rows(len(batch), self.device)
        return plan_micro_batches(batch, self.settings, self.device)

    def forward_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Per-token logprobs without gradients. Afterwards every unit is resharded: FSDP2 keeps the
        root's gathered parameters (embeddings and head) after a forward until the next backward,
        which a forward-only call never runs (260 MiB of bf16 embedding held for nothing on a
        Qwen2.5-0.5B-shaped model, seen on an H100)."""
        return self._forward(batch, lambda micro: self._logprobs(micro)[0])

    def _forward(self, batch: TrainBatch, forward: Callable[[TrainBatch], torch.Tensor]) -> torch.Tensor:
        """`forward` of each micro-batch of `batch` without gradients, joined on the CPU."""
        micros = self._prepare(batch)
        outs = []
        with torch.no_grad():
            for micro in micros:
                with self._routed(micro):
                    outs.append(forward(micro).cpu())
        self.model.reshard()
        return torch.cat(outs)

    def _routed(self, micro: TrainBatch):
        """With routing replay, the context in which `micro`'s forwards (and the recomputation in
        its backward) route its tokens to the rollout's recorded experts; else nothing."""
        if self.replay is None or micro.routed_experts is None:
            return nullcontext()
        return self.replay.replaying(
            batch_routes(micro.routed_experts, micro.attention_mask, self.settings.packing)
        )

    def base_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """`forward_logprobs` of the base model: the adapters disabled (the reference of LoRA)."""
        self._require_lora("base_logprobs")
        with self.model.disable_adapter():
            return self.forward_logprobs(batch)

    def _require_lora(self, member: str) -> None:
        if not self.lora:
            raise TrainerStateError(f"FsdpTrainStrategy.{member} needs adapters: set trainer.lora.rank")

    def _micro_loss(
        self,
        micro: TrainBatch,
        loss_fn: LossFn,
        accounting: StepAccounting,
        computed: Pass,
        routing: Routing | None,
    ) -> torch.Tensor:
        """One micro-batch's scaled loss from its pass (`computed`) and, for a mixture of experts,
        the router's load-balancing loss times `router_aux_loss_coef`, with the routing metrics."""
        output, metrics, entropy = computed
        aux_loss = None
        if routing is not None:
            aux_loss, routing_metrics = routing.last(None if self.settings.packing else micro.attention_mask)
            metrics.update(routing_metrics)
        loss = accounting.scaled_loss(loss_fn, output, micro, metrics, entropy)
        if aux_loss is not None and self.settings.router_aux_loss_coef > 0:
            loss = loss + self.settings.router_aux_loss_coef * aux_loss * accounting.share(micro)
        return loss

    def train_step(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
        with_grad = getattr(loss_fn, "needs_entropy", False)  # an entropy bonus (algorithm.entropy_coef)
        return self._train(batch, loss_fn, lambda micro: self._policy_pass(micro, with_grad))

    def _policy_pass(self, micro: TrainBatch, with_grad: bool) -> Pass:
        """The logprobs, the mean entropy as a metric, and the entropy with its gradient when the
        loss takes it (`with_grad`)."""
        logprobs, entropy = self._logprobs(micro, entropy=GRAD if with_grad else METRIC)
        mask = micro.response_mask.to(entropy.device)
        return (
            logprobs,
            {"entropy": masked_mean(entropy.detach(), mask).item()},
            entropy if with_grad else None,
        )

    def _train(
        self, batch: TrainBatch, loss_fn: LossFn, forward: Callable[[TrainBatch], Pass]
    ) -> dict[str, float]:
        """One optimizer step of `loss_fn` on what `forward` computes of each micro-batch (with
        gradients; its metrics; the entropy for a loss that takes it), aggregated over the global
        batch."""
        micros = self._prepare(batch)
        accounting = StepAccounting(batch, loss_fn, self.device, dp_size=self.data_parallel_size)
        self.model.train()
        with capture(self.model) if self.experts and self.balances_routers else nullcontext() as routing:
            for micro in micros:
                with self._routed(micro):
                    self._micro_loss(micro, loss_fn, accounting, forward(micro), routing).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        metrics = {**accounting.metrics(), "grad_norm": float(grad_norm)}
        try:
            refuse_non_finite(metrics["loss"], metrics["grad_norm"], self.update_name)
        except NonFiniteUpdateError:
            self.optimizer.zero_grad(set_to_none=True)
            raise
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {**metrics, "lr": lr}

    # ---- weights --------------------------------------------------------------------------
    def export_weights(
        self, dtype: torch.dtype | None = None, snapshot: bool = True, to_rank: int | None = None
    ) -> Iterator[tuple[str, torch.Tensor | None]]:
        """Every rank yields the same full tensors under their HF names (each is gathered with a
        collective, so every rank must drain the iterator): fp32 host snapshots, on every kind.
        For a weight sync: `dtype` (the engine's) casts each shard on the device before it is
        gathered (the gather moves the engine's bytes), `snapshot=False` yields the tensors where
        they are (the device; a one-rank model's own parameters), valid until the next train step
        (the sync copies them at once), and `to_rank` gathers them to that rank alone (on a backend
        whose collectives copy the whole tensor, by sends to it; on the others by an all-gather):
        the other ranks yield each name with None. A tied head is the embedding, yielded once
        under the embedding's name (strategies/tied_weights.py)."""
        return self._export(state_once(self.model).items(), dtype, snapshot, to_rank)

    def export_shards(self) -> Iterator[tuple[str, torch.Tensor, Shard]]:
        """Each rank's dim-0 slices of the weights (FSDP2's local shards), under their HF names; a
        tied head once, under the embedding's name."""
        return local_shards(state_once(self.model).items())

    def export_adapters(
        self, dtype: torch.dtype | None = None, snapshot: bool = True, to_rank: int | None = None
    ) -> Iterator[tuple[str, torch.Tensor | None]]:
        """`export_weights` of the adapters alone, under PEFT's saved names."""
        self._require_lora("export_adapters")
        adapters = [(name, p) for name, p in self.model.named_parameters() if is_adapter(name)]
        return self._export(adapters, dtype, snapshot, to_rank)

    def _export(self, named, dtype, snapshot, to_rank) -> Iterator[tuple[str, torch.Tensor | None]]:
        """Each of `named` whole (`export_weights`), under its exported name: the HF name, or a
        LoRA adapter's PEFT saved name."""
        keep = to_rank is None or dist.get_rank() == to_rank
        for name, tensor in named:
            shard = tensor.detach() if dtype is None else tensor.detach().to(dtype)
            full = whole_tensor(shard, self.platform.collectives_copy_whole, to_rank)
            yield (
                saved_name(name) if self.lora else name,
                export_tensor(full, dtype, snapshot) if keep else None,
            )

    def _device_tensors(self) -> Iterator[torch.Tensor]:
        """What the trainer holds on the device, as local tensors: each rank's parameter shards,
        their gradients, the buffers and the optimizer state (with the offload policy the shards
        and the state live on the host already, and are left there)."""
        held = [*self.model.parameters(), *(p.grad for p in self.model.parameters() if p.grad is not None)]
        held += self.model.buffers()
        held += [
            v
            for state in self.optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        ]
        return (t.to_local() if isinstance(t, DTensor) else t for t in held)

    def offload(self) -> None:
        """Parameters, gradients, buffers and optimizer state into the trainer's host buffer
        (strategies/host_turns.py), their device storages shrunk to nothing and given back to the
        device (the caching allocator keeps freed blocks until `empty_cache`: without it a
        colocated engine gets none of it)."""
        if not self.turn.holding:
            self.turn.release(t for t in self._device_tensors() if self.platform.is_device_tensor(t))
            self.platform.empty_cache()

    def reload(self) -> None:
        self.turn.restore()

    # ---- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        """Sharded model and optimizer state (torch.distributed.checkpoint) plus the scheduler;
        with LoRA, the adapters' PEFT config beside them."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        with checkpoint_cause():
            dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=directory)
        if dist.get_rank() == 0:
            torch.save({"scheduler": self.scheduler.state_dict()}, Path(directory) / TRAINER_STATE)
            if self.lora:  # what `roll-device export` builds the adapter with (export_lora.py)
                self.model.peft_config[ADAPTER_NAME].save_pretrained(directory)
        dist.barrier()

    def load_checkpoint(self, directory: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        if not (Path(directory) / TRAINER_STATE).is_file():
            raise ConfigError(
                f"'{directory}' holds no FSDP trainer checkpoint ({TRAINER_STATE} missing): pass a "
                "directory written by save_checkpoint"
            )
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        with checkpoint_cause():
            dcp.load(state, checkpoint_id=directory)
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )
        extra = torch.load(Path(directory) / TRAINER_STATE, weights_only=True)
        self.scheduler.load_state_dict(extra["scheduler"])

    def shutdown(self) -> None:
        self.model = self.optimizer = self.scheduler = None
        release_process_group(self._owns_group)
