"""The reward worker's scorers: one for each choice of `roles.reward.strategy`."""

from roll_device.inputs.settings import REWARD_STRATEGIES
from roll_device.pipeline.reward_worker import SCORERS


def test_each_reward_strategy_has_its_scorer():
    assert tuple(SCORERS) == REWARD_STRATEGIES
