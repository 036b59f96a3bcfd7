"""The prefill graph runner on the SIMULATED NPU (ROLL_DEVICE=npu-sim), in a process of its own (the
simulation renames PrivateUse1 once per process). Results are simulations."""

from __future__ import annotations


def piecewise_capture() -> dict:
    """The device test of piecewise capture and replay, and a host read in a piece refused at
    capture with what was captured released."""
    from tests.graph.prefill_toy import ToyPrefill
    from tests.graph.test_graphs_on_device import test_piecewise_prefill_replay_equals_eager
    from tests.isolated import error_of, simulated_npu

    platform = simulated_npu()
    out = {"platform": platform.name, "compile_backend": platform.compile_backend}
    test_piecewise_prefill_replay_equals_eager(platform)  # asserts inside
    out["replay_equals_eager"] = True

    class HostReadToy(ToyPrefill):
        """A forward whose last piece reads a value on the host: fine eagerly, fatal in a capture."""

        def forward(self, size, inputs):
            result = super().forward(size, inputs)
            if result.max().item() > 2:
                raise ValueError("a softmax above 1")
            return result

    failing = HostReadToy(platform.device()).build(platform, [4, 8])
    out["host_read"] = error_of(failing.prepare)
    out["host_read_released"] = (failing.prepared, failing.graph_count, failing.capture_order)
    return out
