"""Prompt text -> token ids for the rollout engines, and the ids that end a response.

With `model.chat_template` on (the default) and a tokenizer that has a chat template (instruct
models), a prompt is sent as one user message rendered by that template with the generation
prompt appended, as ROLL and verl do; otherwise it is the tokenizer's BOS token (if any) and the
raw text. Responses stop at the tokenizer's EOS and at every EOS id of the model's
`generation_config.json` (chat models end turns with their own token, e.g. `<|im_end|>`).
"""

from __future__ import annotations

from dataclasses import dataclass


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
    def __init__(self, tokenizer, use_chat_template: bool = True, model_path: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.tokens = Tokens.from_tokenizer(tokenizer, model_path)
        self.chat = bool(use_chat_template and getattr(tokenizer, "chat_template", None))

    def render(self, prompt: str) -> str:
        """The text the engine sees for `prompt` (the chat template's rendering when on)."""
        if not self.chat:
            return prompt
        messages = [{"role": "user", "content": prompt}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def decode(self, responses: list[list[int]]) -> list[str]:
        """Response ids as the reward reads them: text without special tokens."""
        return self.tokenizer.batch_decode(responses, skip_special_tokens=True)

    def encode(self, prompt: str) -> list[int]:
        ids = self.tokenizer(self.render(prompt), add_special_tokens=False).input_ids
        if self.chat or self.tokens.bos is None:
            return ids  # a chat template writes its own leading tokens
        return [self.tokens.bos, *ids]
