"""The order of an overlapped pipeline (`algorithm.max_staleness`), driven as the run drives it
(take, admit, train, sync, fill) with launches recorded: k = 0 launches each rollout only after the
sync of the weights it needs, k > 0 runs up to k rollouts ahead, no rollout beyond the bound is
ever trained on, and the configuration refuses k > 0 for colocated roles before anything starts."""

from __future__ import annotations

import pytest

from roll_device.errors import ConfigError
from roll_device.pipeline.overlap import Rollout, RolloutQueue
from tests.configs import run_config

PROMPTS = 4


class Engines:
    """Records launches as (step, position, weight version, the trainer's step at launch)."""

    def __init__(self) -> None:
        self.launched: list[tuple[int, int, int, int]] = []
        self.dropped: list[int] = []
        self.trainer_step = 0

    def launch(self, step: int, position: int, version: int) -> Rollout:
        self.launched.append((step, position, version, self.trainer_step))
        return Rollout(step, position, PROMPTS, version, pending=None)

    def drop(self, rollout: Rollout) -> None:
        self.dropped.append(rollout.step)


def drive(max_staleness: int, steps: int, start: int = 0) -> tuple[Engines, list[tuple[int, int]]]:
    """Run the loop's order from trainer step `start` (the engines hold its weights); returns the
    engines and (trainer step, version trained on) per step."""
    engines = Engines()
    engines.trainer_step = start
    queue = RolloutQueue(max_staleness, steps, engines.launch, engines.drop)
    queue.start(start, start * PROMPTS, engine_version=start)
    queue.fill()
    trained = []
    for step in range(start, steps):
        rollout = queue.take(step)
        assert queue.admit(rollout, rollout.version)
        assert rollout.position == step * PROMPTS, "each step's own prompts, in order"
        trained.append((step, rollout.version))
        engines.trainer_step = step + 1
        queue.synced(step + 1)
        queue.fill()
    return engines, trained


def test_k0_is_the_synchronous_loop():
    engines, trained = drive(0, 5)
    assert trained == [(s, s) for s in range(5)], "every rollout from the trainer's own weights"
    assert [(step, version, at) for step, _, version, at in engines.launched] == [(s, s, s) for s in range(5)]


def test_k1_launches_the_next_rollout_before_the_step_trains():
    engines, trained = drive(1, 5)
    assert trained == [(0, 0), (1, 0), (2, 1), (3, 2), (4, 3)]
    # rollout s + 1 is launched while the trainer is at step s (right after the sync of s)
    assert [(step, at) for step, _, _, at in engines.launched] == [(0, 0), (1, 0), (2, 1), (3, 2), (4, 3)]
    assert not engines.dropped


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_no_rollout_beyond_the_bound_is_trained_on_and_none_past_the_last_step(k):
    engines, trained = drive(k, 7)
    assert all(0 <= step - version <= k for step, version in trained)
    assert max(step - version for step, version in trained) == min(k, 6), "the bound is used"
    assert [step for step, *_ in engines.launched] == list(range(7)), "each step once, none past the last"


def test_a_resumed_run_starts_from_the_resumed_weights():
    _, trained = drive(1, 6, start=3)
    assert trained == [(3, 3), (4, 3), (5, 4)]


def test_a_rollout_reported_beyond_the_bound_is_dropped_with_those_after_it_and_launched_again():
    engines = Engines()
    queue = RolloutQueue(1, 10, engines.launch, engines.drop)
    queue.start(4, 16, engine_version=4)
    queue.fill()  # rollouts 4 and 5 from version 4
    rollout = queue.take(4)
    assert not queue.admit(rollout, generated_version=2), "the engines reported weights 2 steps old"
    assert engines.dropped == [5]
    queue.fill()
    again = queue.take(4)
    assert (again.step, again.position, again.version) == (4, 16, 4)
    assert queue.admit(again, 4)


def test_colocated_rollout_and_trainer_refuse_overlap_in_one_line():
    with pytest.raises(ConfigError) as refused:
        run_config("algorithm.max_staleness=1", "roles.actor_infer.colocate_with=actor_train")
    assert str(refused.value) == (
        "algorithm.max_staleness=1 overlaps rollout and training, but actor_infer and actor_train share "
        "devices (colocate_with): set algorithm.max_staleness=0, or give the two roles devices of their own"
    )
    assert run_config("roles.actor_infer.colocate_with=actor_train").algorithm.max_staleness == 0


def test_the_default_is_synchronous_and_mixed_devices_overlaps():
    assert run_config().algorithm.max_staleness == 0
    assert run_config("experiment=mixed_devices", "cluster=sim").algorithm.max_staleness == 1
    with pytest.raises(ConfigError, match="algorithm.max_staleness"):
        run_config("algorithm.max_staleness=-1")
