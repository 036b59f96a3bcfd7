"""Prompt sources: the seeded order per epoch, the held-out split, position -> epoch, the
prompt/answer keys, and the toy task's stream."""

import json

import pytest

from roll_device.errors import ConfigError
from roll_device.inputs import DatasetPrompts, TaskPrompts, load_source
from roll_device.inputs.arithmetic import TEST_SIZE, make_arithmetic_dataset, problems
from roll_device.inputs.loading import check_files
from roll_device.inputs.rewards import math_reward
from tests.configs import changed, run_config

SEED = 3


def _settings(path=None, **data):
    """The shipped `data` section with `path` and the changes in `data`."""
    return changed(run_config().data, "data", path=path, prompts_per_step=4, **data)


def _source(settings):
    return load_source(settings, SEED)


def _write(path, count, **keys):
    rows = [{"q": f"p{i}", "a": str(i), **keys} for i in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_dataset_order_is_seeded_reshuffled_each_epoch_and_resumable(tmp_path):
    path = _write(tmp_path / "d.jsonl", 10)
    source = _source(_settings(str(path), prompt_key="q", answer_key="a", eval_size=0.2))
    again = _source(_settings(str(path), prompt_key="q", answer_key="a", eval_size=0.2))
    assert isinstance(source, DatasetPrompts) and len(source.train) == 8 and len(source.held_out) == 2
    assert not {s.prompt for s in source.held_out} & {s.prompt for s in source.train}, "held out"
    epoch0, epoch1 = source.batch(0, 8), source.batch(8, 8)
    assert sorted(s.prompt for s in epoch0) == sorted(s.prompt for s in epoch1), (
        "each epoch sees every record"
    )
    assert [s.prompt for s in epoch0] != [s.prompt for s in epoch1], "reshuffled per epoch"
    assert source.batch(5, 6) == again.batch(5, 6), "a position alone gives the same prompts (resume)"
    assert [source.epoch(p) for p in (0, 7, 8, 17)] == [0, 0, 1, 2]
    assert source.steps_available(4) is None


def test_unshuffled_epochs_and_their_step_count(tmp_path):
    path = _write(tmp_path / "d.jsonl", 6)
    source = _source(_settings(str(path), prompt_key="q", answer_key="a", shuffle=False, epochs=2))
    assert [s.prompt for s in source.batch(4, 4)] == ["p4", "p5", "p0", "p1"]
    assert source.steps_available(4) == 3 and source.batch(0, 1)[0].answer == "0"


def test_an_eval_file_and_a_count(tmp_path):
    train, test = _write(tmp_path / "t.jsonl", 5), _write(tmp_path / "e.jsonl", 4)
    source = _source(_settings(str(train), eval_path=str(test), prompt_key="q", answer_key="a", eval_size=3))
    assert len(source.train) == 5 and [s.prompt for s in source.eval_samples(None)] == ["p0", "p1", "p2"]
    assert len(source.eval_samples(2)) == 2


def test_too_long_prompts_are_dropped_and_none_left_is_refused(tmp_path):
    path = _write(tmp_path / "d.jsonl", 4)
    source = _source(_settings(str(path), prompt_key="q", answer_key="a")).fitting(lambda s: s.prompt != "p2")
    assert [s.prompt for s in source.train] == ["p0", "p1", "p3"]
    with pytest.raises(
        ConfigError, match="every prompt of data.path=.* is too long for rollout.max_model_len"
    ):
        _source(_settings(str(path), prompt_key="q", answer_key="a")).fitting(lambda s: False)


@pytest.mark.parametrize(
    "data, message",
    [
        (
            {"prompt_key": "problem"},
            "record 0 of {path} has no key 'problem' (data.prompt_key): its keys are a, q;",
        ),
        ({"prompt_key": "q", "answer_key": "solution"}, "has no key 'solution' (data.answer_key)"),
        (
            {"prompt_key": "q", "answer_key": "a", "eval_size": 3},
            "data.eval_size=3 holds out 3 of 3 records and leaves none",
        ),
    ],
)
def test_bad_keys_and_splits_are_refused(tmp_path, data, message):
    path = _write(tmp_path / "d.jsonl", 3)
    with pytest.raises(ConfigError) as err:
        _source(_settings(str(path), **data))
    assert message.format(path=path) in str(err.value)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"eval_path": "/tmp"}, "data.eval_path is set but data.path is null"),
        ({"generate": "chess"}, "data.generate='chess': unknown dataset: choose arithmetic"),
    ],
)
def test_bad_settings_are_refused(data, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        _settings(**{"path": None, **data})


def test_files_are_checked_where_the_run_runs():
    """A missing file is not the section's to refuse (plan and submit read configs whose files
    live on the cluster): the run checks it on its own machine, before anything starts."""
    config = run_config("data.path=/nope.jsonl", "reward.function=math")  # read: the path is not looked at
    with pytest.raises(ConfigError, match=r"data\.path=/nope\.jsonl does not exist"):
        check_files(config.data, config.reward, config.rollout.max_model_len)


def test_toy_task_stream_and_its_held_out_prompts():
    source = TaskPrompts(_settings(task="digits", prompt_length=6), SEED)
    assert source.batch(2, 2) == source.batch(2, 2) and source.batch(2, 2)[1] == source.batch(3, 1)[0]
    assert not {s.prompt for s in source.eval_samples(8)} & {s.prompt for s in source.batch(0, 8)}
    assert len(source.eval_samples(None)) == 64 and source.batch(0, 1)[0].answer is None


def test_the_arithmetic_dataset_is_gsm8k_shaped_and_its_answers_verify(tmp_path):
    make_arithmetic_dataset(tmp_path / "train.jsonl", tmp_path / "test.jsonl")
    train = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (tmp_path / "test.jsonl").read_text().splitlines()]
    assert len(test) == TEST_SIZE and len(train) + len(test) == len(problems()) == 110
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    for row in train + test:
        value = row["answer"].rsplit("#### ", 1)[1]
        assert math_reward(row["question"], value, row["answer"]) == 1.0
        assert math_reward(row["question"], str(int(value) + 1), row["answer"]) == 0.0
