"""The FSDP trainer at real sizes, on 2 gloo ranks with the tiny model: loading shard by shard
gives the plain load's parameters, and recomputation, packing, token-budget micro-batches,
chunked logprobs and optimizer offload give the plain path's logprobs, loss, gradients and the
step's mean entropy.

Tolerances: logprobs 1e-5 (fp32 sums in another order: packed rows, chunked logits); loss 1e-6
and gradients 1e-6 against a largest gradient of about 0.05 (the same sums reordered); weights
after one AdamW step 1e-4 (Adam's first step is lr-sized, 5e-3, for any gradient not zero, so a
1e-8 change of a near-zero gradient moves its weight by far more than the gradient moved);
entropy 1e-5 (the logprobs' sums)."""

from __future__ import annotations

import pytest

from strategies.training.local_ranks import run_ranks
from tests.strategies.training.scale_checks import FEATURES


def _check_equal(result: dict) -> None:
    assert result["logprob_diff"] < 1e-5
    assert result["loss_diff"] < 1e-6
    assert result["entropy_diff"] < 1e-5 and result["entropy"] > 0  # the step's mean entropy metric
    assert result["grad_diff"] < 1e-6 and result["grad_scale"] > 1e-3
    assert result["weight_diff"] < 1e-4
    assert result["fsdp_warnings"] == []  # e.g. a view among the root's outputs


@pytest.fixture(scope="module")
def all_on(tiny_model_path):
    return run_ranks("tests.strategies.training.scale_checks:features", 2, tiny_model_path, ["all"])


def test_loading_shard_by_shard_gives_the_plain_loads_parameters(all_on):
    for rank in all_on:
        loading = rank["loading"]
        assert loading["devices"] == ["cpu"]
        assert loading["names"] == loading["plain_names"]
        assert loading["max_diff"] == 0.0 and loading["buffer_diff"] == 0.0
        assert loading["embedding_rows"] == loading["vocab"] // 2  # each rank holds its half


def test_loading_shard_by_shard_on_two_simulated_npus(tiny_model_path):
    """SIMULATED: the meta-device build and each rank's shard fill on `npu:0` and `npu:1` (hccl,
    gloo underneath) give the plain load's parameters, on the device."""
    ranks = run_ranks(
        "tests.strategies.training.scale_checks:loaded_parameters",
        2,
        tiny_model_path,
        env={"ROLL_DEVICE": "npu-sim"},
    )
    for rank, loading in enumerate(ranks):
        assert loading["devices"] == [f"npu:{rank}"]
        assert loading["names"] == loading["plain_names"]
        assert loading["max_diff"] == 0.0 and loading["buffer_diff"] == 0.0
        assert loading["embedding_rows"] == loading["vocab"] // 2


def test_every_feature_on_equals_the_plain_path(all_on):
    """Recomputation, packing in 40-token micro-batches and 5-position logprob chunks at once."""
    for rank in all_on:
        _check_equal(rank["all"])


@pytest.mark.slow
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_each_feature_alone_equals_the_plain_path(tiny_model_path, feature):
    for rank in run_ranks("tests.strategies.training.scale_checks:features", 2, tiny_model_path, [feature]):
        _check_equal(rank[feature])


@pytest.mark.slow
def test_megatron_recomputation_and_token_budget_equal_its_plain_path(tiny_model_path):
    """2 data-parallel ranks; a 48-token budget cuts the 4 rows of 16 tokens 3 + 1."""
    changes = {"recompute": True, "max_tokens_per_micro_batch": 48}
    for rank in run_ranks(
        "tests.strategies.training.scale_checks:megatron_features", 2, tiny_model_path, changes
    ):
        assert rank["how"]["recompute"] == (None, "full")
        assert rank["logprob_diff"] < 1e-5 and rank["loss_diff"] < 1e-6 and rank["grad_norm_diff"] < 1e-6
        assert rank["weight_diff"] < 1e-4


def test_chunk_logits_give_the_head_a_gradient_autograd_can_add_to_in_place():
    """The chunked head's logits equal `F.linear`'s, and the weight's gradient reaches autograd as
    a tensor of its own: `F.linear`'s is a view of another, which autograd's accumulation may not
    add to in place, so summing it with the gradient of another chunk or of a tied embedding makes
    a third [vocab x hidden] tensor."""
    import torch
    import torch.nn.functional as F

    from strategies.training.logprobs import head_logits

    g = torch.Generator().manual_seed(0)
    weight = torch.randn(50, 8, generator=g, requires_grad=True)
    bias = torch.randn(50, generator=g)
    hidden = torch.randn(2, 3, 8, generator=g)
    views = []
    weight.register_hook(lambda grad: views.append(grad._base is not None))
    for logits_of in (head_logits, F.linear):
        logits_of(hidden, weight, bias).logsumexp(-1).sum().backward()
    torch.testing.assert_close(head_logits(hidden, weight, bias), F.linear(hidden, weight, bias))
    assert views == [False, True]  # head_logits' gradient is its own tensor; F.linear's a view
