"""What megatron-core needs on each device kind before and while it runs.

`prepare(platform, options)` runs once before the trainer imports megatron and returns the scope
the trainer opens around each of its calls. The adapter is that of the platform's kernels' kind
(`Platform.kernels_kind`):
- cpu: no preparation; the scope redirects megatron's hard-coded CUDA calls (megatron_cuda) to the
  platform. A simulation computes with the host's kernels and takes this adapter too: on the
  simulated NPU megatron-core runs through the redirects, to the simulated NPU's device, streams
  and generator, and MindSpeed (which patches a real NPU's kernels) is neither applied nor asked for;
- npu: MindSpeed is applied (import, then `repatch(options)`); no scope;
- cuda, rocm: megatron runs as written; no scope.
A plugin kind that megatron-core runs on fills the one hook, `register(kind, adapter, packages)`.
On every kind it also silences the notices megatron-core prints in every process about optional
packages it falls back from (Transformer Engine, apex) and about its own deprecated defaults:
they repeat once per worker and say nothing about the run; and, where Transformer Engine is
absent, it defines the one name megatron-core 0.16's MoE router reads without defining it
(`te_general_gemm`, tested for None: the router then multiplies with torch).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

from roll_device.errors import ConfigError
from roll_device.packages import Package
from roll_device.platforms.base import Platform


def _cpu(platform: Platform, options: dict[str, Any]) -> Callable[[], Any]:
    from roll_device.compat.megatron_cuda import redirect_cuda

    return lambda: redirect_cuda(platform)


def _npu(platform: Platform, options: dict[str, Any]) -> Callable[[], Any]:
    from roll_device.compat import mindspeed

    mindspeed.apply(options)
    return contextlib.nullcontext


def run_as_written(platform: Platform, options: dict[str, Any]) -> Callable[[], Any]:
    return contextlib.nullcontext


ADAPTERS: dict[str, Callable[[Platform, dict[str, Any]], Callable[[], Any]]] = {
    "cpu": _cpu,
    "npu": _npu,
    "cuda": run_as_written,
    "rocm": run_as_written,
}
MEGATRON_CORE = Package("megatron", "megatron-core")
# What megatron needs on each kind beyond megatron-core (MindSpeed installs as `mindspeed`).
PACKAGES: dict[str, tuple[Package, ...]] = {"npu": (MEGATRON_CORE, Package("mindspeed", "mindspeed"))}


QUIET_NOTICES = (  # (category, start of the message, module the warning is attributed to)
    (UserWarning, "Transformer Engine and Apex are not installed", ""),
    (UserWarning, "Apex is not installed", ""),
    (UserWarning, "full scope is deprecated", ""),
    (FutureWarning, r"`torch.distributed.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated", ""),
    # the distributed optimizer's zero_grad reads `.grad` of its shard views (non-leaf by design);
    # on the CPU the read passes through the redirect's function mode, elsewhere it is megatron's
    (
        UserWarning,
        "The .grad attribute of a Tensor that is not a leaf Tensor",
        r"(megatron\.core\.optimizer|roll_device\.compat\.megatron_cuda)",
    ),
)


def register(
    kind: str,
    adapter: Callable[[Platform, dict[str, Any]], Callable[[], Any]] = run_as_written,
    packages: tuple[Package, ...] = (MEGATRON_CORE,),
) -> None:
    """The hook of a plugin kind that megatron-core runs on: its adapter (`run_as_written` where
    megatron needs nothing) and the packages it imports there, filled once when its platform
    module is imported (a second, different adapter for a kind is refused)."""
    if ADAPTERS.get(kind, adapter) is not adapter:
        raise ConfigError(
            f"the Megatron trainer already has an adapter for device kind '{kind}': register it once"
        )
    ADAPTERS[kind] = adapter
    PACKAGES[kind] = tuple(packages)


def kinds() -> tuple[str, ...]:
    """The device kinds the Megatron trainer runs on."""
    return tuple(ADAPTERS)


def packages(kind: str) -> tuple[Package, ...]:
    """The packages the Megatron trainer imports on kernels of `kind` (`Platform.kernels_kind`)."""
    return PACKAGES.get(kind, (MEGATRON_CORE,))


def prepare(platform: Platform, options: dict[str, Any]) -> Callable[[], Any]:
    """Get megatron ready for `platform`; returns a factory of the per-call scope."""
    adapter = ADAPTERS.get(platform.kernels_kind)
    if adapter is None:
        raise ConfigError(
            f"the Megatron trainer has no adapter for device kind '{platform.kind}' "
            f"(it runs on {', '.join(kinds())}): use the fsdp trainer on this kind"
        )
    for category, message, module in QUIET_NOTICES:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    scope = adapter(platform, options)
    _define_router_gemm()
    return scope


def _define_router_gemm() -> None:
    """megatron-core 0.16 imports `te_general_gemm` only with Transformer Engine, then reads it in
    every MoE router's forward (a NameError without it): without the engine it is None."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
