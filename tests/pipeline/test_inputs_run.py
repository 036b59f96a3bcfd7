"""Data, reward, eval and model inputs in whole runs: bad values refused before Ray starts, and a
user reward function that raises ends the run cleanly with the finished step checkpointed."""

import json

import pytest
import ray

from roll_device.commands.run import run_checked
from roll_device.inputs.rewards import RewardFunctionError
from tests.configs import run_config


@pytest.fixture
def arithmetic(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"question": "what is 1+1?", "answer": "#### 2"}) + "\n")
    return path


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.path=/no/such.jsonl", "reward.function=math"], "data.path=/no/such.jsonl does not exist"),
        (
            ["data.path={rows}"],
            "data.path={rows} needs a reward that compares with its answers: set reward.function",
        ),
        (
            ["reward.function=math"],
            "reward.function=math compares responses with reference answers: set data.path",
        ),
        (["reward.function=no_module.score"], "cannot import module 'no_module'"),
        (
            ["data.path={rows}", "reward.function=tests.pipeline.user_rewards.two_parameter_reward"],
            "takes (prompt, response): a reward function takes (prompt, response, answer), or verl's",
        ),
        (
            ["data.path={rows}", "reward.function=exact", "data.prompt_key=problem"],
            "has no key 'problem' (data.prompt_key)",
        ),
        (["data.path={empty}", "reward.function=exact"], "data.path={empty} holds no records"),
        (["eval.every_n_steps=-1"], "eval.every_n_steps=-1: input should be greater than or equal to 0"),
        (
            ["data.path={rows}", "reward.function=exact", "eval.every_n_steps=2"],
            "needs at least 1 held-out prompts",
        ),
        (["model.path={tmp}"], "model.path={tmp} has no config.json"),
        (
            ["data.path={rows}", "reward.function=exact", "data.epochs=1"],
            "data.epochs=1 gives less than one step",
        ),
        (  # found once the tokenizer is loaded, before Ray starts
            ["data.path={rows}", "reward.function=exact", "rollout.max_model_len=16"],
            "every prompt of data.path={rows} is too long for rollout.max_model_len",
        ),
    ],
)
def test_bad_inputs_fail_before_anything_starts(tmp_path, capsys, arithmetic, overrides, message):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    names = {"rows": arithmetic, "empty": empty, "tmp": tmp_path}
    with pytest.raises(Exception) as err:
        run_checked(run_config(*(o.format(**names) for o in overrides)), tmp_path / "run")
    assert message.format(**names) in str(err.value) and "\n" not in str(err.value)
    assert not ray.is_initialized() and "cluster ready" not in capsys.readouterr().out, "Ray never started"


@pytest.mark.slow  # by default: test_non_finite_run's NaN reward (a user reward's RewardFunctionError, step kept)
def test_a_raising_user_reward_ends_the_run_with_the_finished_step_saved(tmp_path, shared_cluster):
    run_dir = tmp_path / "run"
    overrides = [
        *shared_cluster,
        "max_steps=3",
        "save_every=0",
        "algorithm.kl_coef=0",
        "reward.function=tests.pipeline.user_rewards.failing_after_64_calls",
    ]
    with pytest.raises(RewardFunctionError) as failed:
        run_checked(run_config(*overrides), run_dir)
    message = str(failed.value)
    assert failed.value.exit_code == 1, "a run that failed on the way, as docs/configuration.md says"
    assert message.startswith(
        "reward.function='tests.pipeline.user_rewards.failing_after_64_calls' failed with ValueError: "
        "the grader is out of service on the sample prompt='"
    )
    assert "the run stopped after step 1; the last checkpoint is step 1" in message
    assert f"resume=true hydra.run.dir={run_dir}" in message and "\n" not in message
    assert (run_dir / "checkpoints" / "step_1" / "pipeline.json").exists()
    assert not ray.is_initialized(), "the run shut its cluster down"


@pytest.mark.slow
def test_verl_prepared_data_with_verls_compute_score(tmp_path, shared_cluster):
    """verl's prepared rows (the answer at reward_model.ground_truth; the prompt as text: the tiny
    model has no chat template) scored by a reward function in verl's form: their data_source and
    extra_info and reward.kwargs reach the reward workers, and its dict's `acc` is recorded."""
    from tests.inputs.test_fields import VERL_ROW

    path = tmp_path / "train.jsonl"
    row = {**VERL_ROW, "prompt": "what is 3+4?", "data_source": "mine"}
    path.write_text("".join(json.dumps(row) + "\n" for _ in range(32)))
    overrides = [
        *shared_cluster,
        f"data.path={path}",
        "data.prompt_key=prompt",
        "data.answer_key=reward_model.ground_truth",
        "reward.function=tests.pipeline.user_rewards.verl_compute_score",
        "+reward.kwargs.source=mine",  # the source the function expects (verl's reward_kwargs)
        "max_steps=2",
        "save_every=0",
    ]
    run_dir = run_checked(run_config(*overrides), tmp_path / "run")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["reward_mean"], r["reward_acc"]) for r in records] == [(1.0, 1.0), (1.0, 1.0)]
