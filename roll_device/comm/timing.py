"""Where a sync's time goes: a `Stopwatch` adds up the seconds spent inside an iterator's `next`
(the sender's export, casts and gathers included; the receiver's wait for the transport), so that
the rest of a sync's seconds is the other side of it (sending, loading); `timing` adds a block's
seconds (the trainer's casts)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


class Stopwatch:
    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def timing(self) -> Iterator[None]:
        """Adds the seconds of the `with` block."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start

    def iterate(self, items: Iterable[T]) -> Iterator[T]:
        """`items`, with the time each `next` takes added to `seconds`."""
        iterator = iter(items)
        while True:
            start = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self.seconds += time.perf_counter() - start
            yield item
