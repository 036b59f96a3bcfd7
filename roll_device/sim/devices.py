"""Device indices of the simulated NPU: how many there are (`ROLL_SIM_NPU_COUNT`, default 8), which is
current (process-wide), and the index a device argument names."""

from __future__ import annotations

import os

import torch

DEVICE_TYPE = "npu"
DEFAULT_COUNT = 8
COUNT_ENV = "ROLL_SIM_NPU_COUNT"

_current = {"index": 0}


def device_count() -> int:
    return int(os.environ.get(COUNT_ENV, DEFAULT_COUNT))


def current_index() -> int:
    """The process-wide current simulated device index."""
    return _current["index"]


def set_current_index(index: int) -> None:
    _current["index"] = device_index(index)


def device_index(device=None) -> int:
    """The index `device` names (an int, `npu:N`, a torch.device; None: the current one), checked."""
    if device is None:
        return current_index()
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        index = device.index if device.index is not None else current_index()
    if not 0 <= index < device_count():
        raise RuntimeError(
            f"simulated npu:{index} does not exist: {COUNT_ENV}={device_count()} "
            "(raise it, or pick an index below it)"
        )
    return index
