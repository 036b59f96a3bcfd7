"""A step's metrics record (roll_device/pipeline/record.py) from its outcome and its timeline
(timeline.py), no workers: the keys in metrics.jsonl's order, the colocated turns' spans and
freed bytes in it, and the sync's extension, whole or cut short."""

import time

import pytest
import torch

from roll_device.pipeline.batching import build_batch
from roll_device.pipeline.experiment import graph_guard_line
from roll_device.pipeline.record import StepOutcome, StepRecord
from roll_device.pipeline.state import PipelineState
from roll_device.pipeline.timeline import StepTimeline, TurnLog, timed
from strategies.base import Completion

ALGORITHM_KEYS = [
    "step",
    "epoch",
    "reward_mean",
    "reward_std",
    "response_len",
    "loss",
    "kl",
    "grad_norm",
    "entropy",
    "lr",
    "clip_fraction",
    "ratio_mean",
    "updates",
    "rollout_vs_train_logprob_gap",
    "rollout_version",
    "staleness",
    "importance_ratio_mean",
    "importance_clipped_share",
    "trainer_wait_s",
    "rollout_wait_s",
    "weights_version",
    "sync_path",
    "graph_guard",
    "sync_export_s",
    "sync_cast_s",
    "sync_transfer_s",
    "sync_load_s",
    "sync_calls_s",
    "sync_bytes",
    "sync_senders",
    "rollout_s",
    "reward_s",
    "logprob_s",
    "train_s",
]
END_KEYS = ["sync_s", "swap_s", "step_s", "timeline"]


def for_rollout():
    time.sleep(0.01)
    return {"freed_bytes_actor_train": 7}


def for_training():
    time.sleep(0.01)
    return {"freed_bytes_actor_infer": 5}


def for_sync():
    time.sleep(0.01)


def outcome() -> StepOutcome:
    completions = [Completion(0, 0, [8, 9], [-0.1, -0.2], "stop"), Completion(0, 0, [10], [-0.3], "stop")]
    batch, sampler = build_batch(
        [[5, 6], [5, 6]], completions, pad_id=0, advantages=torch.tensor([1.0, -1.0])
    )
    batch.old_logprobs = sampler + 0.5 * batch.response_mask  # the trainer 0.5 above on every response token
    update = {"loss": 0.25, "grad_norm": 1.5, "lr": 1e-3, "clip_fraction": 0.125, "updates": 4}
    return StepOutcome(torch.tensor([1.0, 0.0]), batch, sampler, update, 3, 1, 0.2)


def record(turns: TurnLog) -> StepRecord:
    timeline = StepTimeline([100.0, 102.5], 0.75, turns)
    for part in ("reward", "logprob", "update"):
        with timeline.part(part):
            time.sleep(0.01)
    return StepRecord.build(PipelineState(step=4, data_position=8, data_epoch=1), outcome(), timeline)


def test_a_record_has_its_keys_in_order_and_its_values_from_the_outcome_and_the_timeline():
    got = record(TurnLog())
    assert list(got) == ALGORITHM_KEYS + END_KEYS
    assert list(got["timeline"]) == ["rollout", "train", "reward", "logprob", "update"]
    assert (got["step"], got["epoch"], got["rollout_version"], got["staleness"]) == (4, 1, 3, 1)
    assert (got["reward_mean"], got["reward_std"], got["response_len"]) == (0.5, 0.5, 1.5)
    assert (got["loss"], got["kl"], got["entropy"], got["grad_norm"]) == (0.25, 0.0, None, 1.5)
    assert (got["importance_ratio_mean"], got["importance_clipped_share"]) == (1.0, 0.0)
    assert (got["clip_fraction"], got["ratio_mean"], got["updates"]) == (0.125, None, 4), (
        "a loss without a ratio"
    )
    assert got["rollout_vs_train_logprob_gap"] == pytest.approx(0.5)
    assert (got["trainer_wait_s"], got["rollout_wait_s"], got["rollout_s"]) == (0.75, 0.2, 2.5)
    assert (got["weights_version"], got["sync_path"], got["sync_s"], got["swap_s"]) == (None, None, 0.0, 0.0)
    parts = [got[key] for key in ("reward_s", "logprob_s", "train_s")]
    assert all(seconds >= 0.01 for seconds in parts)
    assert got["step_s"] >= sum(parts) + 0.75, "the wait for the rollout is part of the step"
    spans = got["timeline"]
    assert spans["rollout"] == [100.0, 102.5]
    assert spans["train"][0] <= spans["reward"][0] <= spans["reward"][1] <= spans["logprob"][0]
    assert spans["logprob"][1] <= spans["update"][0] <= spans["update"][1] <= spans["train"][1]


def test_colocated_turns_and_the_sync_extend_the_record():
    turns = TurnLog()
    turns.take(for_rollout)
    turns.take(for_training)
    got = record(turns)
    assert list(got) == ALGORITHM_KEYS + ["freed_bytes_actor_train", "freed_bytes_actor_infer"] + END_KEYS
    assert (got["freed_bytes_actor_train"], got["freed_bytes_actor_infer"]) == (7, 5)
    assert turns.pop_freed() == {} and turns.pop_spans() == {}, "a record takes the turns it reports"
    before = got["step_s"]
    turns.take(for_sync)
    got.add_turns(turns.pop_spans())
    with timed() as took:
        time.sleep(0.01)
    guard = {"status": "passed", "engines": {"passed": 1}, "max_error": 1e-6}
    split = {"export_s": 0.001, "cast_s": 0.0, "transfer_s": 0.002, "load_s": 0.003, "seconds": 0.006}
    sync = {"version": 4, "path": "colocated", "graph_guard": guard, "nbytes": 99, "senders": 2, **split}
    got.add_sync(sync, took)
    assert list(got) == ALGORITHM_KEYS + ["freed_bytes_actor_train", "freed_bytes_actor_infer"] + END_KEYS
    spans = got["timeline"]
    assert list(spans)[5:] == ["for_rollout", "for_training", "for_sync", "sync"]
    swaps = sum(end - begin for begin, end in (spans[t] for t in ("for_rollout", "for_training", "for_sync")))
    assert got["swap_s"] == pytest.approx(swaps) and got["swap_s"] >= 0.03
    assert (got["weights_version"], got["sync_path"], got["sync_s"]) == (4, "colocated", took.seconds)
    assert got["graph_guard"] == guard
    assert (got["sync_export_s"], got["sync_transfer_s"], got["sync_load_s"]) == (0.001, 0.002, 0.003)
    assert (got["sync_bytes"], got["sync_senders"]) == (99, 2)
    assert got["sync_calls_s"] == pytest.approx(took.seconds - 0.006)
    assert got["step_s"] == pytest.approx(before + spans["for_sync"][1] - spans["for_sync"][0] + took.seconds)


def test_a_turn_taken_inside_the_train_span_counts_once_in_the_step():
    turns = TurnLog()
    turns.take(for_rollout)  # before the step's train span: added to its seconds
    timeline = StepTimeline([100.0, 102.5], 0.0, turns)
    with timeline.part("reward"):
        time.sleep(0.01)
    turns.take(for_training)  # inside the train span (after the reward): already in its seconds
    with timeline.part("logprob"):
        time.sleep(0.01)
    began = time.perf_counter()
    got = StepRecord.build(PipelineState(step=4, data_position=8, data_epoch=1), outcome(), timeline)
    spans = got["timeline"]
    inside = spans["for_training"][1] - spans["for_training"][0]
    before = spans["for_rollout"][1] - spans["for_rollout"][0]
    assert got["swap_s"] == pytest.approx(inside + before)
    train = spans["train"][1] - spans["train"][0]
    assert got["step_s"] == pytest.approx(train + before, abs=0.005 + time.perf_counter() - began)
    assert got["step_s"] < train + before + inside, "the reload inside the train span is counted once"


def test_a_sync_cut_short_leaves_its_fields_empty():
    got = record(TurnLog())
    with pytest.raises(RuntimeError), timed() as took:
        raise RuntimeError("a rollout worker was lost")
    assert took.span == [] and took.seconds == 0.0
    assert (got["weights_version"], got["sync_path"], got["sync_s"], got["graph_guard"]) == (
        None,
        None,
        0.0,
        None,
    )
    assert "sync" not in got["timeline"]


@pytest.mark.parametrize(
    "guard, said",
    [
        (None, ""),
        ({"status": "no graphs", "engines": {"no graphs": 2}, "max_error": None}, ""),
        ({"status": "passed", "engines": {"passed": 2}, "max_error": 1e-6}, ""),
        (
            {"status": "eager", "engines": {"passed": 1, "eager": 1}, "max_error": 0.206},
            (
                "graph guard: /m, step 3: graphs differed from eager after the weight update (largest "
                "difference 0.206); engines by outcome: {'passed': 1, 'eager': 1}"
            ),
        ),
    ],
)
def test_the_graph_guard_speaks_only_when_it_acted(guard, said):
    assert graph_guard_line({"step": 3, "graph_guard": guard}, "/m") == said
