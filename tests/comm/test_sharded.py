"""The sharded weight sync: the plan of slices (refusals included) in-process; real trainers of two
ranks (FSDP2, and Megatron with its experts spread over the ranks) sending their slices over their
links (shared memory to the engine ranks on their node, gloo to those of another node; nodes
simulated on this host) into engines in this process whose weights then hash as the trainer's
whole model; and a trainer rank lost mid-sync, named in seconds."""

from __future__ import annotations

import collections
import functools
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest
import torch

import roll_device as rd
from roll_device.comm import WeightSyncOptions, abort_sync, plan_sync
from roll_device.comm.sharded import ShardedReceiver, ShardedSender
from roll_device.comm.shards import Box, Shard, plan_shards
from roll_device.errors import WeightSyncError
from roll_device.settings import read_section
from tests.comm.shard_checks import TIMEOUT_S, TRAINER_NODE, HfEngine, ModelEngine
from tests.comm.workers import RemoteError, Worker, close_all, together

CHECKS = "tests.comm.shard_checks"
HERE, AWAY = [TRAINER_NODE], ["node-1"]  # one engine rank on the trainers' node, or on another
T = TypeVar("T")


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


def test_replicas_spread_over_their_holders_by_bytes():
    """Tensors every rank holds whole (a data-parallel replica) go from the rank with the fewest
    bytes to send so far: each once, the ranks' shares even."""
    sizes = {"a": 12, "b": 4, "c": 4, "d": 4}
    layouts = [{n: shard(n, (size,), Box.whole((size,))) for n, size in sizes.items()} for _ in range(2)]
    plan = plan_shards(layouts, [None])
    assert [[p.name for p in pieces] for pieces in plan.sends] == [["a"], ["b", "c", "d"]]
    assert plan.sent_bytes(0) == plan.sent_bytes(1) == 12 * 4


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


def test_an_abort_at_a_trainer_ranks_endpoint_ends_the_waits_of_its_links():
    """A trainer rank's links are namespaces of its one store: the driver's abort, posted at the
    rank's endpoint (a worker was lost), ends a link's wait long before `timeout_s`."""
    layouts = [{"w": shard("w", (4, 4), Box.whole((4, 4)))}]
    plan = plan_sync("cpu", "cpu", colocated=False, same_node=False, forced="bridge")
    values = {"path": "bridge", "bucket_bytes": 4096, "verify": False, "timeout_s": 600}
    options = read_section(WeightSyncOptions, values, "weight_sync")
    cpu = rd.get_platform("cpu")
    sender = ShardedSender(plan, cpu, 0, layouts, HERE + AWAY, options, node=TRAINER_NODE)
    assert [link.sender.plan.transport for link in sender.node_links] == ["shm", "broadcast"]
    reason = "a worker of role 'actor_infer' (rank 1) died"
    threading.Timer(0.2, abort_sync, (sender.endpoint, reason)).start()
    started = time.monotonic()
    with pytest.raises(
        WeightSyncError, match=f"aborted while waiting for every rollout worker .*: {re.escape(reason)}"
    ):
        sender.connect()  # its first link waits for the engine rank that never comes
    assert time.monotonic() - started < 5
    sender.close()


def _trainers(folder: Path) -> list[Worker]:
    """Two trainer ranks in one gloo world (met through a file store in `folder`)."""
    workers = [Worker() for _ in range(2)]
    try:
        store = str(folder / "store")
        _check(together([(w, f"{CHECKS}:join", (rank, 2, store)) for rank, w in enumerate(workers)]))
    except BaseException:
        close_all(workers)
        raise
    return workers


def _start(trainers: list[Worker], start: str, *args) -> list:
    """Every rank holds the model `start` makes of `args`; what each rank's start returned."""
    return _check(together(_on(trainers, start, *args)))


def _alongside(calls: list[tuple[Worker, str, tuple]], engine_side: Callable[[], T]) -> tuple[list, T]:
    """The trainer ranks' `calls` while the engine, in this process, runs `engine_side`; the
    trainers' results (the exception in place of a failed or lost rank's) and the engine's. The
    engine's failure is raised once every trainer rank has answered."""
    for worker, target, args in calls:
        worker.submit(target, *args)
    try:
        mine = engine_side()
    finally:
        theirs = [_result(worker) for worker, _, _ in calls]
    return theirs, mine


def _on(trainers: list[Worker], function: str, *args) -> list[tuple[Worker, str, tuple]]:
    """A call of shard_checks' `function` with `args` on every trainer rank."""
    return [(worker, f"{CHECKS}:{function}", args) for worker in trainers]


def _result(worker: Worker):
    try:
        return worker.result()
    except (RemoteError, EOFError) as exc:  # EOFError: the rank's process is gone
        return exc


def _open(trainers: list[Worker], engines: list[str], verify: bool = True) -> list:
    """The trainer ranks' senders to engine ranks on `engines` (their nodes); their endpoints."""
    return together(_on(trainers, "open_sender", engines, 64 << 10, verify))


class _Engines:
    """Several engine ranks in this process, each call run on all of them at once (a thread each:
    their links meet the trainer ranks' together); the calls return the engines' results."""

    def __init__(self, engines: list) -> None:
        self.engines = engines

    def _each(self, method: str) -> list:
        with ThreadPoolExecutor(len(self.engines)) as pool:
            return [f.result() for f in [pool.submit(getattr(e, method)) for e in self.engines]]

    def connect(self) -> list:
        return self._each("connect")

    def receive(self) -> list:
        return self._each("receive")

    def close(self) -> list:
        return self._each("close")


def _sync(
    trainers: list[Worker], engine_of, engines: list[str], versions: tuple[int, ...], one_copy: bool = False
):
    """Open the trainer ranks' senders to engine ranks on `engines` and the engine
    (`engine_of(endpoints)`, in this process), sync `versions`; returns each sync's (trainer
    results, engine result) and the whole model's hash. `one_copy`: the trainers' tensors in shared
    memory first, the syncs not verified (verified syncs assemble in buffers of their own)."""
    if one_copy:
        _check(together(_on(trainers, "keep_in_shm")))
    engine = engine_of(_open(trainers, engines, verify=not one_copy))
    results = []
    try:
        _check(_alongside(_on(trainers, "connect"), engine.connect)[0])
        for version in versions:
            sent, received = _alongside(_on(trainers, "send", version), engine.receive)
            results.append((_check(sent), received))
        full = together(_on(trainers, "full_hash"))
    finally:
        _alongside(_on(trainers, "close"), engine.close)
    return results, full[0]


def _check(results: list) -> list:
    errors = [r for r in results if isinstance(r, RemoteError)]
    if errors:
        raise errors[0]
    return results


def _check_whole_model_once(results, full: str) -> None:
    """Each sync: the engine's weights hash as the whole model, and the trainer ranks' bytes add
    up to the engine's (every tensor sent once) with no rank sending them all."""
    for sent_by, engine in results:
        assert engine["hash"] == full  # bit-identical to the trainer's whole model
        assert engine["stats"].nbytes == sum(t["stats"].nbytes for t in sent_by)
        for t in sent_by:
            assert t["stats"].nbytes < engine["stats"].nbytes
    assert [engine["stats"].version for _, engine in results] == list(range(1, len(results) + 1))


@pytest.fixture(scope="module")
def trainers(tmp_path_factory):
    """Two trainer ranks (one gloo world) that hold one model after another."""
    workers = _trainers(tmp_path_factory.mktemp("trainers"))
    yield workers
    close_all(workers)


@pytest.fixture
def fsdp_pair(trainers):
    """The two ranks holding the tiny Qwen2 sharded by FSDP2."""
    _start(trainers, "start_fsdp", 7)
    return trainers


@pytest.mark.parametrize("engines", [HERE, AWAY], ids=["shm", "gloo"])
def test_fsdp_ranks_send_their_own_slices_and_the_engine_gets_the_whole_model(fsdp_pair, engines):
    results, full = _sync(fsdp_pair, functools.partial(ModelEngine, rank=1, seed=100), engines, (1, 2))
    _check_whole_model_once(results, full)
    for sent_by, engine in results:
        total = sum(t["shard_bytes"] for t in sent_by)
        assert engine["stats"].nbytes == total
        for t in sent_by:
            assert t["stats"].nbytes == t["shard_bytes"] < total  # each rank sent its slices alone
            assert t["peak_extra"] < total  # and never held the whole model's bytes at once


def test_each_trainer_rank_links_shared_memory_to_its_node_and_gloo_to_another(fsdp_pair):
    """Engine rank 1 on the trainer ranks' node, engine rank 2 on another (simulated) node: each
    trainer rank opens two links at once, shared memory to rank 1 and gloo to rank 2 (the kinds as
    the receivers' links report them), its slices once over each; both engines get the whole
    model, bit-identical, in every sync."""

    def engines(endpoints: list) -> _Engines:
        return _Engines([ModelEngine(endpoints, rank=rank, seed=100 + rank) for rank in (1, 2)])

    results, full = _sync(fsdp_pair, engines, HERE + AWAY, versions=(1, 2))
    for version, (sent_by, received) in enumerate(results, 1):
        assert [engine["hash"] for engine in received] == [full, full]
        assert [engine["links"] for engine in received] == [["shm", "shm"], ["broadcast", "broadcast"]]
        shards = sum(t["shard_bytes"] for t in sent_by)
        assert [(e["stats"].version, e["stats"].nbytes) for e in received] == [(version, shards)] * 2
        for t in sent_by:
            assert t["stats"].transport == "shm+broadcast"
            assert t["stats"].nbytes == 2 * t["shard_bytes"]  # its slices once over each link


class _Refusing:
    """An engine rank whose load fails once it has taken every tensor."""

    def __init__(self, endpoints: list, rank: int) -> None:
        self.receiver = ShardedReceiver(endpoints, rank, rd.get_platform("cpu"), timeout_s=TIMEOUT_S)

    def connect(self) -> None:
        self.receiver.connect()

    def receive(self) -> BaseException | None:
        def apply(named) -> None:
            _drain(named)
            raise RuntimeError("the engine ran out of memory")

        return _raised(lambda: self.receiver.receive(apply))

    def close(self) -> None:
        self.receiver.close()


def test_an_engine_ranks_failure_is_named_by_its_rank_on_its_node_link(fsdp_pair):
    """Engine rank 2 (the only one on its node: rank 1 of that link) fails to load: each trainer
    rank's sync fails naming engine rank 2, while engine rank 1 on the other link loads the whole
    model."""
    endpoints = _open(fsdp_pair, HERE + AWAY)
    engines = _Engines([ModelEngine(endpoints, rank=1, seed=101), _Refusing(endpoints, rank=2)])
    try:
        _check(_alongside(_on(fsdp_pair, "connect"), engines.connect)[0])
        sent, (loaded, refused) = _alongside(_on(fsdp_pair, "send", 1), engines.receive)
        full = together(_on(fsdp_pair, "full_hash"))[0]
    finally:
        _alongside(_on(fsdp_pair, "close"), engines.close)
    assert loaded["hash"] == full
    assert "the engine ran out of memory" in str(refused)
    for failed in sent:
        assert isinstance(failed, RemoteError) and failed.type_name == "WeightSyncError", failed
        assert failed.message.startswith("on the link to engine ranks [2]: weight sync of version 1 failed")
        assert "the engine ran out of memory" in failed.message


def test_an_export_that_fails_is_told_over_every_node_link(fsdp_pair):
    """Each trainer rank's export fails after its slices (a tensor its layout does not hold): the
    error reaches both engine ranks, over shared memory and over gloo, and each trainer rank
    raises its own export's error."""
    endpoints = _open(fsdp_pair, HERE + AWAY)
    engines = _Engines([_Refusing(endpoints, rank=rank) for rank in (1, 2)])
    try:
        _check(_alongside(_on(fsdp_pair, "connect"), engines.connect)[0])
        sent, received = _alongside(_on(fsdp_pair, "send_stray", 1), engines.receive)
    finally:
        _alongside(_on(fsdp_pair, "close"), engines.close)
    for rank, failed in enumerate(sent):
        assert failed.message.startswith(f"trainer rank {rank} exported 'model.stray.weight' [2]"), failed
    for failed in received:
        assert "the trainer aborted the weight sync of version 1 (WeightSyncError: trainer rank" in str(
            failed
        )


def test_one_copy_each_piece_goes_from_the_trainers_shared_memory_into_the_engines_weight(fsdp_pair):
    engine_of = functools.partial(ModelEngine, rank=1, seed=100, in_place=True)
    results, full = _sync(fsdp_pair, engine_of, HERE, versions=(1, 2), one_copy=True)
    for sent_by, engine in results:
        assert engine["hash"] == full
        assert engine["assembled"] > 0 and engine["assembled_in_place"] == engine["assembled"]
        assert engine["segments"] > 0  # the trainer's slices read where they live
        assert [t["packed_buckets"] for t in sent_by] == [0, 0]  # no rank packs its shard


def _experts_sent(pieces: list) -> dict[str, set[tuple[int, int]]]:
    """Per stacked expert tensor a rank sent: the expert rows of its pieces, as (first, stop)."""
    rows: dict[str, set[tuple[int, int]]] = {}
    for name, offset, shape in pieces:
        if ".mlp.experts." in name:
            rows.setdefault(name, set()).add((offset[0], offset[0] + shape[0]))
    return rows


def _megatron_into_hf(trainers: list[Worker], model_path: str, layout: dict) -> tuple[list, list]:
    """Two Megatron ranks of `layout` syncing twice into the HF engine: the ranks' starts and the
    syncs."""
    started = _start(trainers, "start_megatron", model_path, layout)
    engine = functools.partial(HfEngine, rank=1, model_path=model_path)
    results, full = _sync(trainers, engine, HERE, versions=(1, 2))
    _check_whole_model_once(results, full)
    for _, engine in results:
        assert engine["stats"].nbytes == started[0]["whole_bytes"]  # replicated tensors sent once
    return started, results


def test_megatron_expert_parallel_ranks_each_send_their_own_experts(trainers, tiny_moe_path):
    """Megatron, expert_parallel=2 on the tiny Qwen3-MoE, into the HF engine: the engine's weights
    hash as the whole export, every tensor came once, and each rank sent its own experts' rows of
    every stacked expert tensor and no other expert's."""
    started, results = _megatron_into_hf(trainers, tiny_moe_path, {"expert_parallel": 2})
    assert [rank["experts"] for rank in started] == [[0, 4], [4, 8]]
    for sent_by, _ in results:
        for rank, sent in zip(started, sent_by):
            rows = _experts_sent(sent["pieces"])
            assert len(rows) == 4  # 2 layers x (gate_up_proj, down_proj)
            assert all(got == {tuple(rank["experts"])} for got in rows.values()), rows


@pytest.mark.slow  # two Megatron ranks: about 20 s here
@pytest.mark.parametrize("layout", [{"tensor_parallel": 2}, {"pipeline_parallel": 2}], ids=["tp2", "pp2"])
def test_megatron_tensor_and_pipeline_parallel_ranks_send_their_slices(trainers, tiny_model_path, layout):
    """Dense Megatron, TP=2 (fused q/k/v and gate/up slices cut into HF boxes) or PP=2 (each stage
    its own layers), into the HF engine: the engine's weights hash as the whole export."""
    _, results = _megatron_into_hf(trainers, tiny_model_path, layout)
    for sent_by, _ in results:
        assert all(t["stats"].nbytes <= t["shard_bytes"] for t in sent_by)  # replicas: one sends


def _drain(named) -> None:
    collections.deque(named, maxlen=0)


def _raised(action: Callable[[], object]) -> BaseException | None:
    try:
        action()
    except Exception as exc:  # noqa: BLE001  (what the engine raised, for the test to read)
        return exc
    return None


@pytest.mark.parametrize(
    "engines",
    [HERE, pytest.param(AWAY, marks=pytest.mark.slow)],  # gloo links end the same way (slow: 9 s)
    ids=["shm", "gloo"],
)
def test_a_lost_trainer_rank_ends_the_sync_in_seconds_naming_it(engines, tmp_path):
    """Trainer rank 1 dies mid-sync (killed after two of its tensors): the engine and trainer
    rank 0 end with a WeightSyncError that names trainer rank 1, in seconds, not after the
    timeout; the engine's close does not hang on the lost link either."""
    workers = _trainers(tmp_path)
    try:
        _start(workers, "start_replica", 7, 8)
        receiver = ShardedReceiver(_open(workers, engines), 1, rd.get_platform("cpu"), timeout_s=TIMEOUT_S)
        _check(_alongside(_on(workers, "connect"), receiver.connect)[0])
        started = time.monotonic()
        sends = _on(workers[:1], "send", 1) + _on(workers[1:], "send", 1, 2)
        (kept, lost), failed = _alongside(sends, lambda: _raised(lambda: receiver.receive(_drain)))
        seconds = time.monotonic() - started
        closed = _alongside(_on(workers[:1], "close"), lambda: _raised(receiver.close))[1]
    finally:
        close_all(workers)
    assert isinstance(lost, EOFError), lost  # the rank's process is gone
    assert isinstance(failed, WeightSyncError) and str(failed).startswith("trainer rank 1 was lost mid-sync")
    assert isinstance(kept, RemoteError) and kept.type_name == "WeightSyncError"
    assert "the engine failed to load the sync: trainer rank 1 was lost mid-sync" in kept.message
    assert seconds < TIMEOUT_S / 5
    if engines == HERE:  # the link's shared memory is unmapped alone
        assert closed is None
    else:  # the link's group cannot say goodbye to the lost rank: named, the other link closed
        assert str(closed).startswith("trainer rank 1: "), closed
