"""roll_device/agentic/trajectory.py: a trajectory keeps, for each position of its context, the
routes of the request that first fed it to the engine, whatever later turns' prefills recorded."""

from __future__ import annotations

import torch

from roll_device.agentic.trajectory import Trajectory


def recorded(values: list[int]) -> torch.Tensor:
    """A request's routes: one layer, top-1, the expert of each fed position given."""
    return torch.tensor(values, dtype=torch.int16).reshape(-1, 1, 1)


def kept(trajectory: Trajectory) -> list[int]:
    return trajectory.routes.flatten().tolist()


def test_a_later_turns_prefill_does_not_replace_the_routes_a_position_was_first_fed_with():
    trajectory = Trajectory(0, 0, [10, 11], [])
    # turn 1: the prompt's 2 positions prefilled, 3 tokens generated (the last never fed)
    trajectory.add_model([20, 21, 22], [0.0] * 3, 0, recorded([1, 1, 2, 2]))
    trajectory.add_environment([30, 31])
    # turn 2 prefills all 7 positions again (routed otherwise: new weights), then decodes 2 tokens
    trajectory.add_model([40, 41], [0.0] * 2, 1, recorded([7, 7, 7, 7, 3, 3, 3, 4]))
    assert kept(trajectory) == [1, 1, 2, 2, 3, 3, 3, 4]
    assert len(trajectory.routes) == len(trajectory.context) - 1, "the last token was never fed"


def test_a_turn_without_routes_leaves_its_positions_to_the_next_record():
    trajectory = Trajectory(0, 0, [10], [])
    trajectory.add_model([20, 21], [0.0] * 2, 0, None)
    trajectory.add_environment([30])
    trajectory.add_model([40, 41], [0.0] * 2, 0, recorded([5, 5, 5, 5, 6]))
    assert kept(trajectory) == [5, 5, 5, 5, 6]


def test_a_turn_cut_at_the_budget_keeps_the_routes_of_its_kept_tokens_only():
    trajectory = Trajectory(0, 0, [10], [])
    trajectory.add_model([20, 21], [0.0] * 2, 0, recorded([1, 2, 3, 4]))  # 4 tokens made, 2 kept
    assert kept(trajectory) == [1, 2, 3]
