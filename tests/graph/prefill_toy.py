"""A prefill-like forward for the prefill graph runner's tests: per-token work, an eager
"attention" at a boundary (a cumulative sum over the tokens, so every output row depends on the
tokens before it), more per-token work, a second boundary, and a head on chosen rows."""

from __future__ import annotations

import torch

from roll_device.graph import PrefillGraphRunner

WIDTH = 4
HEAD_ROWS = 3


class ToyPrefill:
    """The forward, its static inputs, and a count of eager attention calls."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.weight = torch.linspace(-1, 1, WIDTH * WIDTH, device=device).reshape(WIDTH, WIDTH)
        self.attention_calls = 0
        self.runner: PrefillGraphRunner | None = None

    def build(self, platform, sizes: list[int], **options) -> PrefillGraphRunner:
        self.runner = PrefillGraphRunner(platform, sizes, self.make_inputs, self.forward, **options)
        return self.runner

    def make_inputs(self, size: int) -> dict[str, torch.Tensor]:
        return {
            "x": torch.zeros(size, WIDTH, device=self.device),
            "last": torch.zeros(min(size, HEAD_ROWS), dtype=torch.long, device=self.device),
        }

    def attention(self, hidden: torch.Tensor) -> torch.Tensor:
        self.attention_calls += 1
        return hidden.cumsum(dim=0)

    def forward(self, size: int, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = torch.tanh(inputs["x"] @ self.weight)
        hidden = self.runner.boundary(self.attention, hidden) + hidden
        hidden = torch.tanh(hidden @ self.weight)
        hidden = self.runner.boundary(self.attention, hidden) * 0.5
        return hidden[inputs["last"]].softmax(dim=-1)

    def reference(self, x: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The forward computed directly on unpadded rows (what padding must not change)."""
        hidden = torch.tanh(x @ self.weight)
        hidden = hidden.cumsum(dim=0) + hidden
        hidden = torch.tanh(hidden @ self.weight)
        return (hidden.cumsum(dim=0) * 0.5)[last].softmax(dim=-1)


def padded(size: int, x: torch.Tensor, last: torch.Tensor) -> dict[str, torch.Tensor]:
    """`x` (tokens at the front) and `last` padded to bucket `size` with zeros."""
    full_x = torch.zeros(size, WIDTH, device=x.device)
    full_x[: x.shape[0]] = x
    full_last = torch.zeros(min(size, HEAD_ROWS), dtype=torch.long, device=x.device)
    full_last[: last.shape[0]] = last
    return {"x": full_x, "last": full_last}
