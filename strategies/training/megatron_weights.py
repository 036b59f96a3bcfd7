"""Hugging Face <-> Megatron-core weight names and layouts for Qwen2 / Llama / Qwen3 decoder models
and Qwen3-MoE, with tensor- and expert-parallel splitting and merging.

Megatron layouts (local transformer spec): `linear_qkv` stacks, per query group, the group's query
heads, then its key head, then its value head; `linear_fc1` stacks gate over up (each half split
across tensor-parallel ranks separately); embeddings and the output layer split the vocabulary;
`linear_proj` and `linear_fc2` split their input dimension; norms (Qwen3's per-head q/k norms too)
and the MoE router are replicated.

A MoE layer (`get_gpt_layer_local_spec(num_experts=...)`, no grouped GEMM) holds its rank's share
of the experts as `mlp.experts.local_experts.<i>` (expert-parallel rank r holds experts
r * E/EP ... (r + 1) * E/EP - 1), each a gated MLP split over the expert-tensor-parallel ranks. They
load from the checkpoint's per-expert matrices (`mlp.experts.<e>.gate_proj.weight`, ...) and export
stacked, as transformers 5 and the engines name them (`mlp.experts.gate_up_proj`: experts x (gate
rows, up rows) x hidden; `mlp.experts.down_proj`).

`export` gathers full tensors; `local_slices` yields each rank's own part of them without a gather,
as boxes of the HF tensors (roll_device/comm/shards.py) for the sharded weight sync: a column- or
row-parallel slice is one box of its HF tensor, a fused q/k/v or gate/up slice is cut into a box of
each HF tensor it fuses, a replicated tensor is the whole of it on every rank, and an
expert-parallel rank's experts are one box (its experts' rows) of each stacked expert tensor.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

import torch

from roll_device.comm.shards import Box, Shard
from roll_device.errors import WeightSyncError

# the index of a local expert in a Megatron parameter name (`...local_experts.<i>.linear_fc1.weight`)
LOCAL_EXPERT = re.compile(r"(?<=local_experts\.)\d+(?=\.)")
COLUMN, ROW, REPLICATED, QKV, GATE_UP = "column", "row", "replicated", "qkv", "gate_up"
# a tied head (HEAD) is exported as the embedding alone: strategies/tied_weights.py
EMBEDDING, HEAD = "model.embed_tokens.weight", "lm_head.weight"


@dataclass(frozen=True)
class ModelShape:
    """What the conversion needs to know about the model."""

    num_layers: int
    num_heads: int
    num_groups: int
    head_dim: int
    qkv_bias: bool
    tied_embeddings: bool
    qk_norm: bool = False  # Qwen3: RMSNorm over each query and key head
    num_experts: int = 0  # routed experts per layer (0: dense MLPs)


@dataclass(frozen=True)
class ExpertSplit:
    """How this rank's experts are split: its expert-parallel rank and size (which experts it
    holds), its expert-tensor-parallel rank and size (which part of each)."""

    rank: int = 0
    size: int = 1
    tp_rank: int = 0
    tp_size: int = 1

    def experts(self, shape: ModelShape) -> range:
        """The global indices of the experts this rank holds."""
        per_rank = shape.num_experts // self.size
        return range(self.rank * per_rank, (self.rank + 1) * per_rank)


@dataclass(frozen=True)
class Param:
    """One Megatron parameter: its HF sources (several for fused ones), how TP splits it, and
    whether export yields it (the last stage's copy of a tied embedding is not exported)."""

    megatron: str
    hf: tuple[str, ...]
    split: str
    exported: bool = True
    stacked: str | None = None  # an expert's part: the HF name of its layer's stacked experts


def global_expert_name(name: str, shape: ModelShape, experts: ExpertSplit) -> str:
    """`name` of a Megatron parameter with a local expert's index made the expert's global one."""
    return LOCAL_EXPERT.sub(lambda local: str(experts.experts(shape)[int(local.group())]), name)


def stage_layers(shape: ModelShape, stage: int, num_stages: int) -> range:
    """The global indices of the decoder layers pipeline stage `stage` holds (an even split)."""
    per_stage = shape.num_layers // num_stages
    return range(stage * per_stage, (stage + 1) * per_stage)


def _attention(m: str, h: str, shape: ModelShape) -> list[Param]:
    attn, m = h + "self_attn.", m + "self_attention."
    params = [
        Param(m + "linear_qkv.weight", tuple(attn + f"{p}_proj.weight" for p in "qkv"), QKV),
        Param(m + "linear_proj.weight", (attn + "o_proj.weight",), ROW),
    ]
    if shape.qkv_bias:
        params.append(Param(m + "linear_qkv.bias", tuple(attn + f"{p}_proj.bias" for p in "qkv"), QKV))
    if shape.qk_norm:
        params += [Param(m + f"{p}_layernorm.weight", (attn + f"{p}_norm.weight",), REPLICATED) for p in "qk"]
    return params


def _mlp(m: str, h: str, shape: ModelShape, experts: ExpertSplit) -> list[Param]:
    """A dense MLP's two matrices, or a MoE layer's router and this rank's experts."""
    if not shape.num_experts:
        return [
            Param(
                m + "mlp.linear_fc1.weight", (h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"), GATE_UP
            ),
            Param(m + "mlp.linear_fc2.weight", (h + "mlp.down_proj.weight",), ROW),
        ]
    params = [Param(m + "mlp.router.weight", (h + "mlp.gate.weight",), REPLICATED)]
    for local, e in enumerate(experts.experts(shape)):
        mine, theirs = f"{m}mlp.experts.local_experts.{local}.", f"{h}mlp.experts.{e}."
        params += [
            Param(
                mine + "linear_fc1.weight",
                (theirs + "gate_proj.weight", theirs + "up_proj.weight"),
                GATE_UP,
                stacked=h + "mlp.experts.gate_up_proj",
            ),
            Param(
                mine + "linear_fc2.weight",
                (theirs + "down_proj.weight",),
                ROW,
                stacked=h + "mlp.experts.down_proj",
            ),
        ]
    return params


def parameters(
    shape: ModelShape, stage: int = 0, num_stages: int = 1, experts: ExpertSplit = ExpertSplit()
) -> list[Param]:
    """The Megatron parameters of one pipeline stage (and, in MoE layers, of the experts the
    expert-parallel rank holds) under their names in that stage (layers are numbered from 0 in
    every stage) with their HF sources. The first stage holds the embedding, the last the final
    norm and the output layer; with tied embeddings and several stages the last stage's output
    layer is a copy of the embedding that Megatron keeps in sync."""
    first, last = stage == 0, stage == num_stages - 1
    params = [Param("embedding.word_embeddings.weight", (EMBEDDING,), COLUMN)] if first else []
    for local, i in enumerate(stage_layers(shape, stage, num_stages)):
        m, h = f"decoder.layers.{local}.", f"model.layers.{i}."
        params += [
            Param(m + "input_layernorm.weight", (h + "input_layernorm.weight",), REPLICATED),
            *_attention(m, h, shape),
            Param(m + "pre_mlp_layernorm.weight", (h + "post_attention_layernorm.weight",), REPLICATED),
            *_mlp(m, h, shape, experts),
        ]
    if last:
        params.append(Param("decoder.final_layernorm.weight", ("model.norm.weight",), REPLICATED))
        if not shape.tied_embeddings:
            params.append(Param("output_layer.weight", (HEAD,), COLUMN))
        elif not first:
            params.append(Param("output_layer.weight", (EMBEDDING,), COLUMN, exported=False))
    return params


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    per_group = shape.num_heads // shape.num_groups
    rest = q.shape[1:]
    q = q.reshape(shape.num_groups, per_group * shape.head_dim, *rest)
    k = k.reshape(shape.num_groups, shape.head_dim, *rest)
    v = v.reshape(shape.num_groups, shape.head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def _unfuse_qkv(fused: torch.Tensor, shape: ModelShape) -> tuple[torch.Tensor, ...]:
    per_group = shape.num_heads // shape.num_groups
    rest = fused.shape[1:]
    grouped = fused.reshape(shape.num_groups, (per_group + 2) * shape.head_dim, *rest)
    q, k, v = grouped.split([per_group * shape.head_dim, shape.head_dim, shape.head_dim], dim=1)
    return tuple(t.reshape(-1, *rest) for t in (q, k, v))


def to_megatron_shard(
    param: Param, hf: Mapping[str, torch.Tensor], shape: ModelShape, tp_rank: int, tp_size: int
) -> torch.Tensor:
    """This tensor-parallel rank's shard of `param`, built from the HF tensors."""
    sources = [hf[name] for name in param.hf]
    if param.split == REPLICATED:
        return sources[0]
    if param.split == QKV:  # group-major, so a contiguous chunk holds whole groups
        return _fuse_qkv(*sources, shape).chunk(tp_size, dim=0)[tp_rank]
    if param.split == GATE_UP:
        gate, up = (t.chunk(tp_size, dim=0)[tp_rank] for t in sources)
        return torch.cat([gate, up], dim=0)
    return sources[0].chunk(tp_size, dim=0 if param.split == COLUMN else 1)[tp_rank]


def _joined(shards: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The shards concatenated along `dim`; one shard as it is (a view: no copy)."""
    return shards[0] if len(shards) == 1 else torch.cat(shards, dim=dim)


def to_hf(param: Param, shards: list[torch.Tensor], shape: ModelShape) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named full tensors from the shards of `param` of every tensor-parallel rank (in order);
    views of the parameter where the layouts allow (one rank: all but q/k/v)."""
    if param.split == REPLICATED:
        yield param.hf[0], shards[0]
    elif param.split == QKV:
        yield from zip(param.hf, _unfuse_qkv(_joined(shards, 0), shape))
    elif param.split == GATE_UP:
        halves = [s.chunk(2, dim=0) for s in shards]
        yield param.hf[0], _joined([h[0] for h in halves], 0)
        yield param.hf[1], _joined([h[1] for h in halves], 0)
    else:
        yield param.hf[0], _joined(shards, 0 if param.split == COLUMN else 1)


def load_into(
    named_params: Mapping[str, torch.nn.Parameter],
    hf: Mapping[str, torch.Tensor],
    table: list[Param],
    shape: ModelShape,
    tp_rank: int,
    tp_size: int,
    experts: ExpertSplit = ExpertSplit(),
) -> None:
    """Copy HF tensors into the local Megatron parameters listed in `table` (one stage's; experts
    split as `experts` says); raise KeyError naming a missing or misshapen one."""
    expected = {p.megatron for p in table}
    if set(named_params) != expected:
        raise KeyError(
            f"Megatron model parameters differ from the conversion table: extra "
            f"{sorted(set(named_params) - expected)}, missing {sorted(expected - set(named_params))}"
        )
    with torch.no_grad():
        for param in table:
            rank, size = (experts.tp_rank, experts.tp_size) if param.stacked else (tp_rank, tp_size)
            shard = to_megatron_shard(param, hf, shape, rank, size)
            target = named_params[param.megatron]
            if target.shape != shard.shape:
                raise KeyError(
                    f"{param.megatron}: shard {tuple(shard.shape)} != parameter {tuple(target.shape)}"
                )
            target.copy_(shard)


@dataclass(frozen=True)
class ExpertGathers:
    """How an export collects the experts: `tensor_parallel` returns a local expert matrix's
    shards of every expert-tensor-parallel rank, `expert_parallel` the stacks of the experts of
    every expert-parallel rank, in rank order."""

    tensor_parallel: Callable[[torch.Tensor], list[torch.Tensor]] = lambda local: [local]
    expert_parallel: Callable[[torch.Tensor], list[torch.Tensor]] = lambda stack: [stack]


def _stacked(
    named_params: Mapping[str, torch.Tensor], members: list[Param], shape: ModelShape, gathers: ExpertGathers
) -> torch.Tensor:
    """One layer's experts stacked in HF's layout from the local experts' `members` parameters."""
    whole = [
        torch.cat([t for _, t in to_hf(p, gathers.tensor_parallel(named_params[p.megatron]), shape)])
        for p in members
    ]
    return _joined(gathers.expert_parallel(torch.stack(whole)), 0)


def _exported(table: list[Param]) -> tuple[list[Param], dict[str, list[Param]]]:
    """The exported parameters of `table` but the experts', and the experts' by the HF name of
    the stacked tensor they make (local experts in order)."""
    stacks: dict[str, list[Param]] = {}
    for param in table:
        if param.stacked:
            stacks.setdefault(param.stacked, []).append(param)
    return [p for p in table if p.exported and not p.stacked], stacks


def export(
    named_params: Mapping[str, torch.Tensor],
    table: list[Param],
    shape: ModelShape,
    gather: Callable[[torch.Tensor], list[torch.Tensor]],
    experts: ExpertGathers = ExpertGathers(),
) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named full tensors of the exported parameters in `table`; `gather` returns a local
    shard's tensor-parallel shards in rank order, `experts` collects the experts (after the
    other tensors, one stacked tensor per layer and matrix)."""
    plain, stacks = _exported(table)
    for param in plain:
        local = named_params[param.megatron]
        shards = [local] if param.split == REPLICATED else gather(local)
        yield from to_hf(param, shards, shape)
    for name, members in stacks.items():
        yield name, _stacked(named_params, members, shape, experts)


def manifest(
    named_params: Mapping[str, torch.Tensor],
    table: list[Param],
    shape: ModelShape,
    tp_size: int,
    experts: ExpertSplit = ExpertSplit(),
) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """Name, shape and dtype of every tensor `export` yields, worked out on meta tensors (no data
    moves), so that ranks of other pipeline stages can receive them."""
    meta = {name: torch.empty(t.shape, dtype=t.dtype, device="meta") for name, t in named_params.items()}
    gathers = ExpertGathers(lambda local: [local] * experts.tp_size, lambda stack: [stack] * experts.size)
    return [
        (name, tuple(t.shape), t.dtype)
        for name, t in export(meta, table, shape, lambda local: [local] * tp_size, gathers)
    ]


def _split_box(local: torch.Tensor, dim: int, rank: int, size: int) -> tuple[tuple[int, ...], Box]:
    """The full shape and this rank's box of a tensor split evenly along `dim` over `size` ranks."""
    full = list(local.shape)
    full[dim] *= size
    offset = [0] * local.dim()
    offset[dim] = rank * local.shape[dim]
    return tuple(full), Box(tuple(offset), tuple(local.shape))


def _hf_slices(
    param: Param, local: torch.Tensor, shape: ModelShape, rank: int, size: int
) -> Iterator[tuple[str, torch.Tensor, tuple[int, ...], Box]]:
    """(HF name, part of `local`, the HF tensor's full shape, the part's box) of tensor-parallel
    rank `rank`'s shard `local` of `param`."""
    if param.split == REPLICATED:
        yield param.hf[0], local, tuple(local.shape), Box.whole(local.shape)
        return
    if param.split == QKV:  # whole query groups: a box of each of q, k and v
        mine = replace(shape, num_heads=shape.num_heads // size, num_groups=shape.num_groups // size)
        parts = _unfuse_qkv(local, mine)
    elif param.split == GATE_UP:
        parts = local.chunk(2, dim=0)
    else:
        parts = (local,)
    dim = 1 if param.split == ROW else 0
    for name, part in zip(param.hf, parts, strict=True):
        yield name, part, *_split_box(part, dim, rank, size)


def _expert_slices(
    named_params: Mapping[str, torch.Tensor],
    stacks: dict[str, list[Param]],
    shape: ModelShape,
    split: ExpertSplit,
) -> Iterator[tuple[str, torch.Tensor, Shard]]:
    """This expert-parallel rank's experts of each stacked tensor: its experts' rows, stacked."""
    if stacks and split.tp_size > 1:  # refused for training too (megatron_model.describe)
        raise WeightSyncError(
            f"expert tensor parallel {split.tp_size}: an expert split over ranks is two boxes of a stacked "
            "tensor (its gate and up rows), which a sharded sync's layout cannot hold: set "
            "trainer.expert_tensor_parallel=1"
        )
    first = split.experts(shape).start
    for name, members in stacks.items():
        with torch.no_grad():  # a copy of this rank's own experts, outside autograd
            stack = _stacked(named_params, members, shape, ExpertGathers())
        full = (shape.num_experts, *stack.shape[1:])
        box = Box((first,) + (0,) * (stack.dim() - 1), tuple(stack.shape))
        yield name, stack, Shard(name, stack.dtype, full, box)


def local_slices(
    named_params: Mapping[str, torch.Tensor],
    table: list[Param],
    shape: ModelShape,
    tp_rank: int,
    tp_size: int,
    experts: ExpertSplit = ExpertSplit(),
) -> Iterator[tuple[str, torch.Tensor, Shard]]:
    """(HF name, this rank's part, its `Shard`) of every exported parameter in `table` (one
    stage's), without a gather: views of the parameters where the layouts allow (fused q/k/v of
    several query groups, and the stacked experts, are copies of this rank's own)."""
    plain, stacks = _exported(table)
    for param in plain:
        local = named_params[param.megatron].detach()
        for name, part, full, box in _hf_slices(param, local, shape, tp_rank, tp_size):
            yield name, part, Shard(name, part.dtype, full, box)
    yield from _expert_slices(named_params, stacks, shape, experts)
