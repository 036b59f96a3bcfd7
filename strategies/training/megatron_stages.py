"""The pipeline-parallel stages of a Megatron trainer as its callers see them: every rank answers
every call, so what only one stage holds (logprobs and loss metrics on the last stage, each
stage's weights on that stage) is broadcast over the rank's pipeline group.

With one stage every method returns what it is given and sends nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist


class PipelineStages:
    """This rank's place in its pipeline group (ranks with the same tensor- and data-parallel
    position, one per stage, in stage order)."""

    def __init__(self, group: Any, rank: int, size: int, device: torch.device) -> None:
        self.group, self.rank, self.size, self.device = group, rank, size, device
        self.global_ranks = dist.get_process_group_ranks(group) if size > 1 else [dist.get_rank()]
        self.is_first, self.is_last = rank == 0, rank == size - 1

    def tensor_from_last(
        self, local: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype
    ) -> torch.Tensor:
        """The last stage's `local` on every stage (others pass None and the expected shape)."""
        if self.size == 1:
            return local
        buffer = (
            local.to(self.device) if self.is_last else torch.empty(shape, dtype=dtype, device=self.device)
        )
        dist.broadcast(buffer, src=self.global_ranks[-1], group=self.group)
        return buffer.cpu()

    def object_from_last(self, local: Any) -> Any:
        """The last stage's picklable `local` on every stage."""
        if self.size == 1:
            return local
        box = [local if self.is_last else None]
        dist.broadcast_object_list(box, src=self.global_ranks[-1], group=self.group, device=self.device)
        return box[0]

    def gather_export(
        self,
        local_export: Callable[[], Iterator[tuple[str, torch.Tensor]]],
        local_manifest: Callable[[], list[tuple[str, tuple[int, ...], torch.dtype]]],
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Every stage's exported tensors, stage by stage, on every stage, on the device (valid
        until the next step). A stage first announces its manifest (names, shapes, dtypes), then
        broadcasts its tensors one at a time, so no rank holds more than one foreign tensor at
        once."""
        if self.size == 1:
            yield from local_export()
            return
        for stage, source in enumerate(self.global_ranks):
            mine = stage == self.rank
            box = [local_manifest() if mine else None]
            dist.broadcast_object_list(box, src=source, group=self.group, device=self.device)
            stream = local_export() if mine else None
            for name, shape, sent_dtype in box[0]:
                if mine:
                    sent_name, tensor = next(stream)
                    if sent_name != name:
                        raise RuntimeError(
                            f"stage {stage} exported {sent_name} where its manifest has {name}"
                        )
                    tensor = tensor.detach().to(self.device).contiguous()
                else:
                    tensor = torch.empty(shape, dtype=sent_dtype, device=self.device)
                dist.broadcast(tensor, src=source, group=self.group)
                yield name, tensor
