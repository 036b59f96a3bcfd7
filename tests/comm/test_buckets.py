"""Bucket packing and unpacking, checksums, host receive buffers and the weights hash, in-process."""

from __future__ import annotations

import pytest
import torch

import roll_device as rd
from roll_device.comm import weights_hash
from roll_device.comm.buckets import ALIGN, BucketReader, BucketWriter, bucket_size, checksum
from roll_device.comm.buffers import HostPool
from roll_device.errors import WeightSyncError


def mixed_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed": torch.randn(300, 64, generator=g),  # 76,800 bytes: split across buckets
        "norm": torch.randn(64, generator=g).to(torch.bfloat16),
        "counts": torch.arange(7, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "scale": torch.tensor(0.5, dtype=torch.float16),
        "empty": torch.empty(0, 3),
        "head": torch.randn(64, 40, generator=g).t(),  # not contiguous
        "half": torch.randn(100, 10, generator=g, dtype=torch.float64)[::2],
    }


def roundtrip(state, capacity, reader=None):
    writer, reader, received, sizes = BucketWriter(state.items(), capacity), reader or BucketReader(), {}, []
    while not writer.exhausted:
        buffer = torch.full((capacity,), 0xAB, dtype=torch.uint8)
        pieces = writer.fill(buffer)
        sizes.append(bucket_size(pieces))
        assert all(p.offset % ALIGN == 0 and p.offset + p.nbytes <= capacity for p in pieces)
        received.update((n, t.clone()) for n, t in reader.tensors(pieces, buffer))
    reader.finish()
    return received, sizes, writer.tensors


@pytest.mark.parametrize("capacity", [4096, 20_000, 1 << 20])
def test_roundtrip_keeps_every_tensor_exactly(capacity):
    state = mixed_state()
    received, sizes, count = roundtrip(state, capacity)
    assert count == len(state) and list(received) == list(state)
    for name, tensor in state.items():
        assert received[name].dtype == tensor.dtype and received[name].shape == tensor.shape
        assert torch.equal(received[name], tensor), name
    assert max(sizes) <= capacity
    if capacity == 1 << 20:
        assert len(sizes) == 1
    else:
        assert len(sizes) > 76_800 // capacity


def test_tensors_that_fit_a_bucket_are_never_split():
    state = {f"w{i}": torch.full((600,), float(i)) for i in range(5)}  # 2,400 bytes each
    writer = BucketWriter(state.items(), 4096)
    buckets = []
    while not writer.exhausted:
        buckets.append(writer.fill(torch.empty(4096, dtype=torch.uint8)))
    assert [[p.name for p in b] for b in buckets] == [["w0"], ["w1"], ["w2"], ["w3"], ["w4"]]
    assert all(p.whole for b in buckets for p in b)


def test_whole_tensors_are_views_of_the_received_buffer():
    buffer = torch.empty(4096, dtype=torch.uint8)
    pieces = BucketWriter([("w", torch.ones(8))], 4096).fill(buffer)
    ((_name, tensor),) = BucketReader().tensors(pieces, buffer)
    assert tensor.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()


def test_export_mistakes_are_named():
    writer = BucketWriter([("w", torch.ones(2)), ("w", torch.ones(2))], 4096)
    with pytest.raises(WeightSyncError, match="weight 'w' appears twice"):
        writer.fill(torch.empty(4096, dtype=torch.uint8))
    with pytest.raises(WeightSyncError, match="weight 'w' is a list, not a tensor"):
        BucketWriter([("w", [1.0, 2.0])], 4096)


def test_reader_refuses_a_broken_stream():
    buffer = torch.empty(4096, dtype=torch.uint8)
    writer = BucketWriter([("big", torch.ones(3000))], 4096)
    first = writer.fill(buffer)
    second = writer.fill(torch.empty(4096, dtype=torch.uint8))
    with pytest.raises(WeightSyncError, match="piece of 'big' at byte 4096 arrived without its start"):
        list(BucketReader().tensors(second, buffer))
    reader = BucketReader()
    list(reader.tensors(first, buffer))
    with pytest.raises(WeightSyncError, match="the stream ended inside weight 'big'"):
        reader.finish()


def test_checksum_sees_one_flipped_bit():
    data = torch.randint(0, 255, (10_000,), dtype=torch.uint8)
    before = checksum(data)
    data[1234] ^= 1
    assert checksum(data) != before


def test_host_pool_reuses_a_buffer_only_when_nothing_holds_it():
    pool = HostPool(rd.get_platform("cpu"))
    first = pool.acquire(1024)
    assert pool.acquire(1024) is first
    held = first[10:20].view(torch.int16)
    second = pool.acquire(1024)
    assert second is not first and len(pool) == 2
    assert pool.acquire(2048).numel() == 2048 and len(pool) == 3
    del held
    assert pool.acquire(1024) is first and len(pool) == 3


def test_split_tensors_are_assembled_in_memory_the_receiver_provides():
    pool = HostPool(rd.get_platform("cpu"))
    state = {"big": torch.arange(3000.0)}
    received, _sizes, _count = roundtrip(state, 4096, BucketReader(lambda n, _device: pool.acquire(n)))
    assert torch.equal(received["big"], state["big"]) and len(pool) == 1
    assert pool.acquire(12_000) is not None and len(pool) == 1, "the assembly buffer is free again"


def test_weights_hash_is_name_sorted_and_sees_every_value():
    state = mixed_state()
    reference = weights_hash(state.items())
    assert weights_hash(reversed(list(state.items()))) == reference
    changed = dict(state, embed=state["embed"].clone())
    changed["embed"][7, 3] += 1e-3
    assert weights_hash(changed.items()) != reference
    renamed = {("x" + k if k == "norm" else k): v for k, v in state.items()}
    assert weights_hash(renamed.items()) != reference


def test_weights_hash_compares_floating_values_not_storage_dtypes():
    w = torch.randn(5, 5).to(torch.bfloat16)
    assert weights_hash([("w", w)]) == weights_hash([("w", w.float())])
    assert weights_hash([("w", w.float() + 1e-3)]) != weights_hash([("w", w)])
