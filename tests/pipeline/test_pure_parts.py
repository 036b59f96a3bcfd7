"""Tasks, batching, metrics and checkpoints of the pipeline (no workers)."""

import json

import pytest
import torch

from roll_device.cluster.submit import SUBMITTED_TO_ENV
from roll_device.commands.gate import load_config
from roll_device.errors import ConfigError
from roll_device.inputs import Sample
from roll_device.inputs.prompts import PromptEncoder
from roll_device.inputs.tasks import get_task
from roll_device.models.tiny import build_tokenizer
from roll_device.pipeline.agentic_step import AgenticStep, TrajectoryCompletion
from roll_device.pipeline.batching import build_batch
from roll_device.pipeline.experiment import data_summary, resume_advice
from roll_device.pipeline.generations import GENERATIONS, GenerationsLog, shown
from roll_device.pipeline.loop import GrpoStep
from roll_device.pipeline.metrics import MetricsLog
from roll_device.pipeline.state import Checkpoints, PipelineState, read_state
from strategies.base import Completion


def test_prompts_are_a_deterministic_stream():
    task = get_task("digits")
    assert task.prompt(1, 5, 6) == task.prompt(1, 5, 6)
    assert task.prompt(1, 5, 6) != task.prompt(1, 6, 6)
    assert len(task.prompt(1, 5, 6)) == 7 and task.prompt(1, 5, 6).endswith("=")


@pytest.mark.parametrize(
    "name, prompt, response, reward",
    [("digits", "ab=", "12a4", 0.75), ("digits", "ab=", "", 0.0), ("echo_first", "qa=", "qqxq", 0.75)],
)
def test_rule_rewards(name, prompt, response, reward):
    assert get_task(name).reward(prompt, response) == pytest.approx(reward)


def test_unknown_task_names_the_choices():
    with pytest.raises(ConfigError, match="unknown data.task 'sudoku': choose one of digits, echo_first"):
        get_task("sudoku")


def test_build_batch_masks_the_response_and_pads():
    prompts = [[5, 6], [7]]
    completions = [
        Completion(0, 0, [8, 9], [-0.1, -0.2], "length"),
        Completion(1, 0, [10], [-0.3], "stop"),
    ]
    batch, sampler = build_batch(prompts, completions, pad_id=0, advantages=torch.tensor([1.0, -1.0]))
    assert batch.input_ids.tolist() == [[5, 6, 8, 9], [7, 10, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch.response_mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]
    assert torch.allclose(sampler, torch.tensor([[0, 0, -0.1, -0.2], [0, -0.3, 0, 0]]))
    assert len(batch.select(slice(1, 2))) == 1


def test_build_batch_lays_the_recorded_routes_beside_their_tokens():
    prompts = [[5, 6], [7]]
    routes = [
        torch.tensor([[[1, 2]], [[3, 4]], [[5, 6]]]),
        torch.tensor([[[7, 0]]]),
    ]  # (fed tokens, 1 layer, k=2)
    completions = [
        Completion(0, 0, [8, 9], [-0.1, -0.2], "length", routed_experts=routes[0]),
        Completion(1, 0, [10], [-0.3], "stop", routed_experts=routes[1]),
    ]
    batch, _ = build_batch(prompts, completions, pad_id=0)
    assert batch.routed_experts.tolist() == [
        [[[1, 2]], [[3, 4]], [[5, 6]], [[-1, -1]]],  # the last token was fed to no forward
        [[[7, 0]], [[-1, -1]], [[-1, -1]], [[-1, -1]]],
    ]
    assert batch.select(slice(1, 2)).routed_experts.shape == (1, 4, 1, 2)
    assert build_batch(prompts, [Completion(0, 0, [8], [-0.1], "stop")], pad_id=0)[0].routed_experts is None


def test_build_batch_places_turn_rewards_after_each_rows_prompt_and_keeps_them_through_select():
    prompts = [[5, 6], [7]]
    completions = [
        Completion(0, 0, [8, 9, 10], [-0.1] * 3, "stop", turn_rewards=[(0, 0.5), (2, 1.0)]),
        Completion(1, 0, [11], [-0.3], "stop", turn_rewards=[(0, -1.0)]),
    ]
    batch, _ = build_batch(prompts, completions, pad_id=0)
    assert batch.token_rewards.tolist() == [[0, 0, 0.5, 0, 1.0], [0, -1.0, 0, 0, 0]]
    assert batch.select(slice(1, 2)).token_rewards.tolist() == [[0, -1.0, 0, 0, 0]]
    assert build_batch(prompts, [Completion(0, 0, [8], [-0.1], "stop")], pad_id=0)[0].token_rewards is None


def bare_step(cls):
    """A step of `cls` with its encoder alone (what reading its rows as text takes), without Ray."""
    step = object.__new__(cls)
    step.encoder = PromptEncoder(build_tokenizer())
    return step


def test_a_steps_first_generations_are_written_under_its_step_and_kept_to_the_runs_steps(tmp_path):
    step = bare_step(GrpoStep)
    samples = [Sample("ab=", "7"), Sample("cd=", None)]
    ids = step.encoder.tokenizer("12", add_special_tokens=False).input_ids
    completions = [Completion(0, 0, ids, [0.0] * 2, "stop"), Completion(1, 0, ids[:1], [0.0], "stop")]
    record = {"step": 3, "reward_mean": 0.5, GENERATIONS: shown(step, samples, completions, [1.0, 0.0], 5)}
    log = GenerationsLog(tmp_path)
    log.take(record, evaluation=False)
    log.take({"step": 4, "eval_pass@1": 1.0, GENERATIONS: shown(step, samples, completions, [0.5], 1)}, True)
    assert record == {"step": 3, "reward_mean": 0.5}, "taken out of the record metrics.jsonl gets"
    assert log.read() == [
        {"step": 3, "eval": False, "prompt": "ab=", "response": "12", "answer": "7", "reward": 1.0},
        {"step": 3, "eval": False, "prompt": "cd=", "response": "1", "answer": None, "reward": 0.0},
        {"step": 4, "eval": True, "prompt": "ab=", "response": "12", "answer": "7", "reward": 0.5},
    ]
    log.truncate_after(3)
    assert [g["step"] for g in log.read()] == [3, 3]
    log.clear()
    assert log.read() == []


def test_a_trajectorys_generation_is_its_first_prompt_and_the_rest_of_its_row():
    """The environment's first prompt, not the toy task's text the environment ignores."""
    step = bare_step(AgenticStep)
    ids = step.encoder.tokenizer("u:go.a:3u:higher.a:7", add_special_tokens=False).input_ids
    first = len("u:go.a:")
    row = TrajectoryCompletion(
        0, 0, ids, [0.0] * len(ids), "done", mask=[0.0] * first + [1.0] * (len(ids) - first)
    )
    lines = shown(step, [Sample("zprogv=", None)], [row], [1.0], 1)
    assert lines == [{"prompt": "u:go.a:", "response": "3u:higher.a:7", "answer": None, "reward": 1.0}]


def test_metrics_log_and_plot(tmp_path):
    log = MetricsLog(tmp_path)
    for step in (1, 2, 3):
        log.append({"step": step, "reward_mean": step / 10, "kl": 0.0, "step_s": 1.0, "rollout_s": 0.5})
    log.truncate_after(2)
    assert [r["step"] for r in log.read()] == [1, 2]
    png = log.plot("test run", with_kl=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "with_kl, critic, titles",
    [
        (True, False, ["reward", "KL to reference", "seconds per step"]),
        (False, False, ["reward", "seconds per step"]),
        (False, True, ["reward", "critic", "seconds per step"]),
    ],
)
def test_the_plot_shows_kl_only_with_a_reference_the_critic_with_one_and_whole_steps(
    tmp_path, with_kl, critic, titles
):
    # Before: a flat KL panel without a reference (kl_coef=0, reference=null), and ticks at 1.25, 1.5...
    log = MetricsLog(tmp_path)
    for step in (1, 2, 3):
        critics = {"critic_value_loss": 1 / step, "critic_vf_explained_var": step / 4} if critic else {}
        log.append({"step": step, "reward_mean": step / 10, "kl": 0.0, "step_s": 1.0, **critics})
    fig = log.figure("test run", with_kl=with_kl)
    panels = [ax for ax in fig.axes if ax.get_title()]  # the critic's second y axis has no title
    assert [ax.get_title() for ax in panels] == titles
    if critic:
        loss, explained = (
            ax.lines[0].get_ydata().tolist() for ax in fig.axes if ax.get_title() in ("critic", "")
        )
        assert loss == [1, 1 / 2, 1 / 3] and explained == [1 / 4, 2 / 4, 3 / 4]
    for ax in fig.axes:
        fig.canvas.draw()
        assert all(float(tick).is_integer() for tick in ax.get_xticks()), ax.get_xticks()


@pytest.mark.parametrize("calls", [[2, 0, 3], [0, 0, 0]])
def test_a_multi_turn_run_plots_its_turns_and_its_tool_calls_where_tools_were_called(tmp_path, calls):
    log = MetricsLog(tmp_path)
    for step, called in zip((1, 2, 3), calls, strict=True):
        turns = {"turns_mean": 1 + step / 4, "tool_calls": called, "tool_failures": called // 2}
        log.append({"step": step, "reward_mean": 0.1, "step_s": 1.0, **turns})
    fig = log.figure("test run", with_kl=False)
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == [
        "reward",
        "multi-turn",
        "seconds per step",
    ]
    [turns] = [ax for ax in fig.axes if ax.get_title() == "multi-turn"]
    assert turns.lines[0].get_ydata().tolist() == [1.25, 1.5, 1.75]
    tool_axes = [ax for ax in fig.axes if not ax.get_title()]
    if any(calls):
        [tools] = tool_axes
        assert [line.get_ydata().tolist() for line in tools.lines] == [calls, [1, 0, 1]]
    else:
        assert not tool_axes, "no tool was called: no tool axis"


def test_an_agentic_runs_title_names_its_environment_and_tools():
    assert data_summary(load_config([])) == "task 'digits'"
    tools = load_config(["experiment=agentic_tools"])
    assert data_summary(tools) == "environment 'arithmetic_tools', tools calculator"
    assert data_summary(load_config(["experiment=agentic_game"])) == "environment 'guess_number'"


def test_checkpoints_commit_atomically_and_track_latest(tmp_path):
    ckpts = Checkpoints(tmp_path)
    assert ckpts.latest() is None
    staging = ckpts.staging_dir(2)
    (staging / "policy.bin").write_bytes(b"x")
    assert ckpts.latest() is None, "an uncommitted checkpoint is invisible"
    ckpts.commit(staging, PipelineState(step=2, data_position=16, sampling_seed=9))
    path, state = ckpts.latest()
    assert path.name == "step_2" and (path / "policy.bin").exists()
    assert state == PipelineState(step=2, data_position=16, sampling_seed=9)
    assert json.loads((path / "pipeline.json").read_text())["data_position"] == 16
    assert not list(tmp_path.glob("checkpoints/.step_*"))


def test_pruning_keeps_the_newest_checkpoints_up_to_the_latest(tmp_path):
    checkpoints = Checkpoints(tmp_path)
    for step in (1, 2, 3, 4, 5):
        checkpoints.commit(checkpoints.staging_dir(step), PipelineState(step=step))
    assert [p.name for p in checkpoints.prune(2)] == ["step_3", "step_2", "step_1"]
    assert [p.name for p in checkpoints.steps()] == ["step_5", "step_4"]
    # a run resumed from step 4 commits step 5 again, then 6: only the latest two are kept
    checkpoints.commit(checkpoints.staging_dir(5), PipelineState(step=5))
    checkpoints.commit(checkpoints.staging_dir(6), PipelineState(step=6))
    checkpoints.prune(2)
    assert [p.name for p in checkpoints.steps()] == ["step_6", "step_5"]
    assert checkpoints.latest()[1].step == 6


def test_pruning_leaves_the_later_steps_of_an_abandoned_run_to_be_replaced(tmp_path):
    checkpoints = Checkpoints(tmp_path)
    for step in (1, 2, 3, 4):
        checkpoints.commit(checkpoints.staging_dir(step), PipelineState(step=step))
    checkpoints.commit(checkpoints.staging_dir(2), PipelineState(step=2))  # resumed from step 1
    assert [p.name for p in checkpoints.prune(1)] == ["step_1"]
    assert [p.name for p in checkpoints.steps()] == ["step_4", "step_3", "step_2"]


def test_a_state_carries_the_adapted_kl_coefficient_and_an_older_one_reads_without_it(tmp_path):
    ckpts = Checkpoints(tmp_path)
    ckpts.commit(ckpts.staging_dir(3), PipelineState(step=3, kl_coef=0.0123))
    assert ckpts.latest()[1].kl_coef == 0.0123
    older = ckpts.latest_path() / "pipeline.json"
    older.write_text(json.dumps({"step": 3, "data_position": 0, "data_epoch": 0, "sampling_seed": 0}))
    assert read_state(older.parent) == PipelineState(step=3)
    older.write_text(json.dumps({"step": 3, "data_position": 0}))
    with pytest.raises(ValueError, match="does not hold a pipeline state"):
        read_state(older.parent)


@pytest.mark.parametrize(
    "address, command",
    [(None, "roll-device run"), ("http://head:8265", "roll-device submit --address http://head:8265")],
)
def test_the_resume_advice_continues_where_the_run_was_started(tmp_path, monkeypatch, address, command):
    """A submitted job (`ROLL_DEVICE_SUBMITTED_TO`) is continued by another submission to its cluster."""
    if address is None:
        monkeypatch.delenv(SUBMITTED_TO_ENV, raising=False)
    else:
        monkeypatch.setenv(SUBMITTED_TO_ENV, address)
    checkpoints = Checkpoints(tmp_path)
    checkpoints.commit(checkpoints.staging_dir(2), PipelineState(step=2))
    assert resume_advice(tmp_path).endswith(
        f"continue with: {command} resume=true hydra.run.dir={tmp_path} (and the same overrides)"
    )
