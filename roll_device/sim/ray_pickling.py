"""Simulated tensors reach Ray's tensor serializers as the `npu` tensors they stand for.

Ray hooks torch tensors by exact type (`ray.util.serialization.register_serializer(torch.Tensor,
...)` writes `CloudPickler.dispatch[torch.Tensor]`): its Compiled Graph channels pull device
tensors out for a communicator that way, and Ray Direct Transport pulls out the tensors it sends
directly. A real `npu` tensor is a `torch.Tensor`, so those hooks catch it; a simulated one is a
subclass, which pickle looks up by its own type, so it would slip past them and travel pickled
(as a copy) instead. `expose_to_ray` adds a dispatch entry for the subclass that hands it to
whatever reducer Ray holds for `torch.Tensor` at the time, or pickles it as usual when there is
none. Only Ray's pickler has the entry; plain `pickle` and `torch.save` are unchanged.

Ray's pickler exists once Ray is imported; `roll_device.sim.install` calls `expose_to_ray` each
time it is asked (it costs a dictionary lookup), so a process that imports Ray after the
simulation still gets the entry at its next device access.
"""

from __future__ import annotations

import pickle
import sys

import torch

from roll_device.sim.tensor import SimNpuTensor

RAY_PICKLER_MODULE = "ray.cloudpickle"


def expose_to_ray() -> None:
    """Add the simulated tensor's entry to Ray's pickler, if Ray is loaded (idempotent)."""
    cloudpickle = sys.modules.get(RAY_PICKLER_MODULE)
    if cloudpickle is None:
        return
    dispatch = cloudpickle.CloudPickler.dispatch
    if dispatch.get(SimNpuTensor) is not _reduce_as_tensor:
        dispatch[SimNpuTensor] = _reduce_as_tensor


def _reduce_as_tensor(tensor: SimNpuTensor):
    reducer = sys.modules[RAY_PICKLER_MODULE].CloudPickler.dispatch.get(torch.Tensor)
    if reducer is None:
        return tensor.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    return reducer(tensor)
