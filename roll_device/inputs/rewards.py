"""Verifiable rewards, chosen by `reward.function`:

- null: the toy task's own rule (`data.task`, for runs without `data.path`);
- `math`: the final answer (in `\\boxed{}`, or after `####` as GSM8K writes it, else the whole
  response) equals the reference by the `math-verify` library's parsing and comparison;
- `exact`: the final answers are the same string, spaces collapsed;
- a dotted path `package.module.function` (or `package.module:function`) to a user function
  `function(prompt: str, response: str, answer: str | None) -> float`, importable on the reward
  workers. A user function that raises, or returns NaN, an infinity or a number beyond float32's
  range (rewards are float32 tensors), ends the run with a `RewardFunctionError` that shows the
  offending sample, before the step trains on it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from roll_device.errors import ConfigError, RollDeviceError
from roll_device.inputs.tasks import get_task
from roll_device.naming import resolve_named

RewardFunction = Callable[[str, str, "str | None"], float]
GSM8K_MARK = "####"
SHOWN_CHARS = 200  # of each field of a failing sample
FLOAT32_MAX = 3.4028234663852886e38  # a larger reward becomes inf in the step's float32 tensor


class RewardFunctionError(RollDeviceError, RuntimeError):
    """A user reward function raised, or returned a non-number or a number that is not finite in
    float32, on a sample: the run failed on the way (exit 1), as a lost worker does."""

    exit_code = 1


def final_answer(text: str) -> str:
    """The text after the last `####` (GSM8K's answer mark), else the whole text."""
    return text.rsplit(GSM8K_MARK, 1)[1].strip() if GSM8K_MARK in text else text.strip()


def _math_verify_timeout() -> int | None:
    # math-verify times out with signal.alarm, which works only on a process's main thread
    return 5 if threading.current_thread() is threading.main_thread() else None


def math_reward(prompt: str, response: str, answer: str | None) -> float:
    from math_verify import parse, verify

    timeout = _math_verify_timeout()
    reference = final_answer(answer or "")
    gold = parse(reference, parsing_timeout=timeout) or parse(f"${reference}$", parsing_timeout=timeout)
    guess = parse(final_answer(response), parsing_timeout=timeout)
    if not gold or not guess:
        return 0.0
    return float(verify(gold, guess, timeout_seconds=timeout))


def exact_reward(prompt: str, response: str, answer: str | None) -> float:
    return float(" ".join(final_answer(response).split()) == " ".join(final_answer(answer or "").split()))


BUILT_IN: dict[str, RewardFunction] = {"math": math_reward, "exact": exact_reward}


def resolve_reward(function: str | None, task: str) -> RewardFunction:
    """The reward `reward.function` names (see the module's docstring)."""
    if function is None:
        rule = get_task(task).reward
        return lambda prompt, response, answer: rule(prompt, response)
    found = resolve_named(function, BUILT_IN, "reward.function", "reward workers")
    if not callable(found):
        raise ConfigError(f"reward.function='{function}' names {type(found).__name__}, not a function")
    return found


def _shown(text: str | None) -> str:
    text = "" if text is None else text
    return repr(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")


def score_sample(name: str, reward: RewardFunction, prompt: str, response: str, answer: str | None) -> float:
    """`reward` on one sample as a finite float; a failure names the function and shows the sample."""
    sample = f"the sample prompt={_shown(prompt)} response={_shown(response)} answer={_shown(answer)}"
    try:
        value = float(reward(prompt, response, answer))
    except Exception as exc:  # noqa: BLE001 (a user function may raise anything: shown with its sample)
        raise RewardFunctionError(
            f"reward.function='{name}' failed with {type(exc).__name__}: {exc} on {sample}"
        ) from None
    if not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
        raise RewardFunctionError(
            f"reward.function='{name}' returned {value!r} on {sample}: a reward must be a finite "
            "number within float32's range; the step was not trained on"
        )
    return value
