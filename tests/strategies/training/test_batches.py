"""Train batch checks, splitting and token alignment."""

from __future__ import annotations

import pytest
import torch

from strategies.training.batches import (
    TrainBatchError,
    align_to_tokens,
    micro_batches,
    shifted_labels,
    validate,
)
from tests.strategies.training.data import make_batch


def test_a_well_formed_batch_passes_and_splits():
    batch = make_batch(seed=0, rows=5)
    validate(batch)
    parts = micro_batches(batch, 2)
    assert [len(p) for p in parts] == [2, 2, 1]
    assert torch.equal(torch.cat([p.input_ids for p in parts]), batch.input_ids)


def test_alignment_puts_a_tokens_logprob_at_its_own_position():
    ids = torch.tensor([[5, 6, 7, 0]])
    assert shifted_labels(ids).tolist() == [[6, 7, 0, 0]]
    next_token = torch.tensor([[-0.6, -0.7, -9.0, -9.0]])  # logprob of 6, 7 and two unused
    mask = torch.tensor([[1, 1, 1, 0]])
    assert align_to_tokens(next_token, mask)[0].tolist() == pytest.approx([0.0, -0.6, -0.7, 0.0])


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda b: setattr(b, "input_ids", b.input_ids.float()), "input_ids must be a \\(B, T\\) torch.long"),
        (lambda b: setattr(b, "response_mask", b.response_mask[:, :3]), "response_mask must have the shape"),
        (lambda b: setattr(b, "advantages", torch.zeros(3)), "advantages must have shape \\(2,\\)"),
        (lambda b: b.attention_mask.__setitem__((0, 0), 0), "need right-padded rows"),
        (lambda b: setattr(b, "old_logprobs", torch.zeros(2, 16, device="meta")), "pass batches on the CPU"),
        (
            lambda b: setattr(b, "routed_experts", torch.zeros(2, 15, 2, 2)),
            "routed_experts must be \\(B, T, layers, top-k\\) with \\(B, T\\) = \\(2, 16\\)",
        ),
    ],
)
def test_malformed_batches_name_the_field(change, message):
    batch = make_batch(seed=0)
    change(batch)
    with pytest.raises(TrainBatchError, match=message):
        validate(batch)
