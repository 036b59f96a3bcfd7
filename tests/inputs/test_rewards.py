"""Rewards: math-verify's comparison of final answers (boxed or after ####), exact match, user
functions by dotted path, and the report of a user function that raises."""

import pytest

from roll_device.errors import ConfigError
from roll_device.inputs.rewards import (
    RewardFunctionError,
    exact_reward,
    final_answer,
    math_reward,
    resolve_reward,
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
    failing = resolve_reward("tests.pipeline.user_rewards.failing_reward", "digits")
    with pytest.raises(RewardFunctionError) as err:
        score_sample("tests.pipeline.user_rewards.failing_reward", failing, "what is 2+2?", "4", "#### 4")
    assert str(err.value) == (
        "reward.function='tests.pipeline.user_rewards.failing_reward' failed with ValueError: "
        "cannot score '4' on the sample prompt='what is 2+2?' response='4' answer='#### 4'"
    )
