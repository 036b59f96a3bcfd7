"""roll_device/agentic/host.py: tool calls parsed from the model's text run as tools (failures
answered and counted), other turns go to the environment, and an environment that raises, hangs
or returns a malformed step makes a fault reply within its timeout."""

from __future__ import annotations

import time

import pytest

from roll_device.agentic.environment import Task
from roll_device.agentic.host import EnvHost, HostSpec
from roll_device.agentic.tool_calls import parse_calls

TASK = Task("", None, seed=3)


def host(environment: str, tools=("calculator",), env_timeout_s: float = 10.0) -> EnvHost:
    return EnvHost(HostSpec(environment, tuple(tools), "tiny", env_timeout_s, 5.0))


def test_a_tool_call_runs_the_tool_and_other_turns_go_to_the_environment():
    h = host("arithmetic_tools")
    [first] = h.reset([(0, TASK)])
    problem = first.messages[0]["content"]
    answer = str(eval(problem))  # one-digit + or -: the environment's own answer
    [called] = h.step([(0, f"calc?{problem}")])
    assert called.messages == [{"role": "tool", "name": "calc", "content": answer}]
    assert (called.tool_calls, called.tool_failures, called.done) == (1, 0, False)
    [answered] = h.step([(0, answer)])
    assert (answered.reward, answered.done, answered.messages) == (1.0, True, [])


@pytest.mark.parametrize(
    "text, error",
    [
        ("calc?3/4", "error: valueerror"),
        ("nope?1", "error: no tool nope"),
        ("calc?", "error: tool calc needs"),
    ],
)
def test_a_failed_tool_call_is_answered_with_its_error_and_counted(text, error):
    h = host("arithmetic_tools")
    h.reset([(0, TASK)])
    [reply] = h.step([(0, text)])
    assert reply.messages[0]["content"].startswith(error)
    assert (reply.tool_calls, reply.tool_failures, reply.fault) == (1, 1, "")


def test_hermes_calls_are_json_in_tool_call_tags():
    [call] = parse_calls(
        '<tool_call>\n{"name": "calc", "arguments": {"expression": "2*3"}}\n</tool_call>', "hermes"
    )
    assert (call.name, dict(call.arguments)) == ("calc", {"expression": "2*3"})
    [broken] = parse_calls("<tool_call>{calc}</tool_call>", "hermes")
    assert broken.error


@pytest.mark.parametrize(
    "environment, fault",
    [
        ("tests.agentic.envs.RaisesOnStep", "step() raised RuntimeError: the simulator crashed"),
        ("tests.agentic.envs.Malformed", "malformed step: Step.reward is nan"),
        ("tests.agentic.envs.HangsOnStep", "step() hung: no answer within 0.2s"),
    ],
)
def test_an_environment_that_raises_hangs_or_is_malformed_faults_and_is_let_go(environment, fault):
    h = host(environment, tools=(), env_timeout_s=0.2)
    h.reset([(7, TASK)])
    started = time.perf_counter()
    [reply] = h.step([(7, "5")])
    assert time.perf_counter() - started < 5
    assert reply.fault.startswith(fault)
    assert 7 not in h.live
