"""Prefill graphs in the HF strategy: the switch and its sizes checked and refused on the CPU,
the graph modes the planner sees, and on the SIMULATED NPU (a process of its own) greedy output
equal to the eager prefill, sizes fitted to the graph budget, capture again after a reload."""

import re

import pytest

import roll_device as rd
from roll_device.errors import ConfigError
from roll_device.graph import default_prefill_sizes
from strategies.base import NO_GRAPHS
from strategies.inference.hf import HfStrategy
from tests.configs import rollout_settings
from tests.isolated import run_isolated


def test_prefill_graphs_are_refused_where_the_platform_has_none(tiny_model_path):
    strategy = HfStrategy(rd.get_platform("cpu"))
    with pytest.raises(
        ConfigError,
        match=r"^rollout.prefill_graphs=true but platform 'cpu' has no device graphs: "
        r"set rollout.prefill_graphs to false$",
    ):
        strategy.initialize(tiny_model_path, rollout_settings("hf", prefill_graphs=True))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"prefill_graphs": 1}, "rollout.prefill_graphs=1: input should be a valid boolean"),
        (
            {"prefill_capture_sizes": [16]},
            (
                "rollout.prefill_capture_sizes is set but rollout.prefill_graphs is false: set "
                "prefill_graphs to true or prefill_capture_sizes to null"
            ),
        ),
        (
            {
                "prefill_graphs": True,
                "max_batch_size": 2,
                "max_model_len": 8,
                "prefill_capture_sizes": [8, 32],
            },
            "rollout.prefill_capture_sizes has 32, larger than max_batch_size x max_model_len = 16: drop it",
        ),
        (
            {"prefill_graphs": True, "prefill_capture_sizes": [16, 16]},
            "rollout.prefill_capture_sizes lists a size twice",
        ),
    ],
)
def test_bad_prefill_settings_are_refused_when_the_section_is_read(changes, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        rollout_settings("hf", **changes)


def test_prefill_sizes_default_to_powers_of_two_up_to_1024_tokens():
    assert default_prefill_sizes(100_000) == [16, 32, 64, 128, 256, 512, 1024]
    assert default_prefill_sizes(200) == [16, 32, 64, 128, 200]
    settings = rollout_settings("hf", prefill_graphs=True, max_batch_size=2, max_model_len=20)
    assert settings.prefill_sizes() == [16, 32, 40]


def test_graph_modes_the_planner_sees():
    assert HfStrategy.requirements("cpu").graph_modes == (NO_GRAPHS,)
    with pytest.raises(
        ConfigError,
        match=r"^rollout.prefill_graphs=true but kind 'cpu' has no device graphs: set rollout.prefill_graphs to false$",
    ):
        HfStrategy.settings_need("cpu", rollout_settings("hf", prefill_graphs=True))
    assert set(HfStrategy.requirements("npu").graph_modes) == {
        "NONE",
        "FULL_DECODE_ONLY",
        "PIECEWISE",
        "FULL_AND_PIECEWISE",
    }
    modes = {
        (use, prefill): HfStrategy.settings_need(
            "npu", rollout_settings("hf", use_graphs=use, prefill_graphs=prefill)
        ).graph_mode
        for use in (None, True, False)
        for prefill in (True, False)
    }
    assert modes == {
        (None, True): "PIECEWISE",
        (None, False): "NONE",
        (True, True): "FULL_AND_PIECEWISE",
        (True, False): "FULL_DECODE_ONLY",
        (False, True): "PIECEWISE",
        (False, False): "NONE",
    }


@pytest.fixture(scope="module")
def sim(tiny_model_path):
    return run_isolated(
        "tests.strategies.inference.prefill_sim_checks:hf_prefill_graphs", tiny_model_path, timeout=300
    )


def test_greedy_with_prefill_graphs_equals_the_eager_prefill_on_the_simulated_npu(sim):
    assert sim["platform"] == "npu (simulated)" and sim["greedy_prefill_graphs_equal_eager"]


def test_prefill_graphs_are_captured_again_after_a_reload(sim):
    assert sim["default_sizes"] == [16, 32, 64]  # 4 rows x 16 tokens at most
    assert sim["graphs"] == [[4, 2, 1], 3 * 3]  # 2 layers: 3 pieces per token-count bucket
    assert sim["offloaded_prefill"] and sim["recaptured"] == [64, 32, 16]
    assert sim["same_after_reload"]


def test_prefill_sizes_share_the_graph_budget_with_decode_by_the_shared_rule(sim):
    assert sim["thinned_sizes"] == [16, 64]  # 10 graphs - 3 decode = 7: room for two sizes of 3
    assert sim["over_budget"] == (
        "ConfigError: rollout.prefill_capture_sizes [16, 32, 64] need 9 graphs (3 per size), over the "
        "device's budget of 7: list at most 2 sizes or set rollout.prefill_graphs=false"
    )
