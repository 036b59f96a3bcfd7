"""Rewards from a reward model (`roles.reward.strategy=model`, `reward.model_path`): a Hugging Face
sequence-classification checkpoint with one label, as the Bradley-Terry reward models of
InstructGPT (Ouyang et al. 2022, arXiv 2203.02155) and the Skywork-Reward checkpoints are saved.

- Each prompt and response is one conversation, `[user: prompt, assistant: response]` (a record's
  chat messages in place of the user's turn), rendered by the reward model's own chat template:
  its tokenizer may differ from the policy's, as verl re-renders for its reward models. Without a
  template, the prompt's text followed by the response.
- The reward is the head's output at the conversation's last token (the paper's scalar). The
  conversations are left-padded in micro-batches and fed as embeddings with their own positions, so
  the last position is each one's last token whatever its id (transformers' pooling looks for the
  last token that is not the pad id, which misses a conversation that ends with it).
- `check_reward_model_dir` refuses, before Ray, a folder that is not such a checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch

from roll_device.errors import ConfigError
from roll_device.inputs.rewards import FLOAT32_MAX, RewardFunctionError, Scoring, shown_sample
from roll_device.models.hf_dir import TOKENIZER_FILES

CLASSIFIER_SUFFIX = "ForSequenceClassification"


def check_reward_model_dir(path: str, longest: int) -> None:
    """`reward.model_path` holds a sequence-classification model with one label and a tokenizer,
    whose positions reach `longest` tokens (`rollout.max_model_len`: a prompt and its response)."""
    folder = Path(path).expanduser()
    fix = "give a reward model saved with save_pretrained (a *ForSequenceClassification with num_labels=1)"
    if not (folder / "config.json").is_file():
        what = "does not exist" if not folder.exists() else "has no config.json"
        raise ConfigError(f"reward.model_path={path} {what}: {fix}")
    config = json.loads((folder / "config.json").read_text())
    architectures = config.get("architectures") or []
    if not any(name.endswith(CLASSIFIER_SUFFIX) for name in architectures):
        raise ConfigError(
            f"reward.model_path={path} is a {', '.join(architectures) or 'model'}, not a reward model: {fix}"
        )
    labels = len(config.get("id2label") or {}) or config.get("num_labels", 2)  # transformers' default: 2
    if labels != 1:
        raise ConfigError(f"reward.model_path={path} has {labels} labels, a reward model one: {fix}")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"reward.model_path={path} has no tokenizer: save the reward model's tokenizer beside it"
        )
    positions = config.get("max_position_embeddings")
    if positions is not None and positions < longest:
        raise ConfigError(
            f"reward.model_path={path} reads at most {positions} tokens (max_position_embeddings), and a prompt "
            f"with its response may take rollout.max_model_len={longest}: set rollout.max_model_len to "
            f"{positions} or less, or use a reward model with a longer context"
        )


def conversation(item: Scoring) -> list[dict[str, str]]:
    """The prompt (its chat messages, else the user's text) and the response as the assistant's."""
    asked = [{"role": role, "content": text} for role, text in item.messages or (("user", item.prompt),)]
    return [*asked, {"role": "assistant", "content": item.response}]


class RewardModel:
    """A reward model on `device` (its weights in `dtype`) that scores `micro_batch_size`
    conversations a forward."""

    def __init__(self, path: str, device: torch.device, dtype: str, micro_batch_size: int) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        # fed as embeddings (the module's docstring says why), transformers warns it cannot see padding
        logging.getLogger("transformers.modeling_layers").setLevel(logging.ERROR)
        self.path, self.device, self.micro_batch_size = path, device, micro_batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype).to(device).eval()
        if self.model.config.pad_token_id is None:  # a batch needs one, unused with embeddings
            self.model.config.pad_token_id = 0

    def token_ids(self, item: Scoring) -> list[int]:
        """The conversation's tokens, rendered by the reward model's chat template if it has one."""
        if self.tokenizer.chat_template is None:
            return self.tokenizer(item.prompt + item.response)["input_ids"]
        return self.tokenizer.apply_chat_template(conversation(item), tokenize=True, return_dict=True)[
            "input_ids"
        ]

    @torch.no_grad()
    def forward(self, rows: list[list[int]]) -> list[float]:
        """The head's output at each row's last token (rows left-padded into one batch)."""
        width = max(len(row) for row in rows)
        ids = torch.tensor([[0] * (width - len(row)) + row for row in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows], device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        embeds = self.model.get_input_embeddings()(ids)
        out = self.model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions)
        return out.logits[:, 0].float().tolist()

    def score(self, items: list[Scoring]) -> list[float]:
        """One reward per item, in order; a conversation longer than the model's positions (its
        template's tokens beyond `rollout.max_model_len`) or a score not finite in float32 is refused."""
        rows = [self.token_ids(item) for item in items]
        positions = getattr(self.model.config, "max_position_embeddings", None)
        for item, row in zip(items, rows):
            if positions is not None and len(row) > positions:
                raise RewardFunctionError(
                    f"reward.model_path={self.path} reads at most {positions} tokens, and {shown_sample(item)} "
                    f"renders to {len(row)}: lower rollout.max_model_len; the step was not trained on"
                )
        scores = []
        for start in range(0, len(rows), self.micro_batch_size):
            scores += self.forward(rows[start : start + self.micro_batch_size])
        for item, value in zip(items, scores):
            if not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
                raise RewardFunctionError(
                    f"reward.model_path={self.path} scored {value!r} on {shown_sample(item)}: a reward must be "
                    "finite (in float16 a large score overflows: try reward.dtype=bfloat16 or float32); the "
                    "step was not trained on"
                )
        return scores
