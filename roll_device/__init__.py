"""roll-device: the device layer for RL post-training on mixed hardware.

`current_platform()` is this process's device kind (detected lazily; `ROLL_DEVICE` overrides);
`get_platform(kind)` is a platform by kind, for workers bound to another kind.
`register_ray_communicator(kind)` makes Ray's Compiled Graphs in this process (a Ray actor) move
the kind's device tensors with roll-device's communicator (docs/ray-graphs.md).
"""

from roll_device.errors import RollDeviceError
from roll_device.platforms import Platform, current_platform, get_platform, known_kinds

__all__ = [
    "Platform",
    "RollDeviceError",
    "current_platform",
    "get_platform",
    "known_kinds",
    "register_ray_communicator",
]
__version__ = "0.1.0"


def register_ray_communicator(kind: str | None = None) -> str:
    """Make Ray's Compiled Graphs in this process use roll-device's communicator for `kind` (None:
    this process's platform): call it in each actor of a graph, then compile with
    `transport="accelerator"` edges or collectives. Returns the torch module name registered.
    Imports Ray only when called; see `roll_device.comm.ray_graphs`."""
    from roll_device.comm.ray_graphs import registration

    return registration.register_ray_communicator(kind)
