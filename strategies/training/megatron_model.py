"""A Megatron-core GPTModel described from a Hugging Face config (the Qwen2, Llama and Qwen3
families, and Qwen3-MoE: every layer a MoE layer of top-k routed experts, no shared expert).

`describe(hf_config, settings)` checks the model and the parallel layout and returns what the
trainer needs, raising `ConfigError` for what this conversion does not cover, before megatron is
imported. `build(...)` makes the model on the CPU with the local (no Transformer Engine) spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from roll_device.errors import ConfigError
from roll_device.models.hf_dir import num_experts
from strategies.training.megatron_weights import ModelShape
from strategies.training.settings import MegatronSettings

FAMILIES = ("qwen2", "llama", "qwen3", "qwen3_moe")
MOE_FAMILIES = ("qwen3_moe",)  # families whose experts the conversion maps
QK_NORM_FAMILIES = ("qwen3", "qwen3_moe")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class ModelPlan:
    shape: ModelShape
    vocab_size: int
    hidden_size: int
    ffn_hidden_size: int
    max_positions: int
    rms_norm_eps: float
    rope_theta: float
    moe: MoePlan | None = None


@dataclass(frozen=True)
class MoePlan:
    """A mixture of experts' routing: experts per layer, routed per token, each expert's MLP size,
    and whether the top-k probabilities are renormalised (Qwen3-MoE's `norm_topk_prob`)."""

    num_experts: int
    top_k: int
    ffn_hidden_size: int
    norm_topk_prob: bool


def _rope_theta(hf_config) -> float:
    rope = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default":
        raise ConfigError(
            f"megatron trainer: rope_type '{rope_type}' is not converted (only 'default' rotary "
            "embeddings are); use the fsdp trainer for this model"
        )
    return float(rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def _check_family(hf_config) -> str:
    family = getattr(hf_config, "model_type", None)
    if family not in FAMILIES:
        experts = num_experts(hf_config)
        what = f" (a model with {experts} experts per layer)" if experts else ""
        raise ConfigError(
            f"megatron trainer converts the {', '.join(FAMILIES)} families, not '{family}'{what}: "
            "use the fsdp trainer for this model"
        )
    if getattr(hf_config, "hidden_act", "silu") != "silu" or getattr(hf_config, "mlp_bias", False):
        raise ConfigError("megatron trainer: only SiLU-gated MLPs without bias are converted")
    if getattr(hf_config, "use_sliding_window", False):
        raise ConfigError("megatron trainer: sliding-window attention is not converted")
    return family


def _divides(what: str, size: int, values: dict[str, int]) -> None:
    for name, value in values.items():
        if value % size:
            raise ConfigError(f"megatron trainer: {what}={size} must divide the model's {name} ({value})")


def _describe_moe(hf_config, settings: MegatronSettings) -> MoePlan | None:
    """The routing of a MoE model (None for a dense one), its experts checked against the
    expert-parallel layout."""
    experts = num_experts(hf_config)
    if not experts:
        if settings.expert_parallel > 1:
            raise ConfigError(
                f"megatron trainer: trainer.expert_parallel={settings.expert_parallel} needs a mixture of "
                "experts, and this model is dense: set trainer.expert_parallel=1"
            )
        return None
    if getattr(hf_config, "mlp_only_layers", None) or getattr(hf_config, "decoder_sparse_step", 1) != 1:
        raise ConfigError(
            "megatron trainer: every layer of the model must be a MoE layer (mlp_only_layers=[], "
            "decoder_sparse_step=1): use the fsdp trainer for this model"
        )
    if settings.tensor_parallel > 1:  # megatron-core's MoE layer refuses to train so
        raise ConfigError(
            f"megatron trainer: tensor_parallel={settings.tensor_parallel} with a mixture of experts needs "
            "megatron's sequence parallelism, which this trainer does not run: set trainer.tensor_parallel=1 "
            "and spread the experts with trainer.expert_parallel"
        )
    _divides("trainer.expert_parallel", settings.expert_parallel, {"num_experts": experts})
    if settings.experts_tensor_parallel > 1:
        raise ConfigError(
            f"megatron trainer: trainer.expert_tensor_parallel={settings.experts_tensor_parallel}: experts "
            "split over ranks train wrong here (on the CPU a step's gradient norm is off by 5e-5 of a plain "
            "step's and the distributed optimizer's weights by 0.13): set trainer.expert_tensor_parallel=1"
        )
    moe_ffn = hf_config.moe_intermediate_size
    return MoePlan(experts, hf_config.num_experts_per_tok, moe_ffn, bool(hf_config.norm_topk_prob))


def describe(hf_config, settings: MegatronSettings) -> ModelPlan:
    family = _check_family(hf_config)
    moe = _describe_moe(hf_config, settings)
    heads, groups = hf_config.num_attention_heads, hf_config.num_key_value_heads
    sizes = {"num_attention_heads": heads, "num_key_value_heads": groups, "vocab_size": hf_config.vocab_size}
    if moe is None:
        sizes["intermediate_size"] = hf_config.intermediate_size
    _divides("tensor_parallel", settings.tensor_parallel, sizes)
    pp = settings.pipeline_parallel
    if hf_config.num_hidden_layers % pp:
        raise ConfigError(
            f"megatron trainer: pipeline_parallel={pp} must divide the model's num_hidden_layers "
            f"({hf_config.num_hidden_layers}): every stage holds the same number of layers"
        )
    shape = ModelShape(
        num_layers=hf_config.num_hidden_layers,
        num_heads=heads,
        num_groups=groups,
        head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
        qkv_bias=family == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
        tied_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        qk_norm=family in QK_NORM_FAMILIES,
        num_experts=moe.num_experts if moe else 0,
    )
    return ModelPlan(
        shape=shape,
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        max_positions=hf_config.max_position_embeddings,
        rms_norm_eps=hf_config.rms_norm_eps,
        rope_theta=_rope_theta(hf_config),
        moe=moe,
    )


def _leave_uninitialized(tensor: torch.Tensor) -> None:
    """An init method that leaves the weight as allocated (it is overwritten on load)."""


def transformer_config(plan: ModelPlan, settings: MegatronSettings, compute: str, recompute: bool) -> Any:
    """The TransformerConfig: no fused kernels (none exist on the CPU), CPU initialization; with
    `recompute`, every decoder layer's activations recomputed in the backward (full, uniform, one
    layer per unit: only each layer's input is kept)."""
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    shape = plan.shape
    return TransformerConfig(
        num_layers=shape.num_layers,
        hidden_size=plan.hidden_size,
        ffn_hidden_size=plan.ffn_hidden_size,
        num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_groups,
        kv_channels=shape.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=plan.rms_norm_eps,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        gated_linear_unit=True,
        activation_func=F.silu,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        attention_softmax_in_fp32=True,
        use_cpu_initialization=True,
        # Megatron's initialization path also marks each weight's tensor-parallel split (grad
        # norms and the optimizer read those marks), so it runs, with a no-op init method:
        # every weight is then loaded from the HF checkpoint.
        perform_initialization=True,
        init_method=_leave_uninitialized,
        output_layer_init_method=_leave_uninitialized,
        embedding_init_method=_leave_uninitialized,
        params_dtype=torch.float32,
        bf16=compute == "bf16",
        pipeline_dtype=DTYPES[compute],
        tensor_model_parallel_size=settings.tensor_parallel,
        pipeline_model_parallel_size=settings.pipeline_parallel,
        sequence_parallel=False,
        # micro-batches may differ in rows (the last one of a step): stages exchange shapes
        variable_seq_lengths=settings.pipeline_parallel > 1,
        recompute_granularity="full" if recompute else None,
        recompute_method="uniform" if recompute else None,
        recompute_num_layers=1 if recompute else None,
        qk_layernorm=shape.qk_norm,
        # megatron's own backward call (as Megatron-LM trains): the CPU redirect stays on inside
        # backward functions (roll_device/compat/megatron_cuda.py)
        deallocate_pipeline_outputs=True,
        # the all-to-all dispatcher (megatron refuses its default for dense models with the above)
        moe_token_dispatcher_type="alltoall",
        expert_model_parallel_size=settings.expert_parallel,
        expert_tensor_parallel_size=settings.experts_tensor_parallel,
        **_moe_config(plan, settings),
    )


def _moe_config(plan: ModelPlan, settings: MegatronSettings) -> dict[str, Any]:
    """A mixture of experts' keys of the TransformerConfig: Qwen3-MoE's routing (softmax over the
    experts, top-k, renormalised over the k with `norm_topk_prob`: megatron's softmax over the top-k
    logits is the same), no token dropping, and the load-balancing loss on transformers' scale.
    Megatron's per-layer loss is E * sum(f_i * P_i) with the routed fractions f_i over top-k
    choices (1 when balanced), transformers' counts each choice (top-k when balanced), and megatron
    adds every layer's: its coefficient is router_aux_loss_coef x top-k / layers."""
    moe = plan.moe
    if moe is None:
        return {}
    coef = settings.router_aux_loss_coef
    return {
        "num_moe_experts": moe.num_experts,
        "moe_ffn_hidden_size": moe.ffn_hidden_size,
        "moe_router_topk": moe.top_k,
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": not moe.norm_topk_prob,
        "moe_grouped_gemm": False,
        "moe_router_load_balancing_type": "aux_loss" if coef > 0 else "none",
        "moe_aux_loss_coeff": coef * moe.top_k / plan.shape.num_layers,
    }


def build(plan: ModelPlan, config: Any, first_stage: bool = True, last_stage: bool = True) -> Any:
    """This pipeline stage's part of the model: the embedding on the first stage, the final norm
    and output layer on the last, the stage's share of the decoder layers on every stage (with the
    local spec: no Transformer Engine; a MoE layer's experts one MLP each, no grouped GEMM)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    experts = plan.moe.num_experts if plan.moe else None
    spec = get_gpt_layer_local_spec(
        num_experts=experts, moe_grouped_gemm=False, qk_layernorm=plan.shape.qk_norm, normalization="RMSNorm"
    )
    return GPTModel(
        config,
        spec,
        pre_process=first_stage,
        post_process=last_stage,
        vocab_size=plan.vocab_size,
        max_sequence_length=plan.max_positions,
        share_embeddings_and_output_weights=plan.shape.tied_embeddings,
        position_embedding_type="rope",
        rotary_base=int(plan.rope_theta),
        parallel_output=True,
    )


def to_device(model: torch.nn.Module, device: torch.device) -> None:
    """`model` on `device` with the marks megatron sets on its parameters (`allreduce=False` on
    experts, which DDP then reduces over the expert-data-parallel group, `tensor_model_parallel`).
    `Module.to` keeps each parameter object where the device's tensors can take a CPU tensor's
    place (`param.data = moved`) and makes a new, unmarked one where they cannot (the simulated
    NPU's wrapper tensors): there each rank's expert gradients were summed with another rank's."""
    marks = {name: dict(vars(param)) for name, param in model.named_parameters()}
    model.to(device)
    for name, param in model.named_parameters():
        param.__dict__.update(marks[name])
