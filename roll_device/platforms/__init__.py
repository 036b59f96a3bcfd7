"""One class per device kind and the registry that picks this process's platform."""

from roll_device.platforms.base import Platform
from roll_device.platforms.cpu import HOST_KIND, process_status, release_host_heap
from roll_device.platforms.registry import current_platform, get_platform, known_kinds, resolved_at

__all__ = [
    "HOST_KIND",
    "Platform",
    "current_platform",
    "get_platform",
    "known_kinds",
    "process_status",
    "release_host_heap",
    "resolved_at",
]
