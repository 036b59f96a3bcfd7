"""mstx of the simulated NPU (`torch.npu.mstx`): torch_npu's marker API with its signatures.

A profiler would read these markers; the simulation has none, so it keeps them in `RECORDED`
(kind, message, range id), in order, for checks that instrumented code reached the marker API.
`range_start` returns ids counting from 1, as torch_npu does (0 would mean failure).
"""

from __future__ import annotations

import itertools
import threading

RECORDED: list[tuple[str, str, int]] = []
_ids = itertools.count(1)
_lock = threading.Lock()


class mstx:  # torch_npu's name
    """Markers: `mark`, `range_start` / `range_end`."""

    @staticmethod
    def mark(message: str = "", stream=None, domain: str = "default") -> None:
        with _lock:
            RECORDED.append(("mark", message, 0))

    @staticmethod
    def range_start(message: str = "", stream=None, domain: str = "default") -> int:
        with _lock:
            range_id = next(_ids)
            RECORDED.append(("range_start", message, range_id))
        return range_id

    @staticmethod
    def range_end(range_id: int, domain: str = "default") -> None:
        with _lock:
            RECORDED.append(("range_end", "", range_id))
