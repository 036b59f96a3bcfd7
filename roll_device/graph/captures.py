"""`BucketCaptures`: what the decode and prefill graph runners share. Every bucket's static inputs
are allocated once, graphs are captured largest bucket first into one memory pool, and every
warm-up runs on one side stream (a caching allocator keeps freed blocks per stream: a new stream
per bucket would reserve fresh warm-up memory for each, as the GPU run showed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from roll_device.graph.buckets import capture_order
from roll_device.platforms.base import Platform

Inputs = dict[str, torch.Tensor]
WARMUP_RUNS = 2


class BucketCaptures:
    """A subclass sets `platform`, `sizes`, `use_graphs`, `_make_inputs(size)` and `_inputs`, and
    implements `_capture(size)` (calling `_warm_up` first) and `release()`."""

    platform: Platform
    sizes: list[int]
    use_graphs: bool
    _make_inputs: Callable[[int], Inputs]
    _inputs: dict[int, Inputs]
    _pool: Any = None
    _warmup_stream: Any = None

    @property
    def prepared(self) -> bool:
        return bool(self._inputs)

    def prepare(self) -> None:
        """Allocate every bucket's static inputs; with graphs, capture largest first in one pool.
        A failure releases what was captured before it (graphs hold device streams and memory)."""
        if self.prepared:
            return
        try:
            for size in capture_order(self.sizes):
                self._inputs[size] = self._make_inputs(size)
                if self.use_graphs:
                    self._capture(size)
        except BaseException:
            self.release()
            raise

    def _warm_up(self, run: Callable[[], Any]) -> None:
        """`run()` WARMUP_RUNS times on the shared side stream (made with the pool, on first use)."""
        p = self.platform
        if self._pool is None:
            self._pool = p.graph_pool_handle()
            self._warmup_stream = p.new_stream()
        side = self._warmup_stream
        side.wait_stream(p.current_stream())
        with p.stream(side):
            for _ in range(WARMUP_RUNS):
                run()
        p.current_stream().wait_stream(side)

    def _capture(self, size: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} captures no graphs")

    def release(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} releases nothing")
