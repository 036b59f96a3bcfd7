"""The `trainer` config section of each trainer strategy (`configs/trainer/<name>.yaml` holds the
values a run starts from): typed once, read by `roll_device.settings.read_section`. Unknown keys
and out-of-range values are refused before Ray starts."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StrictBool, StrictInt, model_validator

from roll_device.errors import ConfigError
from roll_device.platforms import Platform
from roll_device.settings import Count, NonNegative, Section

Positive = Annotated[float, Field(gt=0)]


class TrainSettings(Section):
    """Keys every trainer understands."""

    # what the trainer can add to a loss beside the logprobs; None: everything, else the reason
    lacks_entropy_gradient: ClassVar[str | None] = None

    name: str
    lr: Positive
    weight_decay: Annotated[float, Field(ge=0, description="applied to weights, not to norms or biases")]
    max_grad_norm: Positive
    micro_batch_size: Annotated[Count, Field(description="rows per forward/backward")]
    warmup_steps: Annotated[NonNegative, Field(description="linear warmup over this many optimizer steps")]
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

    @model_validator(mode="after")
    def _packing_needs_a_budget(self):
        if self.packing and self.max_tokens_per_micro_batch is None:
            raise ConfigError(
                "trainer.packing=true needs trainer.max_tokens_per_micro_batch (the length of one packed "
                "row): set it, or trainer.packing=false"
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

    def param_dtype_name(self, platform: Platform) -> str:
        """The compute dtype: the configured one, else bf16 on accelerators and fp32 on the host."""
        if self.mixed_precision is not None:
            return self.mixed_precision
        return "fp32" if platform.is_host else "bf16"

    def lr_factor(self, step: int) -> float:
        """Learning-rate multiplier at optimizer step `step` (0-based): linear warmup, then 1."""
        if self.warmup_steps == 0:
            return 1.0
        return min(1.0, (step + 1) / self.warmup_steps)


class FsdpSettings(TrainSettings):
    """FSDP2 keys: how attention is computed (a transformers `attn_implementation`), and for a
    mixture of experts the weight of the router's load-balancing loss."""

    attn_implementation: str = Field(
        description="a transformers attention kernel: sdpa, eager, flash_attention_2, ..."
    )
    router_aux_loss_coef: Annotated[
        float,
        Field(
            ge=0,
            description="a mixture of experts: the router's load-balancing loss times this joins the loss",
        ),
    ]


class MegatronSettings(TrainSettings):
    """Megatron-core keys: the parallel layout, the optimizer kind, the seed, MindSpeed options."""

    tensor_parallel: Annotated[Count, Field(description="ranks that split each layer")]
    pipeline_parallel: Annotated[Count, Field(description="stages; must divide the layers")]
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
        return self

    @property
    def model_parallel_size(self) -> int:
        """Workers one model replica takes (tensor x pipeline parallel)."""
        return self.tensor_parallel * self.pipeline_parallel

    def model_parallel_layout(self) -> str:
        return (
            f"trainer.tensor_parallel x trainer.pipeline_parallel = {self.tensor_parallel} x "
            f"{self.pipeline_parallel}"
        )
