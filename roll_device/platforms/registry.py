"""Which platform this process runs on, and platforms by kind.

Detection is lazy and happens once per process: `ROLL_DEVICE` overrides it (`auto`, a kind, or a
kind's simulation such as `npu-sim`); otherwise plugins from the entry-point group
`roll_device.platforms` are asked first (two that both report devices are an error: set
`ROLL_DEVICE`), then the NPU (probed without ever raising), then CUDA and ROCm (told apart by
torch's build), and the CPU last. A plugin entry point loads a `Platform` subclass with its own
`kind`; one kind per plugin. Where the process resolved its platform is remembered
(`resolved_at()`), and asking again under another `ROLL_DEVICE` warns with that place.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from importlib.metadata import entry_points

from roll_device.errors import ConfigError, DeviceUnavailableError, UnknownDeviceError
from roll_device.platforms import ENV_VAR
from roll_device.platforms.base import Platform
from roll_device.platforms.cpu import HOST_KIND, CpuPlatform
from roll_device.platforms.cuda import CudaPlatform
from roll_device.platforms.npu import NpuPlatform
from roll_device.platforms.rocm import RocmPlatform

AUTO = "auto"
PLUGIN_GROUP = "roll_device.platforms"
BUILTIN: dict[str, type[Platform]] = {
    cls.kind: cls for cls in (NpuPlatform, CudaPlatform, RocmPlatform, CpuPlatform)
}
DETECTION_ORDER = ("npu", "cuda", "rocm", HOST_KIND)

log = logging.getLogger(__name__)
_lock = threading.RLock()
_current: dict[str, object] = {}
_by_kind: dict[str, Platform] = {}
_plugins: dict[str, type[Platform]] | None = None


def _load_plugins() -> dict[str, type[Platform]]:
    found: dict[str, tuple[str, type[Platform]]] = {}
    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            cls = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break detection
            log.warning("roll-device: platform plugin %r failed to load: %s", ep.name, exc)
            continue
        if not (isinstance(cls, type) and issubclass(cls, Platform)):
            log.warning("roll-device: platform plugin %r is not a Platform subclass", ep.name)
            continue
        if cls.kind in found and found[cls.kind][1] is not cls:
            raise ConfigError(
                f"platform plugins '{found[cls.kind][0]}' and '{ep.value}' both register device kind "
                f"'{cls.kind}': uninstall one of them"
            )
        found[cls.kind] = (ep.value, cls)
    return {kind: cls for kind, (_value, cls) in found.items()}


def plugin_platforms() -> dict[str, type[Platform]]:
    """Platform classes registered by installed packages, by kind (loaded once)."""
    global _plugins
    with _lock:
        if _plugins is None:
            _plugins = _load_plugins()
        return _plugins


def _classes() -> dict[str, type[Platform]]:
    """Every platform class by kind: plugins replace a built-in class of their kind."""
    return {**BUILTIN, **plugin_platforms()}


def known_kinds() -> list[str]:
    """Every device kind (what a role's `device` may name), built-in kinds first."""
    return list(DETECTION_ORDER) + [k for k in plugin_platforms() if k not in BUILTIN]


def simulations() -> dict[str, str]:
    """`ROLL_DEVICE` values that run a kind's simulation -> the kind they simulate."""
    return {cls.simulated_kind: kind for kind, cls in _classes().items() if cls.simulated_kind}


def _platform_class(kind: str) -> type[Platform]:
    classes = _classes()
    if kind in classes:
        return classes[kind]
    raise UnknownDeviceError(
        f"unknown device kind '{kind}': valid kinds are {', '.join(known_kinds())} "
        f"({ENV_VAR} also takes {', '.join([AUTO, *simulations()])})"
    )


def get_platform(kind: str) -> Platform:
    """The platform of `kind` or of a simulation (one instance each per process), usable without
    its device for identity members; device operations need the device and its package."""
    with _lock:
        if kind not in _by_kind:
            simulated = simulations().get(kind)
            if simulated is not None:
                _by_kind[kind] = _platform_class(simulated)(simulated=True)
            else:
                _by_kind[kind] = _platform_class(kind)()
        return _by_kind[kind]


def detect_kind() -> str:
    """The first available kind: a plugin, then npu, cuda, rocm, cpu. A ConfigError when two
    plugins report devices (which one to use is for `ROLL_DEVICE` to say)."""
    available = []
    for kind, cls in plugin_platforms().items():
        try:
            if cls.is_available():
                available.append(kind)
        except Exception as exc:  # noqa: BLE001 - detection must end in a clean decision
            log.warning("roll-device: platform plugin %r failed its probe: %s", kind, exc)
    if len(available) > 1:
        raise ConfigError(
            f"platform plugins for kinds {', '.join(available)} all report usable devices here: "
            f"choose one with {' or '.join(f'{ENV_VAR}={k}' for k in available)}"
        )
    if available:
        return available[0]
    return next(kind for kind in DETECTION_ORDER if BUILTIN[kind].is_available())


def current_platform() -> Platform:
    """The platform of this process: `ROLL_DEVICE` if set, else detected; resolved once."""
    requested = os.environ.get(ENV_VAR, AUTO).strip().lower() or AUTO
    with _lock:
        if "platform" not in _current:
            _current["platform"] = _resolve(requested)
            _current["requested"] = requested
            _current["site"] = _caller()
        elif requested != _current["requested"]:
            log.warning(
                "roll-device: %s is now %r, but this process resolved its platform (%s) with %r at %s; "
                "that platform stays",
                ENV_VAR,
                requested,
                _current["platform"].name,
                _current["requested"],
                _current["site"],
            )
        return _current["platform"]


def resolved_at() -> str | None:
    """Where this process first resolved its platform (file:line in function), None if not yet."""
    return _current.get("site")


def _caller() -> str:
    """The first frame outside this module and the package's re-exports."""
    here = (__file__, os.path.join(os.path.dirname(__file__), "__init__.py"))
    for frame in reversed(traceback.extract_stack()[:-1]):
        if frame.filename not in here:
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "unknown"


def _resolve(requested: str) -> Platform:
    if requested == AUTO:
        return get_platform(detect_kind())
    platform = get_platform(requested)
    if platform.simulated:
        platform.device_module()  # installs the simulation
        return platform
    if not platform.is_available():
        raise DeviceUnavailableError(f"{ENV_VAR}={requested} but {platform.unavailable_hint()}")
    return platform


def reset_for_tests() -> None:
    """Forget the resolved platform so a test can resolve again under another environment."""
    global _plugins
    with _lock:
        _current.clear()
        _by_kind.clear()
        _plugins = None
