"""Prompt text -> token ids for the rollout engines, and the ids that end a response.

With `model.chat_template` on (the default) and a tokenizer that has a chat template (instruct
models), a prompt is sent as one user message rendered by that template with the generation prompt
appended, as ROLL and verl do (with `model.chat_template_kwargs` as the template's variables, verl's
`apply_chat_template_kwargs`: Qwen3's `enable_thinking`); otherwise it is the tokenizer's BOS token
(if any) and the raw text.
A prompt the data gives as chat messages (roll_device/inputs/fields.py) is rendered by the template
as it is; without a template it is refused. Responses stop at the tokenizer's EOS and at every EOS
id of the model's `generation_config.json` (chat models end turns with their own token, e.g.
`<|im_end|>`).

A tokenizer with an unknown token (the tiny character tokenizer's is `<pad>`; byte-level ones have
none) turns characters it does not know into that token, which decodes to nothing: the model never
sees them. The encoder warns (`warnings`) naming them, once per character it has not yet named.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from roll_device.errors import ConfigError


@dataclass(frozen=True)
class Tokens:
    """The token ids the loop needs from the tokenizer."""

    pad: int
    eos: int
    bos: int | None
    stop: tuple[int, ...]  # ids that end a response

    @classmethod
    def from_tokenizer(cls, tokenizer, model_path: str | None = None) -> Tokens:
        eos = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        stop = dict.fromkeys([eos, *_generation_eos_ids(model_path)])
        return cls(pad=pad, eos=eos, bos=tokenizer.bos_token_id, stop=tuple(stop))


def _generation_eos_ids(model_path: str | None) -> list[int]:
    if model_path is None:
        return []
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's EOS is the only stop
        return []
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


class PromptEncoder:
    def __init__(
        self,
        tokenizer,
        use_chat_template: bool = True,
        model_path: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.tokens = Tokens.from_tokenizer(tokenizer, model_path)
        self.use_chat_template = use_chat_template
        self.chat = bool(use_chat_template and getattr(tokenizer, "chat_template", None))
        self.unknown = _unknown_token(tokenizer)
        self._named: set[str] = set()  # unknown characters a warning already named

    def render(self, prompt: str, messages: list[dict[str, str]] | None = None) -> str:
        """The text the engine sees for `prompt`, or for its chat `messages` when the data gives them
        (the chat template's rendering when on)."""
        if messages is not None and not self.chat:
            why, fix = (
                ("the model's tokenizer has none", "use a model whose tokenizer has one (model.path)")
                if self.use_chat_template
                else ("model.chat_template=false", "set model.chat_template=true")
            )
            raise ConfigError(
                f"the data's prompts are chat messages, which need a chat template, but {why}: {fix}, "
                "or give the prompts as text"
            )
        if not self.chat:
            return prompt
        messages = messages or [{"role": "user", "content": prompt}]
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.template_kwargs
        )

    def decode(self, responses: list[list[int]]) -> list[str]:
        """Response ids as the reward reads them: text without special tokens."""
        return self.tokenizer.batch_decode(responses, skip_special_tokens=True)

    def encode(self, prompt: str, messages: list[dict[str, str]] | None = None) -> list[int]:
        text = self.render(prompt, messages)
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if self.unknown is not None and self.tokenizer.convert_tokens_to_ids(self.unknown) in ids:
            self._warn_unknown(text)
        if self.chat or self.tokens.bos is None:
            return ids  # a chat template writes its own leading tokens
        return [self.tokens.bos, *ids]

    def _warn_unknown(self, text: str) -> None:
        """Name the characters of `text` the tokenizer encodes as its unknown token, those not named before."""
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        unknown_id = self.tokenizer.convert_tokens_to_ids(self.unknown)
        found = {text[a:b] for i, (a, b) in zip(encoded.input_ids, encoded.offset_mapping) if i == unknown_id}
        new = sorted(found - self._named)
        if not new:
            return
        self._named.update(new)
        warnings.warn(
            f"the tokenizer does not know {', '.join(map(repr, new))} (in prompt {text[:60]!r}): it encodes "
            f"them as {self.unknown!r}, which decodes to nothing, so the model never sees them; write the "
            "prompts in characters it knows, or use a model whose tokenizer knows them (model.path)",
            stacklevel=3,
        )


def _unknown_token(tokenizer) -> str | None:
    """The token a tokenizer gives text it does not know (None: it knows all text, as byte-level
    tokenizers do); a fast tokenizer's model holds it where the tokenizer does not name one."""
    model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    return tokenizer.unk_token or getattr(model, "unk_token", None)
