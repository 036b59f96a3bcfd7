"""vLLM-Ascend facts the NPU engine profile keeps (roll_device/compat/vllm.py): which graph modes are
known good with in-place weight updates, per model type, and which `additional_config` keys the
pinned release accepts.

Graph modes and in-place updates. A captured ACL graph reads the addresses it was captured with; a
weight update stays visible to it only where every tensor the graph reads is written in place.
vLLM-Ascend's RFC #16322 ("Make live weight updates transactional and graph-safe", open) lists
what breaks that: `process_weights_after_loading` re-run after a reload and reassigning derived
tensors (`.contiguous()`, `.clone()`, NZ format casts, quantization repacking) instead of copying
into them. The point fixes so far each copy one family back in place: #7473 (MLA and SFA
attention's absorbed `W_UV` / `W_UK_T`, DeepSeek-V3-style models; v0.18.0 backport #7715), #13902
(w8a8_mxfp8 quantized linears), #15666 (DeepSeek-V4's pre-cast fp32 weights). The list below is
this project's reading of those sources, not a vendor's support matrix: dense unquantized models
with the NZ layout off (`rl_config`, `VLLM_ASCEND_ENABLE_NZ=0`) derive no tensor from their weights,
and MLA models are covered by #7473 in every release since v0.18.0. Every other model type, and
every other mode, is unknown: the engine says so when it starts, and the graph guard
(roll_device/graph/guard.py) checks it after every sync either way.

`additional_config` keys: vLLM-Ascend's `AscendConfig` forbids unknown keys (pydantic
`extra="forbid"`); the keys below are its documented ones (its ascend_config.py), with
`rl_config`'s four. The old `torchair_graph_config` and `ascend_scheduler_config` were removed in
late 2025 (torchair gave way to npugraph_ex).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from roll_device.errors import ConfigError

DECODE_GRAPHS = "FULL_DECODE_ONLY"
GRAPH_MODES_KNOWN_GOOD: Mapping[str, tuple[str, ...]] = {
    # dense, unquantized, NZ off: nothing derived from the weights (RFC #16322's risk patterns)
    "llama": (DECODE_GRAPHS,),
    "qwen2": (DECODE_GRAPHS,),
    "qwen3": (DECODE_GRAPHS,),
    # MLA / SFA attention: absorbed weights copied in place since #7473 (v0.18.0: #7715)
    "deepseek_v3": (DECODE_GRAPHS,),
    "deepseek_v32": (DECODE_GRAPHS,),
}

RL_CONFIG_KEYS = (
    "enabled",
    "sleep_mode_extra_cleanup",
    "enable_training_consistency",
    "enable_batch_invariant",
)
# Each top-level key: the keys of its section where this profile checks them, else None.
ADDITIONAL_CONFIG_KEYS: Mapping[str, tuple[str, ...] | None] = {
    "rl_config": RL_CONFIG_KEYS,
    **dict.fromkeys(
        (
            "refresh",
            "enable_cpu_binding",
            "multistream_overlap_shared_expert",
            "enable_shared_expert_dp",
            "enable_prefill_mc2",
            "enable_kv_nz",
            "weight_nz_mode",
            "ascend_compilation_config",
            "ascend_fusion_config",
            "eplb_config",
            "rejection_sampler_config",
            "xlite_graph_config",
            "finegrained_tp_config",
            "scheduler_config",
            "dump_config_path",
            "dump_config",
        )
    ),
}
REMOVED_KEYS = {
    "torchair_graph_config": "torchair was removed for npugraph_ex: use ascend_compilation_config",
    "ascend_scheduler_config": "the Ascend scheduler was removed: use vLLM's scheduler (scheduler_config)",
}


def known_good_modes(model_type: str | None) -> tuple[str, ...]:
    """The graph modes known good with in-place weight updates for `model_type` (config.json's
    `model_type`); NONE (no graphs) always is."""
    return ("NONE", *GRAPH_MODES_KNOWN_GOOD.get(model_type or "", ()))


def check_additional_config(config: Mapping[str, Any], where: str = "additional_config") -> None:
    """A ConfigError naming the first key of `config` the pinned vLLM-Ascend does not accept."""
    for key, value in config.items():
        if key in REMOVED_KEYS:
            raise ConfigError(f"{where}.{key} was removed from vLLM-Ascend ({REMOVED_KEYS[key]})")
        if key not in ADDITIONAL_CONFIG_KEYS:
            raise ConfigError(
                f"{where}.{key} is not a vLLM-Ascend additional_config key: one of "
                f"{', '.join(sorted(ADDITIONAL_CONFIG_KEYS))}"
            )
        accepted = ADDITIONAL_CONFIG_KEYS[key]
        if accepted is not None and not isinstance(value, Mapping):
            raise ConfigError(f"{where}.{key} must be a mapping of {', '.join(accepted)}, got {value!r}")
        unknown = sorted(set(value) - set(accepted)) if accepted is not None else []
        if unknown:
            raise ConfigError(
                f"{where}.{key}.{unknown[0]} is not a vLLM-Ascend {key} key: one of {', '.join(accepted)}"
            )
