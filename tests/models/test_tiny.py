"""The tiny Qwen3 and Qwen3-MoE models and the Qwen3-30B-A3B shapes: transformers' own classes,
the shapes the engines take, and a marker that keeps models made before valid."""

import json

import pytest

from roll_device.models import qwen_shaped
from roll_device.models.tiny import build_config, make_tiny_model


@pytest.mark.parametrize(
    ("architecture", "class_name"),
    [("qwen2", "Qwen2ForCausalLM"), ("qwen3", "Qwen3ForCausalLM"), ("qwen3_moe", "Qwen3MoeForCausalLM")],
)
def test_each_architecture_saves_transformers_own_class(tmp_path, architecture, class_name):
    path = make_tiny_model(tmp_path / architecture, num_layers=1, architecture=architecture)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == [class_name] and config["num_hidden_layers"] == 1
    assert config["hidden_size"] // config["num_attention_heads"] == 32, (
        "a head size vLLM's CPU attention takes"
    )
    marker = json.loads((path / "roll_device_tiny.json").read_text())
    assert ("architecture" in marker) == (architecture != "qwen2"), "a Qwen2 marker as before"


def test_the_tiny_qwen3_has_qk_norm_and_no_attention_bias():
    from transformers import AutoModelForCausalLM

    names = set(AutoModelForCausalLM.from_config(build_config(architecture="qwen3")).state_dict())
    assert (
        "model.layers.0.self_attn.q_norm.weight" in names
        and "model.layers.0.self_attn.k_norm.weight" in names
    )
    assert not any(name.endswith("_proj.bias") for name in names)


def test_the_tiny_moe_routes_two_of_eight_experts_in_every_layer():
    from transformers import AutoModelForCausalLM

    config = build_config(num_layers=2, architecture="qwen3_moe")
    assert (config.num_experts, config.num_experts_per_tok, config.mlp_only_layers) == (8, 2, [])
    state = AutoModelForCausalLM.from_config(config).state_dict()
    for layer in range(2):
        gate_up = state[f"model.layers.{layer}.mlp.experts.gate_up_proj"]
        assert tuple(gate_up.shape) == (8, 2 * config.moe_intermediate_size, config.hidden_size)
        assert tuple(state[f"model.layers.{layer}.mlp.gate.weight"].shape) == (8, config.hidden_size)


def test_the_30b_a3b_shapes_are_cut_to_two_layers_unless_told():
    config = qwen_shaped.qwen_shaped_config(shapes="qwen3-30b-a3b")
    assert type(config).__name__ == "Qwen3MoeConfig" and config.num_hidden_layers == 2
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (128, 8, 768)
    assert (config.hidden_size, config.head_dim, config.num_key_value_heads) == (2048, 128, 4)
    assert qwen_shaped.qwen_shaped_config(num_layers=48, shapes="qwen3-30b-a3b").num_hidden_layers == 48
    assert type(qwen_shaped.qwen_shaped_config(shapes="qwen2.5-0.5b")).__name__ == "Qwen2Config"
