"""roll_device/pipeline/agentic_step.py's `TurnDriver` on the tiny model's HF engine and an
in-process env host: the model's tokens are the engine's exactly, the mask equals a hand-built
trajectory's, budgets end trajectories, and an environment's fault ends its trajectory (counted)
or the run. The same driver runs through Ray in `AgenticStep` (tests/pipeline/test_agentic_run.py)."""

from __future__ import annotations

import pytest

import roll_device as rd
from roll_device.agentic.chat import ChatRenderer
from roll_device.agentic.environment import EnvironmentFaultError, Task
from roll_device.agentic.host import EnvHost
from roll_device.agentic.registry import resolve_tool
from roll_device.agentic.trajectory import DONE, FAULT, MAX_TURNS, TOTAL_TOKENS, trajectory_metrics
from roll_device.inputs.prompts import Tokens
from roll_device.pipeline.agentic_step import TurnDriver, completion
from roll_device.pipeline.batching import build_batch
from strategies.base import Completion, SamplingConfig
from strategies.registry import strategy_class
from tests.configs import changed, rollout_settings, run_config


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    strategy = strategy_class("inference", "hf", "cpu")(rd.get_platform("cpu"))
    strategy.initialize(tiny_model_path, rollout_settings("hf", max_batch_size=8))
    yield strategy
    strategy.shutdown()


def agentic(**changes):
    config = run_config("experiment=agentic_tools", "rollout=hf")
    return changed(config.agentic, "agentic", **changes)


HOSTS = [None]  # the last driver's env host


def driver(tokenizer, settings, generate):
    tools = [resolve_tool(name).rendered() for name in settings.tools]
    renderer = ChatRenderer(tokenizer, settings.chat_template, tools)
    host = HOSTS[0] = EnvHost(settings.host(renderer.tool_format))
    tokens = Tokens.from_tokenizer(tokenizer)
    return TurnDriver(
        settings, renderer, tokenizer, tokens, generate, lambda method, items: getattr(host, method)(items)
    )


SAMPLING = SamplingConfig(n=1, temperature=1.0, seed=5, stop_token_ids=[2])


def own_turns(produced, trajectory):
    """The engine's completions that continue `trajectory`'s row where they were generated."""
    row = trajectory.prompt_ids + trajectory.tokens
    return [
        (len(context) - len(trajectory.prompt_ids), c)
        for contexts, out in produced
        for context, c in zip(contexts, out)
        if row[: len(context) + len(c.token_ids)] == context + c.token_ids
    ]


def test_the_model_turns_are_the_engines_tokens_and_the_mask_covers_exactly_them(tokenizer, engine):
    produced = []  # each round's contexts and completions, as the engine returned them

    def generate(contexts, sampling):
        out = engine.generate(contexts, sampling)
        produced.append((contexts, out))
        return out

    settings = agentic(environment="tests.agentic.envs.Echo", tools=[], max_turn_tokens=4)
    tasks = [Task("", None, 1), Task("", None, 2)]
    trajectories = driver(tokenizer, settings, generate).roll_out(tasks, 2, SAMPLING)
    assert [t.ended for t in trajectories] == [DONE] * 4
    assert [t.turns for t in trajectories] == [3] * 4 and [t.reward for t in trajectories] == [3.0] * 4
    for trajectory in trajectories:
        turns = own_turns(produced, trajectory)
        assert len(turns) == 3
        expected_mask = [0.0] * len(trajectory.tokens)
        for start, c in turns:
            assert trajectory.tokens[start : start + len(c.token_ids)] == c.token_ids
            assert trajectory.logprobs[start : start + len(c.token_ids)] == c.logprobs
            expected_mask[start : start + len(c.token_ids)] = [1.0] * len(c.token_ids)
        assert trajectory.mask == expected_mask
    first = trajectories[0].prompt_ids
    assert first == tokenizer("u:go 1.a:", add_special_tokens=False).input_ids
    assert trajectories[1].prompt_ids == first  # a group's trajectories share its task


def scripted(turns: list[str], tokenizer):
    """An engine stand-in that answers every context with the next scripted turn (ids of its text)."""
    texts = iter(turns)

    def generate(contexts, sampling):
        return [
            Completion(
                i,
                0,
                (ids := tokenizer(next(texts), add_special_tokens=False).input_ids),
                [-1.0] * len(ids),
                "stop",
            )
            for i in range(len(contexts))
        ]

    return generate


def test_the_row_and_mask_equal_a_hand_built_tool_trajectory(tokenizer):
    settings = agentic()
    problem = EnvHost(settings.host("tiny")).reset([(0, Task("", None, 9))])[0].messages[0]["content"]
    answer = str(eval(problem))  # one-digit + or -
    generate = scripted([f"calc?{problem}<eos>", f"{answer}<eos>"], tokenizer)
    [trajectory] = driver(tokenizer, settings, generate).roll_out([Task("", None, 9)], 1, SAMPLING)
    parts = [  # (text, the model's?) as the tiny template renders the chat
        (f"tools:calc.u:{problem}.a:", False),
        (f"calc?{problem}<eos>", True),
        (f"t:{answer}.a:", False),
        (f"{answer}<eos>", True),
    ]
    ids = [tokenizer(text, add_special_tokens=False).input_ids for text, _ in parts]
    row = completion(trajectory, pad=0)
    assert row.token_ids == [t for part in ids for t in part]
    assert row.mask == [float(model) for part, (_, model) in zip(ids, parts) for _ in part]
    assert (trajectory.reward, trajectory.tool_calls, trajectory.ended) == (1.0, 1, DONE)
    batch, _ = build_batch([[]], [row], pad_id=0)
    assert batch.response_mask[0].tolist() == row.mask  # what the losses score


def test_budgets_end_trajectories_and_are_counted(tokenizer):
    settings = agentic(environment="tests.agentic.envs.Echo", tools=[], max_turns=2)
    [turns] = driver(tokenizer, settings, scripted(["a<eos>"] * 2, tokenizer)).roll_out(
        [Task("", None, 1)], 1, SAMPLING
    )
    assert (turns.ended, turns.turns) == (MAX_TURNS, 2)
    assert HOSTS[0].live == {}, "the environments of trajectories ended on a budget are let go"
    settings = agentic(
        environment="tests.agentic.envs.Echo", tools=[], max_turn_tokens=8, max_total_tokens=12
    )
    [tokens] = driver(tokenizer, settings, scripted(["abcdefg<eos>"] * 2, tokenizer)).roll_out(
        [Task("", None, 1)], 1, SAMPLING
    )
    assert tokens.ended == TOTAL_TOKENS and len(tokens.tokens) <= 12
    assert trajectory_metrics([turns, tokens])["ended_on_budget"] == 2


def test_an_environment_fault_ends_its_trajectory_or_the_run(tokenizer):
    settings = agentic(environment="tests.agentic.envs.RaisesOnStep", tools=[])
    trajectories = driver(tokenizer, settings, scripted(["a<eos>"] * 2, tokenizer)).roll_out(
        [Task("", None, 1)], 2, SAMPLING
    )
    assert [t.ended for t in trajectories] == [FAULT, FAULT]
    assert trajectory_metrics(trajectories)["env_faults"] == 2
    ending = driver(
        tokenizer, changed(settings, "agentic", on_env_fault="run"), scripted(["a<eos>"], tokenizer)
    )
    with pytest.raises(
        EnvironmentFaultError, match="the simulator crashed; agentic.on_env_fault=run ends the run"
    ):
        ending.roll_out([Task("", None, 1)], 1, SAMPLING)
