"""MindSpeed, the Ascend adaptor of Megatron: applied before megatron is first imported.

`apply(options)` imports `mindspeed.megatron_adaptor` (which patches megatron at import and loads
torch_npu's CUDA-to-NPU transfer itself), then calls its `repatch(options)` so the patches follow
the trainer's settings. It refuses when megatron is already imported (the patches would miss it)
and names the package when MindSpeed is missing.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from roll_device.errors import MissingPackageError, RollDeviceError

ADAPTOR = "mindspeed.megatron_adaptor"
INSTALL_HINT = (
    "install MindSpeed from source beside a matching Megatron-LM checkout (the PyPI 'mindspeed' "
    "is a placeholder); see docs/training.md"
)
_applied: dict[str, Any] = {}


class MindSpeedOrderError(RollDeviceError, RuntimeError):
    """megatron was imported before MindSpeed could patch it."""


def apply(options: dict[str, Any]) -> None:
    """Import MindSpeed's megatron adaptor (once per process), then `repatch(options)`."""
    if "adaptor" not in _applied:
        loaded = sorted(m for m in sys.modules if m == "megatron" or m.startswith("megatron."))
        if loaded:
            raise MindSpeedOrderError(
                f"megatron is already imported ({loaded[0]}, ...) so MindSpeed cannot patch it: "
                "start the Megatron trainer on NPU in a process that has not imported megatron"
            )
        try:
            _applied["adaptor"] = importlib.import_module(ADAPTOR)
        except ImportError as exc:
            raise MissingPackageError(
                f"the Megatron trainer on NPU needs the package mindspeed ({ADAPTOR}), which could "
                f"not be imported ({type(exc).__name__}: {exc}): {INSTALL_HINT}"
            ) from exc
    repatch = getattr(_applied["adaptor"], "repatch", None)
    if repatch is None:
        raise MissingPackageError(f"{ADAPTOR} has no repatch(): {INSTALL_HINT}")
    repatch(dict(options))
