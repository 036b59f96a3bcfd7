"""Which platform this process runs on, and platforms by kind.

Detection is lazy and happens once per process: `ROLL_DEVICE` overrides it (`auto`, a kind, or
`npu-sim`); otherwise plugins from the entry-point group `roll_device.platforms` are asked first,
then the NPU (probed without ever raising), then CUDA and ROCm (told apart by torch's build), and
the CPU last. A plugin entry point loads a `Platform` subclass with its own `kind`.
"""

from __future__ import annotations

import logging
import os
import threading
from importlib.metadata import entry_points

from roll_device.errors import DeviceUnavailableError, UnknownDeviceError
from roll_device.platforms.base import Platform
from roll_device.platforms.cpu import CpuPlatform
from roll_device.platforms.cuda import CudaPlatform
from roll_device.platforms.npu import INSTALL_HINT, NpuPlatform
from roll_device.platforms.rocm import RocmPlatform

ENV_VAR = "ROLL_DEVICE"
PLUGIN_GROUP = "roll_device.platforms"
SIMULATED_NPU = "npu-sim"
BUILTIN: dict[str, type[Platform]] = {
    cls.kind: cls for cls in (NpuPlatform, CudaPlatform, RocmPlatform, CpuPlatform)
}
DETECTION_ORDER = ("npu", "cuda", "rocm", "cpu")

log = logging.getLogger(__name__)
_lock = threading.RLock()
_current: dict[str, Platform] = {}
_by_kind: dict[str, Platform] = {}
_plugins: dict[str, type[Platform]] | None = None


def plugin_platforms() -> dict[str, type[Platform]]:
    """Platform classes registered by installed packages, by kind (loaded once)."""
    global _plugins
    with _lock:
        if _plugins is None:
            found: dict[str, type[Platform]] = {}
            for ep in entry_points(group=PLUGIN_GROUP):
                try:
                    cls = ep.load()
                except Exception as exc:  # noqa: BLE001 - a broken plugin must not break detection
                    log.warning("roll-device: platform plugin %r failed to load: %s", ep.name, exc)
                    continue
                if not (isinstance(cls, type) and issubclass(cls, Platform)):
                    log.warning("roll-device: platform plugin %r is not a Platform subclass", ep.name)
                    continue
                found[cls.kind] = cls
            _plugins = found
        return _plugins


def known_kinds() -> list[str]:
    """Every kind `get_platform` accepts, built-in kinds first."""
    kinds = list(DETECTION_ORDER) + [SIMULATED_NPU]
    return kinds + [k for k in plugin_platforms() if k not in kinds]


def _platform_class(kind: str) -> type[Platform]:
    plugins = plugin_platforms()
    if kind in plugins:
        return plugins[kind]
    if kind in BUILTIN:
        return BUILTIN[kind]
    raise UnknownDeviceError(
        f"unknown device kind '{kind}': valid kinds are {', '.join(known_kinds())} "
        f"(or 'auto' for {ENV_VAR})"
    )


def get_platform(kind: str) -> Platform:
    """The platform of `kind` (one instance per kind and process), usable without its device for
    identity members; device operations need the device and its package."""
    with _lock:
        if kind not in _by_kind:
            if kind == SIMULATED_NPU:
                _by_kind[kind] = NpuPlatform(simulated=True)
            else:
                _by_kind[kind] = _platform_class(kind)()
        return _by_kind[kind]


def detect_kind() -> str:
    """The first available kind: plugins, then npu, cuda, rocm, cpu. Never raises."""
    for kind, cls in plugin_platforms().items():
        try:
            if cls.is_available():
                return kind
        except Exception as exc:  # noqa: BLE001 - detection must end in a clean decision
            log.warning("roll-device: platform plugin %r failed its probe: %s", kind, exc)
    for kind in DETECTION_ORDER:
        if BUILTIN[kind].is_available():
            return kind
    return "cpu"


def current_platform() -> Platform:
    """The platform of this process: `ROLL_DEVICE` if set, else detected; resolved once."""
    with _lock:
        if "platform" not in _current:
            _current["platform"] = _resolve(os.environ.get(ENV_VAR, "auto").strip().lower() or "auto")
        return _current["platform"]


def _resolve(requested: str) -> Platform:
    if requested == "auto":
        return get_platform(detect_kind())
    platform = get_platform(requested)
    if platform.simulated:
        platform.device_module()  # installs the simulated NPU
        return platform
    if not platform.is_available():
        raise DeviceUnavailableError(_unavailable_message(requested))
    return platform


def _unavailable_message(kind: str) -> str:
    if kind == "npu":
        return f"{ENV_VAR}=npu but no usable Ascend NPU: {INSTALL_HINT}"
    if kind in ("cuda", "rocm"):
        import torch

        build = f"cuda={torch.version.cuda}, hip={getattr(torch.version, 'hip', None)}"
        return (
            f"{ENV_VAR}={kind} but no {kind} device is visible to this torch ({build}): install a "
            f"torch build for {kind} (docs/install.md) or set {ENV_VAR}=cpu"
        )
    return f"{ENV_VAR}={kind} but platform '{kind}' reports no usable device here"


def reset_for_tests() -> None:
    """Forget the resolved platform so a test can resolve again under another environment."""
    global _plugins
    with _lock:
        _current.clear()
        _by_kind.clear()
        _plugins = None
