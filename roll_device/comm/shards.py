"""The sharded sync's plan: which trainer rank holds which slice of which tensor, which engine rank
needs it, and so what each trainer rank sends and where each engine rank puts it.

A slice is a `Box` (an offset and a shape in the full tensor's index space), so one plan serves
FSDP's dim-0 shards, tensor-parallel slices along any dimension and expert-parallel layouts
(experts as slices of a stacked tensor, or tensors only some ranks hold). Each trainer rank
describes what it holds as a `Layout` (name -> `Shard`); each engine rank what it needs (name ->
`Box`; by default every tensor whole: the HF engine and vLLM's loader take full HF tensors and
cut their own tensor-parallel slices).

`plan_shards` checks that the trainer ranks' layouts fit together (one dtype and full shape per
tensor; boxes inside it; slices either disjoint or identical replicas, which are sent by one of
their holders: the one with the fewest bytes to send so far, so replicas spread over the ranks;
every needed element held) and refuses anything else with a
WeightSyncError that names the tensor and the ranks. It then lists, per trainer rank (a link),
the pieces it sends: the part of its slice some engine rank needs, once even where several need
it (a link reaches every engine rank of a node at once); and, per engine rank, where each piece
lands in the tensors it assembles. Both ends compute the same plan from the same layouts.

`local_shards` reads a module's parameters as this rank holds them: a DTensor's local tensor
and its box (FSDP2, tensor parallel), any other tensor whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from roll_device.errors import WeightSyncError

Layout = dict[str, "Shard"]  # one trainer rank's slices, by tensor name


@dataclass(frozen=True)
class Box:
    """The elements `offset[d] <= i[d] < offset[d] + shape[d]` of a tensor's index space."""

    offset: tuple[int, ...]
    shape: tuple[int, ...]

    @classmethod
    def whole(cls, shape: Iterable[int]) -> Box:
        shape = tuple(shape)
        return cls((0,) * len(shape), shape)

    @property
    def numel(self) -> int:
        n = 1
        for size in self.shape:
            n *= size
        return n

    def intersect(self, other: Box) -> Box | None:
        """The elements both boxes hold (None: none)."""
        starts = [max(a, b) for a, b in zip(self.offset, other.offset, strict=True)]
        ends = [
            min(a + n, b + m)
            for a, n, b, m in zip(self.offset, self.shape, other.offset, other.shape, strict=True)
        ]
        if any(end <= start for start, end in zip(starts, ends)):
            return None
        return Box(tuple(starts), tuple(end - start for start, end in zip(starts, ends)))

    def within(self, outer: Box) -> tuple[slice, ...]:
        """This box's place in a tensor that holds `outer` (which contains it), as slices."""
        return tuple(
            slice(start - base, start - base + size)
            for start, size, base in zip(self.offset, self.shape, outer.offset, strict=True)
        )

    def inside(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == len(self.shape) and all(
            o >= 0 and n >= 0 and o + n <= full for o, n, full in zip(self.offset, self.shape, shape)
        )


@dataclass(frozen=True)
class Shard:
    """What one trainer rank holds of tensor `name`: `box` of a `full_shape` tensor of `dtype`."""

    name: str
    dtype: torch.dtype
    full_shape: tuple[int, ...]
    box: Box


@dataclass(frozen=True)
class Piece:
    """Bytes one link carries: `box` (full-tensor coordinates) of tensor `name`, sent under `key`."""

    key: str
    name: str
    box: Box


@dataclass(frozen=True)
class ShardPlan:
    """Per link (trainer rank), the pieces it sends in order; per engine rank, the tensors it
    assembles (name -> needed box, with dtype) and, per link and piece key, the piece's box in
    full-tensor coordinates (only the pieces that rank needs)."""

    sends: list[list[Piece]]
    needs: list[dict[str, Shard]]
    lands: list[list[dict[str, Box]]]  # [engine rank][link] -> piece key -> box

    def sent_bytes(self, link: int) -> int:
        return sum(p.box.numel * _itemsize(self.needs_dtype(p.name)) for p in self.sends[link])

    def needs_dtype(self, name: str) -> torch.dtype:
        return next(need[name].dtype for need in self.needs if name in need)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def local_shards(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor, Shard]]:
    """(name, this rank's local tensor, its `Shard`) for each of `named`: a DTensor's local part
    and its box, any other tensor whole."""
    from torch.distributed.tensor import DTensor

    for name, tensor in named:
        if isinstance(tensor, DTensor):
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

            shape, offset = compute_local_shape_and_global_offset(
                tensor.shape, tensor.device_mesh, tensor.placements
            )
            local = tensor.to_local()
            box = Box(tuple(offset), tuple(shape))
        else:
            local, box = tensor, Box.whole(tensor.shape)
        yield name, local, Shard(name, local.dtype, tuple(tensor.shape), box)


def _holders(layouts: list[Layout], name: str) -> list[tuple[int, Shard]]:
    """The ranks that hold a slice of `name`, checked against each other."""
    held = [(rank, layout[name]) for rank, layout in enumerate(layouts) if name in layout]
    first_rank, first = held[0]
    for rank, shard in held:
        if (shard.dtype, shard.full_shape) != (first.dtype, first.full_shape):
            raise WeightSyncError(
                f"trainer ranks {first_rank} and {rank} disagree on weight '{name}' "
                f"({first.dtype} {list(first.full_shape)} vs {shard.dtype} {list(shard.full_shape)}): "
                "every rank must export the same model in the same dtype"
            )
        if not shard.box.inside(shard.full_shape):
            raise WeightSyncError(
                f"trainer rank {rank}'s slice of '{name}' (offset {list(shard.box.offset)}, shape "
                f"{list(shard.box.shape)}) lies outside its full shape {list(shard.full_shape)}"
            )
    return held


def _owners(name: str, held: list[tuple[int, Shard]], load: list[int]) -> list[tuple[int, Box]]:
    """One sending rank per distinct slice: of a slice's replicas (identical boxes), the holder
    with the fewest bytes to send so far (`load`, per rank, updated), so that tensors replicated
    on every rank (norms; a data-parallel replica's whole dense part) spread over the ranks; slices
    that overlap without being identical are refused."""
    distinct: dict[Box, list[int]] = {}
    for rank, shard in held:
        if shard.box.numel:
            distinct.setdefault(shard.box, []).append(rank)
    boxes = list(distinct)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if a.intersect(b) is not None:
                raise WeightSyncError(
                    f"trainer ranks {distinct[a]} and {distinct[b]} hold overlapping but different slices "
                    f"of '{name}' ({list(a.offset)}+{list(a.shape)} vs {list(b.offset)}+{list(b.shape)}): "
                    "a layout's slices must be disjoint or identical replicas"
                )
    itemsize = _itemsize(held[0][1].dtype)
    owners = []
    for box, ranks in distinct.items():
        rank = min(ranks, key=lambda r: (load[r], r))
        load[rank] += box.numel * itemsize
        owners.append((rank, box))
    return owners


def plan_shards(layouts: list[Layout], engine_needs: list[dict[str, Box] | None]) -> ShardPlan:
    """The plan for trainer ranks holding `layouts` and engine ranks needing `engine_needs` (None:
    every tensor whole)."""
    names = sorted({name for layout in layouts for name in layout})
    sends: list[list[Piece]] = [[] for _ in layouts]
    needs: list[dict[str, Shard]] = [{} for _ in engine_needs]
    lands: list[list[dict[str, Box]]] = [[{} for _ in layouts] for _ in engine_needs]
    load = [0] * len(layouts)
    for name in names:
        held = _holders(layouts, name)
        spec = held[0][1]
        owners = _owners(name, held, load)
        for engine, asked in enumerate(engine_needs):
            need = Box.whole(spec.full_shape) if asked is None else asked.get(name)
            if need is None:
                continue
            covered = 0
            for rank, box in owners:
                part = box.intersect(need)
                if part is None:
                    continue
                covered += part.numel
                piece = _piece(sends[rank], name, part)
                lands[engine][rank][piece.key] = part
            if covered != need.numel:
                raise WeightSyncError(
                    f"engine rank {engine} needs {need.numel} elements of '{name}' but the trainer ranks "
                    f"hold {covered} of them: the trainer's layout does not cover the engine's"
                )
            needs[engine][name] = Shard(name, spec.dtype, spec.full_shape, need)
    return ShardPlan(sends, needs, lands)


def _piece(pieces: list[Piece], name: str, box: Box) -> Piece:
    """The piece of `name` covering `box` on a link: the one already planned, or a new one (keyed
    by the name alone when it is the name's first piece on this link)."""
    same_name = [p for p in pieces if p.name == name]
    for piece in same_name:
        if piece.box == box:
            return piece
    piece = Piece(name if not same_name else f"{name}#{len(same_name)}", name, box)
    pieces.append(piece)
    return piece


def local_view(local: torch.Tensor, shard: Shard, piece: Piece) -> torch.Tensor:
    """The part of a rank's local tensor (holding `shard.box`) that `piece` carries."""
    return local[piece.box.within(shard.box)]
