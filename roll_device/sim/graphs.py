"""ACL graphs on the simulated NPU: `NPUGraph`, the `graph` context manager, `graph_pool_handle` and
`is_current_stream_capturing`, with torch_npu's signatures and checks.

Capture runs the work issued on the capture stream as usual (so it yields real values, as a warm-up
would) and records each op with the tensors it read and wrote. Replay runs the records again, in
order, on the same tensors: new values written into the static inputs give new results in the same
outputs, in place, as on a device. Views are not recorded (they alias memory that already exists);
an op whose result is a new tensor has it copied into the tensor the capture returned. While a
graph captures, the tensors allocated on its device come from its memory pool (`memory.py`), and
it holds one of the device's streams until it is reset (`streams.py`).

What needs the host during capture (`.item()`, `.tolist()`, a blocking copy to the host, printing a
device tensor, `synchronize()`) is refused by the tensor and device modules through
`capture_for`, with torch_npu's errors (`errors.py`).
"""

from __future__ import annotations

import itertools
import os
import weakref

import torch
from torch.utils._pytree import tree_leaves

from roll_device.sim import errors, streams
from roll_device.sim.devices import current_index
from roll_device.sim.memory import LEDGER, Pool

_captures: dict[int, _Capture] = {}  # device index -> the capture under way there
_graphs: weakref.WeakSet = weakref.WeakSet()  # captured graphs, to find a storage's owner
_handles = itertools.count(1)
_aten = torch.ops.aten
_ALLOCATIONS = {
    _aten.empty.memory_format,
    _aten.empty_strided.default,
    _aten.empty_like.default,
    _aten.new_empty.default,
    _aten.new_empty_strided.default,
}


class _Record:
    """One op of a capture: run again on replay; a new result is copied into the captured one."""

    __slots__ = ("args", "func", "kwargs", "outputs")

    def __init__(self, func, args, kwargs, outputs) -> None:
        self.func, self.args, self.kwargs, self.outputs = func, args, kwargs, outputs

    def replay(self) -> None:
        result = self.func(*self.args, **self.kwargs)
        for new, old in zip(_tensors(result), self.outputs):
            if old is not None and new is not old:
                old.copy_(new)


class _Capture:
    def __init__(self, stream: streams.Stream, pool: Pool) -> None:
        self.stream, self.pool = stream, pool
        self.records: list[_Record] = []

    def record(self, func, args, kwargs, result) -> None:
        """Record `func(*args, **kwargs) -> result` (CPU tensors) unless it only allocated memory
        or made views of memory that exists (neither is work a device graph replays)."""
        if func in _ALLOCATIONS:
            return
        read = {_storage(t) for t in _tensors((args, kwargs))}
        outputs = [None if _storage(t) in read else t for t in _tensors(result)]
        if func._schema.is_mutable or any(o is not None for o in outputs):
            self.records.append(_Record(func, args, kwargs, outputs))


def capture_for(index: int) -> _Capture | None:
    """The capture under way on device `index` if its stream is the current one there, else None."""
    capture = _captures.get(index)
    return capture if capture is not None and streams.current_stream(index) is capture.stream else None


def is_current_stream_capturing() -> bool:
    return capture_for(current_index()) is not None


def graph_pool_handle() -> tuple[int, int]:
    """An opaque token naming a memory pool that several graphs' captures may share."""
    return (0, next(_handles))


def storage_owner(pointer: int) -> torch.Tensor | None:
    """The captured CPU tensor whose memory starts at `pointer` (for weak references to graph
    outputs, which must not outlive the memory they point at), or None."""
    for graph in list(_graphs):
        owner = graph.owned.get(pointer)
        if owner is not None:
            return owner
    return None


class NPUGraph:
    """A graph of NPU work, captured once and replayed (torch_npu's `torch.npu.NPUGraph`)."""

    def __init__(self) -> None:
        self._records: list[_Record] | None = None
        self._capture: _Capture | None = None
        self._release = None
        self._pool: Pool | None = None
        self.owned: dict[int, torch.Tensor] = {}

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        if os.environ.get("TASK_QUEUE_ENABLE", "1").strip() == "2":
            raise RuntimeError(errors.TASK_QUEUE_2)
        if self._records is not None:
            raise RuntimeError(errors.ALREADY_CAPTURED)
        handle = _pool_id(pool)
        index = current_index()
        stream = streams.current_stream(index)
        if stream.is_default:
            raise RuntimeError(errors.DEFAULT_STREAM)
        if index in _captures:
            raise RuntimeError(
                f"[simulated NPU] a graph capture is already under way on npu:{index}: one capture at a "
                "time per device (end it before beginning another)"
            )
        streams.BUDGET.take_graph_stream(index)
        self._pool = LEDGER.pool(index, handle)
        self._pool.users += 1
        self._release = weakref.finalize(self, _release, index, self._pool)
        self._capture = _captures[index] = _Capture(stream, self._pool)
        stream.capturing = self._capture

    def capture_end(self) -> None:
        capture = self._capture
        if capture is None:
            raise RuntimeError("[simulated NPU] NPUGraph.capture_end() without capture_begin()")
        if streams.current_stream(capture.stream.device.index) is not capture.stream:
            raise RuntimeError(errors.OTHER_STREAM)
        self._stop()
        self._records = capture.records
        self.owned = {_storage(t): t for r in self._records for t in r.outputs if t is not None}
        _graphs.add(self)

    def abort_capture(self) -> None:
        """End a capture that failed: nothing is kept (the graph can capture again)."""
        if self._capture is not None:
            self._stop()
        self.reset()

    def _stop(self) -> None:
        capture, self._capture = self._capture, None
        capture.stream.capturing = None
        del _captures[capture.stream.device.index]

    def replay(self) -> None:
        if self._records is None:
            raise RuntimeError(errors.NOT_CAPTURED.format(member="replay"))
        with torch.no_grad():
            for record in self._records:
                record.replay()

    def reset(self) -> None:
        """Drop the captured work; give back its stream and its use of the memory pool."""
        self._records, self.owned = None, {}
        _graphs.discard(self)
        if self._release is not None:
            self._release()

    def pool(self) -> tuple[int, int]:
        """The id of this graph's memory pool, to share with another graph's capture."""
        if self._records is None:
            raise RuntimeError(errors.NOT_CAPTURED.format(member="pool()"))
        return self._pool.id


class graph:
    """Capture the NPU work issued inside the block into `npu_graph` (torch_npu's `torch.npu.graph`).

    `stream`: the capture stream (default: one side stream shared by every `graph`); `pool`: a
    `graph_pool_handle()` or another graph's `pool()` to share memory with."""

    default_capture_stream: streams.Stream | None = None

    def __init__(
        self,
        npu_graph: NPUGraph,
        pool=None,
        stream: streams.Stream | None = None,
        auto_dispatch_capture: bool = False,
        capture_error_mode: str = "global",
    ) -> None:
        if auto_dispatch_capture:
            raise NotImplementedError(
                "the simulated NPU does not model auto_dispatch_capture (graph task updates): "
                "capture with auto_dispatch_capture=False"
            )
        if graph.default_capture_stream is None:
            graph.default_capture_stream = streams.Stream()
        self.npu_graph, self.pool = npu_graph, pool
        self.capture_stream = stream if stream is not None else graph.default_capture_stream
        self.capture_error_mode = capture_error_mode
        self._stream_ctx = None

    def __enter__(self) -> None:
        LEDGER.empty_cache(self.capture_stream.device.index)  # torch_npu empties the cache first
        self._stream_ctx = streams.stream(self.capture_stream)
        self._stream_ctx.__enter__()
        try:
            self.npu_graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self._stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type, exc, traceback) -> None:
        try:
            if exc_type is None:
                self.npu_graph.capture_end()
            else:
                self.npu_graph.abort_capture()
        finally:
            self._stream_ctx.__exit__(exc_type, exc, traceback)


def _release(index: int, memory_pool: Pool) -> None:
    streams.BUDGET.give_graph_stream(index)
    memory_pool.users -= 1


def _pool_id(pool) -> tuple[int, int] | None:
    if pool is None:
        return None
    if not (isinstance(pool, tuple) and len(pool) == 2 and all(isinstance(v, int) for v in pool)):
        raise TypeError(f"pool must be a graph_pool_handle() or a graph's pool(), got {pool!r}")
    return pool


def _tensors(tree) -> list[torch.Tensor]:
    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()
