"""The graph budget rule shared by vLLM's arguments and the HF strategy's decode graphs: graphs per
capture size, derived sizes thinned to the budget, listed sizes over it refused with the fix."""

import pytest

from roll_device.errors import ConfigError
from roll_device.graph import fit_capture_sizes, graphs_per_size
from roll_device.platforms.npu import NpuPlatform

BUDGET = NpuPlatform.graph_budget
SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def test_the_npu_budget_is_vllm_ascends():
    assert BUDGET == 1800


def test_graph_cost_per_capture_size():
    assert [
        graphs_per_size(m, 28)
        for m in ("NONE", "FULL", "FULL_DECODE_ONLY", "PIECEWISE", "FULL_AND_PIECEWISE")
    ] == [0, 1, 1, 29, 30]


def test_derived_sizes_are_thinned_to_the_budget_keeping_the_largest():
    kept = fit_capture_sizes(SIZES, 301, BUDGET, explicit=False, key="k", mode="PIECEWISE")
    assert len(kept) == BUDGET // 301 == 5
    assert kept[-1] == 1024 and kept[0] == 1 and kept == sorted(kept)
    assert fit_capture_sizes(SIZES, 1, BUDGET, explicit=False, key="k", mode="FULL") == SIZES
    assert fit_capture_sizes(SIZES, 1, 3, explicit=False, key="k") == [1, 32, 1024]
    with pytest.raises(ConfigError, match="needs 2001 graphs for a single capture size"):
        fit_capture_sizes(SIZES, 2001, BUDGET, explicit=False, key="k", mode="PIECEWISE")


def test_listed_sizes_over_the_budget_are_refused_unchanged():
    assert fit_capture_sizes(SIZES, 1, None, explicit=True, key="k") == SIZES  # no limit known
    with pytest.raises(
        ConfigError,
        match=r"rollout.capture_sizes \[1, 2, 4\] need 3 graphs \(1 per size\), over the device's "
        r"budget of 2: list at most 2 sizes$",
    ):
        fit_capture_sizes([1, 2, 4], 1, 2, explicit=True, key="rollout.capture_sizes")
