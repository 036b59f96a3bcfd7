"""Checks of a generation request shared by the rollout strategies, run before any work starts:
sampling values in range, token-id prompts inside the vocabulary, prompt plus response within
the engine's context length."""

from __future__ import annotations

from numbers import Integral

from roll_device.errors import ConfigError
from strategies.base import SamplingConfig


def check_sampling(sampling: SamplingConfig) -> None:
    if not isinstance(sampling.n, int) or sampling.n < 1:
        raise ConfigError(f"sampling.n must be a positive integer, got {sampling.n!r}")
    if not isinstance(sampling.max_tokens, int) or sampling.max_tokens < 1:
        raise ConfigError(f"sampling.max_tokens must be a positive integer, got {sampling.max_tokens!r}")
    if sampling.temperature < 0:
        raise ConfigError(f"sampling.temperature must be >= 0 (0 is greedy), got {sampling.temperature}")
    if not 0 < sampling.top_p <= 1:
        raise ConfigError(f"sampling.top_p must be in (0, 1], got {sampling.top_p}")
    if sampling.top_k != -1 and sampling.top_k < 1:
        raise ConfigError(f"sampling.top_k must be -1 (off) or at least 1, got {sampling.top_k}")


def check_request(
    prompt_token_ids: list[list[int]], sampling: SamplingConfig, max_model_len: int, vocab_size: int
) -> None:
    """Raise `ConfigError` naming the first bad prompt or sampling value and the fix."""
    check_sampling(sampling)
    for index, prompt in enumerate(prompt_token_ids):
        if len(prompt) == 0:
            raise ConfigError(f"prompt {index} is empty: every prompt needs at least one token")
        bad = [t for t in prompt if not isinstance(t, Integral) or not 0 <= t < vocab_size]
        if bad:
            raise ConfigError(
                f"prompt {index} has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}"
            )
        if len(prompt) + sampling.max_tokens > max_model_len:
            raise ConfigError(
                f"prompt {index} has {len(prompt)} tokens; with max_tokens={sampling.max_tokens} that "
                f"exceeds max_model_len={max_model_len}: raise rollout.max_model_len or shorten the prompt"
            )
