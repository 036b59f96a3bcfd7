"""The policy's per-token entropy, computed in the logprobs pass: on the plain path it equals the
entropy of transformers' own logits, and packed rows, chunked logits (chunks smaller and larger
than ENTROPY_SLICE) and both at once give the plain path's entropies and logprobs; the entropy
carries no gradient. One process, the tiny model."""

from __future__ import annotations

import pytest
import torch

from strategies.training import logprobs as lp
from tests.strategies.training.scale_checks import mixed_batch


@pytest.fixture(scope="module")
def model(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        tiny_model_path, dtype=torch.float32, attn_implementation="sdpa"
    )


def test_plain_entropy_is_that_of_the_models_logits(model):
    batch = mixed_batch(0)
    _, entropy = lp.model_logprobs(
        model, batch, torch.device("cpu"), packing=False, chunk=None, entropy=lp.METRIC
    )
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    expected = torch.distributions.Categorical(logits=logits[:, :-1]).entropy()
    real = batch.attention_mask.bool()
    real[:, 0] = False  # the first token has no predicting position
    assert torch.allclose(entropy[:, 1:][real[:, 1:]], expected[real[:, 1:]], atol=1e-5)
    assert (entropy[~real] == 0).all()
    assert entropy.shape == batch.input_ids.shape


@pytest.mark.parametrize(
    ("packing", "chunk"), [(True, None), (False, 5), (True, 3), (False, lp.ENTROPY_SLICE + 7)]
)
def test_packed_and_chunked_entropy_equal_the_plain_paths(model, packing, chunk, monkeypatch):
    monkeypatch.setattr(lp, "ENTROPY_SLICE", 4)  # slices smaller than the chunks, and the seams between
    batch = mixed_batch(1)
    cpu = torch.device("cpu")
    plain_logprobs, plain_entropy = lp.model_logprobs(model, batch, cpu, False, None, entropy=lp.METRIC)
    got_logprobs, got_entropy = lp.model_logprobs(model, batch, cpu, packing, chunk, entropy=lp.METRIC)
    assert (got_entropy - plain_entropy).abs().max() < 1e-5
    assert (got_logprobs - plain_logprobs).abs().max() < 1e-5
    assert got_logprobs.requires_grad and not got_entropy.requires_grad
    assert plain_entropy[batch.attention_mask.bool()].gt(0).any()
