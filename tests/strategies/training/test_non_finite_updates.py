"""Both trainers refuse a policy update whose loss or gradient norm is not finite before the
optimizer applies it (Megatron itself would apply NaN gradients in bf16 and fp32): every rank
raises NonFiniteUpdateError, the weights stay as they were, and the next step is unaffected."""

from __future__ import annotations

import pytest

from strategies.training.local_ranks import run_ranks


@pytest.mark.parametrize("trainer", ["fsdp", "megatron"])
def test_a_nan_update_is_refused_on_every_rank_and_changes_nothing(tiny_model_path, trainer):
    ranks = run_ranks(
        "tests.strategies.training.non_finite_checks:refused_update", 2, tiny_model_path, trainer
    )
    for rank in ranks:
        assert rank["refused"] == (
            "the policy update was not applied: its loss is nan and its gradient norm nan, not finite numbers"
        )
        assert rank["unchanged"] == 0.0
        assert rank["after_refusal"] == pytest.approx(rank["first"], rel=1e-6)
