"""The HF strategy's graph guard after a weight update, on the SIMULATED NPU (simulated graph capture
and replay; CPU compute): graphs captured over a stale weight-derived cache are caught, re-captured
or dropped for eager, said in one line, and the greedy tokens then equal an eager engine's with the
same weights; with nothing stale the guard passes and says nothing."""

import pytest
import torch

from roll_device.graph.guard import EAGER, NO_GRAPHS, PASSED, RECAPTURED, TOLERANCES
from roll_device.models.tiny import make_tiny_model
from tests.isolated import run_isolated

CHECKS = "tests.strategies.inference.graph_guard_sim_checks:graph_guard"


@pytest.fixture(scope="module")
def sim(tiny_model_path, tmp_path_factory):
    new = make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-seed-1", seed=1)
    return run_isolated(CHECKS, tiny_model_path, str(new), timeout=300)


def test_the_update_changes_the_eager_engines_tokens(sim):
    assert sim["platform"] == "npu (simulated)"
    assert sim["eager"]["tokens"] != sim["eager"]["before"], "the new weights must change the output"


def test_nothing_stale_passes_and_says_nothing(sim):
    clean = sim["clean"]
    assert clean["graphs"] is True
    assert clean["report"]["status"] == PASSED and clean["said"] == []
    assert clean["report"]["max_error"] <= TOLERANCES[torch.float32]
    assert clean["tokens"] == sim["eager"]["tokens"]


def test_a_cache_made_at_capture_is_caught_and_recaptured(sim):
    cured = sim["recapture"]
    assert cured["report"]["status"] == RECAPTURED and cured["graphs"] is True
    assert cured["report"]["max_error"] > cured["report"]["tolerance"]
    line = (
        f"graph guard: model {cured['report']['model']}, weights version 1: graphs differ from eager by "
        f"{cured['report']['max_error']:.3g} (tolerance 0.001) after the weight update; re-captured, "
        "the new graphs agree"
    )
    assert cured["said"] == [line]
    assert cured["tokens"] == sim["eager"]["tokens"]


def test_a_cache_recapture_cannot_cure_goes_eager_for_the_rest_of_the_run(sim):
    once = sim["once"]
    assert once["report"]["status"] == EAGER and once["graphs"] is False
    (line,) = once["said"]
    assert line.endswith("after the weight update; running eager for the rest of the run")
    assert "weights version 1" in line and once["report"]["model"] in line
    assert once["tokens"] == sim["eager"]["tokens"]
    assert once["graphs_after_reload"] is False, "a reload must not capture graphs again"
    assert once["after_reload"]["status"] == EAGER and once["after_reload"]["max_error"] is None


def test_an_engine_without_graphs_reports_so(sim):
    report = sim["eager"]
    assert (
        report["report"]["status"] == NO_GRAPHS and report["report"]["reason"] == "rollout.use_graphs=false"
    )
    line = (
        f"graph guard: model {report['report']['model']}, weights version 1: no graphs to check "
        "(rollout.use_graphs=false)"
    )
    assert report["said"] == [line]


def test_without_the_guard_the_stale_graphs_sample_other_tokens(sim):
    """What the tests above rest on: before the guard ran, the stale graphs' greedy tokens differ
    from eager (a run without the guard samples them), while the clean engine's agree."""
    assert sim["clean"]["unguarded"] == sim["eager"]["tokens"]
    assert sim["recapture"]["unguarded"] != sim["eager"]["tokens"]
    assert sim["once"]["unguarded"] != sim["eager"]["tokens"]


def test_on_the_cpu_the_guard_reports_no_graphs(hf_cpu):
    report = hf_cpu.guard_graphs(3)
    assert (report["status"], report["version"]) == (NO_GRAPHS, 3)
    assert report["reason"] == "platform 'cpu' has no device graphs" and report["max_error"] is None
