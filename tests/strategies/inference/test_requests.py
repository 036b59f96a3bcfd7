"""Generation requests are checked before any work: sampling ranges, prompts, context length."""

import pytest

from roll_device.errors import ConfigError
from strategies.base import SamplingConfig
from strategies.inference.requests import check_request


@pytest.mark.parametrize(
    "sampling, message",
    [
        (SamplingConfig(n=0), "sampling.n must be a positive integer"),
        (SamplingConfig(max_tokens=0), "sampling.max_tokens must be a positive integer"),
        (SamplingConfig(temperature=-0.5), "temperature must be >= 0"),
        (SamplingConfig(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (SamplingConfig(top_k=0), "top_k must be -1"),
    ],
)
def test_bad_sampling(sampling, message):
    with pytest.raises(ConfigError, match=message):
        check_request([[1, 2]], sampling, max_model_len=64, vocab_size=10)


@pytest.mark.parametrize(
    "prompts, message",
    [
        ([[1], []], "prompt 1 is empty"),
        ([[1, 10]], r"prompt 0 has token ids outside the vocabulary \[0, 10\): \[10\]"),
        ([[-1]], "outside the vocabulary"),
        ([[1] * 60], "prompt 0 has 60 tokens; with max_tokens=8 that exceeds max_model_len=64"),
    ],
)
def test_bad_prompts(prompts, message):
    with pytest.raises(ConfigError, match=message):
        check_request(prompts, SamplingConfig(max_tokens=8), max_model_len=64, vocab_size=10)


def test_good_request_passes():
    check_request([[1, 2], [3] * 56], SamplingConfig(max_tokens=8, top_k=5, top_p=0.9), 64, 10)
