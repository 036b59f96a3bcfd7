"""The `trainer` config section of each trainer strategy (`configs/trainer/<name>.yaml` holds the
values a run starts from): typed once, read by `roll_device.settings.read_section`. Unknown keys
and out-of-range values are refused before Ray starts."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt

from roll_device.settings import Count, NonNegative, Section

Positive = Annotated[float, Field(gt=0)]


class TrainSettings(Section):
    """Keys every trainer understands."""

    name: str
    lr: Positive
    weight_decay: Annotated[float, Field(ge=0, description="applied to weights, not to norms or biases")]
    max_grad_norm: Positive
    micro_batch_size: Annotated[Count, Field(description="rows per forward/backward")]
    warmup_steps: Annotated[NonNegative, Field(description="linear warmup over this many optimizer steps")]
    mixed_precision: Literal["bf16", "fp32"] | None = Field(
        description="null: bf16 where the kind supports it, fp32 on the CPU"
    )

    @property
    def model_parallel_size(self) -> int:
        """Workers one model replica takes."""
        return 1

    def model_parallel_layout(self) -> str:
        """How `model_parallel_size` comes about, in the config's keys."""
        return "1 (one worker per model replica)"

    def param_dtype_name(self, device_type: str) -> str:
        """The compute dtype: the configured one, else bf16 on accelerators and fp32 on the CPU."""
        if self.mixed_precision is not None:
            return self.mixed_precision
        return "fp32" if device_type == "cpu" else "bf16"

    def lr_factor(self, step: int) -> float:
        """Learning-rate multiplier at optimizer step `step` (0-based): linear warmup, then 1."""
        if self.warmup_steps == 0:
            return 1.0
        return min(1.0, (step + 1) / self.warmup_steps)


class FsdpSettings(TrainSettings):
    """FSDP2 keys: how attention is computed (a transformers `attn_implementation`)."""

    attn_implementation: str = Field(
        description="a transformers attention kernel: sdpa, eager, flash_attention_2, ..."
    )


class MegatronSettings(TrainSettings):
    """Megatron-core keys: the parallel layout, the optimizer kind, the seed, MindSpeed options."""

    tensor_parallel: Annotated[Count, Field(description="ranks that split each layer")]
    pipeline_parallel: Annotated[Count, Field(description="stages; must divide the layers")]
    use_distributed_optimizer: StrictBool
    seed: StrictInt
    mindspeed: dict[str, Any] = Field(description="NPU only: extra options for MindSpeed's repatch()")

    @property
    def model_parallel_size(self) -> int:
        """Workers one model replica takes (tensor x pipeline parallel)."""
        return self.tensor_parallel * self.pipeline_parallel

    def model_parallel_layout(self) -> str:
        return (
            f"trainer.tensor_parallel x trainer.pipeline_parallel = {self.tensor_parallel} x "
            f"{self.pipeline_parallel}"
        )
