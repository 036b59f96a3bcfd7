"""The trainers' export for a weight sync: in the engine's dtype, cast where the weights are, and
without a host snapshot when asked (`snapshot=False`: the live parameters' memory, valid until the
next step); the default export stays a snapshot that a train step leaves unchanged. FSDP2 on one
CPU rank, in this process; Megatron's conversion to HF names without a copy on one rank."""

from __future__ import annotations

import pytest
import torch

import roll_device as rd
from strategies.training.fsdp import FsdpTrainStrategy
from strategies.training.megatron_weights import _joined
from tests.configs import trainer_settings


@pytest.fixture(scope="module")
def fsdp(tiny_model_path):
    trainer = FsdpTrainStrategy(rd.get_platform("cpu"))
    trainer.initialize(tiny_model_path, trainer_settings("fsdp"))
    yield trainer
    trainer.shutdown()


def storages(trainer) -> set[int]:
    return {p.to_local().untyped_storage().data_ptr() for p in trainer.model.parameters()}


def test_export_in_the_engines_dtype_without_a_snapshot(fsdp):
    snapshot = dict(fsdp.export_weights())
    live = dict(fsdp.export_weights(snapshot=False))
    half = dict(fsdp.export_weights(dtype=torch.bfloat16, snapshot=False))
    assert set(live) == set(snapshot) == set(half)
    assert all(t.dtype == torch.float32 for t in snapshot.values())
    assert all(t.dtype == torch.bfloat16 for t in half.values())
    assert all(torch.equal(half[n], snapshot[n].bfloat16()) for n in snapshot)
    assert all(torch.equal(live[n], snapshot[n]) for n in snapshot)
    params = storages(fsdp)
    assert all(t.untyped_storage().data_ptr() in params for t in live.values()), "no copy: the parameters"
    assert not any(t.untyped_storage().data_ptr() in params for t in snapshot.values()), "snapshots copy"


def test_megatron_shards_of_one_rank_convert_without_a_copy():
    shard = torch.randn(4, 3)
    assert _joined([shard], 0) is shard
    assert torch.equal(_joined([shard, shard], 1), torch.cat([shard, shard], 1))
