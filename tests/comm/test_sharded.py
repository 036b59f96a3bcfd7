"""The sharded weight sync: the plan of slices (refusals included) in-process, and a real FSDP2
trainer of two ranks sending its slices over two links (shared memory on one host, gloo between
hosts) into an engine whose weights then hash as the trainer's whole model."""

from __future__ import annotations

import socket

import pytest
import torch

from roll_device.comm.shards import Box, Shard, plan_shards
from roll_device.errors import WeightSyncError
from tests.comm.workers import RemoteError, Worker, together

CHECKS = "tests.comm.shard_checks"


def rows(shape: tuple[int, ...], start: int, stop: int) -> Box:
    return Box((start,) + (0,) * (len(shape) - 1), (stop - start, *shape[1:]))


def shard(name: str, shape: tuple[int, ...], box: Box, dtype=torch.float32) -> Shard:
    return Shard(name, dtype, shape, box)


def test_dim0_shards_each_rank_sends_its_own_rows_once():
    shape = (10, 4)
    layouts = [{"w": shard("w", shape, rows(shape, 0, 5))}, {"w": shard("w", shape, rows(shape, 5, 10))}]
    plan = plan_shards(layouts, [None, None])
    assert [[p.box for p in pieces] for pieces in plan.sends] == [[rows(shape, 0, 5)], [rows(shape, 5, 10)]]
    assert plan.lands[1] == [{"w": rows(shape, 0, 5)}, {"w": rows(shape, 5, 10)}]
    assert plan.sent_bytes(0) == 5 * 4 * 4


def test_tensor_parallel_slices_to_tensor_parallel_engine_ranks():
    """Trainer slices along dim 1 in halves, engine ranks need dim-0 halves: each trainer rank
    sends two pieces (one per engine rank), replicated biases go from one holder each."""
    shape = (4, 6)
    cols = [Box((0, 0), (4, 3)), Box((0, 3), (4, 3))]
    layouts = [{"w": shard("w", shape, cols[r]), "b": shard("b", (2,), Box.whole((2,)))} for r in range(2)]
    needs = [{"w": rows(shape, 0, 2), "b": Box.whole((2,))}, {"w": rows(shape, 2, 4), "b": Box.whole((2,))}]
    plan = plan_shards(layouts, needs)
    assert [p.key for p in plan.sends[0]] == ["b", "w", "w#1"]
    assert [p.key for p in plan.sends[1]] == ["w", "w#1"]  # the bias is rank 0's to send
    assert plan.lands[1][1]["w#1"] == Box((2, 3), (2, 3))


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (rows((10, 4), 4, 10), "overlapping but different slices"),
        (rows((10, 4), 6, 10), "hold 36 of them"),
        (rows((10, 4), 8, 12), "outside its full shape"),
    ],
    ids=["overlap", "gap", "outside"],
)
def test_layouts_that_do_not_fit_are_refused(second, message):
    layouts = [{"w": shard("w", (10, 4), rows((10, 4), 0, 5))}, {"w": shard("w", (10, 4), second)}]
    with pytest.raises(WeightSyncError, match=message):
        plan_shards(layouts, [None])


def test_ranks_disagreeing_on_a_dtype_are_refused():
    layouts = [
        {"w": shard("w", (4,), Box((0,), (2,)))},
        {"w": shard("w", (4,), Box((2,), (2,)), dtype=torch.bfloat16)},
    ]
    with pytest.raises(WeightSyncError, match="trainer ranks 0 and 1 disagree on weight 'w'"):
        plan_shards(layouts, [None])


@pytest.fixture(scope="module")
def fsdp_pair():
    """Two FSDP2 trainer ranks (one gloo world) and one engine process."""
    workers = [Worker() for _ in range(3)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        together([(w, f"{CHECKS}:start_trainer", (rank, 2, port, 7)) for rank, w in enumerate(workers[:2])])
        yield workers
    finally:
        for worker in workers:
            worker.close()


def _sync(
    workers, same_node: bool, versions: tuple[int, ...], one_copy: bool = False
) -> list[tuple[list, dict]]:
    trainers, engine = workers[:2], workers[2]
    if one_copy:
        together([(w, f"{CHECKS}:keep_in_shm", ()) for w in trainers])
    verify = not one_copy  # verified syncs assemble in buffers of their own
    endpoints = together([(w, f"{CHECKS}:open_sender", (same_node, 1, 64 << 10, verify)) for w in trainers])
    engine.call(f"{CHECKS}:start_engine", endpoints, 1, 100, one_copy)
    results = []
    try:
        _check(
            together(
                [(w, f"{CHECKS}:connect", ("sender",)) for w in trainers]
                + [(engine, f"{CHECKS}:connect", ("receiver",))]
            )
        )
        for version in versions:
            done = _check(
                together(
                    [(w, f"{CHECKS}:send", (version,)) for w in trainers]
                    + [(engine, f"{CHECKS}:receive", ())]
                )
            )
            results.append((done[:2], done[2]))
        full = together([(w, f"{CHECKS}:full_hash", ()) for w in trainers])
    finally:
        together(
            [(w, f"{CHECKS}:close", ("sender",)) for w in trainers]
            + [(engine, f"{CHECKS}:close", ("receiver",))]
        )
    return results, full[0]


def _check(results: list) -> list:
    errors = [r for r in results if isinstance(r, RemoteError)]
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("same_node", [True, False], ids=["shm", "gloo"])
def test_fsdp_ranks_send_their_own_slices_and_the_engine_gets_the_whole_model(fsdp_pair, same_node):
    results, full = _sync(fsdp_pair, same_node, versions=(1, 2))
    for trainers, engine in results:
        assert engine["hash"] == full  # bit-identical to the trainer's whole model
        total = sum(t["shard_bytes"] for t in trainers)
        assert engine["stats"].nbytes == total
        for t in trainers:
            assert t["stats"].nbytes == t["shard_bytes"] < total  # each rank sent its slices alone
            assert t["peak_extra"] < total  # and never held the whole model's bytes at once
    assert [engine["stats"].version for _, engine in results] == [1, 2]


def test_one_copy_each_piece_goes_from_the_trainers_shared_memory_into_the_engines_weight(fsdp_pair):
    """Runs after the two above: the trainer's tensors move into shared memory for good."""
    results, full = _sync(fsdp_pair, True, versions=(1, 2), one_copy=True)
    for trainers, engine in results:
        assert engine["hash"] == full
        assert engine["assembled"] > 0 and engine["assembled_in_place"] == engine["assembled"]
        assert engine["segments"] > 0  # the trainer's slices read where they live
        assert all(t["peak_extra"] < t["shard_bytes"] for t in trainers)  # no rank packs its shard
