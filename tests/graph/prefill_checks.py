"""The prefill graph runner on the SIMULATED NPU (ROLL_DEVICE=npu-sim), in a process of its own (the
simulation renames PrivateUse1 once per process). Results are simulations."""

from __future__ import annotations

import os


def piecewise_capture() -> dict:
    """Capture per token-count bucket, pieces split at each boundary, replay equal to eager on new
    inputs, and a failed capture released and named."""
    os.environ["ROLL_DEVICE"] = "npu-sim"
    import torch

    import roll_device as rd
    from tests.graph.prefill_toy import WIDTH, ToyPrefill, padded
    from tests.isolated import error_of

    platform = rd.current_platform()
    device = platform.device()
    toy = ToyPrefill(device)
    runner = toy.build(platform, [4, 8, 16])
    runner.prepare()
    out = {
        "platform": platform.name,
        "compile_backend": platform.compile_backend,
        "capture_order": runner.capture_order,
        "pieces": [runner.pieces(size) for size in (4, 8, 16)],
        "graph_count": runner.graph_count,
    }
    matches = []
    for tokens, last in ((3, [2]), (8, [1, 7]), (11, [0, 5, 10]), (16, [15])):
        x = torch.randn(tokens, WIDTH).to(device)
        index = torch.tensor(last).to(device)
        size = runner.bucket(tokens)
        calls = toy.attention_calls
        got = runner.run(size, padded(size, x, index), len(last)).to("cpu")
        matches.append(
            {
                "tokens": tokens,
                "bucket": size,
                "equal": torch.allclose(got, toy.reference(x, index).to("cpu"), atol=1e-6),
                "eager_attentions": toy.attention_calls - calls,
            }
        )
    out["runs"] = matches
    out["over_largest"] = runner.bucket(17)
    runner.release()
    out["released_graphs"] = runner.graph_count

    class HostReadToy(ToyPrefill):
        """A forward whose last piece reads a value on the host: fine eagerly, fatal in a capture."""

        def forward(self, size, inputs):
            result = super().forward(size, inputs)
            if result.max().item() > 2:
                raise ValueError("a softmax above 1")
            return result

    failing = HostReadToy(device).build(platform, [4, 8])
    out["host_read"] = error_of(failing.prepare)
    out["host_read_released"] = (failing.prepared, failing.graph_count, failing.capture_order)
    return out
