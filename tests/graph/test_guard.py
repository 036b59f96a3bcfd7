"""The graph guard's rule (roll_device/graph/guard.py) on a toy engine whose "graph" reads a copy of
its weight taken when it was captured, as a stale weight-derived cache does: a check that passes
says nothing; a mismatch re-captures, or goes eager where re-capture cannot cure it or the engine
cannot re-capture, said in one line naming the model and the weights version; an engine without
graphs says why, once."""

import logging

import pytest
import torch

from roll_device.graph.guard import (
    EAGER,
    NO_GRAPHS,
    PASSED,
    RECAPTURED,
    TOLERANCES,
    GraphGuard,
    probe_prompt,
    probe_tokens,
    step_record,
    tolerance_for,
)


class ToyEngine:
    """Log-probabilities of a linear model; captured, it reads `captured` (the weight as it was at
    capture, when `copies_at_capture`), eagerly the weight itself."""

    def __init__(self, copies_at_capture: bool = True, cured_by_recapture: bool = True) -> None:
        self.weight = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
        self.copies, self.cured = copies_at_capture, cured_by_recapture
        self.graphs = True
        self.captured = self.weight.clone() if copies_at_capture else self.weight
        self.recaptures = 0

    def probe(self, eager: bool) -> torch.Tensor:
        weight = self.weight if eager or not self.graphs else self.captured
        return (torch.ones(16) @ weight.T).log_softmax(-1)

    def recapture(self) -> None:
        self.recaptures += 1
        if self.cured:
            self.captured = self.weight.clone() if self.copies else self.weight

    def go_eager(self) -> None:
        self.graphs = False

    def guard(self, recapture: bool = True, dtype=torch.float32) -> GraphGuard:
        return GraphGuard(
            "toy",
            dtype,
            probe=self.probe,
            graphs_on=lambda: self.graphs,
            go_eager=self.go_eager,
            recapture=self.recapture if recapture else None,
        )


@pytest.fixture
def said(caplog):
    caplog.set_level(logging.WARNING, logger="roll_device.graph.guard")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "roll_device.graph.guard"]


def test_graphs_that_read_the_weights_pass_silently(said):
    engine = ToyEngine(copies_at_capture=False)
    guard = engine.guard()
    engine.weight.mul_(3.0)  # an update in place: the graph reads it
    report = guard.check(version=4)
    assert (report.status, report.version, report.max_error) == (PASSED, 4, 0.0)
    assert said() == [] and engine.recaptures == 0 and engine.graphs


def test_a_stale_copy_is_caught_and_recaptured(said):
    engine = ToyEngine()
    guard = engine.guard()
    engine.weight.mul_(3.0)
    report = guard.check(version=7)
    assert report.status == RECAPTURED and engine.recaptures == 1 and engine.graphs
    assert report.max_error > TOLERANCES[torch.float32]
    line = (
        f"graph guard: model toy, weights version 7: graphs differ from eager by {report.max_error:.3g} "
        "(tolerance 0.001) after the weight update; re-captured, the new graphs agree"
    )
    assert said() == [line]
    assert guard.check(version=8).status == PASSED


def test_what_recapture_cannot_cure_goes_eager_for_good(said):
    engine = ToyEngine(cured_by_recapture=False)
    guard = engine.guard()
    engine.weight.mul_(3.0)
    report = guard.check(version=2)
    assert report.status == EAGER and engine.recaptures == 1 and not engine.graphs
    assert said()[-1].endswith("after the weight update; running eager for the rest of the run")
    later = guard.check(version=3)
    assert (later.status, later.max_error) == (EAGER, None) and len(said()) == 1


def test_an_engine_that_cannot_recapture_goes_eager(said):
    engine = ToyEngine()
    guard = engine.guard(recapture=False)
    engine.weight.mul_(3.0)
    assert guard.check(version=1).status == EAGER and not engine.graphs and engine.recaptures == 0


def test_an_engine_without_graphs_says_why_once():
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("roll_device.graph.guard").addHandler(handler)
    try:
        guard = GraphGuard(
            "toy", "bfloat16", probe=None, graphs_on=lambda: "no device graphs here", go_eager=None
        )
        first, second = guard.check(version=1), guard.check(version=2)
    finally:
        logging.getLogger("roll_device.graph.guard").removeHandler(handler)
    assert first.status == second.status == NO_GRAPHS and first.reason == "no device graphs here"
    assert logged == ["graph guard: model toy, weights version 1: no graphs to check (no device graphs here)"]


def test_a_small_difference_within_the_dtypes_tolerance_passes():
    engine = ToyEngine()
    engine.weight[0].add_(1e-3)  # one logit moves by 0.016: past fp32's tolerance, within bf16's
    assert engine.guard(dtype=torch.bfloat16).check(version=1).status == PASSED
    assert engine.guard(dtype=torch.float32).check(version=1).status == RECAPTURED


def test_tolerances_live_in_one_table():
    assert tolerance_for("float32") < tolerance_for(torch.float16) <= tolerance_for("bfloat16")
    with pytest.raises(ValueError, match="no tolerance for dtype torch.int8"):
        tolerance_for(torch.int8)


def test_the_probe_stays_inside_the_vocabulary():
    for vocab in (2, 50, 151936):
        ids = probe_prompt(vocab) + probe_tokens(vocab)
        assert all(0 <= i < vocab for i in ids)
    assert len(set(probe_tokens(50))) == len(probe_tokens(50))


def test_a_steps_record_keeps_its_engines_worst():
    passed = {"status": PASSED, "max_error": 1e-6}
    eager = {"status": EAGER, "max_error": 0.3}
    assert step_record([passed, eager, passed]) == {
        "status": EAGER,
        "engines": {PASSED: 2, EAGER: 1},
        "max_error": 0.3,
    }
    assert step_record([{"status": NO_GRAPHS, "max_error": None}]) == {
        "status": NO_GRAPHS,
        "engines": {NO_GRAPHS: 1},
        "max_error": None,
    }
    assert step_record([None, None]) is None
