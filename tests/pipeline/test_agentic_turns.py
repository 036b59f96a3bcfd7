"""roll_device/pipeline/agentic_step.py's `TurnDriver` on the tiny model's HF engine and an
in-process env host: the model's tokens are the engine's exactly, the mask equals a hand-built
trajectory's, budgets end trajectories, and an environment's fault ends its trajectory (counted)
or the run. The same driver runs through Ray in `AgenticStep` (tests/pipeline/test_agentic_run.py)."""

from __future__ import annotations

import threading

import pytest

import roll_device as rd
from roll_device.agentic.chat import ChatRenderer
from roll_device.agentic.environment import EnvironmentFaultError, Task
from roll_device.agentic.host import EnvHost
from roll_device.agentic.registry import resolve_tool
from roll_device.agentic.trajectory import DONE, FAULT, MAX_TURNS, TOTAL_TOKENS, trajectory_metrics
from roll_device.comm import WeightSender, plan_sync
from roll_device.inputs.prompts import Tokens
from roll_device.pipeline.agentic_step import TurnDriver, completion
from roll_device.pipeline.batching import build_batch
from roll_device.pipeline.request_pool import EngineRequests
from strategies.base import Completion, Request, SamplingConfig, Served
from strategies.registry import strategy_class
from tests.configs import changed, rollout_settings, run_config, weight_sync


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


def driver(tokenizer, settings, engines):
    tools = [resolve_tool(name).rendered() for name in settings.tools]
    renderer = ChatRenderer(tokenizer, settings.chat_template, tools)
    host = HOSTS[0] = EnvHost(settings.host(renderer.tool_format))
    tokens = Tokens.from_tokenizer(tokenizer)
    return TurnDriver(
        settings, renderer, tokenizer, tokens, engines, lambda method, items: getattr(host, method)(items)
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


class Recording(EngineRequests):
    """The engine's request path, keeping each request's context and its completions."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.contexts, self.produced = {}, []

    def submit(self, requests: list[Request]) -> None:
        self.contexts.update({r.request_id: list(r.prompt_token_ids) for r in requests})
        super().submit(requests)

    def finished(self) -> list[Served]:
        served = super().finished()
        self.produced += [([self.contexts[s.request_id]], s.completions) for s in served]
        return served


def test_the_model_turns_are_the_engines_tokens_and_the_mask_covers_exactly_them(tokenizer, engine):
    engines = Recording(engine)
    settings = agentic(environment="tests.agentic.envs.Echo", tools=[], max_turn_tokens=4)
    tasks = [Task("", None, 1), Task("", None, 2)]
    trajectories = driver(tokenizer, settings, engines).roll_out(tasks, 2, SAMPLING)
    produced = engines.produced
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


class Scripted:
    """An engine stand-in that answers each request with the next scripted turn (ids of its text),
    all requests in flight at every `finished` but those `held` (by id) until `until(events)`."""

    def __init__(self, turns: list[str], tokenizer, held=(), until=lambda events: True) -> None:
        self.texts, self.tokenizer, self.held, self.until = iter(turns), tokenizer, set(held), until
        self.queued: list[Request] = []
        self.events: list[str] = []  # "submit <id>" and "finish <id>" as they happened

    def submit(self, requests: list[Request]) -> None:
        self.queued += requests
        self.events += [f"submit {r.request_id}" for r in requests]

    def finished(self) -> list[Served]:
        done = [r for r in self.queued if r.request_id not in self.held or self.until(self.events)]
        self.queued = [r for r in self.queued if r not in done]
        self.events += [f"finish {r.request_id}" for r in done]
        return [Served(r.request_id, [self.turn()], 0) for r in done]

    def turn(self) -> Completion:
        ids = self.tokenizer(next(self.texts), add_special_tokens=False).input_ids
        return Completion(0, 0, ids, [-1.0] * len(ids), "stop")


def scripted(turns: list[str], tokenizer) -> Scripted:
    return Scripted(turns, tokenizer)


def test_trajectories_advance_independently(tokenizer):
    """A trajectory whose turn is back gets its next turn at once, while another's first turn is
    still in flight; both run to their end."""
    settings = agentic(environment="tests.agentic.envs.Echo", tools=[], max_turns=3)
    engines = Scripted(["a<eos>"] * 6, tokenizer, held={"1.0"}, until=lambda events: "submit 0.2" in events)
    trajectories = driver(tokenizer, settings, engines).roll_out([Task("", None, 1)], 2, SAMPLING)
    events = engines.events
    assert events.index("submit 0.1") < events.index("submit 0.2") < events.index("finish 1.0")
    assert [t.turns for t in trajectories] == [3, 3]


def test_the_same_seed_rolls_out_the_same_trajectories(tokenizer, engine):
    settings = agentic(environment="tests.agentic.envs.Echo", tools=[], max_turn_tokens=4)
    runs = [
        driver(tokenizer, settings, EngineRequests(engine)).roll_out([Task("", None, 1)], 2, SAMPLING)
        for _ in range(2)
    ]
    assert [t.tokens for t in runs[0]] == [t.tokens for t in runs[1]]
    assert runs[0][0].tokens != runs[0][1].tokens  # a group's trajectories sample apart


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
    ends = [sum(map(len, ids[: i + 1])) - 1 for i in (1, 3)]  # each model part's last token
    assert row.turn_rewards == [(ends[0], 0.0), (ends[1], 1.0)]
    batch, _ = build_batch([[]], [row], pad_id=0)
    assert batch.response_mask[0].tolist() == row.mask  # what the losses score
    placed = [0.0] * len(row.token_ids)
    placed[ends[1]] = 1.0  # the token-level estimators' rewards: each turn's on its last model token
    assert batch.token_rewards[0].tolist() == placed


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


class SyncingAfterFirstTurn(EngineRequests):
    """The engine's request path, with a real weight sync into the engine (a sender in this
    thread, the engine receiving on another, as a rollout worker would) as soon as the first
    turn is back: the other first turns are still in flight then."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.synced = False

    def finished(self) -> list[Served]:
        served = super().finished()
        if served and not self.synced:
            self.synced = True
            sync_once(self.engine, version=1)
        return served


def sync_once(engine, version: int) -> None:
    """The engine's own weights sent back to it as weights `version` (the engine held meanwhile);
    its receiver stays open (its version is the engine's) until `close_weights`."""
    options = weight_sync(path="colocated", timeout_s=20)
    plan = plan_sync("cpu", "cpu", colocated=True, same_node=True, forced="colocated")
    sender = WeightSender(plan, rd.get_platform("cpu"), 1, options)
    weights = {name: tensor.clone() for name, tensor in engine.read_weights().items()}
    receiving = threading.Thread(
        target=lambda: (engine.connect_weights(sender.endpoint, 1, 20), engine.receive_weights())
    )
    receiving.start()
    try:
        sender.connect()
        sender.send(weights.items(), version)
    finally:
        receiving.join(timeout=60)
        sender.close()


def test_a_sync_between_turns_serves_the_later_turns_and_a_trajectory_is_as_old_as_its_oldest_turn(
    tokenizer, engine
):
    settings = agentic(environment="tests.agentic.envs.Echo", tools=[], max_turn_tokens=4)
    try:
        trajectories = driver(tokenizer, settings, SyncingAfterFirstTurn(engine)).roll_out(
            [Task("", None, 1), Task("", None, 2)], 2, SAMPLING
        )
    finally:
        engine.close_weights()
    # every first turn was submitted before the sync: the sync waited for it (old weights);
    # every turn submitted after it was made with the new ones
    assert [t.turn_versions for t in trajectories] == [[0, 1, 1]] * 4
    assert [t.version for t in trajectories] == [0] * 4


def test_a_halted_rollout_submits_no_more_turns_and_lets_its_environments_go(tokenizer):
    """A dropped rollout in the background (roll_device/pipeline/rollout_thread.py) is halted: the
    turns in flight come back, no next turn is submitted, the environments are closed."""
    settings = agentic(environment="tests.agentic.envs.Echo", tools=[], max_turns=3)
    halt = threading.Event()
    engines = Scripted(["a<eos>"] * 6, tokenizer, held={"1.0"}, until=lambda events: halt.set() or True)
    trajectories = driver(tokenizer, settings, engines).roll_out([Task("", None, 1)], 2, SAMPLING, halt)
    assert [t.turns for t in trajectories] == [1, 1] and [t.ended for t in trajectories] == [None, None]
    assert [e for e in engines.events if e.startswith("submit")] == ["submit 0.0", "submit 1.0"]
    assert HOSTS[0].live == {}
