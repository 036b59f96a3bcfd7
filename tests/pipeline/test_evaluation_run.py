"""Evaluation in a whole run (the default suite's): sampled responses per held-out prompt, their
pass@1 (avg@k) and pass@k, and the generations shown beside; pass@k checked against its paper."""

from math import comb

import pytest
import torch

from roll_device.commands.run import run_checked
from roll_device.pipeline.evaluation import solved_share
from roll_device.pipeline.generations import GenerationsLog
from roll_device.pipeline.metrics import MetricsLog
from strategies.base import Completion
from tests.configs import run_config


def test_pass_at_k_is_chens_estimator_from_k_samples():
    """Chen et al. 2021 (arXiv 2107.03374, eq. 1): pass@k = E[1 - C(n - c, k) / C(n, k)] over the
    problems, with c of n samples correct; here n = k."""
    torch.manual_seed(0)
    k, prompts = 4, 50
    rewards = (torch.rand(prompts * k) < 0.3).float().tolist()
    completions = [Completion(i // k, i % k, [1], [0.0], "stop") for i in range(prompts * k)]
    correct = [int(sum(rewards[p * k : (p + 1) * k])) for p in range(prompts)]
    paper = sum(1 - comb(k - c, k) / comb(k, k) for c in correct) / prompts
    assert solved_share(completions, rewards) == pytest.approx(paper)
    assert 0 < paper < 1


def test_a_sampled_evaluation_records_avg_and_pass_at_k_and_its_generations(tmp_path, shared_cluster):
    overrides = [
        *shared_cluster,
        "max_steps=2",
        "save_every=0",
        "eval.every_n_steps=1",
        "eval.size=4",
        "eval.samples_per_prompt=3",
        "eval.temperature=1.0",
        "tracking.generations=3",
    ]
    run_dir = run_checked(run_config(*overrides), tmp_path / "run")
    evals = MetricsLog(run_dir).evaluations()
    assert [(r["step"], r["eval_size"]) for r in evals] == [(0, 4), (1, 4), (2, 4)]
    assert all(r["eval_pass@3"] >= r["eval_pass@1"] for r in evals), "a prompt solved once counts for pass@3"
    shown = GenerationsLog(run_dir).read()
    assert [(g["step"], g["eval"]) for g in shown] == [
        (step, evaluation)
        for step, evaluation in ((0, True), (1, False), (1, True), (2, False), (2, True))
        for _ in range(3)
    ]
    first = [g for g in shown if g["eval"] and g["step"] == 0]
    assert len({g["prompt"] for g in first}) == 1, "a prompt's responses together"
    assert len({g["response"] for g in first}) > 1, "sampled at eval.temperature=1.0, not greedy"
