"""`torch.npu.cudart()` of the simulated NPU: the runtime bindings torch_npu exposes under CUDA's
names, of which the simulation models host-memory registration (`cudaHostRegister`,
`cudaHostUnregister`: ACL's `aclrtHostRegister` behind them on a real NPU).

As there, a call returns the runtime's status (0 on success, an error code otherwise) instead of
raising. Registration is checked and remembered; the host memory stays as it was, since simulated
devices read host memory directly (a real registration also makes `tensor.is_pinned()` true, which
the simulation does not model).
"""

from __future__ import annotations

import threading

SUCCESS = 0
ACL_ERROR_INVALID_PARAM = 100000  # ACL's status for a bad pointer, size or unknown registration


class Runtime:
    """Host ranges registered in this process, by start address."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._registered: dict[int, int] = {}

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        with self._lock:
            if ptr <= 0 or size <= 0 or ptr in self._registered:
                return ACL_ERROR_INVALID_PARAM
            self._registered[ptr] = size
            return SUCCESS

    def cudaHostUnregister(self, ptr: int) -> int:
        with self._lock:
            return SUCCESS if self._registered.pop(ptr, None) is not None else ACL_ERROR_INVALID_PARAM


RUNTIME = Runtime()


def cudart() -> Runtime:
    return RUNTIME
