"""One call per process puts roll-device's communicator behind Ray's Compiled Graphs, and one
choice per graph edge says how a tensor crosses it.

- `register_ray_communicator(kind=None)`: in an actor (its `__init__`), make `PlatformCommunicator`
  the communicator Ray creates for `transport="accelerator"` edges and collectives, for the actor's
  kind. Ray keeps one
  accelerator context per process, keyed by the torch module of the kind's device type (`npu`,
  `cuda`), and maps a non-cuda module to the Ray resource of its upper-cased name (`npu` -> `NPU`),
  which is the resource roll-device's NPU platform asks Ray for.
- `edge_transport(src, dst, communicator)`: the `with_tensor_transport(...)` arguments for an edge
  from a `src` actor to a `dst` actor (kinds or platforms). Both on one device type with a
  collective backend: the communicator carries the tensor device to device. Otherwise (a CPU end,
  or two device kinds no one backend joins) the tensor is staged in host memory: Ray's shared
  memory channel with `device="cpu"`, and the receiver moves it to its device.
"""

from __future__ import annotations

from typing import Any

from roll_device.comm.ray_graphs.backend import collective_platform, platform_for
from roll_device.errors import ConfigError
from roll_device.platforms import HOST_KIND, Platform, get_platform

HOST_STAGING = {"transport": "shm", "device": "cpu"}


def register_ray_communicator(kind: str | None = None) -> str:
    """Make Ray's Compiled Graphs in this process use roll-device's communicator for `kind`
    (None: this process's platform). Returns the torch module name registered (the kind's torch device type).

    Raises MissingPackageError naming the kind, its backend and what to install when the kind has
    no collective backend here; refuses the host kind, whose tensors Ray moves itself."""
    from ray.experimental.channel.accelerator_context import register_accelerator_context

    from roll_device.comm.ray_graphs.communicator import PlatformCommunicator  # imports Ray

    platform = platform_for(kind)
    if platform.device_type == get_platform(HOST_KIND).device_type:
        raise ConfigError(
            f"platform '{platform.name}' keeps tensors in host memory, which Ray's Compiled Graphs "
            "move through shared memory themselves: register the communicator in device actors only"
        )
    collective_platform(platform.kind)
    register_accelerator_context(platform.device_type, PlatformCommunicator)
    return platform.device_type


def edge_transport(src: str | Platform, dst: str | Platform, communicator: Any = None) -> dict[str, Any]:
    """`with_tensor_transport(**edge_transport(src, dst, communicator))` for an edge from a `src`
    actor to a `dst` actor; `communicator`: a `PlatformCommunicator` (None: the registered one)."""
    src_p, dst_p = (p if isinstance(p, Platform) else platform_for(p) for p in (src, dst))
    host = get_platform(HOST_KIND).device_type
    if src_p.device_type == dst_p.device_type != host and src_p.dist_backend == dst_p.dist_backend:
        return {"transport": communicator if communicator is not None else "accelerator"}
    return dict(HOST_STAGING)
