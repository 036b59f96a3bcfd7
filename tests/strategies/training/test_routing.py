"""A mixture of experts in the FSDP2 trainer (strategies/training/routing.py): the tiny Qwen3-MoE
loads shard by shard from its per-expert checkpoint into transformers' fused expert parameters,
exports under the HF model's own names, reports the router's load-balancing loss and the expert
load imbalance each step, trains, and the HF engine serves the export; models without experts or
a router loss on a dense model is refused before any worker starts."""

import pytest
import torch

from roll_device.errors import ConfigError
from strategies.training.fsdp import FsdpTrainStrategy
from strategies.training.local_ranks import run_ranks
from strategies.training.megatron import MegatronTrainStrategy
from strategies.training.routing import Routing
from tests.configs import trainer_settings


@pytest.fixture(scope="module")
def moe_rank(tiny_moe_path):
    (rank,) = run_ranks("tests.strategies.training.moe_checks:moe_steps", 1, tiny_moe_path)
    return rank


def test_the_sharded_moe_computes_transformers_logprobs(moe_rank):
    assert moe_rank["load_diff"] < 1e-5, "fused experts filled from the per-expert checkpoint"


def test_the_export_names_are_the_hf_models_state_dict_names(moe_rank):
    assert moe_rank["export_names"] == moe_rank["hf_names"]
    assert "model.layers.1.mlp.experts.gate_up_proj" in moe_rank["export_names"]


def test_each_step_reports_routing_and_the_loss_falls(moe_rank):
    steps = moe_rank["steps"]
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.1
    for step in steps:
        assert 1.9 < step["router_aux_loss"] < 8.0, "near top-k (2) when balanced, at most E (8)"
        assert 1.0 <= step["expert_imbalance"] <= 4.0, "between balanced and all tokens on 2 of 8"


def test_the_hf_engine_serves_the_trainers_export_greedily_as_transformers(moe_rank):
    assert moe_rank["engine_after"] == moe_rank["transformers"]
    assert moe_rank["engine_after"] != moe_rank["engine_before"], "the update reached the engine"


def test_imbalance_counts_the_top_k_choices_of_real_tokens():
    routing = Routing(top_k=2)
    logits = torch.tensor([[3.0, 2.0, 0.0, 0.0], [3.0, 0.0, 2.0, 0.0], [0.0, 0.0, 3.0, 9.0]])
    assert routing.imbalance(logits, torch.tensor([[1, 1, 0]])) == pytest.approx(2 / 1.0)
    assert routing.imbalance(logits, None) == pytest.approx(2 / 1.5)


def test_a_router_loss_on_a_dense_model_is_refused(tiny_model_path, tiny_moe_path):
    settings = trainer_settings("fsdp", router_aux_loss_coef=0.01)
    with pytest.raises(
        ConfigError, match=r"^trainer.router_aux_loss_coef=0.01: model.path=.* is a dense model"
    ):
        FsdpTrainStrategy.check_model(None, settings, tiny_model_path)
    FsdpTrainStrategy.check_model(None, settings, tiny_moe_path)


def test_megatron_takes_the_moe_and_its_router_loss(tiny_moe_path, tiny_model_path):
    settings = trainer_settings("megatron", router_aux_loss_coef=0.01)
    MegatronTrainStrategy.check_model(None, settings, tiny_moe_path)
    with pytest.raises(
        ConfigError, match=r"^trainer.router_aux_loss_coef=0.01: model.path=.* is a dense model"
    ):
        MegatronTrainStrategy.check_model(None, settings, tiny_model_path)
