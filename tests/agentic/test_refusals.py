"""Agentic input refused in one line before Ray, through the commands' gate: unknown environment
or tool names, a tool without a schema, a turn budget larger than the context, an environment
without env workers (and env workers without one), and a chat template without tool support when
tools are asked for (once the model is on disk: `check_model`); routing replay only where a
single-turn run refuses it."""

from __future__ import annotations

import shutil

import pytest

from roll_device.commands.gate import check_model, load_config
from roll_device.pipeline.run_plan import plan_here
from tests.refusals import one_line_refusal

TOOLS = "experiment=agentic_tools"


@pytest.mark.parametrize(
    "overrides, refusal",
    [
        (
            [TOOLS, "agentic.environment=chess"],
            "agentic.environment='chess' is unknown: choose one of arithmetic_tools, guess_number",
        ),
        (
            [TOOLS, "agentic.environment=tests.agentic.envs.NOT_AN_ENVIRONMENT"],
            "not a subclass of roll_device.agentic.Environment",
        ),
        ([TOOLS, "agentic.tools=[abacus]"], "agentic.tools='abacus' is unknown: choose one of calculator"),
        (
            [TOOLS, "agentic.tools=[tests.agentic.envs.no_schema]"],
            "'tests.agentic.envs.no_schema' is a function without a JSON schema",
        ),
        (
            [TOOLS, "agentic.max_total_tokens=250"],
            "the turn budget agentic.max_prompt_tokens + agentic.max_total_tokens (32 + 250) exceeds rollout.max_model_len (256)",
        ),
        (
            [TOOLS, "agentic.max_turn_tokens=100"],
            "agentic.max_turn_tokens=100 exceeds agentic.max_total_tokens=48",
        ),
        ([TOOLS, "roles.env=null"], "agentic.environment=arithmetic_tools but roles.env is null"),
        (["agentic.tools=[calculator]"], "agentic.tools=['calculator'] but agentic.environment is null"),
        ([TOOLS, "roles.env.strategy=docker"], "roles.env.strategy='docker' is unknown: choose python"),
        (
            [TOOLS, "eval.every_n_steps=5"],
            (
                "eval.every_n_steps=5 is single-turn only: with agentic.environment=arithmetic_tools set "
                "eval.every_n_steps=0"
            ),
        ),
        (
            [TOOLS, "algorithm=dapo"],
            (
                "algorithm.dynamic_sampling=true is single-turn only: with "
                "agentic.environment=arithmetic_tools set algorithm.dynamic_sampling=false"
            ),
        ),
    ],
)
def test_bad_agentic_input_is_refused_in_one_line(overrides, refusal):
    assert refusal in one_line_refusal(lambda: load_config(overrides))


def test_the_env_role_is_placed_on_the_cpu_by_the_plan():
    plan = plan_here(load_config(["experiment=agentic_game"]))
    assert plan.placement.roles["env"].kind == "cpu" and "env" in plan.format()


def test_a_chat_template_without_tool_support_is_refused_once_the_model_is_known(tiny_model_path, tmp_path):
    config = load_config([TOOLS, "agentic.chat_template=null"])
    refusal = one_line_refusal(lambda: check_model(config, tiny_model_path, None))
    assert "the tokenizer has none: set agentic.chat_template=tiny" in refusal
    model = shutil.copytree(tiny_model_path, tmp_path / "model")
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    refusal = one_line_refusal(lambda: check_model(config, str(model), None))
    assert "agentic.tools is set but the tokenizer's chat template has no tool support" in refusal
    check_model(load_config([TOOLS]), tiny_model_path, None)  # the tiny template serves tools


def test_routing_replay_of_trajectories_passes_the_gate_and_keeps_the_single_turn_refusals(tiny_model_path):
    """Trajectories carry their turns' routes: replay is refused only where a single-turn run's is
    (the engine, the dense model; tests/strategies/test_routes.py replays a trajectory's routes)."""
    replay = ["experiment=agentic_game", "trainer.routing_replay=true"]
    config = load_config([*replay, "rollout=hf"])
    assert config.trainer.routing_replay and plan_here(config) is not None
    refusal = one_line_refusal(lambda: plan_here(load_config([*replay, "rollout=vllm"])))
    assert refusal.startswith(
        "trainer.routing_replay=true: the vllm rollout engine cannot record routed experts"
    )
    refusal = one_line_refusal(lambda: check_model(config, tiny_model_path, None))
    assert f"model.path={tiny_model_path} is a dense model, without experts or routes to replay" in refusal
