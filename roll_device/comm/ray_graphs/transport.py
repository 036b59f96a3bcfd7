"""Ray Direct Transport per collective backend: `@ray.method(tensor_transport="HCCL")` hands a
method's device tensors to the actor that reads them, over a collective group, never through the
object store.

Ray's own collective transport (`ray.experimental.rdt.collective_tensor_transport`) already does
the transfer generically, through `ray.util.collective` send and receive on the group that holds
both actors; what a backend adds is its name. `register_direct_transport(kind)` registers the
collective backend of `kind` (`collective_group.py`) and a transport of the same name for the
kind's device type, once per process; Ray requires it in the process that creates the actors,
before it creates them, and copies it into each actor itself. Then, from the driver,
`collective_group.device_group(actors, kind)` forms the group both ends use.

`register_own_direct_transport(kind)` is the same over roll-device's own group under the name
`ROLL_<BACKEND>` for every kind (Ray's GLOO group would take over the process's default group);
weight sync's `rdt` path (`roll_device/comm/rdt_transport.py`) registers it in each of its actors.
"""

from __future__ import annotations

from ray.experimental.rdt.collective_tensor_transport import CollectiveTensorTransport

from roll_device.comm.ray_graphs.backend import platform_for
from roll_device.comm.ray_graphs.collective_group import (
    register_collective_backend,
    register_own_collective_backend,
)

_classes: dict[str, type[CollectiveTensorTransport]] = {}


def transport_class(name: str) -> type[CollectiveTensorTransport]:
    """Ray's collective transport under the backend name `name` (one class per name)."""
    if name not in _classes:
        _classes[name] = type(
            f"{name.title()}TensorTransport",
            (CollectiveTensorTransport,),
            {"tensor_transport_backend": lambda self: name, "__module__": __name__},
        )
    return _classes[name]


def register_direct_transport(kind: str) -> str:
    """Register the Ray Direct Transport of `kind`'s collective backend in this process (the one
    that will create the actors; idempotent); returns its name for `tensor_transport=`."""
    import torch
    from ray.experimental import register_tensor_transport
    from ray.experimental.rdt.util import DEFAULT_TRANSPORTS, transport_manager_info

    name = register_collective_backend(kind)
    if name not in DEFAULT_TRANSPORTS and name not in transport_manager_info:
        register_tensor_transport(name, [platform_for(kind).device_type], transport_class(name), torch.Tensor)
    return name


def register_own_direct_transport(kind: str | None = None) -> str:
    """Register, in this process, a Ray Direct Transport over roll-device's own collective group of
    `kind` (None: this process's platform), named `ROLL_<BACKEND>` (idempotent); returns the name.
    Every process that sends, receives or owns the transferred references registers it."""
    import torch
    from ray.experimental import register_tensor_transport
    from ray.experimental.rdt.util import transport_manager_info

    platform = platform_for(kind)
    name = register_own_collective_backend(f"ROLL_{platform.dist_backend.upper()}")
    if name not in transport_manager_info:
        register_tensor_transport(name, [platform.device_type], transport_class(name), torch.Tensor)
    return name
