"""Batched token sampling for the HF strategy: greedy at temperature 0, else temperature, top-k
and top-p, each row drawn from a CPU generator of its own
(its request's seed: the samples do not depend on the rows batched with it). The log-probability reported for a drawn token follows vLLM's modes: `raw_logprobs` (the
model's own distribution, what a trainer recomputes; the default) or `processed_logprobs` (after
temperature, top-k and top-p)."""

from __future__ import annotations

import torch

from strategies.base import SamplingConfig


def _top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    if k == -1 or k >= scores.shape[-1]:
        return scores
    kth = torch.topk(scores, k, dim=-1).values[:, -1:]
    return scores.masked_fill(scores < kth, float("-inf"))


def _top_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    if p >= 1.0:
        return scores
    ordered, order = torch.sort(scores, dim=-1, descending=True)
    probs = ordered.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
    drop = before > p
    drop[:, 0] = False  # the most likely token always stays
    return scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))


def sample(
    logprobs: torch.Tensor,
    sampling: SamplingConfig,
    generators: list[torch.Generator | None],
    mode: str = "raw_logprobs",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, their log-probabilities) for each row of the (rows, vocab) raw `logprobs`; row r
    draws from `generators[r]` (None: the process's CPU generator)."""
    if sampling.temperature == 0:
        tokens = logprobs.argmax(dim=-1)
        processed = logprobs
    else:
        scores = _top_p(_top_k(logprobs / sampling.temperature, sampling.top_k), sampling.top_p)
        processed = scores.log_softmax(dim=-1)
        tokens = _inverse_cdf(processed.exp(), generators)
    source = logprobs if mode == "raw_logprobs" else processed
    return tokens, source.gather(1, tokens[:, None]).squeeze(1)


def _inverse_cdf(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row where the row's uniform draw falls in its cumulative distribution: a
    row's draw depends on its own generator only, not on the rows batched with it."""
    uniform = torch.stack([torch.rand((), generator=g) for g in generators]).to(probs.device)
    cdf = probs.cumsum(dim=-1)
    threshold = uniform[:, None] * cdf[:, -1:]
    # right=True: the first token whose cumulative mass exceeds the draw, never one of mass 0
    return torch.searchsorted(cdf, threshold, right=True).squeeze(1).clamp(max=probs.shape[-1] - 1)
