"""How many devices torch's own C++ code sees on the simulated NPU: its PrivateUse1 device guard.

torch's Python-backend registration (`_setup_privateuseone_for_python_backend`) gives PrivateUse1 a
device guard whose device count is fixed at 1, and offers no way to change it from Python. The
autograd engine sizes its per-device queues by that count at a process's first backward, so a
backward on `npu:1` (a rank whose current device is not the first) stopped in the engine
(`device.index() < device_ready_queues_.size()` assert), where torch_npu's guard reports the
machine's NPUs and every device trains. `register(count)` puts the guard of `device_guard.cpp` in
its place: torch's own, with the simulated machine's count. torch's extension builder compiles it
once per machine (a C++ compiler and ninja; about 3 s, then cached); without them the simulation
keeps torch's guard and says what that costs.
"""

from __future__ import annotations

import ctypes
import subprocess
import warnings
from pathlib import Path

SOURCE = Path(__file__).with_name("device_guard.cpp")
LIBRARY = "roll_device_sim_device_guard"


def register(count: int) -> bool:
    """Make the simulated NPU's guard report `count` devices; False (with a warning) where it cannot
    be built here."""
    from torch.utils import cpp_extension

    try:
        path = cpp_extension.load(name=LIBRARY, sources=[str(SOURCE)], is_python_module=False)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        warnings.warn(
            f"[simulated NPU] its device guard could not be built here ({type(exc).__name__}: {exc}); "
            "a backward on npu:1 and above fails in the autograd engine: install g++ and ninja",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    ctypes.CDLL(path).roll_sim_register_guard(count)
    return True
