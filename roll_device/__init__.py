"""roll-device: the device layer for RL post-training on mixed hardware.

`current_platform()` is this process's device kind (detected lazily; `ROLL_DEVICE` overrides);
`get_platform(kind)` is a platform by kind, for workers bound to another kind.
`register_ray_communicator(kind)` makes Ray's Compiled Graphs in this process (a Ray actor) move
the kind's device tensors with roll-device's communicator (docs/ray-graphs.md).
"""

from roll_device.errors import RollDeviceError

__all__ = [
    "Platform",
    "RollDeviceError",
    "current_platform",
    "get_platform",
    "known_kinds",
    "register_ray_communicator",
]
__version__ = "0.1.0"
PLATFORM_NAMES = ("Platform", "current_platform", "get_platform", "known_kinds")


def __getattr__(name: str):
    """The platform names, imported on first use: the platforms load torch, which a command that
    refuses its arguments (checked before any work) does not need."""
    if name in PLATFORM_NAMES:
        from roll_device import platforms

        return getattr(platforms, name)
    raise AttributeError(f"module 'roll_device' has no attribute '{name}'")


def register_ray_communicator(kind: str | None = None) -> str:
    """Make Ray's Compiled Graphs in this process use roll-device's communicator for `kind` (None:
    this process's platform): call it in each actor of a graph, then compile with
    `transport="accelerator"` edges or collectives. Returns the torch module name registered.
    Imports Ray only when called; see `roll_device.comm.ray_graphs`."""
    from roll_device.comm.ray_graphs import registration

    return registration.register_ray_communicator(kind)
