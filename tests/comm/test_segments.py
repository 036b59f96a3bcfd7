"""The one-copy shared-memory path: a trainer whose tensors live in shared memory sends them as they
are, and a real HF engine (the rollout strategy, receiving on a thread of this process through a
real shared-memory segment) loads with its `update_weights` straight from read-only views of them:
versions arrive hash-equal with the export, with and without verification, a sync with half of
the tensors packed between two in place included, and nothing of the segments is held after the load; an engine that keeps
what it was given fails the sync on both ends."""

from __future__ import annotations

import threading

import pytest
import torch

import roll_device as rd
from roll_device.comm import WeightReceiver, WeightSender, plan_sync, weights_hash
from roll_device.comm.buckets import ALIGN
from roll_device.comm.segments import keep_in_shared_memory, segment_of
from roll_device.errors import WeightSyncError
from strategies.tied_weights import state_once
from tests.configs import weight_sync
from tests.strategies.inference.conftest import start


def test_keep_in_shared_memory_moves_storages_in_place():
    weight = torch.arange(12.0).reshape(3, 4)
    row = weight[1]  # a view made before the move keeps seeing the tensor's bytes
    assert segment_of(row) is None
    assert keep_in_shared_memory([weight, row]) == 48  # one storage, moved once
    weight.add_(1)
    assert row.tolist() == [5.0, 6.0, 7.0, 8.0]
    segment, offset = segment_of(row)
    assert (offset, segment.nbytes) == (16, 48)
    assert segment_of(weight.t()) is None  # not contiguous: packed, not sent in place


@pytest.fixture(scope="module")
def trainer_and_engine(tiny_model_path):
    from transformers import AutoModelForCausalLM

    trainer = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    keep_in_shared_memory(trainer.parameters())
    engine = start("hf", tiny_model_path, max_batch_size=2, update_bucket_bytes=65536)
    yield trainer, engine
    engine.shutdown()


def _sync(trainer, engine, verify: bool, versions, apply=None, plain=(), in_place=True) -> list:
    """Connect, run each version (the trainer's step in between: its tensors change in place),
    close; returns per version (sender stats or error, engine outcome, export hash)."""
    plan = plan_sync("cpu", "cpu", colocated=True, same_node=True, forced="colocated")
    options = weight_sync(path="colocated", bucket_bytes=256 << 10, verify=verify, timeout_s=20)
    sender = WeightSender(plan, rd.get_platform("cpu"), 1, options)
    outcomes: list = []

    def engine_side() -> None:
        receiver = WeightReceiver(sender.endpoint, 1, rd.get_platform("cpu"), 20, reads_in_place=in_place)
        receiver.connect()
        for _ in versions:
            try:
                stats = receiver.receive(apply or engine.update_weights)
                segments = receiver.transport.segments
                outcomes.append((stats, (segments.lent(), len(segments)), engine.weights_hash()))
            except WeightSyncError as exc:
                outcomes.append(exc)
        receiver.close()

    thread = threading.Thread(target=engine_side)
    thread.start()
    results = []
    try:
        sender.connect()
        for version in versions:
            with torch.no_grad():
                for param in trainer.parameters():
                    param.mul_(1.01)  # a training step writes the shared memory in place
            export = state_once(trainer)
            if version in plain:  # every other tensor copied out of shared memory: packed, two copies
                export = {name: t.clone() if i % 2 else t for i, (name, t) in enumerate(export.items())}
            try:
                sent = sender.send(export.items(), version)
            except WeightSyncError as exc:
                sent = exc
            results.append((sent, weights_hash(export.items())))
    finally:
        thread.join(timeout=60)
        sender.close()
    return [(sent, got, digest) for (sent, digest), got in zip(results, outcomes, strict=True)]


@pytest.mark.parametrize("verify", [False, True], ids=["plain", "verified"])
def test_an_hf_engine_loads_versions_from_the_trainers_shared_memory(trainer_and_engine, verify):
    trainer, engine = trainer_and_engine
    synced = _sync(trainer, engine, verify, (1, 2, 3), plain=(2,))
    for version, (sent, (got, lent, held), digest) in enumerate(synced, 1):
        assert got.version == sent.version == version
        assert held == digest  # bit-equal to the export (read from the segments, or the slots)
        tensors = len(state_once(trainer))
        in_place = (tensors + 1) // 2 if version == 2 else tensors  # the even ones; the others unmapped
        assert lent == (0, in_place)  # read in place, and none of them held after the load
        assert sent.nbytes == got.nbytes == sum(p.numel() * 4 for p in state_once(trainer).values())
    assert all(p.data_ptr() % ALIGN == 0 for p in engine.model.parameters())  # not at the file's offsets
    engines = {p.untyped_storage().data_ptr() for p in engine.model.parameters()}
    assert not engines & {p.untyped_storage().data_ptr() for p in trainer.parameters()}  # copies


def test_an_engine_that_keeps_the_trainers_tensors_fails_the_sync(trainer_and_engine):
    trainer, engine = trainer_and_engine
    kept: list = []
    ((sent, got, _),) = _sync(trainer, engine, False, (3,), apply=kept.extend)
    assert "still holds" in str(got) and "trainer's shared memory" in str(got)
    assert isinstance(sent, WeightSyncError) and "worker 1" in str(sent)
    assert len(kept) == len(state_once(trainer))


def test_a_receiver_that_does_not_read_in_place_gets_the_trainers_tensors_packed(trainer_and_engine):
    """An engine that may keep what it is given (vLLM's loaders hold tensors until a layer is
    whole) does not say it reads in place: the sender packs, and nothing is mapped."""
    trainer, engine = trainer_and_engine
    ((sent, (got, lent, held), digest),) = _sync(trainer, engine, False, (1,), in_place=False)
    assert held == digest and lent == (0, 0) and sent.version == got.version == 1
