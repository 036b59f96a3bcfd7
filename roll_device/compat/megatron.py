"""What megatron-core needs on each device kind before and while it runs.

`prepare(platform, options)` runs once before the trainer imports megatron and returns the scope
the trainer opens around each of its calls:
- cpu: no preparation; the scope redirects megatron's hard-coded CUDA calls (megatron_cuda);
- npu: MindSpeed is applied (import, then `repatch(options)`); no scope;
- cuda, rocm: megatron runs as written; no scope.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from roll_device.errors import ConfigError
from roll_device.platforms.base import Platform


def _cpu(platform: Platform, options: dict[str, Any]) -> Callable[[], Any]:
    from roll_device.compat.megatron_cuda import redirect_cuda

    return lambda: redirect_cuda(platform)


def _npu(platform: Platform, options: dict[str, Any]) -> Callable[[], Any]:
    from roll_device.compat import mindspeed

    mindspeed.apply(options)
    return contextlib.nullcontext


def _native(platform: Platform, options: dict[str, Any]) -> Callable[[], Any]:
    return contextlib.nullcontext


ADAPTERS: dict[str, Callable[[Platform, dict[str, Any]], Callable[[], Any]]] = {
    "cpu": _cpu,
    "npu": _npu,
    "cuda": _native,
    "rocm": _native,
}
KINDS = tuple(ADAPTERS)


def prepare(platform: Platform, options: dict[str, Any]) -> Callable[[], Any]:
    """Get megatron ready for `platform`; returns a factory of the per-call scope."""
    adapter = ADAPTERS.get(platform.kind)
    if adapter is None:
        raise ConfigError(
            f"the Megatron trainer has no adapter for device kind '{platform.kind}' "
            f"(it runs on {', '.join(KINDS)}): use the fsdp trainer on this kind"
        )
    return adapter(platform, options)
