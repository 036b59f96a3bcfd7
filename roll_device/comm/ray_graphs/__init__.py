"""Ray Compiled Graphs and Ray Direct Transport on every platform with a collective backend.

- `communicator.py`: `PlatformCommunicator`, Ray's Compiled Graph `Communicator` over the
  platform's backend and streams; `registration.py`: `register_ray_communicator(kind)` (one call per
  actor) and `edge_transport(src, dst)` (device to device, or staged in host memory).
- `collective_group.py`: a `ray.util.collective` backend over the platform's backend, registered
  where Ray has none (`register_collective_backend`); `transport.py`: a Ray Direct Transport per
  collective backend (`register_direct_transport`), on top of it.
- `backend.py`: the check that a kind has its backend here, and the group operations all of them
  share; `rendezvous.py`: how Ray actors form a process group of their own.

Nothing here imports Ray until it is used. See docs/ray-graphs.md.
"""

from roll_device.comm.ray_graphs.registration import edge_transport, register_ray_communicator

__all__ = ["edge_transport", "register_ray_communicator"]
