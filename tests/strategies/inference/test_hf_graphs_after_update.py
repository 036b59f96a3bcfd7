"""Graphs that survive a weight update (an open problem upstream: vLLM-Ascend keeps ACL graphs off
in RL for it): the HF strategy's decode and prefill graphs, replayed after a weight update and
after offload/reload, give the greedy tokens and logprobs of an eager engine holding the same new
weights, on the SIMULATED NPU (simulated graph capture and replay; CPU compute). About 30 s of
CPU for two engines with graphs: slow-marked."""

import pytest

from roll_device.models.tiny import make_tiny_model
from tests.isolated import run_isolated

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim(tiny_model_path, tmp_path_factory):
    new = make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-seed-1", seed=1)
    return run_isolated(
        "tests.strategies.inference.graph_update_sim_checks:graphs_after_update",
        tiny_model_path,
        str(new),
        timeout=300,
    )


def test_replayed_graphs_use_the_new_weights(sim):
    assert sim["platform"] == "npu (simulated)"
    assert sim["graphs"] == [True, True] and sim["eager"] == [False, False]
    tokens = [t for t, _ in sim["updated"]]
    assert tokens != [t for t, _ in sim["before"]], "the update changed the output"
    assert tokens == [t for t, _ in sim["updated_eager"]]
    for (_, ours), (_, theirs) in zip(sim["updated"], sim["updated_eager"]):
        assert ours == pytest.approx(theirs, abs=1e-4)


def test_graphs_captured_again_after_a_reload_use_the_new_weights(sim):
    assert [t for t, _ in sim["reloaded"]] == [t for t, _ in sim["updated_eager"]]
    for (_, ours), (_, theirs) in zip(sim["reloaded"], sim["updated_eager"]):
        assert ours == pytest.approx(theirs, abs=1e-4)
