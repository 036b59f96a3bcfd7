"""Deterministic right-padded train batches over the tiny model's vocabulary, for the trainer tests."""

from __future__ import annotations

import torch

from roll_device.models.tiny import vocabulary
from strategies.base import TrainBatch

PROMPT_TOKENS = 6


def make_batch(seed: int, rows: int = 2, length: int = 16) -> TrainBatch:
    """`rows` sequences of `length` tokens: a prompt of 6, a response, and padding on odd rows."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, len(vocabulary()), (rows, length), generator=g)
    attention = torch.ones(rows, length, dtype=torch.long)
    attention[1::2, length - 3 :] = 0
    ids = ids * attention  # pad id 0 on padding
    response = attention.float()
    response[:, :PROMPT_TOKENS] = 0
    return TrainBatch(
        input_ids=ids,
        attention_mask=attention,
        response_mask=response,
        advantages=torch.randn(rows, generator=g),
    )


def concat(batches: list[TrainBatch]) -> TrainBatch:
    """Rows of several batches in order (what data-parallel ranks hold together)."""
    fields = {}
    for name, value in vars(batches[0]).items():
        fields[name] = torch.cat([getattr(b, name) for b in batches]) if value is not None else None
    return TrainBatch(**fields)


def fixed_batch() -> TrainBatch:
    """4 rows of a 3-token prompt and responses of different lengths (one padded), a target of 1
    on every response token."""
    ids = torch.randint(3, 20, (4, 10), generator=torch.Generator().manual_seed(2))
    attention = torch.ones(4, 10, dtype=torch.long)
    attention[1, 7:] = 0
    response = torch.zeros(4, 10)
    response[:, 3:] = 1
    response *= attention
    return TrainBatch(ids, attention, response, returns=response.clone())
