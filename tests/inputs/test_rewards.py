"""Rewards: math-verify's comparison of final answers (boxed or after ####), exact match, user
functions by dotted path in this project's form and in verl's, and the report of a user function
that raises."""

import pytest

from roll_device.errors import ConfigError
from roll_device.inputs.rewards import (
    RewardFunctionError,
    Scores,
    Scoring,
    exact_reward,
    final_answer,
    math_reward,
    resolve_reward,
    reward_caller,
    score_all,
    score_sample,
)


@pytest.mark.parametrize(
    "response, answer, reward",
    [
        ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("reasoning... #### 7", "3+4=7\n#### 7", 1.0),
        ("7", "#### 7", 1.0),
        ("\\boxed{2}", "\\frac{4}{2}", 1.0),
        ("8", "#### 7", 0.0),
        ("no number", "#### 7", 0.0),
        ("#### 77", "#### 7", 0.0),
    ],
)
def test_math_reward_compares_final_answers(response, answer, reward):
    assert math_reward("q", response, answer) == reward


def test_exact_reward_and_the_final_answer():
    assert final_answer("work\n#### 12 ") == "12" and final_answer(" 12 ") == "12"
    assert exact_reward("q", "x #### a  b", "#### a b") == 1.0
    assert exact_reward("q", "#### 12", "#### 12.0") == 0.0


def test_names_resolve_to_rewards():
    assert (
        resolve_reward("math", "digits") is math_reward and resolve_reward("exact", "digits") is exact_reward
    )
    assert resolve_reward(None, "digits")("ab=", "12a4", None) == pytest.approx(0.75), "the toy task's rule"
    assert resolve_reward("tests.pipeline.user_rewards.length_reward", "digits")("p", "abc", None) == 3.0
    assert resolve_reward("tests.pipeline.user_rewards:length_reward", "digits")("p", "ab", None) == 2.0


@pytest.mark.parametrize(
    "name, message",
    [
        (
            "gsm8k",
            "reward.function='gsm8k' is unknown: choose one of math, exact or a qualified package.module.name",
        ),
        (
            "no_such_module.score",
            "reward.function='no_such_module.score': cannot import module 'no_such_module'",
        ),
        (
            "tests.pipeline.user_rewards.nothing",
            "module 'tests.pipeline.user_rewards' has no 'nothing'",
        ),
    ],
)
def test_bad_reward_names_are_refused(name, message):
    with pytest.raises(ConfigError) as err:
        resolve_reward(name, "digits")
    assert message in str(err.value)


def test_a_raising_user_function_is_reported_with_its_sample():
    name = "tests.pipeline.user_rewards.failing_reward"
    failing = reward_caller(name, "digits", name)
    with pytest.raises(RewardFunctionError) as err:
        score_sample(name, failing, Scoring("what is 2+2?", "4", "#### 4"))
    assert str(err.value) == (
        "reward.function='tests.pipeline.user_rewards.failing_reward' failed with ValueError: "
        "cannot score '4' on the sample prompt='what is 2+2?' response='4' answer='#### 4'"
    )


def _scored(name: str, item: Scoring) -> float:
    value, _extras = score_sample(name, reward_caller(name, "digits", name), item)
    return value


def test_a_verl_compute_score_is_called_by_keyword_with_the_records_fields(tmp_path):
    """verl's prepared row, read from Parquet: its data_source and extra_info reach verl's
    `compute_score` with the ground truth; its dict's score is the reward."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from roll_device.inputs.fields import to_samples
    from roll_device.inputs.records import read_records
    from tests.inputs.test_fields import VERL_ROW

    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([VERL_ROW, {**VERL_ROW, "data_source": "other"}]), path)
    samples = to_samples(read_records(path), "prompt", "reward_model.ground_truth", str(path))
    name = "tests.pipeline.user_rewards.verl_compute_score"
    assert [_scored(name, s.scoring("7")) for s in samples] == [1.0, 0.0]
    without_extra = "tests.pipeline.user_rewards.verl_score_without_extra_info"
    assert _scored(without_extra, samples[0].scoring("abc")) == 3.0


def test_a_verl_dict_without_its_score_is_reported_with_its_keys():
    name = "tests.pipeline.user_rewards.verl_dict_without_score"
    with pytest.raises(RewardFunctionError) as err:
        _scored(name, Scoring("p", "r", "a"))
    assert str(err.value).startswith(
        f"reward.function='{name}' failed with KeyError: \"its dict has no 'score' (keys: acc)\" on the sample"
    )


def test_a_function_of_neither_form_is_refused_naming_both():
    name = "tests.pipeline.user_rewards.two_parameter_reward"
    with pytest.raises(ConfigError) as err:
        reward_caller(name, "digits", name)
    assert str(err.value) == (
        f"reward.function='{name}' takes (prompt, response): a reward function takes (prompt, response, "
        "answer), or verl's (data_source, solution_str, ground_truth, extra_info=None)"
    )


def test_the_numeric_entries_of_verls_dicts_are_kept_beside_the_rewards():
    """verl's `acc` (a bool) is kept as a number, its `pred` (text) is not; each key's mean is
    over the responses that gave it, across the reward workers' shards."""
    name = "tests.pipeline.user_rewards.verl_compute_score"
    call = reward_caller(name, "digits", name)
    gsm8k = Scoring("q", "7", "7", "openai/gsm8k", {"split": "train"})
    first = score_all(name, call, [gsm8k, Scoring("q", "7", "7", "other", {"split": "train"})])
    assert first == Scores([1.0, 0.0], {"acc": [1.0, 0.0]})
    length = "tests.pipeline.user_rewards.length_reward"
    plain = score_all(length, reward_caller(length, "digits", length), [gsm8k])
    joined = Scores.joined([first, plain, first])
    assert joined.rewards == [1.0, 0.0, 1.0, 1.0, 0.0] and joined.means("reward_") == {"reward_acc": 0.5}


def test_reward_kwargs_reach_the_function_as_keywords_or_are_refused_before_ray():
    name = "tests.pipeline.user_rewards.verl_with_format_score"
    call = reward_caller(name, "digits", name, {"format_score": 0.1})
    assert score_all(name, call, [Scoring("q", "7", "7"), Scoring("q", "8", "7")]).rewards == [1.0, 0.1]
    length = "tests.pipeline.user_rewards.length_reward"
    with pytest.raises(ConfigError) as err:
        reward_caller(length, "digits", length, {"format_score": 0.1})
    assert str(err.value).endswith("and the keywords of reward.kwargs (format_score)")
