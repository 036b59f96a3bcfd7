"""`DecodeGraphRunner`: one decode step captured per batch-size bucket, replayed on padded input.

The caller supplies two functions: `make_inputs(size)` allocates the static input tensors of a
bucket (leading dimension `size`, filled with harmless padding values), and `step(size, inputs)`
computes the step's output from them without host synchronization (static shapes, in-place
state only), so that it can be captured. `prepare()` allocates every bucket and, where graphs are
used, warms each step up on a side stream and captures it, largest bucket first, all graphs
sharing one memory pool and every warm-up one side stream (a caching allocator keeps freed blocks
per stream: a new stream per bucket would reserve fresh warm-up memory for each); each graph's
output is held as a weak reference so that the next (smaller) capture can reuse its blocks. `run(inputs)` copies a batch of `n` rows into the
smallest bucket that holds it, replays that bucket's graph (or runs the step eagerly when graphs
are off), and returns the first `n` rows of the output.

Everything device-specific goes through the platform's graph members (`supports_graphs`,
`graph_class`, `graph_capture`, `graph_pool_handle`, `weak_ref_tensor`, streams); on a platform
without graphs the same bucket, pad and slice code runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from roll_device.errors import ConfigError
from roll_device.graph.buckets import bucket_for
from roll_device.graph.captures import BucketCaptures, Inputs
from roll_device.platforms.base import Platform


class DecodeGraphRunner(BucketCaptures):
    """Capture and replay of one decode step per batch-size bucket (see the module docstring)."""

    def __init__(
        self,
        platform: Platform,
        sizes: list[int],
        make_inputs: Callable[[int], Inputs],
        step: Callable[[int, Inputs], torch.Tensor],
        use_graphs: bool | None = None,
    ) -> None:
        if use_graphs and not platform.supports_graphs:
            raise ConfigError(
                f"use_graphs=true but platform '{platform.name}' has no device graphs here: "
                "set use_graphs to null (graphs where available) or false"
            )
        self.platform = platform
        self.sizes = sorted(sizes)
        self.use_graphs = platform.supports_graphs if use_graphs is None else bool(use_graphs)
        self._make_inputs = make_inputs
        self._step = step
        self._inputs: dict[int, Inputs] = {}
        self._graphs: dict[int, Any] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._pool: Any = None
        self._warmup_stream: Any = None
        self.capture_order: list[int] = []

    def _capture(self, size: int) -> None:
        p = self.platform
        self._warm_up(lambda: self._step(size, self._inputs[size]))
        graph = p.graph_class()()
        try:
            with p.graph_capture(graph, pool=self._pool):
                output = self._step(size, self._inputs[size])
        except Exception as exc:
            exc.add_note(
                f"while capturing the decode step of batch size {size} on platform '{p.name}' (captured "
                f"before it: {self.capture_order or 'none'}); fewer capture sizes, or no graphs, avoid it"
            )
            raise
        self._graphs[size] = graph
        self._outputs[size] = p.weak_ref_tensor(output)
        self.capture_order.append(size)

    def bucket(self, rows: int) -> int:
        return bucket_for(rows, self.sizes)

    def static_inputs(self, size: int) -> Inputs:
        """The static input tensors of bucket `size` (allocated by `prepare`)."""
        self.prepare()
        return self._inputs[size]

    def run(self, inputs: Inputs, eager: bool = False) -> torch.Tensor:
        """The step's output for a batch of `n` rows: padded into the smallest bucket, replayed
        (or run eagerly: always with `eager`, the graph guard's reference), sliced back to `n`
        rows. Valid until the next `run`."""
        rows = {name: int(value.shape[0]) for name, value in inputs.items()}
        if len(set(rows.values())) != 1:
            raise ValueError(f"every input needs the same number of rows, got {rows}")
        n = next(iter(rows.values()))
        size = self.bucket(n)
        static = self.static_inputs(size)
        if set(inputs) != set(static):
            raise ValueError(f"inputs {sorted(inputs)} do not match the step's inputs {sorted(static)}")
        for name, value in inputs.items():
            static[name][:n].copy_(value)
        if self.use_graphs and not eager:
            self._graphs[size].replay()
            output = self._outputs[size]
        else:
            output = self._step(size, static)
        return output[:n]

    def release(self) -> None:
        """Drop graphs, outputs, the pool, the warm-up stream and static inputs; `prepare` starts over."""
        self._outputs.clear()
        self._graphs.clear()
        self._inputs.clear()
        self._pool = self._warmup_stream = None
        self.capture_order = []
