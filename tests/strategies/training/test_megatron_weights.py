"""HF <-> Megatron weight conversion: layouts and tensor-parallel split/merge round trips."""

from __future__ import annotations

import pytest
import torch

from strategies.training.megatron_weights import ModelShape, export, parameters, to_megatron_shard

HIDDEN, FFN, VOCAB = 32, 48, 16


def hf_state(shape: ModelShape) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q_rows, kv_rows = shape.num_heads * shape.head_dim, shape.num_groups * shape.head_dim
    sizes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    if not shape.tied_embeddings:
        sizes["lm_head.weight"] = (VOCAB, HIDDEN)
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        sizes.update(
            {
                p + "input_layernorm.weight": (HIDDEN,),
                p + "post_attention_layernorm.weight": (HIDDEN,),
                p + "self_attn.q_proj.weight": (q_rows, HIDDEN),
                p + "self_attn.k_proj.weight": (kv_rows, HIDDEN),
                p + "self_attn.v_proj.weight": (kv_rows, HIDDEN),
                p + "self_attn.o_proj.weight": (HIDDEN, q_rows),
                p + "mlp.gate_proj.weight": (FFN, HIDDEN),
                p + "mlp.up_proj.weight": (FFN, HIDDEN),
                p + "mlp.down_proj.weight": (HIDDEN, FFN),
            }
        )
        if shape.qkv_bias:
            sizes.update({p + f"self_attn.{x}_proj.bias": (r,) for x, r in zip("qkv", (q_rows, kv_rows, kv_rows))})
    return {name: torch.randn(size, generator=g) for name, size in sizes.items()}


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("qkv_bias, tied", [(True, False), (False, True)])
def test_split_then_merge_gives_back_every_hf_tensor(tp, qkv_bias, tied):
    shape = ModelShape(num_layers=2, num_heads=4, num_groups=2, head_dim=8, qkv_bias=qkv_bias, tied_embeddings=tied)
    hf = hf_state(shape)
    shards = {
        p.megatron: [to_megatron_shard(p, hf, shape, rank, tp) for rank in range(tp)] for p in parameters(shape)
    }
    by_tensor = {id(s[0]): s for s in shards.values()}
    local = {name: ranks[0] for name, ranks in shards.items()}
    exported = dict(export(local, shape, gather=lambda t: by_tensor[id(t)]))
    expected = dict(hf, **({"lm_head.weight": hf["model.embed_tokens.weight"]} if tied else {}))
    assert sorted(exported) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(exported[name], tensor), name


def test_qkv_is_group_major_and_tensor_parallel_ranks_hold_whole_groups():
    shape = ModelShape(num_layers=1, num_heads=4, num_groups=2, head_dim=1, qkv_bias=True, tied_embeddings=False)
    hf = hf_state(shape)
    prefix = "model.layers.0.self_attn."
    hf[prefix + "q_proj.bias"] = torch.tensor([0.0, 1.0, 2.0, 3.0])  # heads 0-1: group 0, 2-3: group 1
    hf[prefix + "k_proj.bias"] = torch.tensor([10.0, 11.0])
    hf[prefix + "v_proj.bias"] = torch.tensor([20.0, 21.0])
    qkv_bias = next(p for p in parameters(shape) if p.megatron.endswith("linear_qkv.bias"))
    assert to_megatron_shard(qkv_bias, hf, shape, 0, 1).tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    assert to_megatron_shard(qkv_bias, hf, shape, 1, 2).tolist() == [2, 3, 11, 21]


def test_gate_and_up_are_split_separately_per_rank():
    shape = ModelShape(num_layers=1, num_heads=4, num_groups=2, head_dim=8, qkv_bias=False, tied_embeddings=False)
    hf = hf_state(shape)
    fc1 = next(p for p in parameters(shape) if p.megatron.endswith("linear_fc1.weight"))
    shard = to_megatron_shard(fc1, hf, shape, 1, 2)
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(shard, torch.cat([gate[FFN // 2 :], up[FFN // 2 :]]))
