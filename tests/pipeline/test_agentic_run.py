"""The shipped agentic experiments end to end (slow: whole runs; the tools experiment's two steps
run by default): trajectories of several turns through the env workers, rewards that rise on the
guess-the-number game, the calculator tool run on the env workers. The turn machinery itself is
tested in-process in test_agentic_turns.py."""

import itertools
import json

import pytest

from roll_device.commands.run import run_checked
from tests.configs import run_config


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_game_is_played_in_several_turns_and_its_reward_rises(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLL_DEVICE_HOME", str(tmp_path / "home"))
    cfg = run_config("experiment=agentic_game", "rollout=hf", "save_every=0")
    steps = records(run_checked(cfg, tmp_path / "run"))
    assert len(steps) == cfg.max_steps
    assert all(r["turns_mean"] > 1.5 for r in steps), "a game takes several turns"
    first = sum(r["reward_mean"] for r in steps[:10]) / 10
    last = sum(r["reward_mean"] for r in steps[-10:]) / 10
    assert last > first + 0.05, f"mean reward did not rise: first 10 steps {first:.3f}, last 10 {last:.3f}"


@pytest.mark.timeout(900)
def test_the_tools_experiment_runs_its_turns_through_the_env_workers(tmp_path, monkeypatch):
    """By default: the one whole agentic run of the default suite (its step, env workers, tools)."""
    monkeypatch.setenv("ROLL_DEVICE_HOME", str(tmp_path / "home"))
    cfg = run_config("experiment=agentic_tools", "rollout=hf", "max_steps=2", "save_every=0")
    steps = records(run_checked(cfg, tmp_path / "run"))
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["turns_mean"] >= 1 and r["env_faults"] == 0 for r in steps)
    assert all(0 <= r["reward_mean"] <= 1 for r in steps)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_with_max_staleness_1_the_next_rollout_plays_while_a_step_trains(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLL_DEVICE_HOME", str(tmp_path / "home"))
    cfg = run_config(
        "experiment=agentic_game", "rollout=hf", "max_steps=4", "save_every=0", "algorithm.max_staleness=1"
    )
    steps = records(run_checked(cfg, tmp_path / "run"))
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(r["turns_mean"] > 1 for r in steps), "a game takes several turns"
    assert [r["staleness"] for r in steps[1:]] == [1, 1, 1] and steps[0]["staleness"] == 0
    # rollout 2 was played on the engines while step 1 trained, and so on
    for before, after in itertools.pairwise(steps):
        assert after["timeline"]["rollout"][0] < before["timeline"]["train"][1]
    assert all(r["importance_ratio_mean"] > 0 for r in steps[1:])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_routing_replay_trains_the_moes_trajectories_on_their_turns_routes(tmp_path, monkeypatch):
    """The game on the tiny Qwen3-MoE: the HF engine records each turn's routes, the trajectories
    carry them to the FSDP2 trainer, which replays them: in fp32 on both sides the trainer's
    logprobs of the model's tokens are the sampler's."""
    monkeypatch.setenv("ROLL_DEVICE_HOME", str(tmp_path / "home"))
    moe = [f"model.tiny_dir={tmp_path / 'home' / 'tiny-qwen3-moe'}", "model.tiny_architecture=qwen3_moe"]
    replay = ["rollout=hf", "trainer.routing_replay=true", "max_steps=2", "save_every=0"]
    steps = records(run_checked(run_config("experiment=agentic_game", *moe, *replay), tmp_path / "run"))
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["turns_mean"] > 1 for r in steps), "a game takes several turns"
    assert all(r["rollout_vs_train_logprob_gap"] < 1e-4 for r in steps)
