"""The `trainer` config section of each trainer strategy (`configs/trainer/<name>.yaml` holds the
values a run starts from): typed once, read by `roll_device.settings.read_section`. Unknown keys
and out-of-range values are refused before Ray starts."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator

from roll_device.errors import ConfigError
from roll_device.platforms import Platform
from roll_device.settings import Count, NonNegative, Section, read_section

Positive = Annotated[StrictFloat, Field(gt=0)]
LR_SCHEDULES = ("constant", "cosine")
ALL_LINEAR = "all-linear"  # PEFT's word for every linear layer but the output layer


class LoraSettings(Section):
    """`trainer.lora`: low-rank adapters trained through PEFT instead of every parameter
    (strategies/training/lora.py). `rank: null` trains every parameter."""

    rank: Count | None = Field(
        description="the adapters' rank, 1 or more; null: no LoRA, every parameter trains"
    )
    alpha: Positive = Field(description="the adapters' scale is alpha / rank")
    dropout: Annotated[
        StrictFloat, Field(ge=0, lt=1, description="dropout on the adapters' input, in [0, 1)")
    ]
    target_modules: str | list[str] = Field(
        description="all-linear, or the linear layers' names (q_proj, v_proj, ...) that get adapters"
    )

    @field_validator("target_modules")
    @classmethod
    def _named_layers(cls, targets: str | list[str]) -> str | list[str]:
        if isinstance(targets, str) and targets != ALL_LINEAR:
            raise ValueError(f"give {ALL_LINEAR} or a list of linear layer names ([q_proj, v_proj])")
        if isinstance(targets, list) and not targets:
            raise ValueError(f"name at least one linear layer, or give {ALL_LINEAR}")
        return targets

    @property
    def on(self) -> bool:
        return self.rank is not None


class TrainSettings(Section):
    """Keys every trainer understands."""

    # what the trainer can add to a loss beside the logprobs; None: everything, else the reason
    lacks_entropy_gradient: ClassVar[str | None] = None
    # None: the trainer places experts on expert-parallel ranks; else why it cannot
    lacks_expert_parallel: ClassVar[str | None] = None
    # None: the trainer routes tokens to the experts the rollout recorded; else why it cannot (a
    # trainer replays only once it says so)
    lacks_routing_replay: ClassVar[str | None] = "this trainer does not declare routing replay"

    name: str
    lr: Positive
    weight_decay: Annotated[
        StrictFloat, Field(ge=0, description="applied to weights, not to norms or biases")
    ]
    max_grad_norm: Positive
    micro_batch_size: Annotated[Count, Field(description="rows per forward/backward")]
    warmup_steps: Annotated[NonNegative, Field(description="linear warmup over this many optimizer steps")]
    # the schedule's keys have defaults: a run folder saved before them still reads (gate.py's resume check)
    lr_schedule: Literal[LR_SCHEDULES] = Field(
        default="constant",
        description="after the warmup: constant, or cosine (a half cosine from lr down to min_lr_ratio x lr)",
    )
    min_lr_ratio: Annotated[
        StrictFloat, Field(ge=0, le=1, description="cosine: the rate it ends at, as a fraction of lr")
    ] = 0.0
    schedule_steps: Count | None = Field(
        default=None,
        description="cosine: the optimizer steps it spans, warmup included; null: the run's (set by the run)",
    )
    mixed_precision: Literal["bf16", "fp32"] | None = Field(
        description="null: bf16 where the kind supports it, fp32 on the CPU"
    )
    recompute: StrictBool | None = Field(
        description="activation recomputation; null: on for accelerators, off on the CPU"
    )
    max_tokens_per_micro_batch: Count | None = Field(
        description="null: micro-batches of micro_batch_size rows; a number: micro-batches cut by tokens"
    )
    packing: StrictBool = Field(description="one row of concatenated samples per micro-batch, no padding")
    logprob_chunk_tokens: Count | None = Field(
        description="null: logits of the whole sequence at once; a number: that many positions at a time"
    )
    optimizer_offload: StrictBool = Field(description="optimizer state (and its step) on the CPU")
    router_aux_loss_coef: Annotated[
        StrictFloat,
        Field(
            ge=0,
            description="a mixture of experts: the router's load-balancing loss times this joins the loss",
        ),
    ]
    expert_parallel: Annotated[
        Count, Field(description="a mixture of experts: ranks its experts are spread over (1: all on each)")
    ]
    routing_replay: StrictBool = Field(
        description="a mixture of experts: route each token to the experts the rollout routed it to (R3)"
    )
    lora: LoraSettings

    @model_validator(mode="after")
    def _schedule_has_room(self):
        steps, warmup = self.schedule_steps, self.warmup_steps
        if self.lr_schedule == "cosine" and steps is not None and warmup >= steps:
            raise ConfigError(
                f"trainer.warmup_steps={warmup} leaves no step of the cosine schedule's {steps} optimizer "
                f"steps (trainer.schedule_steps, null: max_steps x algorithm.ppo_epochs x "
                "algorithm.mini_batches): lower warmup_steps, or use trainer.lr_schedule=constant"
            )
        return self

    @model_validator(mode="after")
    def _packing_needs_a_budget(self):
        if self.packing and self.max_tokens_per_micro_batch is None:
            raise ConfigError(
                "trainer.packing=true needs trainer.max_tokens_per_micro_batch (the length of one packed "
                "row): set it, or trainer.packing=false"
            )
        if self.expert_parallel > 1 and self.lacks_expert_parallel:
            raise ConfigError(
                f"trainer.expert_parallel={self.expert_parallel}: {self.lacks_expert_parallel}: set "
                "trainer.expert_parallel=1, or use trainer=megatron"
            )
        if self.routing_replay and self.lacks_routing_replay:
            raise ConfigError(
                f"trainer.routing_replay=true: {self.lacks_routing_replay}: set trainer.routing_replay=false, "
                "or use trainer=fsdp"
            )
        return self

    def recompute_on(self, platform: Platform) -> bool:
        """Whether activations are recomputed: the configured switch, else on for accelerators."""
        return self.recompute if self.recompute is not None else not platform.is_host

    def check_longest_sample(self, tokens: int, what: str) -> None:
        """A ConfigError when a token budget is set below the longest sample (`what` says where
        that length comes from): such a sample would fit no micro-batch."""
        budget = self.max_tokens_per_micro_batch
        if budget is not None and budget < tokens:
            raise ConfigError(
                f"trainer.max_tokens_per_micro_batch={budget} is smaller than one sample ({what} = "
                f"{tokens} tokens): raise it to at least {tokens}"
            )

    @property
    def model_parallel_size(self) -> int:
        """Workers one model replica takes."""
        return 1

    def model_parallel_layout(self) -> str:
        """How `model_parallel_size` comes about, in the config's keys."""
        return "1 (one worker per model replica)"

    def adapters_checkpointed(self) -> str:
        """The LoRA settings that decide the adapter tensors a checkpoint holds, in the config's keys."""
        lora = self.lora
        if not lora.on:
            return "trainer.lora.rank=null"
        return f"trainer.lora.rank={lora.rank} and trainer.lora.target_modules={lora.target_modules}"

    def param_dtype_name(self, platform: Platform) -> str:
        """The compute dtype: the configured one, else bf16 on accelerators and fp32 on the host."""
        if self.mixed_precision is not None:
            return self.mixed_precision
        return "fp32" if platform.is_host else "bf16"

    def scheduled(self, optimizer_steps: int) -> TrainSettings:
        """These settings with `schedule_steps` the run's `optimizer_steps` where it is null and the
        schedule needs it (checked again: a warmup as long is refused)."""
        if self.lr_schedule == "constant" or self.schedule_steps is not None:
            return self
        return read_section(type(self), {**self.model_dump(), "schedule_steps": optimizer_steps}, "trainer")

    def lr_factor(self, step: int) -> float:
        """Learning-rate multiplier at optimizer step `step` (0-based): a linear warmup over
        `warmup_steps`, then 1 (`constant`) or SGDR's cosine (Loshchilov and Hutter, arXiv
        1608.03983, eq. 5, one period: transformers' `get_cosine_schedule_with_warmup` with a floor)
        from 1 down to `min_lr_ratio` over the rest of `schedule_steps`, and the floor after them."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / (self.schedule_steps - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class CriticSettings(Section):
    """PPO's critic (roles.critic): its own optimizer settings on top of the trainer section's, and
    the checkpoint it starts from."""

    lr: Positive
    model_path: str | None = Field(description="null: the policy's model (a value head added at zero)")

    def applied_to(self, trainer: TrainSettings) -> TrainSettings:
        """The trainer section the critic's strategy runs with: `trainer` with the critic's lr."""
        return trainer.model_copy(update={"lr": self.lr})


class FsdpSettings(TrainSettings):
    """FSDP2 keys: how attention is computed (a transformers `attn_implementation`)."""

    lacks_expert_parallel: ClassVar[str | None] = (
        "the fsdp trainer has no expert parallelism (FSDP2 shards every expert over all its ranks)"
    )
    lacks_routing_replay: ClassVar[str | None] = None  # strategies/routes.py's hooks on the routers

    attn_implementation: str = Field(
        description="a transformers attention kernel: sdpa, eager, flash_attention_2, ..."
    )


MEGATRON_CORE = "0.16"  # the megatron-core this refusal was checked against (no LoRA layer in it)


class MegatronSettings(TrainSettings):
    """Megatron-core keys: the parallel layout, the optimizer kind, the seed, MindSpeed options."""

    lacks_routing_replay: ClassVar[str | None] = None  # megatron-core's router_replay hook

    tensor_parallel: Annotated[Count, Field(description="ranks that split each layer")]
    pipeline_parallel: Annotated[Count, Field(description="stages; must divide the layers")]
    expert_tensor_parallel: Count | None = Field(
        description="a mixture of experts: ranks that split each expert; null: tensor_parallel"
    )
    use_distributed_optimizer: StrictBool
    seed: StrictInt
    mindspeed: dict[str, Any] = Field(description="NPU only: extra options for MindSpeed's repatch()")
    lacks_entropy_gradient: ClassVar[str | None] = (
        "the megatron trainer's logprobs come from the vocabulary-parallel cross entropy, without "
        "the distribution's entropy"
    )

    @model_validator(mode="after")
    def _what_megatron_lacks(self):
        """Packing needs Megatron's THD attention (Transformer Engine), which the local layer spec
        this trainer builds lacks; chunked logprobs are the FSDP trainer's."""
        if self.packing:
            raise ConfigError(
                "trainer.packing=true: the megatron trainer's attention (the local layer spec, no "
                "Transformer Engine) cannot take packed rows: set trainer.packing=false (micro-batches "
                "can still be cut by trainer.max_tokens_per_micro_batch), or use trainer=fsdp"
            )
        if self.optimizer_offload and not self.use_distributed_optimizer:
            raise ConfigError(
                "trainer.optimizer_offload=true: Megatron offloads the distributed optimizer's state "
                "only: set trainer.use_distributed_optimizer=true, or trainer.optimizer_offload=false"
            )
        if self.logprob_chunk_tokens is not None:
            raise ConfigError(
                f"trainer.logprob_chunk_tokens={self.logprob_chunk_tokens}: the megatron trainer computes "
                "logprobs over the vocabulary split by tensor parallelism, not in chunks: set it to null, "
                "or use trainer=fsdp"
            )
        if self.routing_replay and self.pipeline_parallel > 1:
            raise ConfigError(
                f"trainer.routing_replay=true with trainer.pipeline_parallel={self.pipeline_parallel}: the "
                "megatron trainer sets each micro-batch's routes before its forward, and a pipeline schedule "
                "recomputes a micro-batch's layers after later forwards: set trainer.pipeline_parallel=1, "
                "or trainer.routing_replay=false"
            )
        if self.lora.on:
            raise ConfigError(
                f"trainer.lora.rank={self.lora.rank}: megatron-core {MEGATRON_CORE} has no LoRA adapters "
                "(they live in NeMo and Megatron-Bridge, not in core): use trainer=fsdp for LoRA, or set "
                "trainer.lora.rank=null"
            )
        return self

    @property
    def experts_tensor_parallel(self) -> int:
        """Ranks that split each expert (megatron's default: the tensor-parallel size)."""
        return self.expert_tensor_parallel or self.tensor_parallel

    @property
    def model_parallel_size(self) -> int:
        """Workers the layout splits into whole replicas: tensor x pipeline parallel for the dense
        layers, and with expert parallelism a multiple of expert x expert-tensor x pipeline
        parallel too (expert-parallel ranks are data-parallel ranks of the dense layers)."""
        dense = self.tensor_parallel * self.pipeline_parallel
        experts = self.expert_parallel * self.experts_tensor_parallel * self.pipeline_parallel
        return math.lcm(dense, experts)

    def model_parallel_layout(self) -> str:
        layout = (
            f"trainer.tensor_parallel x trainer.pipeline_parallel = {self.tensor_parallel} x "
            f"{self.pipeline_parallel}"
        )
        if self.expert_parallel == 1 and self.experts_tensor_parallel == self.tensor_parallel:
            return layout
        return (
            f"{layout} and trainer.expert_parallel x expert tensor parallel x trainer.pipeline_parallel = "
            f"{self.expert_parallel} x {self.experts_tensor_parallel} x {self.pipeline_parallel} "
            f"(their least common multiple, {self.model_parallel_size})"
        )
