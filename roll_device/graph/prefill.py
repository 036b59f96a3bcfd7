"""`PrefillGraphRunner`: a prefill forward captured per token-count bucket as pieces split at
attention (the piecewise graphs of vLLM and of SGLang's NPU port).

The caller supplies `make_inputs(size)`, the static inputs of a bucket of `size` tokens, filled
with padding, and `forward(size, inputs)`, which computes the prefill from them and calls
`runner.boundary(fn, *args)` for every attention. Outside a capture a boundary is a plain call.
While a bucket is captured, a boundary ends the current piece's graph, runs `fn` eagerly, keeps
its arguments and result, and begins the next piece's graph: a model with L attention layers
becomes L + 1 captured pieces with L eager attentions between them. Replay runs the pieces in
order and, between them, each attention again on the same (static) tensors, copying its result
into the tensor the next piece was captured reading. Attention stays eager because its cost and
kernels depend on the lengths inside a batch, which a graph would fix; everything else (norms,
projections, MLPs, the LM head) has the bucket's static shapes.

The forward is compiled with the platform's `compile_backend` (`torch.compile`; `boundary` is
excluded from compilation, so dynamo splits its graphs at attention too). Dynamo's `eager` backend
(the NPU's, as in SGLang's port) generates no kernels: the graph it would run issues the same ATen
ops the forward issues, and a device graph records those ops, not the Python around them, so with
that backend the forward is captured as written, untraced.

Buckets are captured largest first into one memory pool shared with nothing else, after warm-up
runs on one side stream, as `DecodeGraphRunner` does; `run(size, inputs, rows)` copies a batch
padded to `size` tokens into the bucket's static inputs, replays (or runs the forward eagerly),
and returns the first `rows` rows of the output, valid until the next `run`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from roll_device.errors import ConfigError
from roll_device.graph.captures import BucketCaptures, Inputs
from roll_device.platforms.base import Platform

UNCOMPILED_BACKEND = "eager"


def compiled(forward: Callable, backend: str | None) -> Callable:
    """`forward` compiled with the torch.compile `backend`; as written for None or `eager`
    (see the module docstring: the captured ops are the same)."""
    if backend is None or backend == UNCOMPILED_BACKEND:
        return forward
    return torch.compile(forward, backend=backend, dynamic=False)


class _Boundary:
    """One eager call between two captured pieces: run again on replay, result copied in place."""

    __slots__ = ("args", "fn", "kwargs", "output")

    def __init__(self, fn: Callable, args: tuple, kwargs: dict, output: torch.Tensor) -> None:
        self.fn, self.args, self.kwargs, self.output = fn, args, kwargs, output

    def replay(self) -> None:
        self.output.copy_(self.fn(*self.args, **self.kwargs))


class _PiecewiseCapture:
    """The pieces and boundaries of one bucket's forward while it is being captured."""

    def __init__(self, platform: Platform, pool: Any) -> None:
        self.platform, self.pool = platform, pool
        self.pieces: list[Any] = []
        self.boundaries: list[_Boundary] = []
        self._open: tuple[Any, contextlib.AbstractContextManager] | None = None

    def begin(self) -> None:
        graph = self.platform.graph_class()()
        context = self.platform.graph_capture(graph, pool=self.pool)
        context.__enter__()
        self._open = (graph, context)

    def end(self) -> None:
        graph, context = self._open
        self._open = None
        context.__exit__(None, None, None)
        self.pieces.append(graph)

    def abort(self, exc: BaseException) -> None:
        """End a piece left open by a failure (its capture is discarded)."""
        if self._open is not None:
            _, context = self._open
            self._open = None
            context.__exit__(type(exc), exc, exc.__traceback__)


class PrefillGraphRunner(BucketCaptures):
    """Piecewise capture and replay of a prefill forward per token-count bucket (module docstring)."""

    def __init__(
        self,
        platform: Platform,
        sizes: list[int],
        make_inputs: Callable[[int], Inputs],
        forward: Callable[[int, Inputs], torch.Tensor],
        *,
        use_graphs: bool = True,
        compile_backend: str | None = None,
    ) -> None:
        if use_graphs and not platform.supports_graphs:
            raise ConfigError(
                f"prefill graphs asked for, but platform '{platform.name}' has no device graphs here: "
                "set rollout.prefill_graphs to false"
            )
        self.platform = platform
        self.sizes = sorted(sizes)
        self.use_graphs = use_graphs
        self.compile_backend = compile_backend
        self._make_inputs = make_inputs
        self._forward = compiled(forward, compile_backend)
        self._inputs: dict[int, Inputs] = {}
        self._pieces: dict[int, list[Any]] = {}
        self._boundaries: dict[int, list[_Boundary]] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._capturing: _PiecewiseCapture | None = None
        self._pool: Any = None
        self._warmup_stream: Any = None
        self.capture_order: list[int] = []
        # excluded from compilation here, not by a decorator: `torch.compiler.disable` imports
        # dynamo (about 1 s), which every process importing the platforms would then pay
        self.boundary = torch.compiler.disable(self._boundary)

    @property
    def graph_count(self) -> int:
        """Device graphs held: the pieces of every captured bucket."""
        return sum(map(len, self._pieces.values()))

    def pieces(self, size: int) -> int:
        """How many captured pieces bucket `size` replays (0 when not captured)."""
        return len(self._pieces.get(size, ()))

    def bucket(self, tokens: int) -> int | None:
        """The smallest bucket that holds `tokens`, or None when none does (prefill eagerly)."""
        if tokens < 1:
            raise ValueError(f"a prefill needs at least one token, got {tokens}")
        return next((size for size in self.sizes if size >= tokens), None)

    def _boundary(self, fn: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
        """`fn(*args, **kwargs)`, run eagerly between two captured pieces (see the module docstring)."""
        capture = self._capturing
        if capture is None:
            return fn(*args, **kwargs)
        capture.end()
        output = fn(*args, **kwargs)
        capture.boundaries.append(_Boundary(fn, args, kwargs, output))
        capture.begin()
        return output

    def _capture(self, size: int) -> None:
        p, inputs = self.platform, self._inputs[size]
        self._warm_up(lambda: self._forward(size, inputs))
        capture = self._capturing = _PiecewiseCapture(p, self._pool)
        try:
            capture.begin()
            output = self._forward(size, inputs)
            capture.end()
        except Exception as exc:
            capture.abort(exc)
            exc.add_note(
                f"while capturing piece {len(capture.pieces) + 1} of the prefill of {size} tokens on "
                f"platform '{p.name}' (buckets captured before it: {self.capture_order or 'none'}); fewer "
                "prefill capture sizes, or rollout.prefill_graphs=false, avoid it"
            )
            raise
        finally:
            self._capturing = None
        self._pieces[size], self._boundaries[size] = capture.pieces, capture.boundaries
        self._outputs[size] = p.weak_ref_tensor(output)
        self.capture_order.append(size)

    def static_inputs(self, size: int) -> Inputs:
        """The static input tensors of bucket `size` (allocated by `prepare`)."""
        self.prepare()
        return self._inputs[size]

    def run(self, size: int, inputs: Inputs, rows: int) -> torch.Tensor:
        """The forward's first `rows` output rows for `inputs`, already padded to bucket `size`:
        copied into its static inputs, replayed (or run eagerly). Valid until the next `run`."""
        static = self.static_inputs(size)
        if set(inputs) != set(static):
            raise ValueError(f"inputs {sorted(inputs)} do not match the forward's inputs {sorted(static)}")
        for name, value in inputs.items():
            if value.shape != static[name].shape:
                raise ValueError(
                    f"input '{name}' has shape {tuple(value.shape)}, bucket {size} holds "
                    f"{tuple(static[name].shape)}: pad the batch to the bucket first"
                )
            static[name].copy_(value, non_blocking=True)
        if not self.use_graphs:
            return self._forward(size, static)[:rows]
        boundaries = self._boundaries[size]
        for index, piece in enumerate(self._pieces[size]):
            piece.replay()
            if index < len(boundaries):
                boundaries[index].replay()
        return self._outputs[size][:rows]

    def release(self) -> None:
        """Drop graphs, boundaries, outputs, the pool, the warm-up stream and static inputs."""
        self._outputs.clear()
        self._boundaries.clear()
        self._pieces.clear()
        self._inputs.clear()
        self._pool = self._warmup_stream = None
        self.capture_order = []
