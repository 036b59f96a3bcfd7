"""What makes a sync fast, checked as behaviour (in-process, a receiver thread, on the CPU): the
bucket plan travels once per connection (later headers carry no entries) and a changed layout is
sent in full again; the slots made at connect are all a streaming consumer needs, sync after
sync, and its control keys are deleted after it; a consumer gets views of the slot (no copy out of it); a receiver that never got a plan
refuses a header that relies on one; packing copies every tensor, non-contiguous ones included."""

from __future__ import annotations

import threading

import pytest
import torch

import roll_device as rd
from roll_device.comm import WeightReceiver, WeightSender, plan_sync, weights_hash
from roll_device.comm.buckets import BucketWriter, pack, unpack
from roll_device.comm.messages import BucketHeader
from roll_device.comm.slot_transport import SLOTS
from roll_device.errors import WeightSyncError
from tests.configs import weight_sync

CPU = rd.get_platform("cpu")
BUCKET = 1 << 16


def state(rows: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    """About 10 buckets of 64 KiB: tensors of 32 KiB, some smaller."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(16):
        out[f"model.layers.{i}.w"] = torch.randn(rows, 128, generator=g)
        out[f"model.layers.{i}.b"] = torch.randn(128, generator=g)
    return out


class Pair:
    """A sender here and one receiver in a thread of this process, over shared-memory slots."""

    def __init__(self) -> None:
        plan = plan_sync("cpu", "cpu", colocated=True, same_node=True)
        self.sender = WeightSender(plan, CPU, 1, weight_sync(bucket_bytes=BUCKET, timeout_s=30))
        self.receiver = WeightReceiver(self.sender.endpoint, 1, CPU, timeout_s=30)
        self.posted: list[BucketHeader] = []
        post = self.sender.control.post

        def record(key, value):
            if isinstance(value, BucketHeader):
                self.posted.append(value)
            post(key, value)

        self.sender.control.post = record
        self._both(self.sender.connect, self.receiver.connect)

    def _both(self, here, there) -> object:
        failure: list[BaseException] = []

        def run() -> None:
            try:
                there()
            except Exception as exc:  # noqa: BLE001 (re-raised in this thread below)
                failure.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        result = here()
        thread.join(timeout=60)
        if failure:
            raise failure[0]
        return result

    def sync(self, weights: dict[str, torch.Tensor], version: int, apply) -> None:
        self.posted.clear()
        self._both(lambda: self.sender.send(weights.items(), version), lambda: self.receiver.receive(apply))

    def close(self) -> None:
        self._both(self.sender.close, self.receiver.close)


@pytest.fixture
def pair():
    p = Pair()
    yield p
    p.close()


def copy_into(target: dict[str, torch.Tensor]):
    def apply(named):
        for name, tensor in named:
            target[name] = target.get(name, torch.empty_like(tensor)).copy_(tensor)

    return apply


def test_the_plan_travels_once_and_a_changed_layout_again(pair):
    got: dict[str, torch.Tensor] = {}
    first = state()
    pair.sync(first, 1, copy_into(got))
    assert len(pair.posted) > 4 and all(h.entries for h in pair.posted), "the first sync sends the plan"
    second = {name: t + 1 for name, t in first.items()}
    pair.sync(second, 2, copy_into(got))
    assert pair.posted and all(h.entries is None for h in pair.posted), "later headers carry no entries"
    assert weights_hash(got.items()) == weights_hash(second.items())
    other = state(rows=48, seed=1)  # another layout: new shapes, other offsets
    got = {}
    pair.sync(other, 3, copy_into(got))
    assert all(h.entries is not None for h in pair.posted[:-1]), "a changed layout is sent again"
    assert weights_hash(got.items()) == weights_hash(other.items())
    assert pair.receiver.version == 3


def test_the_slots_of_the_connection_serve_every_sync_and_lend_views(pair):
    got: dict[str, torch.Tensor] = {}
    slot_memory = []

    def apply(named):
        for name, tensor in named:
            slot_memory.append(tensor.untyped_storage().data_ptr())
            got[name] = got.get(name, torch.empty_like(tensor)).copy_(tensor)

    weights = state()
    keys = []
    for version in (1, 2, 3):
        pair.sync(weights, version, apply)
        pair.sender.control.flush()  # the sync's keys are deleted in the background
        keys.append(pair.sender.control.store.num_keys())
    assert keys[0] == keys[-1], "each sync's headers, acknowledgements and statuses are deleted"
    assert len(pair.sender.transport.slots) == SLOTS, "no slot made beyond those of the connection"
    mapped = {slot.tensor.untyped_storage().data_ptr() for slot in pair.receiver.transport.slots}
    assert set(slot_memory) <= mapped, "the consumer reads views of the slots, not copies"
    assert weights_hash(got.items()) == weights_hash(weights.items())


def test_a_consumer_that_keeps_tensors_gets_new_slots_not_overwritten_ones(pair):
    kept: list[tuple[str, torch.Tensor]] = []
    weights = state()
    pair.sync(weights, 1, lambda named: kept.extend(named))
    assert len(pair.sender.transport.slots) > SLOTS
    assert weights_hash(kept) == weights_hash(weights.items())


def test_a_header_without_a_known_plan_is_refused():
    receiver = WeightReceiver(None, 1, CPU)
    with pytest.raises(
        WeightSyncError, match="bucket 3 of the weight sync of version 7 came without its layout"
    ):
        receiver._learn_plan(BucketHeader(7, 3, entries=None))


def test_packing_copies_every_tensor_in_one_batch_non_contiguous_ones_too():
    weights = {
        "a": torch.randn(8, 6).t(),
        "b": torch.arange(10, dtype=torch.int64),
        "c": torch.ones(3).bfloat16(),
    }
    writer = BucketWriter(weights.items(), 4096)
    entries, parts = writer.take()
    buffer = torch.zeros(4096, dtype=torch.uint8)
    packed = pack(entries, parts, buffer)
    back = dict(unpack(entries, packed))
    assert all(torch.equal(back[name], tensor) for name, tensor in weights.items())
    assert back["a"].dtype == torch.float32 and back["c"].dtype == torch.bfloat16
