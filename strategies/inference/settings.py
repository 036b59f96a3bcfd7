"""The `rollout` config section of each rollout strategy (`configs/rollout/<name>.yaml` holds the
values a run starts from): typed once, read by `roll_device.settings.read_section`. What depends
on the device kind (graph modes a kind has, the graph budget, sleep levels) is checked where the
kind is known: `settings_need` and the strategy itself."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, model_validator

from roll_device.errors import ConfigError
from roll_device.graph import check_capture_sizes, default_capture_sizes, default_prefill_sizes
from roll_device.settings import Count, Section, Seed, WeightsDtype

GRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")


class RolloutSettings(Section):
    """Keys every rollout engine reads."""

    name: str
    max_model_len: Annotated[Count, Field(description="prompt and response tokens of one sequence")]
    dtype: WeightsDtype
    update_bucket_bytes: Annotated[Count, Field(description="weight updates travel in buckets of this size")]
    logprobs_mode: Literal[LOGPROBS_MODES]
    capture_sizes: list[Count] | None = Field(description="batch sizes captured as graphs; null: the default")


TensorParallelSize = Annotated[
    StrictInt,
    Field(
        ge=1,
        description="devices of one engine (one actor_infer worker); roles.actor_infer.num_devices "
        "= engines x tensor_parallel_size",
    ),
]


SleepLevel = Annotated[
    Annotated[StrictInt, Field(ge=1, le=2)] | None,
    Field(
        description="how a colocated engine sleeps: 1 keeps its weights in host memory, 2 drops them "
        "and takes them from the next weight sync; null: the kind's first level"
    ),
]


class HfSettings(RolloutSettings):
    """transformers with a static KV cache and graph-captured decoding (strategies/inference/hf.py)."""

    tensor_parallel_size: TensorParallelSize  # 1 only: refused otherwise, saying it is vLLM's

    max_batch_size: Annotated[Count, Field(description="rows per forward; larger requests run in chunks")]
    use_graphs: StrictBool | None = Field(description="null: on where the platform has graphs")
    prefill_graphs: StrictBool
    prefill_capture_sizes: list[Count] | None = Field(description="token counts; null: 16, 32, ... 1024")
    sleep_level: SleepLevel

    @model_validator(mode="after")
    def _capture_sizes_fit(self) -> HfSettings:
        if self.tensor_parallel_size != 1:
            raise ConfigError(
                f"rollout.tensor_parallel_size={self.tensor_parallel_size}: the hf rollout runs each engine "
                "on one device; tensor parallelism is vLLM's (rollout=vllm), or set it to 1"
            )
        self.decode_sizes()  # refuses sizes past max_batch_size, or a largest that misses it
        if self.prefill_capture_sizes is not None and not self.prefill_graphs:
            raise ConfigError(
                "rollout.prefill_capture_sizes is set but rollout.prefill_graphs is false: set "
                "prefill_graphs to true or prefill_capture_sizes to null"
            )
        self.prefill_sizes()
        return self

    def decode_sizes(self) -> list[int]:
        """The decode batch sizes to capture, ascending: the listed ones, else the default."""
        if self.capture_sizes is None:
            return default_capture_sizes(self.max_batch_size)
        return check_capture_sizes(self.capture_sizes, self.max_batch_size, "rollout.capture_sizes")

    def prefill_sizes(self) -> list[int]:
        """The prefill token counts to capture, ascending: the listed ones, else the default."""
        max_tokens = self.max_batch_size * self.max_model_len  # the most tokens one prefill holds
        if self.prefill_capture_sizes is None:
            return default_prefill_sizes(max_tokens)
        return check_capture_sizes(
            self.prefill_capture_sizes,
            max_tokens,
            "rollout.prefill_capture_sizes",
            reach_max=False,
            limit="max_batch_size x max_model_len =",
        )


class VllmSettings(RolloutSettings):
    """vLLM on every kind it runs on (strategies/inference/vllm.py; per kind: vllm_args.py)."""

    max_num_seqs: Annotated[Count, Field(description="concurrent sequences; capture sizes never exceed it")]
    tensor_parallel_size: TensorParallelSize
    expert_parallel: StrictBool = Field(
        description="spread a mixture of experts' experts over the engine's tensor_parallel_size ranks "
        "(vLLM's enable_expert_parallel) where the kind's vLLM offers it"
    )
    enforce_eager: StrictBool | None = Field(
        description="null: per kind (eager on the CPU, graphs elsewhere)"
    )
    graph_mode: Literal[GRAPH_MODES] | None = Field(description="null: the kind's default graph mode")
    kv_cache_bytes: Count | None = Field(
        description="null: 256 MiB on the CPU, gpu_memory_utilization elsewhere"
    )
    gpu_memory_utilization: Annotated[StrictFloat, Field(gt=0, le=1)]
    sleep_when_colocated: StrictBool
    sleep_level: SleepLevel
    seed: Seed
    env: dict[str, str | int | float | bool] = Field(description="variables of the engine process")

    @model_validator(mode="after")
    def _experts_over_ranks(self) -> VllmSettings:
        if self.expert_parallel and self.tensor_parallel_size == 1:
            raise ConfigError(
                "rollout.expert_parallel=true spreads an engine's experts over its ranks, but "
                "rollout.tensor_parallel_size=1: set rollout.tensor_parallel_size to 2 or more"
            )
        return self

    @model_validator(mode="after")
    def _capture_sizes_fit(self) -> VllmSettings:
        if self.capture_sizes is not None:
            check_capture_sizes(
                self.capture_sizes, self.max_num_seqs, "rollout.capture_sizes", reach_max=False
            )
        return self
