"""Megatron-core trainer: a GPTModel built from the HF config (Qwen2 / Llama / Qwen3, and Qwen3-MoE
with expert parallelism and the all-to-all token dispatcher), tensor x pipeline x data (x expert)
parallel through `parallel_state` over the platform's backend, Megatron's DDP and (distributed)
Adam optimizer, HF weights converted in on load and out on export.

Megatron is imported lazily, after `roll_device.compat.megatron.prepare` has readied it for the
platform: MindSpeed on NPU, CUDA-call redirects on the CPU and the simulated NPU (around every call
of this trainer), nothing on GPUs. Ranks of one model replica (its tensor- and pipeline-parallel
ranks) must pass the same rows; data-parallel ranks pass their own. All ranks must call every
method (collectives), and every rank gets the whole answer (logprobs, metrics, weights).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from roll_device.comm.shards import Shard
from roll_device.compat import megatron as megatron_compat
from roll_device.errors import ConfigError
from roll_device.platforms import Platform, get_platform
from strategies.base import LossFn, Requirements, TrainBatch, TrainStrategy
from strategies.host_turns import HostTurn
from strategies.training import megatron_model, megatron_weights
from strategies.training.batches import align_to_tokens, shifted_labels, validate
from strategies.training.common import (
    StepAccounting,
    TrainerStateError,
    check_model_path,
    export_tensor,
    plan_micro_batches,
    refuse_non_finite,
)
from strategies.training.distributed import (
    check_same_rows,
    check_same_tokens,
    ensure_process_group,
    release_process_group,
)
from strategies.training.hf_weights import HfWeights
from strategies.training.megatron_checkpoints import MegatronCheckpoints
from strategies.training.megatron_groups import join_parallel_state, leave_parallel_state
from strategies.training.megatron_routing import ReplayedRouters, RouterTaps
from strategies.training.megatron_stages import PipelineStages
from strategies.training.routing import check_routing
from strategies.training.settings import MegatronSettings


def _in_scope(method):
    """Run a trainer method inside the platform's megatron scope."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._scope():
            return method(self, *args, **kwargs)

    return wrapper


class MegatronTrainStrategy(MegatronCheckpoints, TrainStrategy):
    """Megatron-core GPT training, tensor x pipeline x data parallel, expert parallel for MoE layers."""

    settings_cls = MegatronSettings
    exports_shards = True
    update_name = "policy update"  # what a refused update says it was
    balances_routers = True  # a mixture of experts' load-balancing loss and routing metrics

    @classmethod
    def serves(cls, platform: Platform) -> bool:
        """The kinds roll_device/compat adapts megatron-core to."""
        return platform.kind in megatron_compat.kinds()

    @classmethod
    def requirements(cls, kind: str) -> Requirements:
        """megatron-core, and MindSpeed on a real NPU (not on its simulation: compat/megatron.py)."""
        return Requirements(packages=megatron_compat.packages(get_platform(kind).kernels_kind))

    @classmethod
    def check_model(cls, platform: Platform | None, settings: MegatronSettings, model_path: str) -> None:
        """The model's family, heads, vocabulary, layers and experts take the tensor, pipeline and
        expert sizes; the router's load-balancing loss and routing replay need a router; optimizer
        offload needs a device to offload from (Megatron's hybrid optimizer uses the device's
        streams)."""
        from transformers import AutoConfig

        if settings.optimizer_offload and platform is not None and platform.is_host:
            raise ConfigError(
                f"trainer.optimizer_offload=true: the megatron trainer runs on {platform.name}, whose "
                "optimizer state is in host memory already: set trainer.optimizer_offload=false"
            )

        check_routing(settings, model_path)
        try:
            megatron_model.describe(AutoConfig.from_pretrained(model_path), settings)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (model.path={model_path})") from None

    def initialize(self, model_path: str, settings: MegatronSettings) -> None:
        from transformers import AutoConfig

        self.settings = settings
        check_model_path(model_path)
        self.plan = self._describe(AutoConfig.from_pretrained(model_path))
        hf_weights = HfWeights(model_path)
        self._scope = megatron_compat.prepare(self.platform, self._mindspeed_options())
        self._owns_group = ensure_process_group(self.platform)
        world = dist.get_world_size()
        if world % settings.model_parallel_size:
            release_process_group(self._owns_group)
            raise ConfigError(
                f"megatron trainer: {settings.model_parallel_layout()} must divide the world size {world}"
            )
        self.device = self.platform.device()
        self.steps = 0
        self.turn = HostTurn(self.platform)
        with self._scope():
            self._build(hf_weights)

    def _describe(self, hf_config) -> megatron_model.ModelPlan:
        """The model this trainer builds from `hf_config` (checked against the layout)."""
        return megatron_model.describe(hf_config, self.settings)

    def _new_model(self, config) -> Any:
        """This pipeline stage's GPTModel, its weights not yet loaded."""
        return megatron_model.build(self.plan, config, self.stages.is_first, self.stages.is_last)

    def _mindspeed_options(self) -> dict[str, Any]:
        s = self.settings
        return {
            "tensor_model_parallel_size": s.tensor_parallel,
            "pipeline_model_parallel_size": s.pipeline_parallel,
            "expert_model_parallel_size": s.expert_parallel,
            "expert_tensor_parallel_size": s.experts_tensor_parallel,
            "use_distributed_optimizer": s.use_distributed_optimizer,
            **s.mindspeed,
        }

    def _build(self, hf_weights: Mapping[str, torch.Tensor]) -> None:
        """Megatron's parallel state, the model with `hf_weights` loaded, its DDP and optimizer."""
        from megatron.core.transformer.module import Float16Module

        s = self.settings
        self._join_groups()
        compute = s.param_dtype_name(self.platform)
        config = megatron_model.transformer_config(self.plan, s, compute, s.recompute_on(self.platform))
        model = self._new_model(config)
        megatron_weights.load_into(
            dict(model.named_parameters()),
            hf_weights,
            self.table,
            self.plan.shape,
            self.tp_rank,
            s.tensor_parallel,
            self.experts,
        )
        self.gpt = model
        moe = self.plan.moe
        balances = moe is not None and self.balances_routers
        self.router_taps = RouterTaps(model, moe.num_experts, moe.top_k) if balances else None
        self.replay = ReplayedRouters(model) if moe and s.routing_replay else None
        if compute == "bf16":  # bf16 compute weights; the optimizer keeps fp32 master copies
            model = Float16Module(config, model)
        megatron_model.to_device(model, self.device)
        self._wrap(model, config, bf16=compute == "bf16")

    def _join_groups(self) -> None:
        """Joins Megatron's parallel state; this rank's groups, ranks, pipeline stage and weights table."""
        from megatron.core import parallel_state, tensor_parallel

        s = self.settings
        join_parallel_state(
            s.tensor_parallel, s.pipeline_parallel, s.expert_parallel, s.experts_tensor_parallel
        )
        tensor_parallel.model_parallel_cuda_manual_seed(s.seed)
        self.ep_group = parallel_state.get_expert_model_parallel_group()
        self.etp_group = parallel_state.get_expert_tensor_parallel_group()
        self.experts = megatron_weights.ExpertSplit(
            parallel_state.get_expert_model_parallel_rank(),
            s.expert_parallel,
            parallel_state.get_expert_tensor_parallel_rank(),
            s.experts_tensor_parallel,
        )
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.replica_group = parallel_state.get_model_parallel_group()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.stages = PipelineStages(
            parallel_state.get_pipeline_model_parallel_group(),
            parallel_state.get_pipeline_model_parallel_rank(),
            s.pipeline_parallel,
            self.device,
        )
        self.table = megatron_weights.parameters(
            self.plan.shape, self.stages.rank, self.stages.size, self.experts
        )
        self.data_parallel_rank = parallel_state.get_data_parallel_rank()
        self.data_parallel_size = parallel_state.get_data_parallel_world_size()

    def _wrap(self, model, config, bf16: bool) -> None:
        """Megatron's DDP around `model` and its (distributed) Adam, hooked into `config`."""
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        s = self.settings
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=s.use_distributed_optimizer
        )
        self.model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=s.lr,
                weight_decay=s.weight_decay,
                clip_grad=s.max_grad_norm,
                bf16=bf16,
                params_dtype=torch.float32,
                use_distributed_optimizer=s.use_distributed_optimizer,
                # Megatron's HybridDeviceOptimizer: master weights, Adam state and step on the CPU
                optimizer_cpu_offload=s.optimizer_offload,
                optimizer_offload_fraction=1.0 if s.optimizer_offload else 0.0,
                use_torch_optimizer_for_cpu_offload=s.optimizer_offload,
            ),
            [self.model],
        )
        config.finalize_model_grads_func = finalize_model_grads
        config.no_sync_func = self.model.no_sync
        config.grad_scale_func = self.optimizer.scale_loss

    # ---- forward ------------------------------------------------------------------------
    def _micro_forward(self, model, micro: TrainBatch) -> torch.Tensor:
        """Per-token outputs (`_per_token`) on the last pipeline stage; the hidden states it passes
        on elsewhere (a stage after the first takes its input from the previous stage, not from
        `ids`)."""
        ids = micro.input_ids.to(self.device)
        positions = torch.arange(ids.shape[1], device=self.device).unsqueeze(0).expand_as(ids)
        # causal (rows are right-padded); the mask is passed, not left to Megatron's default, which
        # makes it on a hard-coded accelerator device where recomputation in the backward is beyond
        # the CPU redirects (roll_device/compat)
        causal = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool, device=self.device).triu(1)
        output = model(ids, positions, attention_mask=causal[None, None])
        return self._per_token(output, ids, micro) if self.stages.is_last else output

    def _per_token(self, output: torch.Tensor, ids: torch.Tensor, micro: TrainBatch) -> torch.Tensor:
        """(B, T) logprobs of `micro`'s tokens from the last stage's vocabulary-parallel logits."""
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        next_token = -vocab_parallel_cross_entropy(output.float(), shifted_labels(ids))
        return align_to_tokens(next_token, micro.attention_mask.to(self.device))

    def _prepare(self, batch: TrainBatch) -> list[TrainBatch]:
        if self.turn.holding:
            raise TrainerStateError("the Megatron trainer is offloaded: call reload() before using it")
        validate(batch)
        check_same_rows(len(batch), self.device, self.dp_group)
        check_same_tokens(batch.input_ids, self.device, self.replica_group)
        return plan_micro_batches(batch, self.settings, self.device, self.dp_group)

    def _run(self, micros: list[TrainBatch], forward_only: bool, loss_for=None) -> list:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        taps = self.router_taps

        def forward_step(data_iterator, model):
            micro = next(data_iterator)
            if taps is not None:
                taps.clear()
            if self.replay is not None:
                self.replay.use(micro.routed_experts)
            output = self._micro_forward(model, micro)
            if forward_only:  # the schedule calls the loss function on the last stage only
                return output, lambda logprobs, non_loss_data=False: logprobs.detach().cpu()
            routing = taps.take(micro.attention_mask) if taps is not None else {}
            return output, functools.partial(loss_for, micro, routing)

        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micros),
            model=[self.model],
            num_microbatches=len(micros),
            seq_length=micros[0].input_ids.shape[1],
            micro_batch_size=self.settings.micro_batch_size,
            forward_only=forward_only,
            collect_non_loss_data=forward_only,
        )

    @_in_scope
    def forward_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        micros = self._prepare(batch)
        with torch.no_grad():
            outputs = self._run(micros, forward_only=True)
        local = torch.cat(outputs) if self.stages.is_last else None
        return self.stages.tensor_from_last(local, tuple(batch.input_ids.shape), torch.float32)

    @_in_scope
    def train_step(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
        micros = self._prepare(batch)
        accounting = StepAccounting(batch, loss_fn, self.device, self.dp_group, self.data_parallel_size)
        lr = self.settings.lr * self.settings.lr_factor(self.steps)
        for group in self.optimizer.param_groups:  # what megatron's own scheduler would set
            group["lr"] = lr
            group["weight_decay"] = self.settings.weight_decay * group.get("wd_mult", 1.0)
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

        def loss_for(micro, routing, logprobs):
            # the schedule divides each micro-batch loss by the number of micro-batches; a MoE
            # layer's load-balancing loss is megatron's own (attached to the router's output)
            return accounting.scaled_loss(loss_fn, logprobs, micro, routing) * len(micros), {}

        with self.router_taps.recording() if self.router_taps else contextlib.nullcontext():
            self._run(micros, forward_only=False, loss_for=loss_for)
        # losses exist on the last stage (its data-parallel group reduces them), the others get them
        metrics = self.stages.object_from_last(accounting.metrics() if self.stages.is_last else None)
        grad_norm = self._step(metrics["loss"])
        self.steps += 1
        return {**metrics, "grad_norm": float(grad_norm), "lr": lr}

    def _step(self, loss: float) -> float:
        """Megatron's optimizer step, refused (a NonFiniteUpdateError) when `loss` or the gradient
        norm is not finite: Megatron itself skips a step only with an fp16 loss scaler, and would
        apply NaN gradients in bf16 and fp32. The norm is read first with the optimizer's own public
        steps (`prepare_grads` copies the gradients to the main ones, again in `step`: a copy)."""
        self.optimizer.prepare_grads()
        # the next step zeroes the grads
        refuse_non_finite(loss, float(self.optimizer.get_grad_norm()), self.update_name)
        _, grad_norm, _ = self.optimizer.step()
        return grad_norm

    # ---- weights --------------------------------------------------------------------------
    def _all_gather(self, local: torch.Tensor, group: Any, size: int) -> list[torch.Tensor]:
        """`local` of every rank of `group` (of `size` ranks), in rank order."""
        if size == 1:
            return [local]
        with self._scope():
            shards = [torch.empty_like(local) for _ in range(size)]
            dist.all_gather(shards, local.detach().contiguous(), group=group)
        return shards

    def _gather_tp(self, local: torch.Tensor) -> list[torch.Tensor]:
        return self._all_gather(local, self.tp_group, self.settings.tensor_parallel)

    def _expert_gathers(self) -> megatron_weights.ExpertGathers:
        """Each expert's expert-tensor-parallel shards, then every expert-parallel rank's experts:
        the export gathers all the experts on every rank (the sync's export contract: full
        tensors)."""
        split = self.experts
        return megatron_weights.ExpertGathers(
            lambda local: self._all_gather(local, self.etp_group, split.tp_size),
            lambda stack: self._all_gather(stack, self.ep_group, split.size),
        )

    def export_weights(
        self, dtype: torch.dtype | None = None, snapshot: bool = True, to_rank: int | None = None
    ) -> Iterator[tuple[str, torch.Tensor | None]]:
        """Every rank yields the same full tensors under HF names (tensor-parallel shards are
        all-gathered per tensor, experts over the expert-parallel ranks per layer, stacked as
        transformers names them, pipeline stages broadcast theirs in turn, so every rank must
        drain the iterator): the fp32 weights, or with bf16 compute the bf16 weights the model
        computes with, as host snapshots. For a weight sync: `dtype` (the engine's) casts each on
        the device, `snapshot=False` yields them where they are, valid until the next train step
        (the sync copies them at once), and with `to_rank` the other ranks yield each name with
        None (they still take part in every gather and broadcast: no cast, no copy)."""
        if self.turn.holding:
            raise TrainerStateError("the Megatron trainer is offloaded: call reload() before export")
        params = dict(self.gpt.named_parameters())
        shape, tp = self.plan.shape, self.settings.tensor_parallel
        exported = self.stages.gather_export(
            lambda: megatron_weights.export(
                params, self.table, shape, self._gather_tp, self._expert_gathers()
            ),
            lambda: megatron_weights.manifest(params, self.table, shape, tp, self.experts),
        )
        keep = to_rank is None or dist.get_rank() == to_rank
        for name, tensor in exported:
            yield name, export_tensor(tensor, dtype, snapshot) if keep else None

    def export_shards(self) -> Iterator[tuple[str, torch.Tensor, Shard]]:
        """This rank's own slices under HF names, without a gather or a broadcast: its
        tensor-parallel slices (fused q/k/v and gate/up cut into a box of each HF tensor), its
        pipeline stage's layers, the tensors it replicates whole (the plan has one holder send
        each), and its own experts, one box of each layer's stacked experts."""
        if self.turn.holding:
            raise TrainerStateError("the Megatron trainer is offloaded: call reload() before export")
        params, tp = dict(self.gpt.named_parameters()), self.settings.tensor_parallel
        return megatron_weights.local_slices(
            params, self.table, self.plan.shape, self.tp_rank, tp, self.experts
        )

    def _device_tensors(self) -> list[torch.Tensor]:
        tensors = list(self.gpt.parameters())
        tensors += [b.grad_data for b in self.model.buffers]
        for optimizer in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            for state in optimizer.optimizer.state.values():
                tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
            for group in optimizer.optimizer.param_groups:
                tensors += list(group["params"])
        return tensors

    def offload(self) -> None:
        """Parameters, gradient buffers and optimizer state into the trainer's host buffer
        (strategies/host_turns.py), their device storages shrunk to nothing (views into Megatron's
        flat buffers stay valid) and given back to the device (`empty_cache`: the caching allocator
        keeps freed blocks until then). With the optimizer offloaded, its state is on the host
        already and stays there."""
        if not self.turn.holding:
            self.turn.release(t for t in self._device_tensors() if self.platform.is_device_tensor(t))
            self.platform.empty_cache()

    def reload(self) -> None:
        self.turn.restore()

    def shutdown(self) -> None:
        if getattr(self, "model", None) is None:
            return
        self.model = self.gpt = self.optimizer = None
        with self._scope():
            leave_parallel_state()
        release_process_group(self._owns_group)
