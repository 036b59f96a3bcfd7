"""The errors the simulated NPU raises where a real Ascend NPU fails, worded as torch_npu words them.

Each message starts with torch_npu's (or CANN's) own text, so that a log read on the simulation
looks like one read on a device, and ends with a line marked `[simulated NPU]` that says what was
done and what to do about it. Sources of the wordings (public): torch_npu's NPUGraph.cpp and
NPUGraphsUtils.h (capture checks), its caching allocator (out of memory), and device logs quoted in
vLLM-Ascend and vLLM-Omni issues (error codes 107001, 107027, 107030, 207008); see docs/simulation.md.
"""

from __future__ import annotations

import torch

_PTA = "[ERROR] ERR00100 PTA call acl api failed."


def host_sync_in_capture(what: str) -> RuntimeError:
    """A synchronization with the host while a stream captures (`.item()`, `synchronize()`)."""
    return RuntimeError(
        "NPU function error: c10_npu::acl::AclrtSynchronizeStreamWithTimeout(copy_stream), "
        f"error code is 107027\n{_PTA}\nEE9999: Inner Error!\nNot allow to synchronize captured-stream. "
        "rtStreamSynchronizeWithTimeout execution failed, reason=stream is captured\n"
        f"[simulated NPU] {what} waits for the host during NPU graph capture: keep host reads and "
        "synchronization out of the captured step (read results after replay)"
    )


def host_copy_in_capture(what: str) -> RuntimeError:
    """A blocking copy from the device to the host while a stream captures (`.cpu()`, printing)."""
    return RuntimeError(
        "NPU function error: aclrtMemcpy, error code is 107030\n"
        f"{_PTA}\nrtMemcpy execution failed, reason=the current capture mode does not support this "
        "operation\nsynchronized memcpy failed, kind = 2, runtime result = 107030\n"
        f"[simulated NPU] {what} copies to the host during NPU graph capture: copy after replay, "
        "or use non_blocking=True into a host buffer"
    )


def streams_exhausted(needed: int, budget: int, graphs: int) -> RuntimeError:
    """A capture that needs a stream when the device has none left (CANN error 207008)."""
    return RuntimeError(
        "capture_begin: NPU function error: c10_npu::acl::AclmdlRICaptureBegin(capture_stream_, "
        f"capture_mode), error code is 207008\n{_PTA}\n[Error]: Stream resources are insufficient.\n"
        "Insufficient_Stream_Resources(EL0009): The stream resources are insufficient.\n"
        "rtStreamBeginCapture execution failed, reason=driver error:no stream resource\n"
        f"[simulated NPU] this capture needs stream {needed} of the device's {budget} "
        f"(ROLL_SIM_NPU_STREAMS), {graphs} of them held by captured graphs: capture fewer sizes "
        "(rollout.capture_sizes, cudagraph_capture_sizes), use FULL_DECODE_ONLY (one graph per size; "
        "piecewise takes one per layer), or check STREAMS_PER_DEVICE (torch_npu's stream pool, 8 or "
        "32, draws on the same streams)"
    )


def out_of_memory(
    index: int, size: int, total: int, fraction: float | None, allocated: int, reserved: int
) -> torch.OutOfMemoryError:
    """An allocation past what the process may reserve: the device's `total`, or the part of it the
    `fraction` set by `set_per_process_memory_fraction` allows (None: none was set). As torch_npu's
    caching allocator words it, "total capacity" is the device's and "free" what the device has free
    (a fraction lowers neither); once a fraction is set, what it allows is a part of its own ("X allowed")."""
    free = max(total - reserved, 0)
    if fraction is None:
        allowance, limit = "", f"the device holds {_size(total)} (ROLL_SIM_NPU_MEMORY_BYTES={total})"
    else:
        allowed = int(fraction * total)
        allowance = f"{_size(allowed)} allowed; "
        limit = (
            f"this process may reserve {_size(allowed)}: set_per_process_memory_fraction({fraction}) of "
            f"the device's {_size(total)} (ROLL_SIM_NPU_MEMORY_BYTES={total})"
        )
    return torch.OutOfMemoryError(
        f"NPU out of memory. Tried to allocate {_size(size)} (NPU {index}; {_size(total)} total capacity; "
        f"{_size(allocated)} already allocated; {_size(allocated)} current active; {_size(free)} free; "
        f"{allowance}{_size(reserved)} reserved in total by PyTorch)\n"
        f"[simulated NPU] {limit}: free or offload what is resident, or lower the batch size, sequence "
        "length or KV cache"
    )


def invalid_device(index: int, count: int, count_env: str) -> RuntimeError:
    """A device index the machine does not have, set or allocated on (ACL error 107001): torch_npu's
    `SetDevice` fails with the runtime's words."""
    return RuntimeError(
        "NPU function error: c10_npu::SetDevice(device), error code is 107001\n"
        f"{_PTA}\n[Error]: Invalid device ID.\n        Check whether the device ID is valid.\n"
        f"Invalid_Argument(EE1003): SetDevice failed because value {index} for parameter drv devId is "
        f"invalid. Expected value: [0, {count}).\n"
        f"[simulated NPU] npu:{index} does not exist: {count_env}={count} (pick an index below "
        f"{count}, or raise {count_env})"
    )


def _size(nbytes: int) -> str:
    """Bytes as torch's allocator messages print them (bytes, KiB, MiB, GiB)."""
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    unit, shift = next((u, s) for u, s in (("GiB", 30), ("MiB", 20), ("KiB", 10)) if nbytes >= 1 << s)
    return f"{nbytes / (1 << shift):.2f} {unit}"


# Checks of NPUGraph's own (torch_npu/csrc/core/npu/NPUGraph.cpp), in its words.
TASK_QUEUE_2 = (
    "Do not support TASK_QUEUE_ENABLE = 2 during NPU graph capture, please export TASK_QUEUE_ENABLE=1/0."
)
DEFAULT_STREAM = (
    "NPU graphs must be captured on a non-default stream. (However, after capture, it's ok to replay "
    "them on the default stream.)"
)
ALREADY_CAPTURED = (
    "This NPUGraph instance already owns a captured graph. To capture a new graph, create a new instance."
)
OTHER_STREAM = "Capture must end on the same stream it began on."
NOT_CAPTURED = "Called NPUGraph::{member} without a preceding successful capture."
