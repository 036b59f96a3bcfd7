"""HF <-> Megatron weight conversion: layouts, tensor-parallel split/merge round trips, and each
rank's own slices as boxes of the HF tensors (the sharded sync's export)."""

from __future__ import annotations

import itertools

import pytest
import torch

from roll_device.errors import WeightSyncError
from strategies.training.megatron_weights import (
    ExpertGathers,
    ExpertSplit,
    ModelShape,
    export,
    local_slices,
    manifest,
    parameters,
    to_megatron_shard,
)
from tests.comm.shard_layouts import assembled

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
            sizes.update(
                {p + f"self_attn.{x}_proj.bias": (r,) for x, r in zip("qkv", (q_rows, kv_rows, kv_rows))}
            )
    return {name: torch.randn(size, generator=g) for name, size in sizes.items()}


@pytest.mark.parametrize("tp, pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("qkv_bias, tied", [(True, False), (False, True)])
def test_split_then_merge_gives_back_every_hf_tensor(tp, pp, qkv_bias, tied):
    """Every stage's shards, merged and exported, give each HF tensor once; the manifest
    (worked out on meta tensors) names the same tensors with the same shapes and dtypes."""
    shape = ModelShape(
        num_layers=4, num_heads=4, num_groups=2, head_dim=8, qkv_bias=qkv_bias, tied_embeddings=tied
    )
    hf = hf_state(shape)
    exported: dict[str, torch.Tensor] = {}
    for stage in range(pp):
        table = parameters(shape, stage, pp)
        shards = {
            p.megatron: [to_megatron_shard(p, hf, shape, rank, tp) for rank in range(tp)] for p in table
        }
        by_tensor = {id(s[0]): s for s in shards.values()}
        local = {name: ranks[0] for name, ranks in shards.items()}
        stage_export = list(
            export(local, table, shape, gather=lambda t, by_tensor=by_tensor: by_tensor[id(t)])
        )
        assert manifest(local, table, shape, tp) == [(n, tuple(t.shape), t.dtype) for n, t in stage_export]
        assert not set(exported) & {n for n, _ in stage_export}, "a tensor exported by two stages"
        exported.update(stage_export)
    assert sorted(exported) == sorted(hf)  # a tied head: the embedding alone, as HF checkpoints store it
    for name, tensor in hf.items():
        assert torch.equal(exported[name], tensor), name


def test_pipeline_stages_number_their_layers_from_zero():
    shape = ModelShape(
        num_layers=4, num_heads=4, num_groups=2, head_dim=8, qkv_bias=False, tied_embeddings=True
    )
    first, last = parameters(shape, 0, 2), parameters(shape, 1, 2)
    qkv = [p for p in last if p.megatron.endswith("linear_qkv.weight")]
    assert [(p.megatron, p.hf[0]) for p in qkv] == [
        ("decoder.layers.0.self_attention.linear_qkv.weight", "model.layers.2.self_attn.q_proj.weight"),
        ("decoder.layers.1.self_attention.linear_qkv.weight", "model.layers.3.self_attn.q_proj.weight"),
    ]
    assert first[
        0
    ].megatron == "embedding.word_embeddings.weight" and "decoder.final_layernorm.weight" not in {
        p.megatron for p in first
    }
    head = last[-1]  # the last stage's copy of the tied embedding: loaded, not exported
    assert (head.megatron, head.hf, head.exported) == (
        "output_layer.weight",
        ("model.embed_tokens.weight",),
        False,
    )


def test_qkv_is_group_major_and_tensor_parallel_ranks_hold_whole_groups():
    shape = ModelShape(
        num_layers=1, num_heads=4, num_groups=2, head_dim=1, qkv_bias=True, tied_embeddings=False
    )
    hf = hf_state(shape)
    prefix = "model.layers.0.self_attn."
    hf[prefix + "q_proj.bias"] = torch.tensor([0.0, 1.0, 2.0, 3.0])  # heads 0-1: group 0, 2-3: group 1
    hf[prefix + "k_proj.bias"] = torch.tensor([10.0, 11.0])
    hf[prefix + "v_proj.bias"] = torch.tensor([20.0, 21.0])
    qkv_bias = next(p for p in parameters(shape) if p.megatron.endswith("linear_qkv.bias"))
    assert to_megatron_shard(qkv_bias, hf, shape, 0, 1).tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    assert to_megatron_shard(qkv_bias, hf, shape, 1, 2).tolist() == [2, 3, 11, 21]


def test_gate_and_up_are_split_separately_per_rank():
    shape = ModelShape(
        num_layers=1, num_heads=4, num_groups=2, head_dim=8, qkv_bias=False, tied_embeddings=False
    )
    hf = hf_state(shape)
    fc1 = next(p for p in parameters(shape) if p.megatron.endswith("linear_fc1.weight"))
    shard = to_megatron_shard(fc1, hf, shape, 1, 2)
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(shard, torch.cat([gate[FFN // 2 :], up[FFN // 2 :]]))


EXPERTS, EXPERT_FFN = 4, 8


def hf_moe_state(shape: ModelShape) -> dict[str, torch.Tensor]:
    """A dense state with each layer's MLP replaced by a router and per-expert matrices."""
    g = torch.Generator().manual_seed(1)
    state = {k: v for k, v in hf_state(shape).items() if ".mlp." not in k}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}.mlp."
        state[p + "gate.weight"] = torch.randn(EXPERTS, HIDDEN, generator=g)
        for e in range(EXPERTS):
            for part, size in (
                ("gate", (EXPERT_FFN, HIDDEN)),
                ("up", (EXPERT_FFN, HIDDEN)),
                ("down", (HIDDEN, EXPERT_FFN)),
            ):
                state[f"{p}experts.{e}.{part}_proj.weight"] = torch.randn(size, generator=g)
    return state


def expert_rank_shards(shape: ModelShape, hf, ep: int, etp: int, r: int) -> tuple[list, dict, ExpertGathers]:
    """Expert-parallel rank r's table, its tensors on expert-tensor-parallel rank 0, and the
    gathers that collect each expert's shards over the expert-tensor-parallel ranks."""
    table = parameters(shape, experts=ExpertSplit(r, ep, 0, etp))
    ranks = [
        {
            p.megatron: to_megatron_shard(p, hf, shape, t if p.stacked else 0, etp if p.stacked else 1)
            for p in table
        }
        for t in range(etp)
    ]
    names = {id(tensor): name for name, tensor in ranks[0].items()}
    return table, ranks[0], ExpertGathers(lambda local: [ranks[t][names[id(local)]] for t in range(etp)])


@pytest.mark.parametrize("ep, etp", [(1, 1), (2, 1), (2, 2), (4, 1)])
def test_experts_split_over_ranks_export_stacked_as_transformers_names_them(ep, etp):
    """Each expert-parallel rank loads its experts (each split over the expert-tensor-parallel
    ranks) from the per-expert matrices; gathered, they export as one stacked tensor per layer
    and matrix (experts x (gate rows, up rows) x hidden; experts x hidden x rows), after the
    other tensors, and the manifest lists the same."""
    shape = ModelShape(2, 4, 2, 8, qkv_bias=False, tied_embeddings=False, qk_norm=True, num_experts=EXPERTS)
    hf = hf_moe_state(shape)
    hf.update({f"model.layers.{i}.self_attn.{x}_norm.weight": torch.randn(8) for i in range(2) for x in "qk"})
    ranks = [expert_rank_shards(shape, hf, ep, etp, r) for r in range(ep)]
    others = [  # the other expert-parallel ranks' stacks, in the order every rank exports them
        iter([t for n, t in export(local, table, shape, lambda t: [t], gathers) if ".experts." in n])
        for table, local, gathers in ranks[1:]
    ]
    table, local, gathers = ranks[0]
    gathers = ExpertGathers(gathers.tensor_parallel, lambda stack: [stack] + [next(o) for o in others])
    exported = dict(export(local, table, shape, lambda t: [t], gathers))
    layer = "model.layers.1.mlp.experts."
    gate_up = [
        torch.cat([hf[f"{layer}{e}.gate_proj.weight"], hf[f"{layer}{e}.up_proj.weight"]])
        for e in range(EXPERTS)
    ]
    assert torch.equal(exported[layer + "gate_up_proj"], torch.stack(gate_up))
    down = torch.stack([hf[f"{layer}{e}.down_proj.weight"] for e in range(EXPERTS)])
    assert torch.equal(exported[layer + "down_proj"], down)
    stacked = {f"model.layers.{i}.mlp.experts.{m}" for i in range(2) for m in ("down_proj", "gate_up_proj")}
    assert set(exported) == {n for n in hf if ".experts." not in n} | stacked
    assert torch.equal(
        exported["model.layers.0.self_attn.q_norm.weight"], hf["model.layers.0.self_attn.q_norm.weight"]
    )
    listed = manifest(local, table, shape, 1, ExpertSplit(0, ep, 0, etp))
    assert listed == [(n, tuple(t.shape), t.dtype) for n, t in exported.items()]


@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("qkv_bias, tied", [(True, False), (False, True)])
def test_each_ranks_slices_are_boxes_of_the_hf_tensors(tp, pp, qkv_bias, tied):
    """Every (stage, tensor-parallel rank)'s slices, placed at their boxes, give back every HF
    tensor (fused q/k/v of two query groups per rank and gate/up cut into boxes of each)."""
    shape = ModelShape(
        num_layers=4, num_heads=8, num_groups=4, head_dim=8, qkv_bias=qkv_bias, tied_embeddings=tied
    )
    hf = hf_state(shape)
    ranks = []
    for stage, rank in itertools.product(range(pp), range(tp)):
        table = parameters(shape, stage, pp)
        local = {p.megatron: to_megatron_shard(p, hf, shape, rank, tp) for p in table}
        ranks.append(list(local_slices(local, table, shape, rank, tp)))
    full, _ = assembled(ranks)
    assert sorted(full) == sorted(hf)
    for name, tensor in hf.items():
        assert torch.equal(full[name], tensor), name


@pytest.mark.parametrize("ep", [2, 4])
def test_each_expert_parallel_rank_slices_its_own_experts(ep):
    """An expert-parallel rank's experts are its rows of each stacked tensor (global indices);
    the replicated rest is whole on every rank; together they are the stacked export."""
    shape = ModelShape(2, 4, 2, 8, qkv_bias=False, tied_embeddings=False, num_experts=EXPERTS)
    hf = hf_moe_state(shape)
    ranks = []
    for r in range(ep):
        table, local, _ = expert_rank_shards(shape, hf, ep, 1, r)
        ranks.append(list(local_slices(local, table, shape, 0, 1, ExpertSplit(r, ep, 0, 1))))
        stacked = {shard.box for name, _, shard in ranks[-1] if ".experts." in name}
        per_rank = EXPERTS // ep
        assert {(box.offset[0], box.shape[0]) for box in stacked} == {(r * per_rank, per_rank)}
    table, local, gathers = expert_rank_shards(shape, hf, 1, 1, 0)
    whole = dict(export(local, table, shape, lambda t: [t], gathers))
    full, _ = assembled(ranks)
    assert sorted(full) == sorted(whole)
    for name, tensor in whole.items():
        assert torch.equal(full[name], tensor), name


def test_experts_split_over_ranks_are_refused_by_the_sharded_export():
    shape = ModelShape(1, 4, 2, 8, qkv_bias=False, tied_embeddings=False, num_experts=EXPERTS)
    table, local, _ = expert_rank_shards(shape, hf_moe_state(shape), 1, 2, 0)
    with pytest.raises(WeightSyncError, match="set trainer.expert_tensor_parallel=1"):
        list(local_slices(local, table, shape, 0, 1, ExpertSplit(0, 1, 0, 2)))
