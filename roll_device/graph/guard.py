"""The graph guard: after a weight update, an engine's captured graphs are checked against an eager
step with the new weights, on one small probe (a fixed prompt; the log-probabilities of a few fixed
tokens at the prefill's last position and at one decode step).

A graph reads the addresses it was captured with. An update that copies into the same tensors is
seen by the next replay; one that leaves a graph reading a tensor the update did not write (a
weight replaced instead of copied into, a copy transformed from the weights when the graph was
captured: a layout cast, an absorbed projection, a pre-cast fp32 copy) is not, and the graph goes
on computing the old weights. vLLM-Ascend keeps ACL graphs off in RL for many models for this
reason (its RFC #16322; point fixes #7473, #13902, #15666).

`GraphGuard.check(version)` compares the two; past the dtype's tolerance (`TOLERANCES`, the one
table) it re-captures where the engine can and checks again, and where that is not possible or not
enough it switches the engine to eager for the rest of the run. Either way it says so in one line
naming the model and the weights version, and returns a `GuardReport` for the step's record. A
check that passes says nothing. An engine without graphs reports `no graphs` (with the reason),
once in words and then only in the record: nothing was checked, and the report says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

log = logging.getLogger(__name__)

# The largest |graph - eager| over the probe's log-probabilities that still counts as the same
# weights. fp32: the same kernels replayed agree to rounding; bf16/fp16: a captured step and an
# eager one may pick other kernels (a packed prefill, another attention split) and round apart.
TOLERANCES = {torch.float64: 1e-3, torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 6e-2}
PROBE_PROMPT_LENGTH = 6  # shorter than a KV-cache block: nothing of it is served from a prefix cache
PROBE_TOKENS = 4  # log-probabilities compared per position

PASSED = "passed"  # graphs agree with eager: nothing said
RECAPTURED = "recaptured"  # graphs disagreed; captured again, and the new ones agree
EAGER = "eager"  # graphs disagreed (or re-capture did not help): eager for the rest of the run
NO_GRAPHS = "no graphs"  # nothing captured: nothing to check


def tolerance_for(dtype: torch.dtype | str) -> float:
    """The guard's tolerance for an engine computing in `dtype` (a torch dtype or its name)."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if dtype not in TOLERANCES:
        raise ValueError(
            f"the graph guard has no tolerance for dtype {dtype}: one of {sorted(map(str, TOLERANCES))}"
        )
    return TOLERANCES[dtype]


def probe_prompt(vocab_size: int) -> list[int]:
    """The probe's prompt: fixed ids spread over the vocabulary (id 0 left out: often padding)."""
    return [1 + (i * 7919) % (vocab_size - 1) for i in range(PROBE_PROMPT_LENGTH)]


def probe_tokens(vocab_size: int) -> list[int]:
    """The ids whose log-probabilities the probe compares: spread evenly over the vocabulary."""
    return [(i * vocab_size) // PROBE_TOKENS for i in range(PROBE_TOKENS)]


@dataclass
class GuardReport:
    """What the guard found after one weight update: `status` (PASSED, RECAPTURED, EAGER,
    NO_GRAPHS), the model, the weights version, the largest difference the probe saw (None where
    nothing was compared), the tolerance, and the reason where there were no graphs."""

    status: str
    model: str
    version: int | None
    max_error: float | None = None
    tolerance: float | None = None
    reason: str | None = None

    def line(self) -> str:
        """The one line a user reads (a check that passed has nothing to say, but has a line)."""
        where = f"graph guard: model {self.model}, weights version {self.version}"
        if self.status == NO_GRAPHS:
            return f"{where}: no graphs to check ({self.reason})"
        if self.status == EAGER and self.max_error is None:
            return f"{where}: running eager since an earlier mismatch, nothing to check"
        seen = f"graphs differ from eager by {self.max_error:.3g} (tolerance {self.tolerance:g})"
        if self.status == RECAPTURED:
            return f"{where}: {seen} after the weight update; re-captured, the new graphs agree"
        if self.status == EAGER:
            return f"{where}: {seen} after the weight update; running eager for the rest of the run"
        return f"{where}: graphs agree with eager ({self.max_error:.3g} <= {self.tolerance:g})"

    def as_dict(self) -> dict:
        return asdict(self)


SEVERITY = (NO_GRAPHS, PASSED, RECAPTURED, EAGER)  # a step's record keeps its engines' worst


def step_record(reports: list[dict | None]) -> dict | None:
    """One step's `graph_guard` record from its engines' reports (each rollout worker's sync result
    carries one): the worst status, the engines at each status, the largest difference seen. None
    where no engine declares a guard."""
    found = [r for r in reports if r is not None]
    if not found:
        return None
    errors = [r["max_error"] for r in found if r["max_error"] is not None]
    return {
        "status": max((r["status"] for r in found), key=SEVERITY.index),
        "engines": {s: n for s in SEVERITY if (n := sum(r["status"] == s for r in found))},
        "max_error": max(errors, default=None),
    }


Probe = Callable[[bool], torch.Tensor]  # probe(eager) -> the probe's log-probabilities, on the CPU


class GraphGuard:
    """The check an engine runs after each weight update (see the module docstring).

    `probe(eager)`: the probe's log-probabilities through the engine's graphs (`eager=False`) or
    eagerly with the same weights (`eager=True`); `graphs_on()`: whether the engine replays graphs
    now (or why not: a string is the reason there are none); `recapture()`: capture every graph
    again (None: the engine cannot); `go_eager()`: stop using graphs for the rest of the run."""

    def __init__(
        self,
        model: str,
        dtype: torch.dtype | str,
        probe: Probe,
        graphs_on: Callable[[], bool | str],
        go_eager: Callable[[], None],
        recapture: Callable[[], None] | None = None,
    ) -> None:
        self.model, self.tolerance = model, tolerance_for(dtype)
        self._probe, self._graphs_on = probe, graphs_on
        self._recapture, self._go_eager = recapture, go_eager
        self.went_eager = False
        self._said_no_graphs = False

    def check(self, version: int | None) -> GuardReport:
        """Graphs against eager after the update to weights `version`; re-capture or eager on a
        mismatch (said in one line); the report for the step's record."""
        on = self._graphs_on()
        if on is not True:
            return self._without_graphs(version, on)
        error = self.difference()
        if error <= self.tolerance:
            return self._report(PASSED, version, error)
        if self._recapture is not None:
            self._recapture()
            if self.difference() <= self.tolerance:
                return self._said(self._report(RECAPTURED, version, error))
        self._go_eager()
        self.went_eager = True
        return self._said(self._report(EAGER, version, error))

    def difference(self) -> float:
        """The largest |graph - eager| over the probe's log-probabilities."""
        graphs, eager = self._probe(False), self._probe(True)
        return float((graphs - eager).abs().max())

    def _without_graphs(self, version: int | None, why: bool | str) -> GuardReport:
        if self.went_eager:
            return self._report(EAGER, version, None)
        report = self._report(NO_GRAPHS, version, None, reason=why or "the engine captures none")
        if not self._said_no_graphs:  # once in words; every later sync in the record only
            self._said_no_graphs = True
            log.warning(report.line())
        return report

    def _report(self, status: str, version, error, reason: str | None = None) -> GuardReport:
        return GuardReport(status, self.model, version, error, self.tolerance, reason)

    @staticmethod
    def _said(report: GuardReport) -> GuardReport:
        log.warning(report.line())
        return report
