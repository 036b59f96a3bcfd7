"""A data record's prompt and reference answer, as the run reads them (`to_samples`).

- Keys may be dotted paths into nested records: verl's prepared datasets keep the answer at
  `reward_model.ground_truth` (`data.answer_key=reward_model.ground_truth`).
- A prompt is a string, or a list of chat messages (`{"role": ..., "content": ...}`, as verl's and
  ROLL's datasets write them, a system message included); the messages are rendered by the model's
  chat template (roll_device/inputs/prompts.py), and the text of the last one stands for the
  prompt where a string is needed (a reward function's `prompt`, an environment's task).
- An answer is a string or a number (written as text).
- A record's `data_source` and `extra_info` (verl's fields, where a record has them) go with its
  sample to a reward function in verl's form (roll_device/inputs/rewards.py).

Anything else (an empty prompt, a message without a role or text, a null or nested answer) is
refused with the record, the key and what was found, before Ray starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roll_device.errors import ConfigError
from roll_device.inputs.rewards import Messages, Scoring

VERL_FIELDS = ("data_source", "extra_info")  # a record's fields verl's reward functions take, if any


@dataclass(frozen=True)
class Sample:
    prompt: str  # the prompt's text (with chat messages: the last message's)
    answer: str | None  # the reference answer; None for toy tasks (their rule needs none)
    messages: Messages | None = None  # the prompt's chat messages, when the record gives a list
    source: str | None = None  # the record's `data_source` (verl's), for its reward functions
    extra: Any = None  # the record's `extra_info` (verl's), for its reward functions

    def scoring(self, response: str) -> Scoring:
        """What a reward function is given for `response` to this sample."""
        return Scoring(self.prompt, response, self.answer, self.source, self.extra, self.messages)

    def chat(self) -> list[dict[str, str]] | None:
        """The messages as a chat template takes them (None: a plain prompt)."""
        if self.messages is None:
            return None
        return [{"role": role, "content": content} for role, content in self.messages]


def to_samples(rows: list[dict], prompt_key: str, answer_key: str, where: str) -> list[Sample]:
    """Rows of `where` -> samples; a row without the keys, or with values a run cannot read, is a
    ConfigError naming it."""
    samples = []
    for index, row in enumerate(rows):
        record = _Record(row, index, where)
        prompt = record.field(prompt_key, "prompt_key")
        answer = record.field(answer_key, "answer_key")
        text, messages = record.prompt(prompt, prompt_key)
        source, extra = row.get(VERL_FIELDS[0]), row.get(VERL_FIELDS[1])
        samples.append(Sample(text, record.answer(answer, answer_key), messages, source, extra))
    return samples


@dataclass
class _Record:
    row: dict
    index: int
    where: str

    def refused(self, key: str, what: str) -> ConfigError:
        return ConfigError(f"record {self.index} of {self.where}: {key} {what}")

    def field(self, key: str, setting: str) -> Any:
        """The value at `key`, or at its dotted path through nested records."""
        if key in self.row:
            return self.row[key]
        value, walked = self.row, []
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                keys = (
                    ", ".join(sorted(value)) if isinstance(value, dict) else f"none ({type(value).__name__})"
                )
                at = f" under '{'.'.join(walked)}'" if walked else ""
                raise ConfigError(
                    f"record {self.index} of {self.where} has no key '{key}' (data.{setting}): its keys"
                    f"{at} are {keys}; set data.{setting} to one of them (a dotted path reaches nested keys)"
                )
            value, walked = value[part], [*walked, part]
        return value

    def prompt(self, value: Any, key: str) -> tuple[str, Messages | None]:
        if isinstance(value, str):
            if not value.strip():
                raise self.refused(f"'{key}'", "is an empty prompt: give every record a prompt")
            return value, None
        if isinstance(value, list | tuple) and value:
            messages = tuple(self.message(m, key, i) for i, m in enumerate(value))
            return messages[-1][1], messages
        raise self.refused(
            f"'{key}'",
            f"is {_shown(value)}: a prompt is a string or a list of chat messages "
            '({"role": ..., "content": ...})',
        )

    def message(self, value: Any, key: str, position: int) -> tuple[str, str]:
        if (
            isinstance(value, dict)
            and isinstance(value.get("role"), str)
            and isinstance(value.get("content"), str)
        ):
            return value["role"], value["content"]
        raise self.refused(
            f"'{key}'[{position}]",
            f'is {_shown(value)}: each chat message is {{"role": <str>, "content": <str>}}',
        )

    def answer(self, value: Any, key: str) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise self.refused(
            f"'{key}'",
            f"is {_shown(value)}: a reference answer is a string or a number; fix or drop the record",
        )


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
