"""The trainer config group (`configs/trainer/*.yaml`) as checked dataclasses: unknown keys and
out-of-range values raise `ConfigError` before any model is loaded."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from roll_device.errors import ConfigError

MIXED_PRECISION = (None, "bf16", "fp32")


@dataclass
class TrainSettings:
    """Keys every trainer understands."""

    name: str = ""
    lr: float = 1.0e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch_size: int = 16
    warmup_steps: int = 0
    mixed_precision: str | None = None  # None: bf16 on accelerators, fp32 on the CPU

    @classmethod
    def from_dict(cls, config: dict[str, Any] | None):
        config = dict(config or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ConfigError(
                f"trainer '{config.get('name', cls.__name__)}': unknown key(s) {', '.join(unknown)}; "
                f"valid keys are {', '.join(sorted(known))}"
            )
        settings = cls(**config)
        settings.check()
        return settings

    def check(self) -> None:
        _require(self.lr > 0, f"lr must be > 0, got {self.lr}")
        _require(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        _require(self.max_grad_norm > 0, f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        _require(
            isinstance(self.micro_batch_size, int) and self.micro_batch_size >= 1,
            f"micro_batch_size must be an integer >= 1, got {self.micro_batch_size}",
        )
        _require(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        _require(
            self.mixed_precision in MIXED_PRECISION,
            f"mixed_precision must be null, bf16 or fp32, got {self.mixed_precision!r}",
        )

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


@dataclass
class FsdpSettings(TrainSettings):
    """FSDP2 keys: how attention is computed (a transformers `attn_implementation`)."""

    attn_implementation: str = "sdpa"


@dataclass
class MegatronSettings(TrainSettings):
    """Megatron-core keys: the parallel layout, the optimizer kind, the seed, MindSpeed options."""

    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    use_distributed_optimizer: bool = True
    seed: int = 42
    mindspeed: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        super().check()
        _require(self.tensor_parallel >= 1, f"tensor_parallel must be >= 1, got {self.tensor_parallel}")
        _require(self.pipeline_parallel >= 1, f"pipeline_parallel must be >= 1, got {self.pipeline_parallel}")
        _require(isinstance(self.mindspeed, dict), f"mindspeed must be a mapping, got {self.mindspeed!r}")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(f"trainer config: {message}")
