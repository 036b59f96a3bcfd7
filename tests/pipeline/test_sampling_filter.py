"""DAPO's dynamic sampling on its own: which groups a step keeps, when it samples another round,
and how the rounds' rollouts join (the whole run: tests/pipeline/test_algorithms_run.py)."""

import pytest
import torch

from roll_device.pipeline.loop import Collected
from roll_device.pipeline.overlap import RolloutQueue
from roll_device.pipeline.sampling_filter import SamplingFilter
from strategies.base import Completion
from tests.configs import run_config


def dapo_filter(rounds: int = 10, prompts: int = 2) -> SamplingFilter:
    config = run_config(
        "algorithm=dapo", "algorithm.samples_per_prompt=2", f"algorithm.max_sampling_rounds={rounds}"
    )
    return SamplingFilter(config.algorithm, prompts)


def test_rounds_go_on_until_the_step_holds_its_informative_groups_or_run_out():
    sampler = dapo_filter()
    one_informative = torch.tensor([1.0, 0.0, 1.0, 1.0])  # groups: (1, 0) informative, (1, 1) not
    assert sampler.wants_more(one_informative, rounds=1)
    assert not sampler.wants_more(one_informative, rounds=10), "the last round"
    two = torch.cat([one_informative, torch.tensor([0.0, 1.0, 0.0, 0.0])])
    assert not sampler.wants_more(two, rounds=2)
    assert not dapo_filter(rounds=1).wants_more(one_informative, rounds=1), "1 round: no refill"


def test_a_full_step_keeps_its_first_informative_groups_up_to_the_step_s_prompts():
    sampler = dapo_filter()
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0])  # informative: 1, 3, 4
    assert sampler.keep(rewards, data_parallel_size=1).tolist() == [2, 3, 6, 7]
    assert sampler.dropped == 3
    sampler.rounds = 3
    assert sampler.report({}) == {"dropped_groups": 3, "sampling_rounds": 3}


def test_joined_rounds_index_their_prompts_in_order():
    def collected(prompts: int, version: int, span: tuple[float, float]) -> Collected:
        completions = [Completion(i, 0, [i], [0.0], "stop") for i in range(prompts)]
        return Collected(
            [None] * prompts, [[i] for i in range(prompts)], completions, version, *span, 0.5, 1.0
        )

    joined = collected(2, 4, (10.0, 12.0)).joined(collected(3, 3, (12.5, 13.0)))
    assert [c.prompt_index for c in joined.completions] == [0, 1, 2, 3, 4]
    assert (len(joined.samples), joined.version, joined.started, joined.finished) == (5, 3, 10.0, 13.0)
    assert joined.waited_s == pytest.approx(2.0)


def test_the_next_rollout_starts_after_the_prompts_a_step_took():
    launched = []
    queue = RolloutQueue(
        0, 5, lambda step, position, version: launched.append(position) or _Rollout(step, position), None
    )
    queue.start(0, 0, engine_version=0)
    queue.fill()
    queue.take(0)
    queue.took_prompts_to(12)  # the step's rounds took prompts 0..11
    queue.synced(1)
    queue.fill()
    assert launched == [0, 12]


class _Rollout:
    def __init__(self, step: int, position: int, size: int = 4) -> None:
        self.step, self.position, self.size = step, position, size
