"""Verifiable rewards, chosen by `reward.function`:

- null: the toy task's own rule (`data.task`, for runs without `data.path`);
- `math`: the final answer (in `\\boxed{}`, or after `####` as GSM8K writes it, else the whole
  response) equals the reference by the `math-verify` library's parsing and comparison;
- `exact`: the final answers are the same string, spaces collapsed;
- a dotted path `package.module.function` (or `package.module:function`) to a user function,
  importable on the reward workers, in either of two forms (`caller` tells them apart by the
  function's parameters, once, before Ray starts):
  - this project's `function(prompt: str, response: str, answer: str | None) -> float`;
  - verl's `compute_score(data_source, solution_str, ground_truth, extra_info=None)`, called by
    keyword as verl calls it, with the record's `data_source` and `extra_info` fields (verl's
    prepared datasets carry both; None where a record has none). It returns a number, or verl's
    dict whose `score` is the reward; the dict's other numeric entries (verl's `acc`, ...) are kept
    beside the rewards (`Scores.extras`) and recorded as the step's means, `reward_<key>`.
  `reward.kwargs` are passed to either form as keywords (verl's `reward_kwargs`).
  A user function that raises, or returns NaN, an infinity or a number beyond float32's range
  (rewards are float32 tensors), ends the run with a `RewardFunctionError` that shows the offending
  sample, before the step trains on it.
"""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from roll_device.errors import ConfigError, RollDeviceError
from roll_device.inputs.tasks import get_task
from roll_device.naming import resolve_named

RewardFunction = Callable[[str, str, "str | None"], float]
Messages = tuple[tuple[str, str], ...]  # a prompt's chat messages, (role, content) pairs
VERL_PARAMETERS = ("data_source", "solution_str", "ground_truth")  # verl's compute_score takes these
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


def reward_caller(function: str | None, task: str, name: str, kwargs: dict[str, Any] | None = None):
    """`caller` of the reward `function` names (None: `task`'s rule), reported as `name`: an unknown
    name, a failing import, or a function that cannot take its sample's arguments and `kwargs`
    (`reward.kwargs`) is a ConfigError, before Ray starts (the gate) and in each reward worker."""
    return caller(resolve_reward(function, task), name, kwargs)


@dataclass(frozen=True)
class Scoring:
    """What a reward function is given for one response: the prompt's text, the response, the
    reference answer, and the record's `data_source` and `extra_info` (verl's; None without); a
    reward model the prompt's chat messages ((role, content) pairs; None: a plain prompt)."""

    prompt: str
    response: str
    answer: str | None
    source: str | None = None
    extra: Any = None
    messages: Messages | None = None


def caller(reward: Callable, name: str, kwargs: dict[str, Any] | None = None) -> Callable[[Scoring], Any]:
    """How `reward` (`reward.function`'s `name`) is called on a `Scoring`: verl's `compute_score`
    by keyword (`extra_info` where it takes it), any other with (prompt, response, answer); either
    with `kwargs` (`reward.kwargs`, verl's `reward_kwargs`) as keywords beside. A function that
    cannot take those arguments is a ConfigError."""
    kwargs = dict(kwargs or {})
    try:
        signature = inspect.signature(reward)
    except (TypeError, ValueError):  # a builtin without a signature: called as ours, unchecked
        signature = None
    params = signature.parameters if signature is not None else {}
    if all(p in params for p in VERL_PARAMETERS):
        with_extra = "extra_info" in params or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
        )

        def arguments(s: Scoring) -> tuple[tuple, dict[str, Any]]:
            extra = {"extra_info": s.extra} if with_extra else {}
            return (), {
                "data_source": s.source,
                "solution_str": s.response,
                "ground_truth": s.answer,
                **extra,
                **kwargs,
            }
    else:

        def arguments(s: Scoring) -> tuple[tuple, dict[str, Any]]:
            return (s.prompt, s.response, s.answer), kwargs

    if signature is not None:
        args, keywords = arguments(Scoring("", "", None))
        try:
            signature.bind(*args, **keywords)
        except TypeError:
            given = f", and the keywords of reward.kwargs ({', '.join(kwargs)})" if kwargs else ""
            raise ConfigError(
                f"reward.function='{name}' takes {signature}: a reward function takes (prompt, response, "
                f"answer), or verl's (data_source, solution_str, ground_truth, extra_info=None){given}"
            ) from None

    def call(s: Scoring) -> Any:
        args, keywords = arguments(s)
        return reward(*args, **keywords)

    return call


def _shown(text: str | None) -> str:
    text = "" if text is None else text
    return repr(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")


@dataclass
class Scores:
    """Rewards of responses in order, and the numeric entries verl's dicts gave beside their `score`,
    by key (each key's values over the responses that gave it)."""

    rewards: list[float]
    extras: dict[str, list[float]]

    @classmethod
    def joined(cls, parts: list[Scores]) -> Scores:
        """The parts' responses in order (the reward workers' shards, or sampling rounds)."""
        extras: dict[str, list[float]] = {}
        for part in parts:
            for key, values in part.extras.items():
                extras.setdefault(key, []).extend(values)
        return cls([r for part in parts for r in part.rewards], extras)

    def means(self, prefix: str) -> dict[str, float]:
        """Each extra entry's mean, under `prefix` + its key (`reward_acc`)."""
        return {f"{prefix}{key}": sum(values) / len(values) for key, values in sorted(self.extras.items())}


def _split(value: Any) -> tuple[float, dict[str, float]]:
    """A reward function's result as a float and the numeric extras beside it (verl's dict's)."""
    if not isinstance(value, dict):
        return float(value), {}
    if "score" not in value:
        raise KeyError(f"its dict has no 'score' (keys: {', '.join(map(str, value))})")
    extras = {
        str(key): float(extra)
        for key, extra in value.items()
        if key != "score" and isinstance(extra, int | float) and math.isfinite(extra)
    }
    return float(value["score"]), extras


def shown_sample(item: Scoring) -> str:
    """The sample as an error shows it (each field cut to `SHOWN_CHARS`)."""
    return f"the sample prompt={_shown(item.prompt)} response={_shown(item.response)} answer={_shown(item.answer)}"


def score_sample(name: str, call: Callable[[Scoring], Any], item: Scoring) -> tuple[float, dict[str, float]]:
    """`call` (a `caller`) on one sample: a finite float and verl's numeric extras beside it; a
    failure names the function and shows the sample."""
    sample = shown_sample(item)
    try:
        value, extras = _split(call(item))
    except Exception as exc:  # noqa: BLE001 (a user function may raise anything: shown with its sample)
        raise RewardFunctionError(
            f"reward.function='{name}' failed with {type(exc).__name__}: {exc} on {sample}"
        ) from None
    if not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
        raise RewardFunctionError(
            f"reward.function='{name}' returned {value!r} on {sample}: a reward must be a finite "
            "number within float32's range; the step was not trained on"
        )
    return value, extras


def score_all(name: str, call: Callable[[Scoring], Any], items: list[Scoring]) -> Scores:
    """`score_sample` of every item, in order."""
    scored = (score_sample(name, call, item) for item in items)
    return Scores.joined([Scores([value], {k: [e] for k, e in extras.items()}) for value, extras in scored])
