"""`platform.determinism`: the RNG state of every device of the kind, and the switches that make a
run repeatable (torch's deterministic algorithms, the kind's library flags, and the environment its
math and collective libraries read).

The variables of `deterministic_env()` are read when a library initialises (cuBLAS at its first
handle, HCCL at its first communicator): give them to a worker's environment, or call
`set_deterministic()` before the first kernel and the first collective.
"""

from __future__ import annotations

import os
from typing import ClassVar

import torch

from roll_device.platforms.groups import PlatformGroup


class Determinism(PlatformGroup):
    """The determinism group; kinds name a subclass that sets `deterministic_env_vars` and the
    library flags."""

    attribute = "determinism"
    deterministic_env_vars: ClassVar[dict[str, str]] = {}

    def get_rng_state_all(self) -> list[torch.Tensor]:
        """The RNG state of every visible device of this kind, by index."""
        return list(self._call("get_rng_state_all", "get_rng_state_all"))

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        self._call("set_rng_state_all", "set_rng_state_all", states)

    def deterministic_env(self) -> dict[str, str]:
        """Variables that make this kind's math and collective libraries deterministic."""
        return dict(self.deterministic_env_vars)

    def set_deterministic(self, enabled: bool = True) -> None:
        """Switch deterministic algorithms on (or off) in this process, with the kind's flags."""
        if enabled:
            os.environ.update(self.deterministic_env())
        torch.use_deterministic_algorithms(enabled, warn_only=True)
        self._set_library_determinism(enabled)

    def _set_library_determinism(self, enabled: bool) -> None:
        """The kind's own library switches (cuDNN on CUDA and ROCm); none by default."""
