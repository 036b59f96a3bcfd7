"""Device indices of the simulated NPU: how many there are (`ROLL_SIM_NPU_COUNT`, default 8, checked
in `settings.py`), which is current (process-wide), and the index a device argument names, checked
as torch_npu checks it: an index the machine does not have fails with the device's invalid-device
error (ACL error 107001), whether a device is set, made current or allocated on."""

from __future__ import annotations

import torch

from roll_device.sim import errors, settings

DEVICE_TYPE = "npu"
COUNT_ENV = settings.COUNT.env

_current = {"index": 0}


def device_count() -> int:
    return settings.COUNT.value()


def current_index() -> int:
    """The process-wide current simulated device index."""
    return _current["index"]


def set_current_index(index: int) -> None:
    _current["index"] = device_index(index)


def device_index(device=None) -> int:
    """The index `device` names (an int, `npu:N`, a torch.device; None: the current one), checked."""
    if device is None:
        index = current_index()
    elif isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        index = device.index if device.index is not None else current_index()
    return checked(index)


def checked(index: int) -> int:
    """`index` if the machine has that device, else torch_npu's invalid-device error."""
    count = device_count()
    if not 0 <= index < count:
        raise errors.invalid_device(index, count, COUNT_ENV)
    return index
