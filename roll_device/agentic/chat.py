"""The chat rendered turn by turn with a chat template, as token ids.

`ChatRenderer.first(messages)` is the first prompt (the template's rendering with the tools and
the generation prompt; every rendering with `model.chat_template_kwargs` as the template's variables). After each model turn, `after_model(history, text, stop_text, new)` is
the environment's part of the context: what the template writes after the model's text (the end
of its turn, less the stop token the model generated itself), then the new messages (tool results,
the environment's observation) and the next generation prompt, all as the difference of two
renderings. The model's own tokens are never re-tokenised: they are kept as the engine made them.

The tiny model's character tokenizer has no template; `agentic.chat_template=tiny` gives it
`TINY_TEMPLATE` (its characters only: `tools:calc.u:3+4.a:calc?3+4<eos>t:7.a:7<eos>`).
"""

from __future__ import annotations

from typing import Any

from roll_device.agentic.tool_calls import TINY_MARK, format_of
from roll_device.errors import ConfigError

TINY_TEMPLATE = (
    TINY_MARK + "{%- if tools -%}tools:{%- for t in tools -%}{{ t.function.name }}{{ ',' if not loop.last }}"
    "{%- endfor -%}.{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}a:{{ m.content }}<eos>"
    "{%- else -%}{{ m.role[0] }}:{{ m.content }}.{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}a:{%- endif -%}"
)
TEMPLATES = {"tiny": TINY_TEMPLATE}
PROBE = "zq"  # an assistant text no template writes itself


def template_of(tokenizer, name: str | None) -> str | None:
    """The chat template the run renders with: `agentic.chat_template`'s, or the tokenizer's."""
    if name is None:
        return getattr(tokenizer, "chat_template", None)
    if name not in TEMPLATES:
        raise ConfigError(f"agentic.chat_template='{name}' is unknown: choose {', '.join(TEMPLATES)} or null")
    return TEMPLATES[name]


class ChatRenderer:
    """Messages -> token ids with one chat template (see the module docstring)."""

    def __init__(
        self,
        tokenizer,
        template_name: str | None,
        tools: list[dict[str, Any]],
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer, self.tools = tokenizer, tools or None
        self.template_kwargs = dict(template_kwargs or {})
        self.template = template_of(tokenizer, template_name)
        where = (
            f"agentic.chat_template='{template_name}'" if template_name else "the tokenizer's chat template"
        )
        if not self.template:
            raise ConfigError(
                "agentic rollouts render the chat with a chat template, but the tokenizer has none: "
                "set agentic.chat_template=tiny (the tiny model) or use a chat model (model.path)"
            )
        self.tool_format = format_of(self.template)
        if tools and ("tools" not in self.template or self.tool_format is None):
            raise ConfigError(
                f"agentic.tools is set but {where} has no tool support (no tool list or tool-call "
                "format it writes): use a template with tools (Qwen2.5's, agentic.chat_template=tiny) "
                "or agentic.tools=[]"
            )
        self.turn_end = self._turn_end()

    def render(self, messages: list[dict[str, Any]], generation: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=self.tools,
            chat_template=self.template,
            tokenize=False,
            add_generation_prompt=generation,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def first(self, messages: list[dict[str, Any]]) -> list[int]:
        return self.encode(self.render(messages, generation=True))

    def _turn_end(self) -> str:
        """What the template writes after an assistant message's text."""
        text = self.render([{"role": "user", "content": "x"}, {"role": "assistant", "content": PROBE}], False)
        return text[text.rindex(PROBE) + len(PROBE) :]

    def after_model(
        self, history: list[dict[str, Any]], text: str, stop_text: str, new: list[dict[str, Any]]
    ) -> list[int]:
        """The token ids of the environment's part after a model turn whose text is `text` (ended by
        the stop token that decodes as `stop_text`, "" when cut off), with `new` messages after it."""
        turn = [*history, {"role": "assistant", "content": text}]
        before, after = self.render(turn, False), self.render([*turn, *new], True)
        if not after.startswith(before):
            raise ConfigError(
                "the chat template renders earlier turns differently once more follow: it cannot be "
                "rendered turn by turn; use another template (agentic.chat_template)"
            )
        closing = (
            self.turn_end[len(stop_text) :]
            if stop_text and self.turn_end.startswith(stop_text)
            else self.turn_end
        )
        return self.encode(closing + after[len(before) :])
