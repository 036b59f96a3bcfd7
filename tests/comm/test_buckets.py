"""Bucket packing and unpacking, checksums, host receive buffers and the weights hash, in-process."""

from __future__ import annotations

import pytest
import torch

import roll_device as rd
from roll_device.comm import weights_hash
from roll_device.comm.buckets import ALIGN, BucketWriter, bucket_size, checksum, entry_bytes, pack, unpack
from roll_device.comm.buffers import HostPool, own_aligned_memory
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


def roundtrip(state, capacity):
    """Cut `state` into buckets, pack each into a buffer of its size (at least `capacity`) and
    unpack it; returns clones of what came out, and the bucket sizes."""
    writer, received, sizes = BucketWriter(state.items(), capacity), {}, []
    while not writer.exhausted:
        entries, parts = writer.take()
        sizes.append(bucket_size(entries))
        assert all(e.offset % ALIGN == 0 for e in entries)
        assert len(entries) == 1 or bucket_size(entries) <= capacity
        buffer = torch.full((max(capacity, sizes[-1]),), 0xAB, dtype=torch.uint8)
        packed = pack(entries, parts, buffer)
        received.update((n, t.clone()) for n, t in unpack(entries, packed))
    return received, sizes, writer.tensors


@pytest.mark.parametrize("capacity", [4096, 20_000, 1 << 20])
def test_roundtrip_keeps_every_tensor_exactly(capacity):
    state = mixed_state()
    received, sizes, count = roundtrip(state, capacity)
    assert count == len(state) and sorted(received) == sorted(state)
    for name, tensor in state.items():
        assert received[name].dtype == tensor.dtype and received[name].shape == tensor.shape
        assert torch.equal(received[name], tensor), name
    if capacity == 1 << 20:
        assert len(sizes) == 1
    else:
        assert 76_800 in sizes, "the embedding, larger than a bucket, travels alone"


def test_tensors_share_buckets_and_are_never_split():
    state = {f"w{i}": torch.full((600,), float(i)) for i in range(5)} | {"big": torch.ones(3000)}
    writer = BucketWriter(state.items(), 4096 + 2 * 2400)
    buckets = []
    while not writer.exhausted:
        buckets.append(writer.take()[0])
    assert [[e.name for e in b] for b in buckets] == [["w0", "w1", "w2"], ["w3", "w4"], ["big"]]
    assert [e.offset for e in buckets[0]] == [0, 2432, 4864], "each entry on a 64-byte boundary"
    assert bucket_size(buckets[2]) == 12_000, "larger than a bucket: alone, in a bucket of its size"


def test_large_tensors_leading_the_stream_follow_the_first_regular_bucket():
    state = {"embed": torch.ones(2000), "big": torch.ones(1500)} | {
        f"w{i}": torch.ones(600) for i in range(4)
    }
    writer = BucketWriter(state.items(), 4096)
    buckets = []
    while not writer.exhausted:
        buckets.append([e.name for e in writer.take()[0]])
    assert buckets == [["w0"], ["embed"], ["big"], ["w1"], ["w2"], ["w3"]]
    assert writer.tensors == len(state)
    only_large = BucketWriter([("a", torch.ones(2000)), ("b", torch.ones(2000))], 4096)
    assert [only_large.take()[0][0].name for _ in range(2)] == ["a", "b"] and only_large.exhausted


def test_buckets_hand_over_the_tensors_bytes_without_a_copy():
    big, small = torch.arange(3000.0), torch.ones(4)
    entries, parts = BucketWriter([("small", small), ("big", big)], 4096).take()
    assert [e.name for e in entries] == ["small"] and parts[0].data_ptr() == small.data_ptr()


def test_unpacked_tensors_are_views_of_the_received_buffer():
    buffer = torch.empty(4096, dtype=torch.uint8)
    entries, parts = BucketWriter([("w", torch.ones(8))], 4096).take()
    ((_name, tensor),) = unpack(entries, pack(entries, parts, buffer))
    assert tensor.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()


def test_export_mistakes_are_named():
    writer = BucketWriter([("w", torch.ones(2)), ("w", torch.ones(2))], 4096)
    with pytest.raises(WeightSyncError, match="weight 'w' appears twice"):
        writer.take()
    with pytest.raises(WeightSyncError, match="weight 'w' is a list, not a tensor"):
        BucketWriter([("w", [1.0, 2.0])], 4096)


def test_checksum_covers_the_entries_not_the_padding():
    entries, parts = BucketWriter([("a", torch.ones(3)), ("b", torch.arange(5.0))], 4096).take()
    first = pack(entries, parts, torch.zeros(4096, dtype=torch.uint8))
    second = pack(entries, parts, torch.full((4096,), 7, dtype=torch.uint8))
    assert checksum(entry_bytes(entries, first)) == checksum(entry_bytes(entries, second)) == checksum(parts)


def test_checksum_sees_one_flipped_bit():
    data = torch.randint(0, 255, (10_000,), dtype=torch.uint8)
    before = checksum([data[:5000], data[5000:]])
    data[1234] ^= 1
    assert checksum([data[:5000], data[5000:]]) != before


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


def test_own_aligned_memory_moves_only_tensors_off_a_boundary_and_keeps_ties():
    lying = torch.arange(17.0)  # a tensor 4 bytes into its storage, as in a safetensors file's mapping
    model = torch.nn.Sequential(torch.nn.Embedding(4, 4), torch.nn.Linear(4, 4, bias=False))
    with torch.no_grad():
        model[0].weight.data = lying[1:].view(4, 4)
    model[1].weight = model[0].weight  # tied: one parameter
    assert model[0].weight.data_ptr() % ALIGN
    assert own_aligned_memory(model) == 64  # the tied weight once
    assert model[0].weight.data_ptr() % ALIGN == 0 and model[1].weight is model[0].weight
    assert model[0].weight.flatten().tolist() == lying[1:].tolist()
    before = model[0].weight.data_ptr()
    assert own_aligned_memory(model) == 0 and model[0].weight.data_ptr() == before


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
