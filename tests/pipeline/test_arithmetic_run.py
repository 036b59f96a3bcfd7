"""The shipped arithmetic experiment end to end: roll-device's own GSM8K-format dataset, the math
reward through math-verify on the reward workers, greedy pass@1 on the held-out problems through
the rollout workers. The tiny model starts from random weights: reward and pass@1 start near 0
and rise as it learns to answer with (likely) numbers."""

import json

import pytest

from roll_device.commands.run import run_checked
from tests.configs import run_config


@pytest.mark.slow
def test_reward_and_eval_pass_at_1_rise_on_the_arithmetic_dataset(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("ROLL_DEVICE_HOME", str(tmp_path / "home"))
    cfg = run_config("experiment=arithmetic_math", "save_every=0")
    run_dir = run_checked(cfg, tmp_path / "run")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward_mean" in r]
    evals = [r for r in records if "eval_pass@1" in r]
    assert len(steps) == cfg.max_steps and (tmp_path / "home" / "arithmetic" / "test.jsonl").exists()
    first = sum(r["reward_mean"] for r in steps[:20]) / 20
    last = sum(r["reward_mean"] for r in steps[-20:]) / 20
    assert last > first + 0.05, f"mean reward did not rise: first 20 steps {first:.3f}, last 20 {last:.3f}"
    assert [r["step"] for r in evals] == list(range(0, cfg.max_steps + 1, cfg.eval.every_n_steps))
    assert all(r["eval_size"] == 20 for r in evals)
    assert max(r["eval_pass@1"] for r in evals[1:]) > evals[0]["eval_pass@1"], "held-out pass@1 rose"
    shown = "".join(capfd.readouterr())
    for noise in ("Triton", "FutureWarning", "NUMA", "Loading safetensors", "Token authentication"):
        assert noise not in shown, f"worker or Ray noise reached the terminal: {noise}"
    assert "Triton" in (run_dir / "logs" / "actor_infer_0.log").read_text(), (
        "worker output is in the run directory"
    )
