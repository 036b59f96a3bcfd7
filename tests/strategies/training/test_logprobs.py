"""Token logprobs from logits (strategies/training/logprobs.py) against float64: the fp32 result
stays within a few ulps of the exact value at a real model's vocabulary size."""

import torch

from strategies.training.logprobs import next_token_logprobs

VOCAB = 37_984  # a quarter of Qwen2.5's: large enough for a strided reduction to lose precision


def test_next_token_logprobs_are_as_exact_as_fp32_allows():
    torch.manual_seed(0)
    logits = torch.randn(2, 64, VOCAB) * 4
    labels = torch.randint(0, VOCAB, (2, 64))
    exact = logits.double().log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    got = next_token_logprobs(logits, labels)
    assert got.dtype == torch.float32 and got.shape == (2, 64)
    assert (got.double() - exact).abs().max().item() < 2e-5  # the transposed cross-entropy: 1.2e-4
